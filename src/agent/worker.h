/*
 * worker.h - one worker process of the agent: spawning it in its own process
 * group, relaying its output line by line with a rank prefix, and keeping the
 * last lines it printed for the failure report.
 */
#ifndef COHORT_AGENT_WORKER_H
#define COHORT_AGENT_WORKER_H

#include <stddef.h>
#include <sched.h>
#include <sys/types.h>

#include "agent/agent.h"
#include "agent/progress.h"
#include "agent/sweep.h"

/* Longer lines are relayed in pieces of this size. */
#define WORKER_LINE_MAX 16384
#define WORKER_TAIL_LINE_MAX 400

typedef struct worker_stream {
  int fd;         /* read end of the pipe, -1 once closed */
  int console_fd; /* where prefixed lines go (1 or 2), -1 for none */
  int to_file;    /* its lines also go to the worker's log file */
  int dup_fd;     /* the node's filtered_std*.log for lines matching dup, -1 none */
  const agent_filters *dup;
  size_t len; /* bytes of an unfinished line in buf */
  char buf[WORKER_LINE_MAX];
} worker_stream;

typedef struct worker {
  int rank; /* global rank */
  int local_rank;
  pid_t pid;              /* 0 before spawn */
  int running;            /* spawned and not yet reaped */
  int status;             /* waitpid() status once reaped */
  int stopped_by;         /* signal the agent sent it before it ended, or 0 */
  int was_frozen;         /* it was stopped (SIGSTOP, traced) when the job began to stop */
  int64_t started_ms;     /* base_now_ms() at spawn */
  int64_t last_output_ms; /* base_now_ms() of its last output, 0 none */
  worker_stream out, err;
  int log_fd;     /* per-rank log file or -1 */
  int keep_fd;    /* during its spawn: an fd the worker inherits (its control channel), -1 */
  int exec_fd;    /* from its start to agent_worker_started(): where a failed exec writes, -1 */
  progress *prog; /* its progress (--hang-timeout), or NULL: a line counts */
  char tail[AGENT_TAIL_LINES][WORKER_TAIL_LINE_MAX];
  int tail_next, tail_count;
} worker;

/*
 * Where local rank lr's streams go under cfg: *console and *files as Std
 * masks (bit 1 stdout, bit 2 stderr). Files need cfg->log_dir.
 */
void agent_worker_output(const agent_config *cfg, int lr, int *console, int *files);

/* Resets the worker's state before a spawn; console and files as agent_worker_output gives. */
void agent_worker_init(worker *w, int rank, int local_rank, int console, int files, int log_fd);

/* Also copy the lines of stream (0 stdout, 1 stderr) that hold one of f to fd (prefixed). */
void agent_worker_duplicate(worker *w, int stream, const agent_filters *f, int fd);

/*
 * Forks and execs argv in a new process group with envp, its stdout and
 * stderr on pipes and stdin on /dev/null. The child dies with the agent
 * (PR_SET_PDEATHSIG), bound to cpus unless NULL, in the job's cgroup sw
 * when it has one. Returns 0 (w running, its pid set) without waiting for
 * the exec: agent_worker_started() tells how it went, so that the next
 * worker's fork need not wait for this one's exec. -errno of a failed
 * fork/pipe (nothing started).
 */
int agent_worker_start(worker *w, char *const argv[], char *const envp[], const cpu_set_t *cpus,
                       sweep *sw);

/* After agent_worker_start(): waits for the child's exec. 0, or the errno
 * (> 0) why the command could not be executed (or bound). Once only. */
int agent_worker_started(worker *w);

/*
 * Reads what is available on one of the worker's streams and relays the
 * complete lines. Returns 0, or 1 when the stream reached end of file.
 */
int agent_worker_stream_read(worker *w, worker_stream *s);

/* Relays a final unterminated line and closes both streams and the log. */
void agent_worker_close_streams(worker *w);

/* Describes how the worker ended, e.g. "exited with code 3", "killed by SIGSEGV". */
void agent_worker_describe_status(int status, char *out, size_t outlen);

/* 1 when the process is stopped (state T or t in /proc/PID/stat). */
int agent_worker_is_frozen(pid_t pid);

/* 1 when the worker ended successfully (exit code 0). */
int agent_worker_succeeded(const worker *w);

#endif

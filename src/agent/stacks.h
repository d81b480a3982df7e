/*
 * stacks.h - the stacks of running workers, and what they say about a hang.
 *
 * Collection (agent_stacks_collect): for each process, in parallel and within one
 * deadline,
 *  - a Python worker that loaded cohort's start-up hook (python/ beside this
 *    file, put on PYTHONPATH by the agent) catches STACKS_PY_SIGNAL and has
 *    faulthandler write every thread's traceback to its own file: the agent
 *    truncates that file, sends the signal and reads the file back;
 *  - any other process (or a Python one whose dump did not come) gets a
 *    native backtrace of every thread from eu-stack or gdb, whichever is on
 *    the search path first; the debugger is killed at the deadline, so a
 *    stuck one never holds the agent;
 *  - without either, the process state and kernel wait channel from
 *    /proc/PID/stat and /proc/PID/wchan, plus one line saying what to install.
 * Each process's text goes to DIR/rank<R>.txt when a directory is given.
 *
 * Classification (agent_stacks_classify): a rank whose main thread waits inside a
 * collective (torch.distributed, DDP's backward, gloo, NCCL, c10d, libcohort)
 * is a victim; one that does not is a cause. The verdict also carries the
 * place where the rank is ("all_reduce, train.py:41") for grouping, and the
 * first frames of its main thread.
 *
 * Thread safety: none; the agent calls these from its loop.
 */
#ifndef COHORT_AGENT_STACKS_H
#define COHORT_AGENT_STACKS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Offset from SIGRTMIN of the signal the Python hook listens to; the agent
 * passes the number in COHORT_STACKS_SIGNAL. */
#define STACKS_PY_SIGNAL_OFFSET 7
#define STACKS_WHERE_MAX 512
#define STACKS_FRAMES_MAX 1024

typedef enum stacks_kind {
  STACKS_NONE = 0,   /* nothing collected (the process is gone) */
  STACKS_PYTHON,     /* faulthandler traceback of every thread */
  STACKS_NATIVE,     /* eu-stack or gdb backtrace of every thread */
  STACKS_PROC_STATE, /* /proc state and wait channel only */
} stacks_kind;

typedef struct stacks_target {
  int rank;
  pid_t pid;
  const char *py_file; /* the rank's COHORT_STACKS_FILE, or NULL */
  const char *no_py;   /* with py_file NULL: why there is no hook, said for a Python rank */
} stacks_target;

typedef struct stacks_opts {
  const char *dir;       /* where rank<R>.txt go, NULL: nowhere */
  const char *path;      /* search path for eu-stack and gdb ($PATH), "" none */
  const char *proc_root; /* "/proc" (a fixture tree in tests) */
  int64_t deadline_ms;   /* base_now_ms() clock: everything ends by then */
} stacks_opts;

typedef struct stacks_dump {
  int rank;
  pid_t pid;
  stacks_kind kind;
  char *text; /* malloc'ed, NUL-terminated; never NULL after a collect */
} stacks_dump;

/* The signal number the Python hook is told to catch (SIGRTMIN + offset). */
int agent_stacks_py_signal(void);

/*
 * Collects the stacks of n targets into out[0..n) (free with
 * agent_stacks_dump_free). Returns 0, or -errno when nothing could be started
 * (out of memory); a process that cannot be inspected gets a text saying
 * why, not an error. Waits its own children by pid only.
 */
int agent_stacks_collect(const stacks_target *t, int n, const stacks_opts *o, stacks_dump *out);
void agent_stacks_dump_free(stacks_dump *d, int n);

typedef struct stacks_verdict {
  int rank;
  int collected;                  /* 0: no stack (process gone, dump failed) */
  int in_collective;              /* 1: a victim, waiting for the others */
  char where[STACKS_WHERE_MAX];   /* "all_reduce, train.py:41" / "sleep, train.py:12" */
  char frames[STACKS_FRAMES_MAX]; /* first frames of the main thread, one a line */
} stacks_verdict;

/* Reads a dump's main thread (Python or native text) into a verdict. */
void agent_stacks_classify(const stacks_dump *d, stacks_verdict *v);

/*
 * The rank to blame among n verdicts, by index (silent_ms[i]: how long rank
 * i made no progress). In order: a rank not waiting in a collective (the
 * longest silent of them); when all wait, one whose collective differs from
 * the others' (the smallest group); a rank whose stack could not be taken
 * while all others wait; else the longest silent. *why receives the reason
 * in words (static storage). Returns -1 when n is 0.
 */
int agent_stacks_blame(const stacks_verdict *v, const int64_t *silent_ms, int n, const char **why);

/*
 * The others grouped by where they are, one line each, ranks in order:
 * "ranks 0-2,5 waiting in all_reduce, train.py:41" (skip: the index left
 * out, the cause; -1 none).
 */
void agent_stacks_group_lines(const stacks_verdict *v, int n, int skip, char *out, size_t outlen);

/* Where a rank runs and how long it has been silent, for the report. */
typedef struct stacks_place {
  int node;
  const char *host;
  pid_t pid;
  int64_t silent_ms;
} stacks_place;

/*
 * The hang report, the same text wherever the same verdicts are given:
 * the cause (rank, node, host, pid, silence, why, where) and its first
 * frames, the others grouped by place, and where the full stacks are
 * (stacks_dir, or NULL). Returns the index of the cause, -1 when n is 0.
 */
int agent_stacks_report(const stacks_verdict *v, const stacks_place *at, int n,
                        const char *stacks_dir, char *out, size_t outlen);

/* "0-2,5" for a sorted list of ranks. */
void agent_stacks_rank_list(const int *ranks, int n, char *out, size_t outlen);

#endif

/*
 * launch.h - what `cohort launch` needs below the command line: the host
 * list (a hostfile in the MPI/DeepSpeed format or `--hosts`, filtered by
 * --include/--exclude), the ssh command lines that reach each host, a
 * bounded parallel fan-out of short remote commands, and the pre-flight that
 * checks every host before anything starts.
 *
 * Library code: functions return 0 or -errno and never print; where an error
 * needs words (which line of which file, which host), they go to the
 * caller's err buffer as one line without a trailing newline. Not thread-safe;
 * nothing here keeps global state.
 */
#ifndef COHORT_LAUNCH_LAUNCH_H
#define COHORT_LAUNCH_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#define LAUNCH_HOST_MAX 255   /* longest host name, with an optional user@ */
#define LAUNCH_MAX_HOSTS 4096 /* as many nodes as `cohort run` accepts */
#define LAUNCH_MAX_SLOTS 1024 /* as many workers per node as `cohort run` */
#define LAUNCH_ERR_MAX 320    /* a good size for the err buffers below */

typedef struct launch_host {
  char name[LAUNCH_HOST_MAX + 1]; /* what ssh is given: [user@]host */
  int slots;                      /* workers on the host; 0 = not given */
} launch_host;

typedef struct launch_hosts {
  launch_host *v; /* owned; free with launch_hosts_free */
  size_t n;
} launch_hosts;

/*
 * Parses a hostfile: one host per line as `HOST [slots=N]`, `#` starting a
 * comment, blank lines ignored. HOST is [user@]name of letters, digits, '.',
 * '-' and '_', not starting with '-' (ssh would take it for an option). A
 * host named twice is an error (a hostfile names nodes, not ranks).
 * text need not be NUL-terminated. On success *out holds at least one host.
 * Errors: -EINVAL (err names the line), -ENOMEM, -E2BIG (over
 * LAUNCH_MAX_HOSTS). *out is left empty on failure.
 */
int launch_hostfile_parse(const char *text, size_t len, launch_hosts *out, char *err,
                          size_t errlen);

/*
 * Parses `--hosts H1[:SLOTS],H2,...` (the form of `mpirun --host`). Same
 * rules and errors as launch_hostfile_parse.
 */
int launch_hosts_parse_list(const char *spec, launch_hosts *out, char *err, size_t errlen);

/*
 * Keeps only the hosts named in include (a comma-separated list), or drops
 * those named in exclude; either may be NULL, not both given. A name that is
 * not in the list is an error (a typo would otherwise run the job on the
 * wrong machines), and so is a filter that leaves no host. -EINVAL with err
 * set; h is unchanged on failure.
 */
int launch_hosts_filter(launch_hosts *h, const char *include, const char *exclude, char *err,
                        size_t errlen);

/* Frees the list and empties it; a NULL or empty list is fine. */
void launch_hosts_free(launch_hosts *h);

/*
 * Quotes argv for a POSIX shell (each word in single quotes, a quote as
 * '\'') and joins the words with spaces: the remote command line of ssh.
 * *out is malloc'ed. Returns 0 or -ENOMEM.
 */
int launch_shell_join(char *const *argv, char **out);

/* How ssh is run: the system's `ssh`, always in batch mode. */
typedef struct launch_ssh {
  const char *program;   /* "ssh", or a path (tests) */
  char **opts;           /* --ssh-opts split at blanks, NULL-terminated; owned */
  int connect_timeout_s; /* ssh's ConnectTimeout */
  /*
   * NULL: every ssh its own connection. Else a private directory for ssh's
   * control sockets: the pre-flight's connection to a host stays open
   * (ControlMaster=auto, ControlPersist) and the job's session there runs
   * over it, one TCP connection and key exchange per host instead of two;
   * launch_ssh_release() closes them.
   */
  const char *control_dir;
} launch_ssh;

/*
 * Splits --ssh-opts at spaces and tabs into s->opts (no quoting: an option
 * that needs a space belongs in an ssh_config given with -F). NULL or ""
 * gives no options. Returns 0 or -ENOMEM.
 */
int launch_ssh_set_opts(launch_ssh *s, const char *ssh_opts);

/* Frees s->opts. */
void launch_ssh_free(launch_ssh *s);

/*
 * The argv that runs remote_cmd on host: program -o BatchMode=yes
 * -o ConnectTimeout=T [the control options] [opts...] -- host remote_cmd. The host goes after
 * "--", so no name can be taken for an option. *argv_out is one malloc'ed
 * block (free it once); it points into s and host, which must outlive it.
 * Returns 0 or -ENOMEM.
 */
int launch_ssh_argv(const launch_ssh *s, const char *host, const char *remote_cmd,
                    char ***argv_out);

/*
 * With s->control_dir: asks the master connection of each host to exit
 * (ssh -O exit, a local request to the socket; bounded by timeout_ms) and
 * removes the directory. Nothing without one. Returns 0 or -errno.
 */
int launch_ssh_release(const launch_ssh *s, const launch_hosts *h, int64_t timeout_ms);

/* The result of one command of a fan-out. */
typedef struct launch_result {
  int status;      /* waitpid() status; meaningful when timed_out and spawn_errno are 0 */
  int timed_out;   /* killed at the deadline */
  int spawn_errno; /* the command could not be started (e.g. ENOENT: no ssh) */
  char out[1024];  /* the start of its stdout, NUL-terminated */
  char err[1024];  /* the start of its stderr, NUL-terminated */
} launch_result;

/*
 * Runs the n commands argvs[i] (stdin /dev/null, stdout and stderr
 * captured), at most max_parallel at once, and fills results[i]. Every
 * command still running timeout_ms after the fan-out began is killed
 * (SIGKILL, by its PID) and marked timed out; the call returns once every
 * child has been reaped. Returns 0, or -errno when a pipe or poll failed
 * (the children it started are then killed and reaped).
 */
int launch_run_all(char **const *argvs, size_t n, int max_parallel, int64_t timeout_ms,
                   launch_result *results);

/*
 * The pre-flight: runs `COHORT --version` on every host over ssh (bounded
 * by max_parallel and timeout_ms) and compares its first line with expect
 * (e.g. "cohort 0.1.0"). Each host with a problem gets one line in
 * *report (malloc'ed, "HOST: what is wrong\n" per host), which is NULL when
 * every host is fine. Returns 0 (look at *report) or -errno.
 */
int launch_preflight(const launch_ssh *s, const launch_hosts *h, const char *cohort_path,
                     const char *expect, int max_parallel, int64_t timeout_ms, char **report);

/*
 * A job started over ssh: one `cohort run` agent per host, node i on
 * hosts.v[i], node 0 hosting the rendezvous store. Every remote command is
 *   exec sh -c 'read -r COHORT_TOKEN && export COHORT_TOKEN && exec "$@"' sh
 *        COHORT run --nnodes N --node-rank I --master M --job ID
 *        --nproc-per-node S [run_words...] -- command...
 * (each word quoted for the remote shell, which must be a POSIX one: sh,
 * bash, zsh): the job's token reaches the agent's environment through ssh's
 * standard input, never a command line that `ps` shows.
 */
typedef struct launch_job {
  launch_hosts hosts;
  launch_ssh ssh;
  const char *cohort_path; /* the cohort binary on every host */
  char *const *run_words;  /* more `cohort run` options, NULL-terminated */
  char *const *command;    /* the workers' command, NULL-terminated */
  int nproc;               /* workers per host; 0: each host's slots (1 when none) */
  const char *master;      /* HOST:PORT of node 0's store; NULL: first host's name:29400 */
  const char *job_id;      /* NULL: a random one */
  int64_t stop_grace_ms;   /* after a stop, how long the agents get before ssh is killed */
  int out_fd, err_fd;      /* where the agents' stdout and stderr are relayed */
} launch_job;

/*
 * Builds host i's remote command line (see launch_job) into *out
 * (malloc'ed). master and job_id are the resolved ones. Returns 0 or
 * -ENOMEM.
 */
int launch_remote_command(const launch_job *job, size_t i, const char *master, const char *job_id,
                          char **out);

/*
 * Runs the job: starts every session, writes the token to each, relays the
 * agents' output line by line (a line of cohort's own that an earlier host
 * already printed word for word, such as the job's root cause, which every
 * agent prints, is relayed once), and waits until every session has ended.
 * While it runs, SIGPIPE is ignored and SIGINT, SIGTERM and SIGHUP are
 * caught (through a self-pipe; the caller's handlers are put back): the
 * first one sends every agent a "stop" line and closes its standard input
 * (the agents stop their workers within their grace), a second one ends
 * the ssh clients. A session that ends while others run
 * is named on err_fd, and the others get the agents' own fail-together
 * time, then are stopped. *status: the job's exit status (0, the first
 * failing agent's code in node order, 1 for a session that ssh lost,
 * 128+N after signal N). Returns 0, or -errno when it could not start (a
 * session already started is then stopped).
 */
int launch_job_run(const launch_job *job, int *status);

#endif

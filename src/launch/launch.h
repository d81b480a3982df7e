/*
 * launch.h - what `cohort launch` needs below the command line: the host
 * list (a hostfile in the MPI/DeepSpeed format or `--hosts`, filtered by
 * --include/--exclude), the ssh command lines that reach each host, and
 * the job: one ssh session per host whose first answer checks the host
 * before anything starts anywhere.
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
 * -o ConnectTimeout=T [opts...] -- host remote_cmd. The host goes after
 * "--", so no name can be taken for an option. *argv_out is one malloc'ed
 * block (free it once); it points into s and host, which must outlive it.
 * Returns 0 or -ENOMEM.
 */
int launch_ssh_argv(const launch_ssh *s, const char *host, const char *remote_cmd,
                    char ***argv_out);

/*
 * The first host of h that is this machine: its name (hosts with a user@
 * are never taken) resolves to a loopback address or to an address of one
 * of this machine's interfaces. -1 when none is, or the interfaces could
 * not be read. Resolves the names in order until one is local.
 */
long launch_local_host(const launch_hosts *h);

/*
 * What a host's session showed before the job started on it: the agent's
 * first line (its version), or how the session ended without one.
 */
typedef struct launch_answer {
  const char *version; /* the first line of its stdout, no newline; NULL: none came */
  int ended;           /* the session ended; status is its waitpid() status */
  int status;
  int timed_out;   /* no version within the time given */
  int spawn_errno; /* ssh could not be started */
  const char *err; /* the last line ssh or the remote side wrote to stderr, or "" */
} launch_answer;

/*
 * The verdict on one host's answer: 0 when the host answered expect (e.g.
 * "cohort 0.1.0") and waits for the token; else 1 with one line in line
 * ("unreachable over ssh: ...", "runs 'cohort 0.0.9', not ...", "COHORT is
 * not there ...", "no answer over ssh within N s", ...). cohort_path names
 * the remote binary, timeout_ms the time it was given.
 */
int launch_judge_answer(const launch_answer *a, const char *cohort_path, const char *expect,
                        int64_t timeout_ms, char *line, size_t cap);

/*
 * A job started over ssh: one `cohort run` agent per host, node i on
 * hosts.v[i], node 0 hosting the rendezvous store, one ssh session (one
 * connection, one login) per host for the job's whole life, but none for
 * this machine (job->local). Every remote command is
 *   exec COHORT run --launcher-stdin --nnodes N --node-rank I --master M
 *        --job ID --nproc-per-node S [run_words...] -- command...
 * (each word quoted for the remote shell, which must be a POSIX one: sh,
 * bash, zsh). The handshake: the agent's first line on stdout is its
 * version; it then waits for the job's token on its standard input (never
 * a command line that `ps` shows). The token goes to every host once every
 * host has answered with expect; otherwise no host gets it, and nothing
 * starts anywhere.
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
  long local;              /* the host that is this machine: its agent runs here, under
                            * `sh -c` instead of ssh (launch_local_host); -1 none */
  const char *expect;      /* the version line every host must answer ("cohort 0.1.0") */
  int fanout;              /* sessions connecting at once (not yet answered); 0: 32 */
  int64_t answer_ms;       /* each host's time to answer from its session's start */
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
 * Runs the job: starts every session (at most job->fanout connecting at
 * once), reads each host's answer, and, when every host answered
 * job->expect within job->answer_ms, writes the token to each; else it
 * writes one line per host with a problem to err_fd ("cohort launch: HOST:
 * what is wrong", as launch_judge_answer words it, then "cohort launch:
 * nothing was started"), closes every session's standard input, so that no
 * agent starts, and *status is 1. Once started, it relays the agents'
 * output line by line (a line of cohort's own that an earlier host already
 * printed word for word, such as the job's root cause, which every agent
 * prints, is relayed once), and waits until every session has ended.
 * While it runs, SIGPIPE is ignored and SIGINT, SIGTERM and SIGHUP are
 * caught (through a self-pipe; the caller's handlers are put back): the
 * first one sends every agent a "stop" line and closes its standard input
 * (the agents stop their workers within their grace; before the token,
 * nothing starts), a second one ends the ssh clients. A session that ends
 * while others run is named on err_fd, and the others get the agents' own
 * fail-together time, then are stopped. *status: the job's exit status (0,
 * the first failing agent's code in node order, 1 for a session that ssh
 * lost or a host that failed the handshake, 128+N after signal N). Returns
 * 0, or -errno when it could not start (a session already started is then
 * stopped).
 */
int launch_job_run(const launch_job *job, int *status);

#endif

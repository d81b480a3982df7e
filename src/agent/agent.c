/* agent.c - the node agent's loop: spawn, supervise, fail together, restart. */
#include "agent/agent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/env.h"
#include "agent/guard.h"
#include "agent/watch.h"
#include "agent/worker.h"
#include "rdzv/join.h"
#include "base/base.h"
#include "base/net.h"
#include "doctor/doctor.h"
#include "store/store.h"

extern char **environ;

/* How long the agent keeps reading a finished attempt's pipes: a grandchild
 * that left the process group may hold them open forever. */
#define DRAIN_MS 500
/* How long a local error exit waits before it is published as the root
 * cause, in case another node reports the failure it reacted to. */
#define PUBLISH_DELAY_MS 300

int agent_run_id_valid(const char *id) {
  size_t n = strlen(id);
  if (n == 0 || n > AGENT_RUN_ID_MAX) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = id[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    if (!ok) return 0;
  }
  return 1;
}

/* ---- signals: the handler only writes the signal number to a pipe ---- */

static int sig_pipe[2] = {-1, -1};
static const int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};

/* While no worker exists (rendezvous), a stop signal ends the agent at once. */
static volatile sig_atomic_t no_workers = 1;
/* The error-file directory, empty between attempts; removed (rmdir is
 * async-signal-safe) when a signal ends the agent. */
static char sig_err_dir[128];

static void on_signal(int sig) {
  int saved = errno;
  if (no_workers && (sig == SIGINT || sig == SIGTERM || sig == SIGHUP)) {
    if (sig_err_dir[0] != '\0') rmdir(sig_err_dir);
    signal(sig, SIG_DFL);
    raise(sig);
  }
  unsigned char b = (unsigned char)sig;
  ssize_t k = write(sig_pipe[1], &b, 1);
  (void)k;
  errno = saved;
}

static int signals_install(void) {
  if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return -errno;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCHLD, &sa, NULL);
  for (size_t i = 0; i < BASE_ARRAY_LEN(forwarded_signals); i++)
    sigaction(forwarded_signals[i], &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

static void signals_restore(void) {
  signal(SIGCHLD, SIG_DFL);
  for (size_t i = 0; i < BASE_ARRAY_LEN(forwarded_signals); i++)
    signal(forwarded_signals[i], SIG_DFL);
  for (int i = 0; i < 2; i++) {
    if (sig_pipe[i] >= 0) close(sig_pipe[i]);
    sig_pipe[i] = -1;
  }
}

/* ---- the job ---- */

typedef enum attempt_outcome {
  ATTEMPT_OK,
  ATTEMPT_FAILED,     /* a worker failed */
  ATTEMPT_EXEC_ERROR, /* the command could not be executed */
  ATTEMPT_SIGNALED,   /* the agent was told to stop */
  ATTEMPT_INTERNAL    /* the agent itself could not go on */
} attempt_outcome;

typedef struct job {
  const agent_config *cfg;
  worker *workers;
  int nworkers;
  guard guard;
  store_server *store;
  char token[STORE_TOKEN_MAX + 1];
  int restart;
  /* per attempt */
  int stopping;       /* SIGTERM sent to the groups */
  int64_t kill_at;    /* when the stragglers get SIGKILL */
  int killed;         /* SIGKILL sent */
  int first_failed;   /* index of the first worker that failed, -1 */
  int stop_signal;    /* signal that told the agent to stop, 0 */
  int64_t publish_at; /* when to publish a local failure held back, 0 none */
  int sigint_count;
  int exec_errno;
  int exec_failed_rank;
  int remote_failed;             /* another node failed (or was lost) first */
  char report[WATCH_REPORT_MAX]; /* the root cause, as every node prints it */
  char cause[256];               /* short form for the "stopped by cohort after ..." lines */
  /* multi-node (multinode == 0: this node alone) */
  int multinode;
  int round;
  rdzv_plan plan;
  store_client *client; /* main thread's store connection */
  agent_watch *watch;
  char store_host[BASE_HOST_MAX]; /* the store as this agent reaches it */
  int store_port;
  char store_env[BASE_HOST_MAX + 16]; /* COHORT_STORE for the workers */
  char iface[64];                     /* interface toward node 0, "" unknown */
  char hostname[BASE_HOST_MAX];
  char run_id[AGENT_RUN_ID_MAX + 1];
  rdzv_opts ropts;    /* discovery options as used, for publishing */
  doctor_result *net; /* derived network settings (--net auto), or NULL */
  char err_dir[128];  /* temporary directory for TORCHELASTIC_ERROR_FILE, "" none */
} job;

/* The job's token, or NULL for a multi-node job started without one. */
static const char *job_token(const job *j) {
  return j->token[0] != '\0' ? j->token : NULL;
}

static void signal_groups(job *j, int sig, int mark) {
  for (int i = 0; i < j->nworkers; i++) {
    worker *w = &j->workers[i];
    if (w->pid <= 0) continue;
    kill(-w->pid, sig);
    if (mark && w->running && (w->stopped_by == 0 || sig == SIGKILL)) w->stopped_by = sig;
  }
}

static void begin_stop(job *j) {
  if (j->stopping) return;
  j->stopping = 1;
  /* A stopped (hung) worker is worth naming in the report. */
  for (int i = 0; i < j->nworkers; i++)
    if (j->workers[i].running && worker_is_frozen(j->workers[i].pid)) j->workers[i].was_frozen = 1;
  signal_groups(j, SIGTERM, 1);
  /* Stopped processes act on SIGTERM only once continued. */
  signal_groups(j, SIGCONT, 0);
  j->kill_at = base_now_ms() + j->cfg->grace_ms;
}

static int running_count(const job *j) {
  int n = 0;
  for (int i = 0; i < j->nworkers; i++) n += j->workers[i].running;
  return n;
}

static void note_local_failure(job *j, int index);

static void reap(job *j) {
  for (;;) {
    int st;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid <= 0) break;
    for (int i = 0; i < j->nworkers; i++) {
      worker *w = &j->workers[i];
      if (w->pid != pid || !w->running) continue;
      w->running = 0;
      w->status = st;
      if (!worker_succeeded(w) && j->first_failed < 0 && !j->remote_failed && w->stopped_by == 0 &&
          j->stop_signal == 0) {
        j->first_failed = i;
        begin_stop(j);
        if (j->multinode && WIFEXITED(st)) {
          /* A worker that exits with an error is often reacting to a peer
           * on another node that was killed: give that node's agent a
           * moment to publish the signal death as the root cause. */
          j->publish_at = base_now_ms() + PUBLISH_DELAY_MS;
        } else {
          note_local_failure(j, i);
        }
      }
      /* The worker's own children go with it. */
      kill(-w->pid, SIGKILL);
    }
  }
}

static void handle_signal(job *j, int sig) {
  if (sig == SIGCHLD) {
    reap(j);
    return;
  }
  if (sig == WATCH_NOTIFY_BYTE) {
    /* Another node failed or was lost: stop ours, blaming it. */
    int can_adopt = j->first_failed < 0 || j->publish_at != 0;
    if (can_adopt && !j->remote_failed && watch_failure(j->watch, j->report, sizeof j->report)) {
      j->remote_failed = 1;
      j->first_failed = -1; /* a local error exit, if any, becomes a consequence */
      j->publish_at = 0;
      const char *nl = strchr(j->report, '\n');
      size_t n = nl ? (size_t)(nl - j->report) : strlen(j->report);
      if (n > sizeof j->cause - 1) n = sizeof j->cause - 1;
      memcpy(j->cause, j->report, n);
      j->cause[n] = '\0';
      begin_stop(j);
    }
    return;
  }
  if (sig == SIGUSR1 || sig == SIGUSR2) {
    signal_groups(j, sig, 0);
    return;
  }
  if (sig == SIGINT) j->sigint_count++;
  if (j->stop_signal != 0 && sig == SIGINT && j->sigint_count >= 2) {
    base_log(BASE_LOG_WARN, "second SIGINT: killing the workers");
    signal_groups(j, SIGKILL, 1);
    j->killed = 1;
    return;
  }
  if (j->stop_signal == 0) j->stop_signal = sig;
  /* Forward the signal itself: a worker may want to checkpoint on SIGTERM. */
  signal_groups(j, sig, 1);
  if (!j->stopping) {
    j->stopping = 1;
    j->kill_at = base_now_ms() + j->cfg->grace_ms;
  }
}

static int open_log(const agent_config *cfg, int restart, int rank) {
  if (cfg->log_dir == NULL) return -1;
  char path[4096];
  snprintf(path, sizeof path, "%s/attempt%d", cfg->log_dir, restart);
  mkdir(cfg->log_dir, 0755);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/attempt%d/rank%d.log", cfg->log_dir, restart, rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) base_log(BASE_LOG_WARN, "cannot write log file %s: %s", path, strerror(errno));
  return fd;
}

/* ---- the workers' environment ---- */

/* Where rank's TORCHELASTIC_ERROR_FILE is in this attempt ("" when none). */
static void error_file_path(const job *j, int rank, char *out, size_t outlen) {
  out[0] = '\0';
  if (j->err_dir[0] != '\0')
    snprintf(out, outlen, "%s/attempt%d-rank%d.json", j->err_dir, j->restart, rank);
}

static int build_env(const job *j, const worker *w, agent_env *e) {
  const rdzv_plan *p = &j->plan;
  char errfile[256];
  error_file_path(j, w->rank, errfile, sizeof errfile);
  agent_env_in in = {.parent = environ,
                     .rank = w->rank,
                     .local_rank = w->local_rank,
                     .world_size = p->world_size,
                     .local_world_size = j->cfg->nproc,
                     .group_rank = p->my_index,
                     .group_world_size = p->nnodes,
                     .role = j->cfg->role,
                     .master_addr = p->master_addr,
                     .master_port = p->master_port,
                     .restart = j->restart,
                     .max_restarts = j->cfg->max_restarts,
                     .run_id = j->run_id,
                     .error_file = errfile[0] ? errfile : NULL,
                     .iface = j->iface,
                     .store = j->store_env,
                     .token = job_token(j),
                     .net = j->net ? j->net->set : NULL,
                     .nnet = j->net ? j->net->nset : 0};
  return agent_env_build(&in, e);
}

/* Removes shared-memory segments a crashed job of this run id left behind. */
static void cleanup_shm(const char *run_id) {
  DIR *d = opendir("/dev/shm");
  if (d == NULL) return;
  char prefix[AGENT_RUN_ID_MAX + 16];
  snprintf(prefix, sizeof prefix, "cohort-%s-", run_id);
  size_t pl = strlen(prefix);
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strncmp(de->d_name, prefix, pl) == 0) {
      if (unlinkat(dirfd(d), de->d_name, 0) == 0)
        base_log(BASE_LOG_INFO, "removed leftover shared memory /dev/shm/%s", de->d_name);
    }
  }
  closedir(d);
}

/* ---- the report ---- */

static void tail_lines(const worker *w, char *out, size_t outlen) {
  size_t off = 0;
  out[0] = '\0';
  if (w->tail_count == 0) return;
  off += (size_t)snprintf(out, outlen, "last lines of rank %d:", w->rank);
  int start = (w->tail_next - w->tail_count + AGENT_TAIL_LINES) % AGENT_TAIL_LINES;
  for (int k = 0; k < w->tail_count && off < outlen; k++)
    off += (size_t)snprintf(out + off, outlen - off, "\n  | %s",
                            w->tail[(start + k) % AGENT_TAIL_LINES]);
}

/* The root cause of a local failure, as every node will print it. */
static void compose_local_report(job *j, int index) {
  worker *f = &j->workers[index];
  /* The worker has exited: what it printed last is already in the pipes. */
  worker_stream_read(f, &f->out);
  worker_stream_read(f, &f->err);
  char how[128], tail[WATCH_REPORT_MAX / 2];
  worker_describe_status(f->status, how, sizeof how);
  tail_lines(f, tail, sizeof tail);
  char where[BASE_HOST_MAX + 32] = "";
  if (j->multinode) snprintf(where, sizeof where, "node %d (%s): ", j->plan.my_index, j->hostname);
  char exc[1024] = "";
  char path[256];
  error_file_path(j, f->rank, path, sizeof path);
  if (path[0] != '\0') {
    char msg[900];
    if (agent_error_file_message(path, msg, sizeof msg) == 0)
      snprintf(exc, sizeof exc, "\nexception: %s", msg);
  }
  snprintf(j->report, sizeof j->report, "%srank %d (local rank %d, pid %d) %s%s%s%s", where,
           f->rank, f->local_rank, (int)f->pid, how, exc, tail[0] ? "\n" : "", tail);
  snprintf(j->cause, sizeof j->cause, "rank %d failed", f->rank);
}

static void note_local_failure(job *j, int index) {
  compose_local_report(j, index);
  if (!j->multinode) return;
  /* Tell the other nodes now; if one of them was first, its report counts. */
  char winner[WATCH_REPORT_MAX];
  watch_publish_failure(j->store_host, j->store_port, job_token(j), j->run_id, j->round, j->report,
                        winner, sizeof winner);
  if (strcmp(winner, j->report) != 0) {
    base_strlcpy(j->report, winner, sizeof j->report);
    j->remote_failed = 1;
    j->first_failed = -1;
    const char *nl = strchr(j->report, '\n');
    size_t n = nl ? (size_t)(nl - j->report) : strlen(j->report);
    if (n > sizeof j->cause - 1) n = sizeof j->cause - 1;
    memcpy(j->cause, j->report, n);
    j->cause[n] = '\0';
  }
}

static void print_report(const job *j) {
  /* The root cause: the same text on every node. */
  const char *p = j->report;
  int first = 1;
  while (*p) {
    const char *nl = strchr(p, '\n');
    int n = nl ? (int)(nl - p) : (int)strlen(p);
    fprintf(stderr, "cohort: %s%.*s\n", first ? "job failed: " : "", n, p);
    first = 0;
    p += n;
    if (*p == '\n') p++;
  }
  /* Then what this node did about it. */
  char node[32] = "";
  if (j->multinode) snprintf(node, sizeof node, "node %d: ", j->plan.my_index);
  for (int i = 0; i < j->nworkers; i++) {
    const worker *w = &j->workers[i];
    if (i == j->first_failed || w->pid <= 0) continue;
    char st[128];
    worker_describe_status(w->status, st, sizeof st);
    if (w->was_frozen)
      fprintf(
          stderr,
          "cohort: %srank %d: was stopped (SIGSTOP or traced) when the job failed: a hung worker\n",
          node, w->rank);
    if (w->stopped_by != 0) {
      const char *sn = sigabbrev_np(w->stopped_by);
      fprintf(stderr, "cohort: %srank %d: stopped by cohort (SIG%s) after %s; %s\n", node, w->rank,
              sn ? sn : "?", j->cause, st);
    } else if (!worker_succeeded(w)) {
      fprintf(stderr, "cohort: %srank %d: also %s\n", node, w->rank, st);
    }
  }
  fflush(stderr);
}

/* ---- one attempt: spawn everyone, supervise until all are gone ---- */

static attempt_outcome run_attempt(job *j) {
  const agent_config *cfg = j->cfg;
  j->stopping = 0;
  j->killed = 0;
  j->first_failed = -1;
  j->remote_failed = 0;
  j->publish_at = 0;
  j->report[0] = '\0';
  j->cause[0] = '\0';
  j->exec_errno = 0;
  j->exec_failed_rank = -1;
  int console = cfg->log_dir == NULL || cfg->tee;
  attempt_outcome outcome = ATTEMPT_OK;
  if (j->err_dir[0] == '\0') {
    /* Made only now that workers will run; the guard removes it if the
     * agent is killed, the signal handler if a signal ends the agent. */
    const char *tmpdir = getenv("TMPDIR");
    snprintf(j->err_dir, sizeof j->err_dir, "%s/cohort-errors-XXXXXX",
             tmpdir && tmpdir[0] && strlen(tmpdir) < 64 ? tmpdir : "/tmp");
    if (mkdtemp(j->err_dir) == NULL) {
      j->err_dir[0] = '\0';
    } else {
      guard_set_dir(&j->guard, j->err_dir);
      base_strlcpy(sig_err_dir, j->err_dir, sizeof sig_err_dir);
    }
  }
  int offset = j->plan.nodes[j->plan.my_index].rank_offset;

  for (int i = 0; i < j->nworkers; i++)
    worker_init(&j->workers[i], offset + i, i, console, open_log(cfg, j->restart, offset + i));
  no_workers = 0;

  for (int i = 0; i < j->nworkers && !j->stopping && j->stop_signal == 0; i++) {
    worker *w = &j->workers[i];
    agent_env env = {0};
    int rc = build_env(j, w, &env);
    int exec_errno = 0;
    if (rc == 0) rc = worker_spawn(w, cfg->argv, env.v, &exec_errno);
    agent_env_free(&env);
    if (rc != 0) {
      base_log(BASE_LOG_ERROR, "cannot start rank %d: %s", w->rank, strerror(-rc));
      outcome = ATTEMPT_INTERNAL;
      begin_stop(j);
      break;
    }
    guard_add(&j->guard, w->pid);
    if (exec_errno != 0) {
      j->exec_errno = exec_errno;
      j->exec_failed_rank = i;
      outcome = ATTEMPT_EXEC_ERROR;
      begin_stop(j);
      break;
    }
  }

  int64_t drain_until = 0;
  for (;;) {
    int running = running_count(j);
    int open_streams = 0;
    for (int i = 0; i < j->nworkers; i++)
      open_streams += (j->workers[i].out.fd >= 0) + (j->workers[i].err.fd >= 0);
    if (running == 0 && j->publish_at == 0) {
      if (open_streams == 0) break;
      if (drain_until == 0) drain_until = base_now_ms() + DRAIN_MS;
      if (base_now_ms() >= drain_until) break;
    }
    if (j->stopping && !j->killed && base_now_ms() >= j->kill_at) {
      signal_groups(j, SIGKILL, 1);
      j->killed = 1;
    }
    if (j->publish_at != 0 && base_now_ms() >= j->publish_at) {
      j->publish_at = 0;
      if (j->first_failed >= 0) note_local_failure(j, j->first_failed);
    }

    struct pollfd pfd[1 + 2 * AGENT_MAX_NPROC];
    worker_stream *sref[1 + 2 * AGENT_MAX_NPROC];
    worker *wref[1 + 2 * AGENT_MAX_NPROC];
    nfds_t n = 0;
    pfd[n].fd = sig_pipe[0];
    pfd[n].events = POLLIN;
    n++;
    for (int i = 0; i < j->nworkers; i++) {
      worker *w = &j->workers[i];
      worker_stream *ss[2] = {&w->out, &w->err};
      for (int k = 0; k < 2; k++) {
        if (ss[k]->fd < 0) continue;
        pfd[n].fd = ss[k]->fd;
        pfd[n].events = POLLIN;
        sref[n] = ss[k];
        wref[n] = w;
        n++;
      }
    }
    int timeout = -1;
    if (j->stopping && !j->killed) timeout = base_deadline_left(j->kill_at);
    if (running == 0 && drain_until != 0) timeout = base_deadline_left(drain_until);
    if (j->publish_at != 0) {
      int left = base_deadline_left(j->publish_at);
      if (timeout < 0 || left < timeout) timeout = left;
    }
    int ready = poll(pfd, n, timeout);
    if (ready < 0 && errno != EINTR) {
      base_log(BASE_LOG_ERROR, "poll: %s", strerror(errno));
      outcome = ATTEMPT_INTERNAL;
      begin_stop(j);
      base_sleep_ms(10);
      continue;
    }
    if (ready <= 0) continue;
    for (nfds_t k = 1; k < n; k++) {
      if (pfd[k].revents != 0) worker_stream_read(wref[k], sref[k]);
    }
    if (pfd[0].revents & POLLIN) {
      unsigned char sigs[64];
      ssize_t got = read(sig_pipe[0], sigs, sizeof sigs);
      for (ssize_t k = 0; k < got; k++) handle_signal(j, sigs[k]);
    }
  }

  for (int i = 0; i < j->nworkers; i++) {
    worker *w = &j->workers[i];
    worker_close_streams(w);
    if (w->pid > 0) {
      kill(-w->pid, SIGKILL);
      guard_remove(&j->guard, w->pid);
    }
  }
  cleanup_shm(j->run_id);
  no_workers = 1;

  if (outcome != ATTEMPT_OK) return outcome;
  if (j->remote_failed) return ATTEMPT_FAILED;
  if (j->stop_signal != 0) return ATTEMPT_SIGNALED;
  if (j->first_failed >= 0) return ATTEMPT_FAILED;
  for (int i = 0; i < j->nworkers; i++) {
    if (!worker_succeeded(&j->workers[i])) {
      j->first_failed = i;
      compose_local_report(j, i);
      return ATTEMPT_FAILED;
    }
  }
  return ATTEMPT_OK;
}

/* ---- multi-node: discovery, store, join, completion ---- */

/* Publishes a failure that is not a worker's (exec error, signal) so that
 * the other nodes stop too, and keeps whichever report came first. */
static void publish_other_failure(job *j, const char *what) {
  snprintf(j->report, sizeof j->report, "node %d (%s): %s", j->plan.my_index, j->hostname, what);
  if (!j->multinode) return;
  char winner[WATCH_REPORT_MAX];
  watch_publish_failure(j->store_host, j->store_port, job_token(j), j->run_id, j->round, j->report,
                        winner, sizeof winner);
}

/* After local success: wait until every node is done, or a failure. */
static int wait_all_done(job *j) {
  const rdzv_plan *p = &j->plan;
  char key[STORE_KEY_MAX], suffix[32];
  snprintf(suffix, sizeof suffix, "done/%d", p->my_index);
  rdzv_key(key, sizeof key, j->run_id, j->round, suffix);
  store_set(j->client, key, "1", 1, base_deadline_in(5000));
  for (int k = 0; k < p->nnodes; k++) {
    snprintf(suffix, sizeof suffix, "done/%d", k);
    rdzv_key(key, sizeof key, j->run_id, j->round, suffix);
    const char *keys[1] = {key};
    for (;;) {
      if (watch_failure(j->watch, j->report, sizeof j->report)) return -1;
      int rc = store_wait(j->client, keys, 1, base_deadline_in(200));
      if (rc == 0) break;
      if (rc != -ETIMEDOUT) {
        snprintf(j->report, sizeof j->report,
                 "node 0 (%s) lost: the rendezvous store stopped answering (%s)",
                 p->nodes[0].hostname, cohort_strerror(rc));
        return -1;
      }
      /* Signals still count while we wait. */
      unsigned char sigs[64];
      ssize_t got = read(sig_pipe[0], sigs, sizeof sigs);
      for (ssize_t i = 0; i < got; i++) {
        if (sigs[i] == SIGINT || sigs[i] == SIGTERM || sigs[i] == SIGHUP) {
          j->stop_signal = sigs[i];
          return -1;
        }
      }
    }
  }
  return 0;
}

/* The interface holding a local address, for GLOO/NCCL_SOCKET_IFNAME. */
static void find_iface(const char *addr, char *out, size_t outlen) {
  out[0] = '\0';
  if (addr == NULL || addr[0] == '\0') return;
  base_iface_of_addr(addr, out, outlen);
}

static int multinode_join(job *j) {
  const agent_config *cfg = j->cfg;
  char err[512] = "";
  rdzv_join_opts jo = {
      .job_id = j->run_id,
      .round = j->round,
      .is_host = j->store != NULL,
      .claimed_rank = cfg->rdzv.node_rank,
      .nproc = cfg->nproc,
      .nnodes_min = cfg->rdzv.nnodes_min,
      .nnodes_max = cfg->rdzv.nnodes_max,
      .last_call_ms = cfg->last_call_ms,
      .my_host = NULL,
      .master_host = NULL,
      .deadline_ms = base_deadline_in(cfg->join_timeout_ms),
  };
  char local[BASE_HOST_MAX] = "", remote[BASE_HOST_MAX] = "";
  if (j->store == NULL) {
    /* Which of our addresses reaches node 0, and node 0's address as we see it. */
    base_route_addrs(j->store_host, j->store_port, local, sizeof local, remote, sizeof remote);
    jo.my_host = local;
    jo.master_host = remote;
  }
  rdzv_plan_free(&j->plan);
  int rc = rdzv_join(j->client, &jo, &j->plan, err, sizeof err);
  if (rc != 0) {
    fprintf(stderr, "cohort: rendezvous failed (round %d): %s\n", j->round,
            err[0] ? err : cohort_strerror(rc));
    return rc;
  }
  const rdzv_plan *p = &j->plan;
  if (j->store != NULL) {
    find_iface(p->master_addr, j->iface, sizeof j->iface);
    base_join_hostport(p->master_addr, j->store_port, j->store_env, sizeof j->store_env);
    if (p->nnodes == 1) {
      base_strlcpy(j->iface, "lo", sizeof j->iface);
      base_join_hostport("127.0.0.1", j->store_port, j->store_env, sizeof j->store_env);
    }
  } else {
    find_iface(local, j->iface, sizeof j->iface);
    base_join_hostport(remote[0] ? remote : j->store_host, j->store_port, j->store_env,
                       sizeof j->store_env);
  }
  const rdzv_node *me = &p->nodes[p->my_index];
  fprintf(stderr,
          "cohort: node %d of %d (%s), ranks %d-%d of %d, master %s:%d, interface %s, round %d\n",
          p->my_index, p->nnodes, j->hostname, me->rank_offset, me->rank_offset + me->nproc - 1,
          p->world_size, p->master_addr, p->master_port, j->iface[0] ? j->iface : "?", j->round);
  return 0;
}

/*
 * --net auto: derive NCCL/UCX/Gloo settings for this node (cohort doctor's
 * logic) toward the master, and in a multi-node job compare the result with
 * node 0's, warning when the RDMA setups differ.
 */
static void derive_network(job *j) {
  if (!j->cfg->net_auto) return;
  doctor_result_destroy(j->net);
  j->net = NULL;
  doctor_config dc;
  memset(&dc, 0, sizeof dc);
  dc.master = j->multinode ? j->plan.master_addr : NULL;
  /* COHORT_DOCTOR_ROOT: a directory holding sys/, proc/, dev/, lib/ and an
   * ifaddrs file that stand for this machine (fixture trees in tests, or a
   * container that mounts the host's /sys elsewhere). */
  char roots[5][4096];
  const char *droot = getenv("COHORT_DOCTOR_ROOT");
  if (droot != NULL && droot[0] != '\0') {
    snprintf(roots[0], sizeof roots[0], "%s/sys", droot);
    snprintf(roots[1], sizeof roots[1], "%s/proc", droot);
    snprintf(roots[2], sizeof roots[2], "%s/dev", droot);
    snprintf(roots[3], sizeof roots[3], "%s/lib", droot);
    snprintf(roots[4], sizeof roots[4], "%s/ifaddrs", droot);
    dc.sysfs_root = roots[0];
    dc.proc_root = roots[1];
    dc.dev_root = roots[2];
    dc.lib_root = roots[3];
    dc.ifaddrs_file = roots[4];
  }
  int rc = doctor_plan(&dc, environ, &j->net);
  if (rc != 0) {
    base_log(BASE_LOG_WARN, "cannot derive network settings: %s", cohort_strerror(rc));
    j->net = NULL;
    return;
  }
  for (size_t i = 0; i < j->net->nwarnings; i++)
    base_log(j->multinode ? BASE_LOG_WARN : BASE_LOG_INFO, "network: %s", j->net->warnings[i]);
  if (!j->multinode) return;
  char line[1024] = "";
  size_t off = 0;
  for (size_t i = 0; i < j->net->nset && off < sizeof line; i++)
    off += (size_t)snprintf(line + off, sizeof line - off, "%s%s=%s", i ? " " : "",
                            j->net->set[i].name, j->net->set[i].value);
  if (off > 0) fprintf(stderr, "cohort: network settings added: %s\n", line);
  /* Publish ours; compare with node 0's. */
  char mine[DOCTOR_SUMMARY_MAX], key[STORE_KEY_MAX], suffix[32];
  if (doctor_summary_format(&j->net->summary, mine, sizeof mine) != 0) return;
  snprintf(suffix, sizeof suffix, "net/%d", j->plan.my_index);
  rdzv_key(key, sizeof key, j->run_id, j->round, suffix);
  store_set(j->client, key, mine, strlen(mine), base_deadline_in(2000));
  if (j->plan.my_index == 0) return;
  rdzv_key(key, sizeof key, j->run_id, j->round, "net/0");
  const char *keys[1] = {key};
  void *val = NULL;
  size_t len = 0;
  if (store_wait(j->client, keys, 1, base_deadline_in(5000)) != 0 ||
      store_get(j->client, key, &val, &len, base_deadline_in(2000)) != 0)
    return;
  char theirs[DOCTOR_SUMMARY_MAX];
  size_t n = len < sizeof theirs - 1 ? len : sizeof theirs - 1;
  memcpy(theirs, val, n);
  theirs[n] = '\0';
  free(val);
  doctor_summary other;
  char msg[1024], me_name[BASE_HOST_MAX + 16], n0_name[BASE_HOST_MAX + 16];
  snprintf(me_name, sizeof me_name, "node %d (%s)", j->plan.my_index, j->hostname);
  snprintf(n0_name, sizeof n0_name, "node 0 (%s)", j->plan.nodes[0].hostname);
  if (doctor_summary_parse(theirs, &other) == 0 &&
      doctor_summary_compare(n0_name, &other, me_name, &j->net->summary, msg, sizeof msg) == 1)
    fprintf(stderr, "cohort: warning: %s\n", msg);
}

static void plan_single_node(job *j) {
  rdzv_plan_free(&j->plan);
  j->plan.nodes = calloc(1, sizeof *j->plan.nodes);
  j->plan.nnodes = 1;
  j->plan.world_size = j->cfg->nproc;
  j->plan.my_index = 0;
  j->plan.nodes[0].nproc = j->cfg->nproc;
  base_strlcpy(j->plan.master_addr, "127.0.0.1", sizeof j->plan.master_addr);
  if (base_free_port("127.0.0.1", &j->plan.master_port) != 0) j->plan.master_port = 29500;
  base_strlcpy(j->iface, "lo", sizeof j->iface);
  base_join_hostport("127.0.0.1", j->store_port, j->store_env, sizeof j->store_env);
}

/* Decides single- or multi-node, starts (or finds) the store. */
static int setup_store(job *j) {
  const agent_config *cfg = j->cfg;
  const rdzv_opts *ro = &cfg->rdzv;
  int explicit_multi = ro->method != RDZV_AUTO || ro->master != NULL || ro->nnodes_max > 0 ||
                       ro->node_rank >= 0 || ro->rdzv_file != NULL;
  rdzv_target t;
  memset(&t, 0, sizeof t);
  char err[512] = "";
  rdzv_opts opts = *ro;
  opts.job_id = j->run_id[0] ? j->run_id : NULL;
  opts.token = job_token(j);
  opts.deadline_ms = base_deadline_in(cfg->join_timeout_ms);
  int rc = -ENOENT;
  if (explicit_multi || ro->method == RDZV_AUTO) {
    extern char **environ;
    rc = rdzv_discover(&opts, environ, &t, err, sizeof err);
  }
  if (rc != 0 && (explicit_multi || rc != -ENOENT)) {
    /* A scheduler environment that is there but malformed is an error, not
     * a reason to run alone. */
    fprintf(stderr, "cohort: rendezvous: %s\n", err[0] ? err : cohort_strerror(rc));
    return rc;
  }
  if (rc != 0 || (!explicit_multi && t.nnodes_max <= 1)) {
    /* This node alone: the store on loopback, no rendezvous, and a random
     * token unless one was given, so other local users cannot join. */
    if (j->run_id[0] == '\0') {
      unsigned char raw[6];
      if (base_random_bytes(raw, sizeof raw) != 0) return -EIO;
      base_hex(raw, sizeof raw, j->run_id);
    }
    if (j->token[0] == '\0') {
      unsigned char raw[16];
      if (base_random_bytes(raw, sizeof raw) != 0) {
        fprintf(stderr, "cohort: cannot read random bytes for the job token\n");
        return -EIO;
      }
      base_hex(raw, sizeof raw, j->token);
    }
    store_server_opts so = {.bind_host = "127.0.0.1", .port = 0, .token = job_token(j)};
    rc = store_server_start(&so, &j->store);
    if (rc != 0) {
      fprintf(stderr, "cohort: cannot start the rendezvous store: %s\n", cohort_strerror(rc));
      return rc;
    }
    j->store_port = store_server_port(j->store);
    base_strlcpy(j->store_host, "127.0.0.1", sizeof j->store_host);
    j->multinode = 0;
    return 0;
  }
  j->multinode = 1;
  if (t.source[0]) fprintf(stderr, "cohort: rendezvous via %s\n", t.source);
  if (j->run_id[0] == '\0') {
    /* Every node must use the same id: derive it from what they share, the
     * store's address (and Slurm's job and step when there). */
    const char *sj = getenv("SLURM_JOB_ID");
    const char *ss = getenv("SLURM_STEP_ID");
    char basis[BASE_HOST_MAX + 64];
    snprintf(basis, sizeof basis, "%s:%d/%s/%s", t.host, t.port, sj ? sj : "", ss ? ss : "");
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *c = basis; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    snprintf(j->run_id, sizeof j->run_id, "j%016llx", (unsigned long long)h);
  }
  j->ropts = opts;
  j->ropts.job_id = j->run_id;
  /* The job's node counts come from discovery when the flags did not say. */
  agent_config *mcfg = (agent_config *)cfg;
  if (mcfg->rdzv.nnodes_max <= 0) {
    mcfg->rdzv.nnodes_min = t.nnodes_min > 0 ? t.nnodes_min : 1;
    mcfg->rdzv.nnodes_max = t.nnodes_max > 0 ? t.nnodes_max : mcfg->rdzv.nnodes_min;
  }
  if (mcfg->rdzv.node_rank < 0 && t.node_rank >= 0) mcfg->rdzv.node_rank = t.node_rank;
  if (t.host_store) {
    store_server_opts so = {
        .bind_host = strchr(t.host, ':') ? "::" : "0.0.0.0", .port = t.port, .token = job_token(j)};
    rc = store_server_start(&so, &j->store);
    if (rc != 0) {
      fprintf(stderr, "cohort: cannot host the rendezvous store on port %d: %s\n", t.port,
              cohort_strerror(rc));
      return rc;
    }
    j->store_port = store_server_port(j->store);
    base_strlcpy(j->store_host, "127.0.0.1", sizeof j->store_host);
  } else {
    base_strlcpy(j->store_host, t.host, sizeof j->store_host);
    j->store_port = t.port;
  }
  return 0;
}

/* Removes the files in a directory (the error files of an attempt, read by now). */
static void clear_dir(const char *dir) {
  if (dir[0] == '\0') return;
  DIR *d = opendir(dir);
  if (d == NULL) return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
      unlinkat(dirfd(d), de->d_name, 0);
  }
  closedir(d);
}

/* Removes the error-file directory and the files in it (no subdirectories). */
static void remove_tree(const char *dir) {
  clear_dir(dir);
  rmdir(dir);
}

/* ---- entry ---- */

int agent_run(const agent_config *cfg) {
  job j;
  memset(&j, 0, sizeof j);
  j.cfg = cfg;
  j.nworkers = cfg->nproc;
  int exit_code = AGENT_EXIT_INTERNAL;
  rdzv_publisher *pub = NULL;
  j.workers = calloc((size_t)cfg->nproc, sizeof *j.workers);
  if (j.workers == NULL) {
    fprintf(stderr, "cohort: out of memory\n");
    return AGENT_EXIT_INTERNAL;
  }
  for (int i = 0; i < cfg->nproc; i++) {
    j.workers[i].out.fd = j.workers[i].err.fd = j.workers[i].log_fd = -1;
  }
  j.guard.fd = -1;
  gethostname(j.hostname, sizeof j.hostname - 1);
  if (cfg->run_id != NULL) base_strlcpy(j.run_id, cfg->run_id, sizeof j.run_id);

  if (cfg->token != NULL) base_strlcpy(j.token, cfg->token, sizeof j.token);

  /* Orphaned grandchildren come back to us, so nothing outlives the job. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  if (signals_install() != 0) {
    fprintf(stderr, "cohort: cannot set up signal handling: %s\n", strerror(errno));
    goto out;
  }
  int rc = guard_start(&j.guard);
  if (rc != 0) {
    fprintf(stderr, "cohort: cannot start the guard process: %s\n", strerror(-rc));
    goto out;
  }
  if (setup_store(&j) != 0) goto out;
  if (j.multinode) {
    if (j.store != NULL) {
      char perr[512] = "";
      rc = rdzv_publish_start(&j.ropts, NULL, j.store_port, &pub, perr, sizeof perr);
      if (rc != 0) {
        fprintf(stderr, "cohort: cannot announce the store: %s\n",
                perr[0] ? perr : cohort_strerror(rc));
        goto out;
      }
    }
    char err[512] = "";
    rc = store_client_connect(j.store_host, j.store_port, job_token(&j),
                              base_deadline_in(cfg->join_timeout_ms), &j.client, err, sizeof err);
    if (rc != 0) {
      fprintf(stderr, "cohort: cannot reach the rendezvous store: %s\n",
              err[0] ? err : cohort_strerror(rc));
      exit_code = rc == COHORT_EAUTH ? AGENT_EXIT_WORKER_FAILED : AGENT_EXIT_INTERNAL;
      goto out;
    }
  }

  for (j.restart = 0;; j.restart++) {
    j.round = j.restart;
    if (j.multinode) {
      if (multinode_join(&j) != 0) {
        exit_code = AGENT_EXIT_WORKER_FAILED;
        break;
      }
      derive_network(&j);
      guard_set_report(&j.guard, j.store_host, j.store_port, job_token(&j), j.run_id, j.round,
                       j.plan.my_index, j.hostname);
      if (j.round == 0 && pub != NULL) {
        /* Everyone has joined: no more announcements needed. */
        rdzv_publish_stop(pub);
        pub = NULL;
      }
      const char **names = calloc((size_t)j.plan.nnodes, sizeof *names);
      for (int k = 0; names && k < j.plan.nnodes; k++) names[k] = j.plan.nodes[k].hostname;
      watch_opts wo = {.store_host = j.store_host,
                       .store_port = j.store_port,
                       .token = job_token(&j),
                       .job_id = j.run_id,
                       .round = j.round,
                       .my_node = j.plan.my_index,
                       .nnodes = j.plan.nnodes,
                       .hostnames = names,
                       .heartbeat_ms = cfg->heartbeat_ms,
                       .lost_after_ms = cfg->lost_after_ms,
                       .notify_fd = sig_pipe[1]};
      rc = names ? watch_start(&wo, &j.watch) : -ENOMEM;
      if (rc != 0) {
        free(names);
        fprintf(stderr, "cohort: cannot watch the other nodes: %s\n", cohort_strerror(rc));
        break;
      }
      attempt_outcome o = run_attempt(&j);
      clear_dir(j.err_dir);
      if (o == ATTEMPT_OK && wait_all_done(&j) != 0)
        o = j.stop_signal ? ATTEMPT_SIGNALED : ATTEMPT_FAILED;
      if (o == ATTEMPT_OK) {
        exit_code = AGENT_EXIT_OK;
      } else if (o == ATTEMPT_FAILED) {
        if (j.report[0] == '\0') watch_failure(j.watch, j.report, sizeof j.report);
        exit_code = AGENT_EXIT_WORKER_FAILED;
      } else {
        char what[512];
        if (o == ATTEMPT_EXEC_ERROR)
          snprintf(what, sizeof what, "cannot execute '%s': %s", cfg->argv[0],
                   strerror(j.exec_errno));
        else if (o == ATTEMPT_SIGNALED)
          snprintf(what, sizeof what, "cohort run was stopped by SIG%s",
                   sigabbrev_np(j.stop_signal) ? sigabbrev_np(j.stop_signal) : "?");
        else
          snprintf(what, sizeof what, "internal error of the agent");
        publish_other_failure(&j, what);
        exit_code = o == ATTEMPT_SIGNALED     ? 128 + j.stop_signal
                    : o == ATTEMPT_EXEC_ERROR ? ((j.exec_errno == ENOENT || j.exec_errno == ENOTDIR)
                                                     ? AGENT_EXIT_NOT_FOUND
                                                     : AGENT_EXIT_NOT_EXECUTABLE)
                                              : AGENT_EXIT_INTERNAL;
      }
      watch_stop(j.watch);
      j.watch = NULL;
      free(names);
      if (exit_code == AGENT_EXIT_OK) break;
      print_report(&j);
      if (exit_code != AGENT_EXIT_WORKER_FAILED) break;
    } else {
      plan_single_node(&j);
      if (j.restart == 0) derive_network(&j);
      attempt_outcome o = run_attempt(&j);
      clear_dir(j.err_dir);
      if (o == ATTEMPT_OK) {
        exit_code = AGENT_EXIT_OK;
        break;
      }
      if (o == ATTEMPT_EXEC_ERROR) {
        fprintf(stderr, "cohort: cannot execute '%s': %s\n", cfg->argv[0], strerror(j.exec_errno));
        exit_code = (j.exec_errno == ENOENT || j.exec_errno == ENOTDIR) ? AGENT_EXIT_NOT_FOUND
                                                                        : AGENT_EXIT_NOT_EXECUTABLE;
        break;
      }
      if (o == ATTEMPT_SIGNALED) {
        const char *sn = sigabbrev_np(j.stop_signal);
        fprintf(stderr, "cohort: stopped by SIG%s; workers were signalled\n", sn ? sn : "?");
        exit_code = 128 + j.stop_signal;
        break;
      }
      if (o == ATTEMPT_INTERNAL) {
        exit_code = AGENT_EXIT_INTERNAL;
        break;
      }
      exit_code = AGENT_EXIT_WORKER_FAILED;
      print_report(&j);
    }
    if (j.restart >= cfg->max_restarts) {
      if (cfg->max_restarts > 0)
        fprintf(stderr, "cohort: no restarts left (%d used)\n", cfg->max_restarts);
      break;
    }
    fprintf(stderr, "cohort: restarting all workers (restart %d of %d)\n", j.restart + 1,
            cfg->max_restarts);
  }

  if (j.multinode && j.client != NULL) {
    /* Say goodbye; node 0 keeps the store up until everyone has read the end. */
    char key[STORE_KEY_MAX], suffix[32];
    snprintf(suffix, sizeof suffix, "exit/%d", j.plan.my_index);
    rdzv_key(key, sizeof key, j.run_id, j.round, suffix);
    store_set(j.client, key, "1", 1, base_deadline_in(2000));
    if (j.store != NULL) {
      for (int k = 0; k < j.plan.nnodes; k++) {
        snprintf(suffix, sizeof suffix, "exit/%d", k);
        rdzv_key(key, sizeof key, j.run_id, j.round, suffix);
        const char *keys[1] = {key};
        if (store_wait(j.client, keys, 1, base_deadline_in(3000)) != 0) break;
      }
    }
  }

out:
  rdzv_publish_stop(pub);
  store_client_close(j.client);
  rdzv_plan_free(&j.plan);
  doctor_result_destroy(j.net);
  store_server_stop(j.store);
  if (j.err_dir[0] != '\0') remove_tree(j.err_dir);
  sig_err_dir[0] = '\0';
  guard_stop(&j.guard);
  signals_restore();
  free(j.workers);
  return exit_code;
}

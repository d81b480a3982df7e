/* agent.c - the node agent's loop: spawn, supervise, fail together, restart. */
#include "agent/agent.h"
#include "agent/launcher.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/dirs.h"
#include "agent/env.h"
#include "agent/internal.h"
#include "agent/network.h"
#include "agent/report.h"
#include "agent/secure.h"
#include "agent/spawn.h"
#include "agent/signals.h"
#include "agent/stacks.h"
#include "base/base.h"

extern char **environ;

/* How long the agent keeps reading a finished attempt's pipes: a grandchild
 * that left the process group may hold them open forever. */
#define DRAIN_MS 500
/* How long a local error exit waits before it is published as the root
 * cause, in case another node reports the failure it reacted to. */
#define PUBLISH_DELAY_MS 300

void agent_job_error_file(const job *j, int rank, char *out, size_t outlen) {
  out[0] = '\0';
  if (j->err_dir[0] != '\0')
    snprintf(out, outlen, "%s/attempt%d-rank%d.json", j->err_dir, j->restart, rank);
}

/* ---- stopping the workers together ---- */

/* Whether the worker has already ended (not yet reaped): then nothing cohort sends stopped it. */
static int already_ended(const worker *w) {
  siginfo_t si = {0};
  return waitid(P_PID, (id_t)w->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid != 0;
}

static void signal_groups(job *j, int sig, int mark) {
  for (int i = 0; i < j->nworkers; i++) {
    worker *w = &j->workers[i];
    if (w->pid <= 0) continue;
    int ended = mark && w->running && already_ended(w);
    kill(-w->pid, sig);
    if (mark && w->running && !ended && (w->stopped_by == 0 || sig == SIGKILL)) w->stopped_by = sig;
  }
}

/* Starts the grace period: SIGKILL for those still there at kill_at. */
static void start_grace(job *j) {
  if (j->stopping) return;
  j->stopping = 1;
  j->kill_at = base_now_ms() + j->cfg->grace_ms;
}

/* The fail-together path: every group gets SIGTERM, then SIGKILL. */
static void begin_stop(job *j) {
  if (j->stopping) return;
  /* A stopped (hung) worker is worth naming in the report. */
  for (int i = 0; i < j->nworkers; i++)
    if (j->workers[i].running && agent_worker_is_frozen(j->workers[i].pid))
      j->workers[i].was_frozen = 1;
  signal_groups(j, SIGTERM, 1);
  /* Stopped processes act on SIGTERM only once continued. */
  signal_groups(j, SIGCONT, 0);
  start_grace(j);
}

static int running_count(const job *j) {
  int n = 0;
  for (int i = 0; i < j->nworkers; i++) n += j->workers[i].running;
  return n;
}

/* Another node's report is the root cause; a local failure, if any, is a consequence. */
static void adopt_report(job *j, const char *report) {
  if (report != j->report) base_strlcpy(j->report, report, sizeof j->report);
  if (agent_cluster_stopped(j->report)) agent_cluster_ack_stop(&j->cl, j->round);
  j->remote_failed = 1;
  j->first_failed = -1;
  j->publish_at = 0;
}

void agent_job_stop_unneeded(job *j) {
  begin_stop(j);
}

void agent_job_fail(job *j) {
  char winner[WATCH_REPORT_MAX];
  agent_cluster_publish_failure(&j->cl, j->round, j->report, winner, sizeof winner);
  adopt_report(j, j->report); /* its own words: the losses it saw, in order */
  begin_stop(j);
}

/* Reports worker `index`'s failure and tells the other nodes now; if one of
 * them was first, its report counts. */
static void note_local_failure(job *j, int index) {
  agent_report_worker_failure(j, index);
  char winner[WATCH_REPORT_MAX];
  agent_cluster_publish_failure(&j->cl, j->round, j->report, winner, sizeof winner);
  if (strcmp(winner, j->report) != 0) adopt_report(j, winner);
}

/* A worker that failed on its own (not stopped by us) starts the stop. */
static void on_worker_failed(job *j, int index) {
  j->first_failed = index;
  begin_stop(j);
  if (j->cl.multinode && WIFEXITED(j->workers[index].status)) {
    /* A worker that exits with an error is often reacting to a peer on
     * another node that was killed: give that node's agent a moment to
     * publish the signal death as the root cause. */
    j->publish_at = base_now_ms() + PUBLISH_DELAY_MS;
  } else {
    note_local_failure(j, index);
  }
}

/* A worker lost (index >= 0) or another node's report: the job re-forms without
 * stopping the survivors (--on-failure reform), or fails together. */
static void on_loss(job *j, int index) {
  if (index < 0) agent_cluster_note_lost(&j->cl, j->report);
  int rc = agent_reform_on_loss(j, index);
  if (rc < 0)
    agent_job_fail(j);
  else if (rc == 0 && index >= 0)
    on_worker_failed(j, index);
  else if (rc == 0)
    adopt_report(j, j->report);
  if (rc == 0 && index < 0 && agent_hang_is_report(j->report)) agent_report_gather_hang(j);
  if (rc == 0 && index < 0) begin_stop(j);
}

static void reap(job *j) {
  int st;
  pid_t pid;
  while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
    for (int i = 0; i < j->nworkers; i++) {
      worker *w = &j->workers[i];
      if (w->pid != pid || !w->running) continue;
      w->running = 0;
      w->status = st;
      /* The worker's own children go with it (before a re-form starts another in its place). */
      kill(-w->pid, SIGKILL);
      int lost = !agent_worker_succeeded(w) && j->first_failed < 0 && !j->remote_failed &&
                 w->stopped_by == 0 && j->stop_signal == 0;
      /* A finisher, no loss: said for the peers whose connections to it close (on_broken). */
      if (agent_worker_succeeded(w) && j->rf.slot != NULL && !j->stopping)
        agent_cluster_note_finished(&j->cl, j->round);
      if (lost && j->cl.ahead == 1) { /* started ahead, no member yet: this node fails alone */
        j->first_failed = i;
        agent_report_worker_failure(j, i);
        begin_stop(j);
      } else if (lost) {
        on_loss(j, i);
      }
    }
  }
}

/* ---- hangs (--hang-timeout) and stack dumps ---- */

static hang_node here(const job *j) {
  return (hang_node){.node = j->cl.plan.my_index, .host = j->cl.hostname};
}

/* SIGQUIT: every rank's stack on the console and in the log directory; the job goes on. */
static void dump_stacks(job *j) {
  if (j->hang.prog == NULL) {
    base_log(BASE_LOG_WARN,
             "SIGQUIT: no stack dumps with --straggler-factor 0 and no --hang-timeout (no hooks)");
    return;
  }
  char dir[4096];
  hang_node at = here(j);
  agent_hang_dump(&j->hang, j->workers, &at,
                  agent_dirs_stacks(j->cfg, j->restart, dir, sizeof dir));
}

/* Local rank i made no progress for the timeout: the job fails together as hung. */
static void on_hung(job *j, int i) {
  const worker *w = &j->workers[i];
  snprintf(j->report, sizeof j->report,
           "%srank %d (node %d, %s, pid %d) made no progress for %.1f s (its stacks could not be "
           "taken)",
           HANG_REPORT_PREFIX, w->rank, j->cl.plan.my_index, j->cl.hostname, (int)w->pid,
           (double)j->cfg->hang_timeout_ms / 1000);
  j->hung = 1;
  j->hung_rank = w->rank;
  char winner[WATCH_REPORT_MAX];
  agent_cluster_publish_failure(&j->cl, j->round, j->report, winner, sizeof winner);
  if (strcmp(winner, j->report) != 0) adopt_report(j, winner);
  if (agent_hang_is_report(j->report)) agent_report_gather_hang(j);
  begin_stop(j);
}

/* The loop's hang check; returns the poll timeout it needs (-1: none). Paused during a
 * re-form, which --reform-timeout bounds: a rank re-forming is not hung. */
static int hang_tick(job *j, int64_t now) {
  if (j->hang.prog == NULL || j->stopping || j->rf.forming) return -1;
  int next = -1;
  int i = agent_hang_check(&j->hang, j->workers, now, &next);
  if (i >= 0) on_hung(j, i);
  return next;
}

/* Another node failed or was lost: stop ours, blaming it. */
static void on_remote_failure(job *j) {
  int can_adopt = j->first_failed < 0 || j->publish_at != 0;
  if (!can_adopt || j->remote_failed || j->hung) return;
  if (!agent_cluster_failure(&j->cl, j->report, sizeof j->report)) return;
  on_loss(j, -1);
}

/* How long a rank's word that a peer's connection closed waits for the word that the peer
 * finished or went (its agent's, or the store's for an agent gone) before it counts as a loss. */
#define FINISHED_WAIT_MS 300

/* Whether a worker of the round finished (exited 0), here or on another node, or a node went
 * (agent_cluster_left), as the store says within FINISHED_WAIT_MS. */
static int peer_left(job *j) {
  for (int i = 0; i < j->nworkers; i++) {
    const worker *w = &j->workers[i];
    if (!w->running && w->pid > 0 && agent_worker_succeeded(w)) return AGENT_LEFT_FINISHED;
  }
  return agent_cluster_left(&j->cl, j->round, FINISHED_WAIT_MS);
}

/*
 * Worker rank's collectives found a peer gone before any agent said so (a
 * node killed whole: its connections close at once, its heartbeat stops
 * only later). The job re-forms now; the planner still waits for the lost
 * node until the heartbeat timeout unless a replacement takes its place.
 * A peer that finished (exited 0, with no goodbye) is no loss: the job is
 * ending, or, when the rank asks for a next membership (asks), the job
 * fails together naming it (a rank that ended well is not replaced). Its
 * word waits FINISHED_WAIT_MS for the finisher's, which also gives a lost
 * worker's own agent the time to publish the loss in its words; a node
 * killed whole ends the wait at once (its agent's will: the store says it
 * went, and no agent of its is there to speak).
 */
static void on_broken(job *j, int rank, int asks) {
  if (j->stopping || j->remote_failed || j->first_failed >= 0) return;
  int left = peer_left(j);
  if (left == AGENT_LEFT_FINISHED) {
    if (!asks) {
      base_log(BASE_LOG_INFO, "rank %d: a peer's connection closed: it finished (exit 0), no loss",
               rank);
      return;
    }
    snprintf(j->report, sizeof j->report,
             "node %d (%s): rank %d lost a peer that finished (exited 0 without a goodbye) while "
             "it still needed it: a rank that ended well is not replaced",
             j->cl.plan.my_index, j->cl.hostname, rank);
    agent_job_fail(j);
    return;
  }
  if (!j->cl.multinode) return;
  snprintf(
      j->report, sizeof j->report, "node %d (%s): rank %d lost a peer (its connection closed)%s",
      j->cl.plan.my_index, j->cl.hostname, rank,
      left == AGENT_LEFT_GONE ? ", and an agent of the job left the store without finishing" : "");
  char winner[WATCH_REPORT_MAX];
  agent_cluster_publish_failure(&j->cl, j->round, j->report, winner, sizeof winner);
  base_strlcpy(j->report, winner, sizeof j->report);
  on_loss(j, -1);
}

/* SIGINT, SIGTERM, SIGHUP: forward it (a worker may want to checkpoint on
 * SIGTERM); a second SIGINT kills. */
static void on_stop_signal(job *j, int sig) {
  if (sig == SIGINT) j->sigint_count++;
  if (j->stop_signal != 0 && sig == SIGINT && j->sigint_count >= 2) {
    base_log(BASE_LOG_WARN, "second SIGINT: killing the workers");
    signal_groups(j, SIGKILL, 1);
    j->killed = 1;
    return;
  }
  if (j->stop_signal == 0) j->stop_signal = sig;
  signal_groups(j, sig, 1);
  start_grace(j);
}

static void handle_event(job *j, int ev) {
  if (ev == SIGCHLD)
    reap(j);
  else if (ev == SIGQUIT)
    dump_stacks(j);
  else if (ev == WATCH_NOTIFY_BYTE)
    on_remote_failure(j);
  else if (ev == SIGUSR1 || ev == SIGUSR2)
    signal_groups(j, ev, 0);
  else
    on_stop_signal(j, ev);
}

/* The error-file directory, made once workers are about to run; the guard
 * removes it if the agent is killed, the signal handler if a signal ends
 * the agent. Without it the workers get no TORCHELASTIC_ERROR_FILE. */
static void make_err_dir(job *j) {
  if (j->err_dir[0] != '\0') return;
  const char *tmpdir = getenv("TMPDIR");
  tmpdir = tmpdir && tmpdir[0] && strlen(tmpdir) < 64 ? tmpdir : "/tmp";
  /* Those of agents killed with their guard (kill -9 of both): their locks are free. */
  int swept = agent_dirs_sweep(tmpdir, "cohort-errors-");
  if (swept > 0)
    base_log(BASE_LOG_INFO, "removed %d dead agents' cohort-errors-* in %s", swept, tmpdir);
  snprintf(j->err_dir, sizeof j->err_dir, "%s/cohort-errors-XXXXXX", tmpdir);
  j->err_lock = agent_dirs_make_locked(j->err_dir);
  if (j->err_lock < 0) {
    j->err_dir[0] = '\0';
    return;
  }
  agent_guard_set_dir(&j->guard, j->err_dir);
  agent_signals_set_dir(j->err_dir);
}

/* ---- one attempt: spawn everyone, supervise until all are gone ---- */

static void attempt_reset(job *j) {
  j->stopping = 0;
  j->killed = 0;
  j->first_failed = -1;
  j->remote_failed = 0;
  j->hung = 0;
  j->publish_at = 0;
  j->report[0] = '\0';
  j->exec_errno = 0;
  j->rf.unneeded = 0;
}

/* The sooner of two poll timeouts (-1: none). */
static int sooner(int a, int b) {
  return a < 0 || (b >= 0 && b < a) ? b : a;
}

/* The timers of the loop, each with its own period: SIGKILL after the grace,
 * a held-back failure published, the status snapshot, `cohort stacks`, the
 * straggler comparison, the hang check, the metrics file, the re-form's
 * deadline. Returns the poll
 * timeout until the next one (-1 none). */
static int run_timers(job *j) {
  int64_t now = base_now_ms();
  if (j->stopping && !j->killed && now >= j->kill_at) {
    signal_groups(j, SIGKILL, 1);
    j->killed = 1;
  }
  if (j->publish_at != 0 && now >= j->publish_at) {
    j->publish_at = 0;
    if (j->first_failed >= 0) note_local_failure(j, j->first_failed);
  }
  /* Workers started ahead (no plan yet): this node is no member to show or compare. */
  int member = j->cl.ahead != 1;
  int timeout = member ? agent_snapshot_tick(j, now) : -1;
  if (member) timeout = sooner(timeout, agent_remote_stacks_tick(j, now));
  if (member) timeout = sooner(timeout, agent_straggle_tick(j, now));
  timeout = sooner(timeout, hang_tick(j, now));
  timeout = sooner(timeout, agent_metrics_tick(&j->metrics, j, now));
  timeout = sooner(timeout, agent_reform_tick(j, now));
  if (j->stopping && !j->killed) timeout = sooner(timeout, base_deadline_left(j->kill_at));
  if (j->publish_at != 0) timeout = sooner(timeout, base_deadline_left(j->publish_at));
  return timeout;
}

/* What the loop polls: the self-pipe first, then every open output stream,
 * then the metrics server's descriptors, then the control channels. */
typedef struct poll_set {
  struct pollfd pfd[1 + 2 * AGENT_MAX_NPROC + 1 + METRICS_MAX_CLIENTS + AGENT_MAX_NPROC];
  worker_stream *stream[1 + 2 * AGENT_MAX_NPROC];
  worker *owner[1 + 2 * AGENT_MAX_NPROC];
  nfds_t streams_end; /* the self-pipe and the streams: pfd[0, streams_end) */
  nfds_t control_at;  /* the control channels: pfd[control_at, n) */
  nfds_t n;
} poll_set;

static void poll_set_fill(job *j, poll_set *ps) {
  ps->n = 0;
  ps->pfd[ps->n++] = (struct pollfd){.fd = agent_signals_fd(), .events = POLLIN};
  for (int i = 0; i < j->nworkers; i++) {
    worker *w = &j->workers[i];
    worker_stream *ss[2] = {&w->out, &w->err};
    for (int k = 0; k < 2; k++) {
      if (ss[k]->fd < 0) continue;
      ps->pfd[ps->n] = (struct pollfd){.fd = ss[k]->fd, .events = POLLIN};
      ps->stream[ps->n] = ss[k];
      ps->owner[ps->n] = w;
      ps->n++;
    }
  }
  ps->streams_end = ps->n;
  ps->n += (nfds_t)agent_metrics_pollfds(&j->metrics, ps->pfd + ps->n);
  ps->control_at = ps->n;
  ps->n += (nfds_t)agent_reform_pollfds(j, ps->pfd + ps->n);
}

/* Relays the output ready and handles the events; -1 when poll failed. */
static int poll_once(job *j, poll_set *ps, int timeout) {
  int ready = poll(ps->pfd, ps->n, timeout);
  if (ready < 0 && errno != EINTR) {
    base_log(BASE_LOG_ERROR, "poll: %s", strerror(errno));
    return -1;
  }
  if (ready <= 0) return 0;
  for (nfds_t k = 1; k < ps->streams_end; k++)
    if (ps->pfd[k].revents != 0) agent_worker_stream_read(ps->owner[k], ps->stream[k]);
  agent_metrics_serve(&j->metrics, ps->pfd + ps->streams_end,
                      (int)(ps->control_at - ps->streams_end), j);
  agent_reform_serve(j, ps->pfd + ps->control_at, (int)(ps->n - ps->control_at));
  int asks = 0, broken = agent_reform_take_broken(j, &asks);
  if (broken >= 0) on_broken(j, broken, asks);
  if (agent_reform_ahead_ready(j) && !j->stopping && agent_reform_admit(j) != 0) {
    adopt_report(j, j->report);
    begin_stop(j);
  }
  if (ps->pfd[0].revents & POLLIN) {
    unsigned char evs[64];
    ssize_t got = agent_signals_read(evs, sizeof evs);
    for (ssize_t k = 0; k < got; k++) handle_event(j, evs[k]);
  }
  return 0;
}

/* Supervises until every worker is reaped and its output read (or the
 * drain time is up). Returns ATTEMPT_OK or ATTEMPT_INTERNAL. */
static attempt_outcome supervise(job *j) {
  attempt_outcome outcome = ATTEMPT_OK;
  int64_t drain_until = 0;
  poll_set *ps = malloc(sizeof *ps);
  if (ps == NULL) return ATTEMPT_INTERNAL;
  for (;;) {
    int timeout = run_timers(j);
    poll_set_fill(j, ps);
    if (running_count(j) == 0 && j->publish_at == 0) {
      if (ps->streams_end == 1) break;
      if (drain_until == 0) drain_until = base_now_ms() + DRAIN_MS;
      if (base_now_ms() >= drain_until) break;
      timeout = base_deadline_left(drain_until);
    }
    if (poll_once(j, ps, timeout) != 0) {
      outcome = ATTEMPT_INTERNAL;
      begin_stop(j);
      base_sleep_ms(10);
    }
  }
  free(ps);
  return outcome;
}

/* Every group killed and forgotten, leftovers removed; then the verdict. */
static attempt_outcome attempt_finish(job *j, attempt_outcome outcome) {
  agent_reform_close(j);
  j->cl.ahead = 0; /* a later round joins as any node does */
  for (int i = 0; i < j->nworkers; i++) {
    worker *w = &j->workers[i];
    agent_worker_close_streams(w);
    if (w->pid > 0) {
      kill(-w->pid, SIGKILL);
      agent_guard_remove(&j->guard, w->pid);
    }
  }
  /* What left the groups (setsid, double forks, nohup) ends here too. */
  int left = agent_sweep_kill(&j->sweep, "/proc", getpid(), j->guard.pid);
  if (left > 0) base_log(BASE_LOG_INFO, "killed %d process(es) the workers left behind", left);
  agent_dirs_clear_shm(j->cl.run_id);
  agent_signals_set_workers(0);
  if (outcome != ATTEMPT_OK) return outcome;
  if (j->rf.unneeded && !j->remote_failed && j->stop_signal == 0) return ATTEMPT_OK;
  if (j->hung) return ATTEMPT_HUNG;
  if (j->remote_failed) return ATTEMPT_FAILED;
  if (j->stop_signal != 0) return ATTEMPT_SIGNALED;
  if (j->first_failed >= 0) return ATTEMPT_FAILED;
  for (int i = 0; i < j->nworkers; i++) {
    if (!agent_worker_succeeded(&j->workers[i])) {
      j->first_failed = i;
      agent_report_worker_failure(j, i);
      return ATTEMPT_FAILED;
    }
  }
  return ATTEMPT_OK;
}

static attempt_outcome run_attempt(job *j) {
  attempt_reset(j);
  make_err_dir(j);
  /* The progress files, and the Python hooks' directory with them: cohort_reform must be on a
   * re-forming job's path even when neither hangs nor stragglers are watched. */
  int beats = j->cfg->hang_timeout_ms > 0 || j->cfg->straggler_factor > 0 || j->cfg->reform;
  if (beats && j->hang.prog == NULL && j->err_dir[0] != '\0' &&
      agent_hang_setup(&j->hang, j->cfg->hang_timeout_ms, j->cfg->hang_start_ms, j->err_dir,
                       j->nworkers) != 0)
    base_log(BASE_LOG_WARN, "cannot set up the progress files: no hang or straggler detection");
  attempt_outcome spawned = agent_spawn_all(j);
  j->cl.newcomer = 0; /* a restart starts everyone afresh */
  if (spawned != ATTEMPT_OK) begin_stop(j);
  attempt_outcome supervised = supervise(j);
  return attempt_finish(j, spawned != ATTEMPT_OK ? spawned : supervised);
}

/* ---- rounds: join, attempt, agree on the end ---- */

/* The one mapping from how a round ended to `cohort run`'s exit status. */
static int exit_status(const job *j, attempt_outcome o) {
  switch (o) {
  case ATTEMPT_OK:
    return AGENT_EXIT_OK;
  case ATTEMPT_FAILED:
    return AGENT_EXIT_WORKER_FAILED;
  case ATTEMPT_EXEC_ERROR:
    return j->exec_errno == ENOENT || j->exec_errno == ENOTDIR ? AGENT_EXIT_NOT_FOUND
                                                               : AGENT_EXIT_NOT_EXECUTABLE;
  case ATTEMPT_SIGNALED:
    return 128 + j->stop_signal;
  case ATTEMPT_STOPPED:
    return AGENT_EXIT_STOPPED;
  case ATTEMPT_HUNG:
    return AGENT_EXIT_HUNG;
  case ATTEMPT_INTERNAL:
    break;
  }
  return AGENT_EXIT_INTERNAL;
}

/*
 * The one mapping from an error that ended the agent before its workers ran
 * to the exit status: in the rendezvous (meeting: finding the store, the
 * join), a wrong token, a store that never answered or nodes that never all
 * came are AGENT_EXIT_RDZV; a required token missing is a usage error.
 */
static int exit_of_error(int rc, int meeting) {
  if (rc == AGENT_TOKEN_REFUSED) return AGENT_EXIT_USAGE;
  int unreached = rc == COHORT_EAUTH || rc == -ETIMEDOUT || rc == -ECONNREFUSED ||
                  rc == -EHOSTUNREACH || rc == -ENETUNREACH || rc == -ECONNRESET;
  return rc != -ENOMEM && (meeting || unreached) ? AGENT_EXIT_RDZV : AGENT_EXIT_INTERNAL;
}

/* Joins the round and prepares what its workers need. */
int agent_job_begin_round(job *j) {
  cluster *c = &j->cl;
  int rc = agent_cluster_join(c, j->cfg, &j->round);
  if (rc == -EINPROGRESS)
    return AGENT_EXIT_OK; /* workers started ahead, the join later (reform.c) */
  if (rc != 0) return exit_of_error(rc, 1);
  /* One node's settings do not change between rounds; several nodes'
   * master may. */
  if (j->cfg->net_auto && (c->multinode || j->round == 0)) {
    doctor_result_destroy(j->net);
    j->net =
        agent_network_derive(c->multinode, c->multinode ? c->plan.master_addr : NULL, c->iface);
    agent_cluster_compare_network(c, j->round, j->net);
  }
  /* With etcd the guard cannot publish (it holds no credentials): the lease says it. */
  if (c->multinode && !c->etcd)
    agent_guard_set_report(&j->guard, c->store_host, c->store_port, agent_cluster_token(c),
                           c->run_id, j->round, c->plan.my_index, c->hostname);
  if (agent_cluster_watch(c, j->cfg, j->round, agent_signals_notify_fd()) != 0)
    return AGENT_EXIT_INTERNAL;
  return AGENT_EXIT_OK;
}

/* run_round's answer when a node joined: the job re-forms without using a restart. */
#define ROUND_REFORM (-1)

/* Whether the round ended because a late node asked the job to re-form with it. */
static int grown(const job *j, attempt_outcome o) {
  return o == ATTEMPT_FAILED && strncmp(j->report, RDZV_GROW_PREFIX, strlen(RDZV_GROW_PREFIX)) == 0;
}

/* One round; returns the exit status it would end the job with, or ROUND_REFORM. */
static int run_round(job *j) {
  int status = agent_job_begin_round(j);
  if (status != AGENT_EXIT_OK) return status;
  attempt_outcome o = run_attempt(j);
  agent_dirs_clear(j->err_dir, "", NULL); /* the error files are read by now */
  if (o == ATTEMPT_OK &&
      agent_cluster_wait_done(&j->cl, j->round, j->report, sizeof j->report, &j->stop_signal) != 0)
    o = j->stop_signal ? ATTEMPT_SIGNALED : ATTEMPT_FAILED;
  if (o == ATTEMPT_FAILED && j->report[0] == '\0')
    agent_cluster_failure(&j->cl, j->report, sizeof j->report);
  if (o == ATTEMPT_FAILED && agent_cluster_stopped(j->report)) o = ATTEMPT_STOPPED;
  if (o == ATTEMPT_FAILED && agent_hang_is_report(j->report))
    o = ATTEMPT_HUNG; /* another node found the job hung */
  if (o != ATTEMPT_OK && o != ATTEMPT_FAILED && o != ATTEMPT_STOPPED && o != ATTEMPT_HUNG) {
    /* Not a worker's failure: the other nodes stop too, and whichever
     * report came first counts there. */
    char winner[WATCH_REPORT_MAX];
    agent_report_outcome(j, o);
    agent_cluster_publish_failure(&j->cl, j->round, j->report, winner, sizeof winner);
    /* Here too (all nodes stopped at once: a launcher's stop), so that
     * every node prints the same cause. */
    base_strlcpy(j->report, winner, sizeof j->report);
  }
  agent_cluster_unwatch(&j->cl);
  if (grown(j, o)) {
    fprintf(stderr, "cohort: %s: re-forming the job (round %d)\n",
            j->report + strlen(RDZV_GROW_PREFIX), j->round + 1);
    return ROUND_REFORM;
  }
  if (o != ATTEMPT_OK) agent_report_print(j, o);
  return exit_status(j, o);
}

/* Rounds until success, an end that is not a worker's failure, or no restarts left. */
static int run_rounds(job *j) {
  const agent_config *cfg = j->cfg;
  for (j->restart = 0, j->round = 0;; j->round++) {
    int status = run_round(j);
    if (status == ROUND_REFORM) continue;
    /* A hung job restarts as a failed one does. */
    if (status != AGENT_EXIT_WORKER_FAILED && status != AGENT_EXIT_HUNG) return status;
    if (j->restart >= cfg->max_restarts) {
      if (cfg->max_restarts > 0)
        fprintf(stderr, "cohort: no restarts left (%d used)\n", cfg->max_restarts);
      return status;
    }
    j->restart++;
    fprintf(stderr, "cohort: restarting all workers (restart %d of %d)\n", j->restart,
            cfg->max_restarts);
  }
}

/* ---- entry ---- */

/* job's configuration: the given one, with the worker count placement found. */
static int job_init(job *j, const agent_config *cfg, const placement *place) {
  memset(j, 0, sizeof *j);
  j->own_cfg = *cfg;
  j->own_cfg.nproc = place->nproc;
  j->cfg = &j->own_cfg;
  j->place = *place;
  j->nworkers = place->nproc;
  j->guard.fd = -1;
  j->dup_fd[0] = j->dup_fd[1] = -1;
  j->hung_rank = -1;
  j->err_lock = -1;
  j->cl.ahead_ok = cfg->reform;
  agent_metrics_init(&j->metrics);
  j->workers = calloc((size_t)j->nworkers, sizeof *j->workers);
  if (j->workers == NULL) return -ENOMEM;
  for (int i = 0; i < j->nworkers; i++)
    j->workers[i].out.fd = j->workers[i].err.fd = j->workers[i].log_fd = -1;
  return agent_reform_init(j);
}

static void job_free(job *j) {
  agent_reform_free(j);
  agent_cluster_close(&j->cl);
  doctor_result_destroy(j->net);
  agent_hang_free(&j->hang);
  agent_straggle_free(&j->strag);
  agent_metrics_close(&j->metrics);
  agent_dirs_remove(j->err_dir);
  if (j->err_lock >= 0) close(j->err_lock);
  agent_guard_stop(&j->guard);
  agent_sweep_close(&j->sweep);
  agent_signals_restore();
  agent_place_free(&j->place);
  for (int k = 0; k < 2; k++)
    if (j->dup_fd[k] >= 0) close(j->dup_fd[k]);
  free(j->workers);
}

int agent_run(const agent_config *cfg) {
  job j;
  placement place;
  char err[256] = "";
  if (agent_place_resolve(cfg, environ, stderr, &place, err, sizeof err) != 0) {
    fprintf(stderr, "cohort run: %s\n", err);
    return AGENT_EXIT_USAGE;
  }
  if (job_init(&j, cfg, &place) != 0) {
    fprintf(stderr, "cohort: out of memory\n");
    agent_place_free(&place);
    free(j.workers);
    return AGENT_EXIT_INTERNAL;
  }
  int status = AGENT_EXIT_INTERNAL;
  /* Orphaned grandchildren come back to us, so nothing outlives the job. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  int rc = agent_signals_install();
  if (rc != 0) {
    fprintf(stderr, "cohort: cannot set up signal handling: %s\n", strerror(-rc));
    goto out;
  }
  if (cfg->launcher_stdin && agent_launcher_watch_start(0) != 0) {
    fprintf(stderr, "cohort: cannot watch the launcher's connection\n");
    goto out;
  }
  rc = agent_guard_start(&j.guard);
  if (rc != 0) {
    fprintf(stderr, "cohort: cannot start the guard process: %s\n", strerror(-rc));
    goto out;
  }
  rc = agent_metrics_open(&j.metrics, cfg->metrics_port, cfg->metrics_file);
  if (rc != 0) {
    fprintf(stderr, "cohort: cannot serve metrics on port %d: %s\n", cfg->metrics_port,
            strerror(-rc));
    status = AGENT_EXIT_USAGE;
    goto out;
  }
  char cg[64];
  snprintf(cg, sizeof cg, "cohort-%d", (int)getpid());
  if (agent_sweep_open(&j.sweep, "/proc", cg) == 0)
    agent_guard_set_cgroup(&j.guard, j.sweep.dir, j.sweep.v2);
  rc = agent_cluster_open(&j.cl, cfg);
  status = rc != 0 ? exit_of_error(rc, 0) : AGENT_EXIT_OK;
  if (status != AGENT_EXIT_OK) goto out;
  status = run_rounds(&j);
  agent_metrics_flush(&j.metrics, &j);
  agent_cluster_leave(&j.cl, j.round);
out:
  job_free(&j);
  return status;
}

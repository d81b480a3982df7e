/* reform.c - --on-failure reform: re-forming the job around its survivors. */
#include "agent/reform.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/control.h"
#include "agent/internal.h"
#include "agent/relay.h"
#include "agent/report.h"
#include "agent/spawn.h"
#include "base/base.h"

int agent_reform_init(job *j) {
  if (!j->cfg->reform) return 0;
  j->rf.slot = calloc((size_t)j->nworkers, sizeof *j->rf.slot);
  if (j->rf.slot == NULL) return -ENOMEM;
  for (int i = 0; i < j->nworkers; i++) {
    j->rf.slot[i].fd = -1;
    j->rf.slot[i].step = -1;
  }
  j->rf.step_before = -1;
  j->rf.broken_rank = -1;
  return 0;
}

void agent_reform_free(job *j) {
  agent_reform_close(j);
  free(j->rf.slot);
  j->rf.slot = NULL;
}

static void slot_close(reform_slot *s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
}

int agent_reform_channel(job *j, int i, int *child) {
  *child = -1;
  if (j->rf.slot == NULL) return 0;
  reform_slot *s = &j->rf.slot[i];
  slot_close(s);
  int fds[2];
  int rc = agent_control_open(fds);
  if (rc != 0) return rc;
  s->fd = fds[0];
  s->hello = s->formed = s->warned = s->heir = 0;
  s->step = -1;
  *child = fds[1];
  return 0;
}

void agent_reform_close(job *j) {
  for (int i = 0; j->rf.slot != NULL && i < j->nworkers; i++) slot_close(&j->rf.slot[i]);
  j->rf.forming = 0;
}

int agent_reform_pollfds(const job *j, struct pollfd *pfd) {
  int n = 0;
  for (int i = 0; j->rf.slot != NULL && i < j->nworkers; i++)
    if (j->rf.slot[i].fd >= 0) pfd[n++] = (struct pollfd){.fd = j->rf.slot[i].fd, .events = POLLIN};
  return n;
}

/* Whether slot s's worker takes part in re-forms: it said hello, or its hello is still to come
 * (it is starting) while its channel is open and its program is known to speak: it is an heir,
 * or a worker of the job said hello. */
static int takes_part(const reform *rf, const reform_slot *s) {
  return s->hello || (s->fd >= 0 && (s->heir || rf->spoke));
}

/* ---- the re-form's end: every survivor said `formed` ---- */

static int64_t max_step(const job *j, int formed_only) {
  int64_t best = -1;
  for (int i = 0; i < j->nworkers; i++) {
    const reform_slot *s = &j->rf.slot[i];
    if ((!formed_only || s->formed) && s->step > best) best = s->step;
  }
  return best;
}

static void formed_all(job *j) {
  reform *rf = &j->rf;
  reform_record *r = &rf->last;
  r->duration_ms = base_now_ms() - r->detected_ms;
  int64_t after = max_step(j, 1);
  r->steps_lost = rf->step_before >= 0 && after >= 0
                      ? (rf->step_before > after ? rf->step_before - after : 0)
                      : -1;
  rf->forming = 0;
  /* The hang check paused while the ranks re-formed: their silence counts from now. */
  agent_hang_resume(&j->hang, base_now_ms());
  if (rf->admitting) { /* a late node's workers, started ahead: no re-form of this node's */
    rf->admitting = 0;
    fprintf(stderr, "cohort: the workers started ahead joined in %.2f s: round %d, world %d\n",
            (double)r->duration_ms / 1000, j->round, j->cl.plan.world_size);
    return;
  }
  rf->count++;
  char lost[32] = "?"; /* unknown, as in cohort status: no worker here said its step */
  if (r->steps_lost >= 0) snprintf(lost, sizeof lost, "%lld", (long long)r->steps_lost);
  fprintf(stderr,
          "cohort: re-formed in %.2f s: round %d, nodes %d -> %d, world %d -> %d, "
          "steps lost %s\n",
          (double)r->duration_ms / 1000, r->round, r->nodes_before, r->nodes_after, r->world_before,
          r->world_after, lost);
}

static void check_formed(job *j) {
  if (!j->rf.forming) return;
  for (int i = 0; i < j->nworkers; i++)
    if (j->workers[i].running && takes_part(&j->rf, &j->rf.slot[i]) && !j->rf.slot[i].formed)
      return;
  formed_all(j);
}

/* ---- messages from the workers ---- */

/* Once every worker said hello: whether they all can be started ahead, for late nodes. */
static void note_ahead(job *j) {
  int yes = 1;
  for (int i = 0; i < j->nworkers; i++) {
    if (!j->rf.slot[i].hello) return;
    yes &= j->rf.slot[i].await_form;
  }
  agent_cluster_note_ahead(&j->cl, yes);
}

static void on_message(job *j, int i, const char *buf, size_t len) {
  reform_slot *s = &j->rf.slot[i];
  control_msg m;
  if (agent_control_parse(buf, len, &m) != 0 || m.verb == CONTROL_OTHER) {
    if (!s->warned)
      base_log(BASE_LOG_WARN, "rank %d: ignoring %s on COHORT_CONTROL_FD", j->workers[i].rank,
               m.verb == CONTROL_OTHER ? "an unknown message" : "bad bytes");
    s->warned = 1;
    return;
  }
  if (m.verb == CONTROL_HELLO) {
    s->hello = j->rf.spoke = 1;
    s->await_form = m.await_form == 1;
    note_ahead(j);
  }
  if (m.step >= 0) s->step = m.step;
  if (m.verb == CONTROL_READY && m.step > j->rf.step_before) j->rf.step_before = m.step;
  /* `broken`, or a `ready` no `reshape` asked for: the worker's own collectives found a peer
   * gone (libcohort re-forms at once, the PyTorch module says `broken`). */
  int unasked = m.verb == CONTROL_BROKEN || (m.verb == CONTROL_READY && !j->rf.forming);
  if (unasked && m.epoch == j->round && j->rf.broken_rank < 0) {
    j->rf.broken_rank = j->workers[i].rank;
    j->rf.broken_asks = m.verb == CONTROL_READY;
  }
  if (m.verb == CONTROL_FORMED && j->rf.forming) {
    s->formed = 1;
    check_formed(j);
  }
}

static void read_slot(job *j, int i) {
  reform_slot *s = &j->rf.slot[i];
  for (int k = 0; k < 64 && s->fd >= 0; k++) {
    char buf[CONTROL_MSG_MAX + 2];
    ssize_t n = recv(s->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) { /* the worker closed its end (it ended, or dropped the channel) */
      slot_close(s);
      return;
    }
    on_message(j, i, buf, (size_t)n);
  }
}

void agent_reform_serve(job *j, const struct pollfd *pfd, int n) {
  for (int k = 0; k < n; k++) {
    if (pfd[k].revents == 0) continue;
    for (int i = 0; i < j->nworkers; i++)
      if (j->rf.slot[i].fd == pfd[k].fd) read_slot(j, i);
  }
}

/* ---- a loss ---- */

/* Records a loss for the report (the first REFORM_LOSSES_MAX, then a count). */
static void note_loss(job *j, const char *text) {
  reform *rf = &j->rf;
  if (rf->nlosses < REFORM_LOSSES_MAX) {
    char *at = rf->losses[rf->nlosses];
    base_strlcpy(at, text, sizeof rf->losses[0]);
    at[strcspn(at, "\n")] = '\0';
  }
  rf->nlosses++;
}

void agent_reform_print_losses(const job *j, FILE *f) {
  const reform *rf = &j->rf;
  if (rf->slot == NULL || rf->nlosses < 2 || strstr(j->report, "losses in order:") != NULL) return;
  fprintf(f, "cohort: losses in order:");
  for (int k = 0; k < rf->nlosses && k < REFORM_LOSSES_MAX; k++)
    fprintf(f, "%s %d) %s", k ? ";" : "", k + 1, rf->losses[k]);
  if (rf->nlosses > REFORM_LOSSES_MAX) fprintf(f, " and %d more", rf->nlosses - REFORM_LOSSES_MAX);
  fprintf(f, "\n");
}

/* report plus "; losses in order: 1) ...; 2) ..." into j->report. */
static void report_with_losses(job *j, const char *why) {
  char *out = j->report;
  size_t cap = sizeof j->report;
  size_t off = (size_t)snprintf(out, cap, "%s; losses in order:", why);
  for (int k = 0; k < j->rf.nlosses && k < REFORM_LOSSES_MAX && off < cap; k++)
    off +=
        (size_t)snprintf(out + off, cap - off, "%s %d) %s", k ? ";" : "", k + 1, j->rf.losses[k]);
  if (j->rf.nlosses > REFORM_LOSSES_MAX && off < cap)
    snprintf(out + off, cap - off, " and %d more", j->rf.nlosses - REFORM_LOSSES_MAX);
}

/* How many members of the last round the re-form round expects back: all of them for a grow,
 * else all but one, whether the report names the lost node or not (a worker's lost peer: the
 * node it was on, or its replacement, may be the one missing). */
static int expected_members(const job *j, const char *report) {
  int n = j->cl.multinode ? j->cl.plan.nnodes : 1;
  return strncmp(report, RDZV_GROW_PREFIX, strlen(RDZV_GROW_PREFIX)) == 0 ? n : n - 1;
}

/* How many nodes it expects: every member but a lost one it knows (a worker's lost peer names
 * none: its node, or that node's replacement, may come), and a newcomer that asks to join. */
static int expected_nodes(const job *j, const char *report) {
  int n = j->cl.multinode ? j->cl.plan.nnodes : 1;
  if (strncmp(report, RDZV_GROW_PREFIX, strlen(RDZV_GROW_PREFIX)) == 0)
    return n + 1 <= j->cl.nnodes_max ? n + 1 : n;
  return agent_cluster_lost_node(report, NULL, 0) >= 0 ? n - 1 : n;
}

/* Whether the job's program speaks, once a worker here is still to say hello: another node's
 * workers may have (the store's ahead keys). */
static void learn_spoke(job *j) {
  int silent = 0;
  for (int i = 0; i < j->nworkers; i++) silent |= j->workers[i].running && !j->rf.slot[i].hello;
  if (silent && !j->rf.spoke) j->rf.spoke = agent_cluster_job_spoke(&j->cl);
}

/* What stopping every worker leads to, for the line that says why: a restart while
 * --max-restarts allows one, else the job's end. */
static const char *then_what(const job *j) {
  return j->restart < j->cfg->max_restarts ? "restarting"
                                           : "the job fails together (no restart left: "
                                             "--max-restarts)";
}

/* Why this node's workers cannot re-form, or NULL: each must take part and still run. */
static const char *not_taking_part(job *j, int lost, char *why, size_t len) {
  learn_spoke(j);
  for (int i = 0; i < j->nworkers; i++) {
    const worker *w = &j->workers[i];
    if (i == lost) continue;
    if (!w->running && w->pid > 0 && !agent_worker_succeeded(w)) continue; /* lost too */
    if (!w->running) {
      snprintf(why, len, "rank %d has finished and cannot re-form: %s", w->rank, then_what(j));
      return why;
    }
    const reform_slot *s = &j->rf.slot[i];
    if (!takes_part(&j->rf, s)) {
      snprintf(why, len, "rank %d does not take part in re-forms (%s): %s", w->rank,
               s->fd < 0 ? "its control channel closed without hello"
                         : "no hello on COHORT_CONTROL_FD",
               then_what(j));
      return why;
    }
  }
  if (lost >= 0 && j->rf.slot[lost].losses >= REFORM_SLOT_LOSSES) {
    snprintf(why, len, "local rank %d was lost %d times: %s", lost, j->rf.slot[lost].losses,
             then_what(j));
    return why;
  }
  return NULL;
}

/* How many of the losses so far name the node that report names lost, by its "(HOST)". */
static int host_losses(const job *j, const char *report, char *host, size_t hostlen) {
  char other[BASE_HOST_MAX + 2];
  if (agent_cluster_lost_node(report, host, hostlen) < 0) return 0;
  int n = 0;
  for (int k = 0; k < j->rf.nlosses && k < REFORM_LOSSES_MAX; k++)
    n += agent_cluster_lost_node(j->rf.losses[k], other, sizeof other) >= 0 &&
         strcmp(other, host) == 0;
  return n;
}

/* The job cannot go on around its survivors at all: why (the job fails together), or NULL. */
static const char *cannot_reform(job *j, const char *report, char *why, size_t len) {
  char host[BASE_HOST_MAX + 2];
  int k = agent_cluster_lost_node(report, NULL, 0), expect = expected_nodes(j, report);
  int again = host_losses(j, report, host, sizeof host);
  if (again >= REFORM_SLOT_LOSSES) {
    snprintf(why, len, "node %d %s was lost %d times", k, host, again);
    return why;
  }
  int lost = j->cl.store_lost || agent_watch_store_lost(j->cl.watch);
  if (j->cl.etcd && lost) {
    snprintf(why, len, "this node lost etcd: the job goes on only where etcd's majority is");
    return why;
  }
  if (lost || (k == 0 && j->cl.multinode && !j->cl.etcd)) {
    snprintf(why, len,
             "node 0, which holds the rendezvous store, is lost: a re-form needs the store's node "
             "(use --rdzv-backend etcd to survive any node)");
    return why;
  }
  if (j->cl.multinode && expect < j->cl.nnodes_min && j->cl.nnodes_min == j->cl.nnodes_max) {
    snprintf(why, len,
             "fewer than MIN nodes left (%d of %d: --nnodes %d keeps no fewer; --nnodes MIN:%d "
             "lets the job go on with MIN)",
             expect, j->cl.nnodes_min, j->cl.nnodes_min, j->cl.nnodes_max);
    return why;
  }
  if (j->cl.multinode && expect < j->cl.nnodes_min) {
    snprintf(why, len, "fewer than MIN nodes left (%d of at least %d)", expect, j->cl.nnodes_min);
    return why;
  }
  return NULL;
}

/* When report names this node lost (it was stopped or cut off longer than the heartbeat timeout,
 * and has come back: the others went on without it): why it ends alone, else NULL. */
static const char *self_lost(job *j, const char *report, char *why, size_t len) {
  char host[BASE_HOST_MAX + 2], mine[BASE_HOST_MAX + 2];
  if (!j->cl.multinode || agent_cluster_lost_node(report, host, sizeof host) != j->cl.plan.my_index)
    return NULL;
  snprintf(mine, sizeof mine, "(%s)", j->cl.hostname);
  if (strcmp(host, mine) != 0) return NULL;
  snprintf(why, len,
           "this node was declared lost while it did not answer (stopped, or cut off) and the job "
           "went on without it: start it again to rejoin");
  return why;
}

/* `verb epoch=E why=...` to every running worker: the why's first line, cut to fit a message. */
static void send_all(job *j, const char *verb, const char *why) {
  int len = (int)strcspn(why, "\n\r");
  if (len > CONTROL_MSG_MAX - 64) len = CONTROL_MSG_MAX - 64;
  for (int i = 0; i < j->nworkers; i++)
    if (j->workers[i].running && j->rf.slot[i].fd >= 0)
      agent_control_send(j->rf.slot[i].fd, "%s epoch=%d why=%.*s", verb, j->round, len, why);
}

/* `form` to local survivor i, with the new round's places. */
static void send_form(job *j, int i) {
  const rdzv_plan *p = &j->cl.plan;
  const worker *w = &j->workers[i];
  agent_control_send(j->rf.slot[i].fd,
                     "form epoch=%d rank=%d size=%d local_rank=%d local_size=%d node_rank=%d "
                     "nnodes=%d store=%s job=%s master_addr=%s master_port=%d",
                     j->round, w->rank, p->world_size, i, j->nworkers, p->my_index, p->nnodes,
                     j->cl.store_env, j->cl.run_id, p->master_addr, p->master_port);
}

/* agent_job_begin_round, which may wait the heartbeat timeout for a missing node: the workers'
 * output flows on meanwhile. */
static int join_relayed(job *j) {
  relay r;
  int relayed = agent_relay_start(&r, j->workers, j->nworkers);
  if (relayed != 0)
    base_log(BASE_LOG_WARN, "no output relay during the join: %s", strerror(-relayed));
  int status = agent_job_begin_round(j);
  agent_relay_stop(&r);
  return status;
}

/* Joins the re-form round: 0, or -1 with why. */
static int join_next(job *j, int cannot, char *why, size_t len, const char *report) {
  cluster *c = &j->cl;
  c->reform_expect = expected_nodes(j, report);
  c->reform_back = expected_members(j, report);
  c->reform_prev = c->plan.my_index;
  c->reform_cannot = cannot;
  agent_cluster_unwatch(c);
  j->round++;
  int status = join_relayed(j);
  c->reform_expect = c->reform_back = 0;
  /* The round may have filled with the others and a replacement before this survivor joined
   * it (a race under load): then it has no place in the plan, and fails cleanly. */
  const rdzv_plan *p = &c->plan;
  int placed = p->nodes != NULL && p->my_index >= 0 && p->my_index < p->nnodes;
  if (status == AGENT_EXIT_OK && placed) return 0;
  if (status == AGENT_EXIT_OK)
    snprintf(why, len,
             "node %s was left out of the re-form's round %d: the round had its %d nodes "
             "before this survivor joined it",
             c->hostname, j->round, p->nnodes);
  else
    snprintf(why, len, "the re-form's rendezvous (round %d) failed", j->round);
  return -1;
}

/* The survivors get `form`, every lost local rank a new process. 0, or -1 with why. */
static int form(job *j, char *why, size_t len) {
  const rdzv_plan *p = &j->cl.plan;
  int offset = p->nodes[p->my_index].rank_offset;
  for (int i = 0; i < j->nworkers; i++) {
    worker *w = &j->workers[i];
    reform_slot *s = &j->rf.slot[i];
    w->rank = offset + i;
    s->formed = !w->running;
    if (w->running) {
      send_form(j, i);
      continue;
    }
    int heir = s->hello || s->heir; /* its predecessor took part (read before the spawn) */
    int rc = agent_spawn_newcomer(j, i);
    if (rc != 0) {
      snprintf(why, len, "cannot start a new local rank %d: %s", i, strerror(-rc));
      return -1;
    }
    s->heir = heir;
    s->formed = 1; /* a newcomer joins by its start: only survivors say `formed` */
  }
  return 0;
}

static void begin_record(job *j) {
  reform_record *r = &j->rf.last;
  const rdzv_plan *p = &j->cl.plan;
  *r = (reform_record){.detected_ms = base_now_ms(),
                       .nodes_before = p->nnodes,
                       .world_before = p->world_size,
                       .duration_ms = -1,
                       .steps_lost = -1};
  j->rf.step_before = max_step(j, 0);
}

/* The re-form itself, once every check passed: as agent_reform_on_loss. */
static int reform_round(job *j, const char *report, const char *part_why) {
  char why[512];
  if (part_why == NULL) {
    fprintf(stderr, "cohort: re-forming without stopping the survivors: %.*s\n",
            (int)strcspn(report, "\n"), report);
    /* A node joining: every member lives, so a worker may finish its step first (grow=1), for a
     * third of --reform-timeout at most (the rendezvous and the connecting take the rest). */
    char verb[64] = "reshape";
    if (strncmp(report, RDZV_GROW_PREFIX, strlen(RDZV_GROW_PREFIX)) == 0)
      snprintf(verb, sizeof verb, "reshape grow=1 defer_ms=%lld",
               (long long)(j->cfg->reform_timeout_ms / 3));
    send_all(j, verb, report);
  }
  begin_record(j);
  if (join_next(j, part_why != NULL, why, sizeof why, report) != 0) {
    report_with_losses(j, why);
    return -1;
  }
  if (part_why != NULL || j->cl.plan.restart) {
    if (part_why != NULL)
      fprintf(stderr, "cohort: %s\n", part_why);
    else
      fprintf(stderr, "cohort: another node cannot re-form (its agent says why): %s\n",
              then_what(j));
    base_strlcpy(j->report, report, sizeof j->report);
    send_all(j, "stop", "the job restarts");
    return 0;
  }
  j->rf.last.round = j->round;
  j->rf.last.nodes_after = j->cl.plan.nnodes;
  j->rf.last.world_after = j->cl.plan.world_size;
  j->rf.forming = 1;
  j->rf.deadline_ms = j->rf.last.detected_ms + j->cfg->reform_timeout_ms;
  if (form(j, why, sizeof why) != 0) {
    report_with_losses(j, why);
    return -1;
  }
  check_formed(j);
  return 1;
}

int agent_reform_ahead_ready(const job *j) {
  if (j->rf.slot == NULL || j->cl.ahead != 1) return 0;
  int running = 0;
  for (int i = 0; i < j->nworkers; i++) {
    if (!j->workers[i].running) continue;
    if (!j->rf.slot[i].hello) return 0;
    running++;
  }
  return running == j->nworkers;
}

int agent_reform_admit(job *j) {
  char why[512];
  j->cl.ahead = 2;
  int64_t t0 = base_now_ms();
  fprintf(stderr, "cohort: the workers started ahead said hello: joining the job\n");
  if (join_relayed(j) != AGENT_EXIT_OK) {
    snprintf(j->report, sizeof j->report, "node %s: the join after its workers started failed",
             j->cl.hostname);
    return -1;
  }
  if (j->cl.plan.restart) {
    snprintf(j->report, sizeof j->report,
             "node %s: the job restarts as it joins (a node cannot "
             "re-form)",
             j->cl.hostname);
    return -1;
  }
  j->rf.last.detected_ms = t0; /* the admission's duration: the join and every `formed` */
  j->rf.forming = j->rf.admitting = 1;
  j->rf.deadline_ms = t0 + j->cfg->reform_timeout_ms;
  if (form(j, why, sizeof why) != 0) {
    base_strlcpy(j->report, why, sizeof j->report);
    return -1;
  }
  check_formed(j);
  return 0;
}

/* Whether the job's training ended: a worker of this round exited 0, on some node (no wait). */
static int round_finished(job *j) {
  return j->cl.multinode && agent_cluster_left(&j->cl, j->round, 0) == AGENT_LEFT_FINISHED;
}

/* A worker here failed after the job's training ended: there is nothing to re-form around; the
 * job fails together, as torchrun's would. */
static const char *lost_after_end(job *j, char *why, size_t len) {
  if (!round_finished(j)) return NULL;
  snprintf(why, len,
           "it failed after the job's training ended (a worker of round %d exited 0): there is "
           "nothing to re-form",
           j->round);
  return why;
}

int agent_reform_on_loss(job *j, int index) {
  if (j->rf.slot == NULL || j->stopping || j->stop_signal != 0) return 0;
  char report[WATCH_REPORT_MAX], why[512];
  if (index >= 0) { /* ours: the others learn of it through the round's fail key */
    agent_report_worker_failure(j, index);
    agent_cluster_publish_failure(&j->cl, j->round, j->report, report, sizeof report);
  } else {
    base_strlcpy(report, j->report, sizeof report);
  }
  if (agent_cluster_stopped(report) || agent_hang_is_report(report)) return 0;
  if (strncmp(report, RDZV_GROW_PREFIX, strlen(RDZV_GROW_PREFIX)) != 0)
    note_loss(j, index >= 0 ? j->report : report);
  if (index >= 0) j->rf.slot[index].losses++;
  const char *fatal = self_lost(j, report, why, sizeof why);
  if (fatal == NULL && index >= 0) fatal = lost_after_end(j, why, sizeof why);
  if (fatal == NULL) fatal = cannot_reform(j, report, why, sizeof why);
  if (fatal != NULL) {
    report_with_losses(j, fatal);
    return -1;
  }
  char part[256];
  const char *part_why = not_taking_part(j, index, part, sizeof part);
  if (!j->cl.multinode && part_why != NULL) {
    fprintf(stderr, "cohort: %s\n", part_why);
    return 0;
  }
  int rc = reform_round(j, report, part_why);
  if (rc > 0) j->report[0] = '\0';
  return rc;
}

int agent_reform_take_broken(job *j, int *asks) {
  int rank = j->rf.slot != NULL && !j->rf.forming ? j->rf.broken_rank : -1;
  *asks = j->rf.broken_asks;
  j->rf.broken_rank = -1;
  j->rf.broken_asks = 0;
  return rank;
}

/* How often a late node being admitted looks for the word that the job finished. */
#define FINISH_CHECK_MS 200

/* A late node admitted as the job ends (a replacement that came within its last step): the
 * members' workers finish and never form with it, and its own workers, which never trained,
 * would wait for them until --reform-timeout failed the job. Once a worker of the round exited 0
 * they are stopped instead, and this node ends well. */
static int ended_while_admitting(job *j, int64_t now) {
  reform *rf = &j->rf;
  if (!rf->admitting || now < rf->finish_check_ms) return 0;
  rf->finish_check_ms = now + FINISH_CHECK_MS;
  if (!round_finished(j)) return 0;
  fprintf(stderr,
          "cohort: the job finished as this node joined it (a worker of round %d exited 0): its "
          "workers are not needed; this node ends well\n",
          j->round);
  rf->forming = rf->admitting = 0;
  rf->unneeded = 1;
  agent_job_stop_unneeded(j);
  return 1;
}

int agent_reform_tick(job *j, int64_t now) {
  if (!j->rf.forming || ended_while_admitting(j, now)) return -1;
  if (now < j->rf.deadline_ms) {
    int left = base_deadline_left(j->rf.deadline_ms);
    return j->rf.admitting && left > FINISH_CHECK_MS ? FINISH_CHECK_MS : left;
  }
  j->rf.forming = 0;
  char why[256];
  snprintf(why, sizeof why, "the re-form did not finish within %.0f s (--reform-timeout)",
           (double)j->cfg->reform_timeout_ms / 1000);
  report_with_losses(j, why);
  send_all(j, "stop", why);
  agent_job_fail(j);
  return -1;
}

/*
 * reform.c - re-forming a communicator in place (`cohort run --on-failure
 * reform`): the end of a membership (a reshape from the agent, or a lost
 * peer), cohort_comm_reform's release of everything the old membership held
 * and bootstrap of the new one under its round, the new-rank bits and the
 * state transfer from a survivor to the newcomers.
 *
 * The membership's transports are "live" (under ctl.mu) from the end of a
 * bootstrap until cohort_comm_reform releases them: only then may the
 * control thread fail them (coll_reshape), so it never touches a transport
 * being torn down or set up. See docs/collectives.md "Re-forming a
 * communicator" and docs/reform.md for the agent's side.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "coll/coll.h"

#define DEFAULT_REFORM_TIMEOUT_MS 600000
#define DEFAULT_GROW_DEFER_MS 20000

/* A reshape for a node joining (grow=1: every member lives) that the program defers
 * (cohort_comm_defer_grow): the membership stays up, its end pending until the program re-forms
 * at a step boundary or the limit passes (the control thread's timed wake: on_grow_late). Under
 * ctl.mu; 1 when deferred, -1 when it came within the program's break window
 * (cohort_comm_grow_break_for: the step in flight has barely begun, so it ends now), else 0. */
static int defer_grow(cohort_comm *c, const coll_ctl_msg *m) {
  int e = m->epoch < 0 ? c->epoch : m->epoch;
  if (m->grow != 1 || c->grow_defer_ms <= 0 || !c->live || e < c->epoch ||
      atomic_load(&c->eng.failed))
    return 0;
  if (c->grow_epoch < 0 && base_now_ms() < c->grow_break_until_ms) {
    base_log(BASE_LOG_INFO,
             "rank %d: a node joins (membership %d ends) %lld ms before the program's break "
             "limit: not deferred, the step in flight ends",
             c->rank, e, (long long)(c->grow_break_until_ms - base_now_ms()));
    return -1;
  }
  if (c->grow_epoch < 0) { /* the first: the limit counts from it */
    int ms = m->defer_ms >= 0 && m->defer_ms < c->grow_defer_ms ? m->defer_ms : c->grow_defer_ms;
    if (ms <= 0) return 0;
    c->ctl.deadline_ms = base_now_ms() + ms;
    base_log(BASE_LOG_INFO,
             "rank %d: a node joins (membership %d ends): deferred until the "
             "program re-forms, %d ms at most",
             c->rank, e, ms);
  }
  if (e > c->grow_epoch) c->grow_epoch = e;
  atomic_store(&c->grow_pending, 1);
  return 1;
}

/* The deferral's limit passed (the control thread) or the program turned it off, under ctl.mu:
 * the pending grow ends the membership as any reshape does. */
static void on_grow_late(void *arg) {
  cohort_comm *c = arg;
  if (c->grow_epoch >= 0)
    coll_reshape(c, c->grow_epoch,
                 "a node joins, and the program did not re-form within the grow's deferral "
                 "(COHORT_GROW_DEFER_MS), or turned it off");
}

/* The control thread's messages that concern the running membership (called under ctl.mu). */
static void on_control(void *arg, const coll_ctl_msg *m) {
  cohort_comm *c = arg;
  int d = m->verb == COLL_CTL_RESHAPE ? defer_grow(c, m) : 1;
  char why[COLL_CTL_MAX + 100];
  if (d < 0) {
    snprintf(why, sizeof why, "%s; it came early in the step (cohort_comm_grow_break_for)", m->why);
    coll_reshape(c, m->epoch, why);
  } else if (d == 0) {
    coll_reshape(c, m->epoch, m->why);
  } else if (m->verb == COLL_CTL_STOP && c->live) {
    coll_fail(&c->eng, COHORT_EABORTED, "rank %d: the agent stopped the job: %s", c->rank,
              m->why[0] ? m->why : "(no reason given)");
  }
}

/* The engine found a peer gone (its connection closed, its process gone): the agent learns it now
 * (`broken`), not when this rank's program next calls cohort_comm_reform, nor when the lost
 * node's heartbeat times out. Not when a reshape already ended this membership. */
static void on_lost(void *arg, const char *why) {
  cohort_comm *c = arg;
  pthread_mutex_lock(&c->ctl.mu);
  int epoch = c->epoch, send = c->live && atomic_load(&c->ended) < c->epoch;
  pthread_mutex_unlock(&c->ctl.mu);
  if (send) coll_ctl_send(&c->ctl, "broken epoch=%d why=%.900s", epoch, why);
}

void coll_reshape(cohort_comm *c, int epoch, const char *why) {
  int e = epoch < 0 ? c->epoch : epoch;
  if (e > atomic_load(&c->ended)) atomic_store(&c->ended, e);
  if (c->live && e >= c->epoch)
    coll_fail(&c->eng, COHORT_ERESHAPED, "rank %d: membership %d ended (the agent: %s)", c->rank, e,
              why != NULL && why[0] ? why : "reshape");
}

int coll_reform_init(cohort_comm *c, const cohort_comm_config *cfg) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&c->ctl.mu, NULL);
  pthread_cond_init(&c->ctl.cv, &ca);
  pthread_condattr_destroy(&ca);
  c->ctl.fd = c->ctl.wake_fd = -1;
  int ahead = cfg->await_form == COHORT_AWAIT_FORM_NOW;
  c->epoch = ahead ? -1 : cfg->restart; /* started ahead: no membership before the first form */
  atomic_init(&c->ended, -1);
  c->step = -1;
  c->boot_k = -1;
  c->transport = cfg->transport;
  const char *nc = getenv("COHORT_NEWCOMER");
  c->self_new = nc != NULL && strcmp(nc, "1") == 0;
  c->job_id = strdup(ahead || cfg->job_id == NULL ? "" : cfg->job_id); /* ahead: the form's */
  c->token = cfg->token != NULL ? strdup(cfg->token) : NULL;
  if (c->job_id == NULL || (cfg->token != NULL && c->token == NULL)) return -ENOMEM;
  c->grow_epoch = -1;
  atomic_init(&c->grow_pending, 0);
  c->ctl.notify = on_control;
  c->ctl.notify_arg = c;
  c->ctl.expire = on_grow_late;
  int rc = coll_ctl_open(&c->ctl, cfg->await_form != 0);
  c->eng.reshape_on_loss = c->ctl.fd >= 0;
  c->eng.lost = on_lost;
  c->eng.lost_arg = c;
  return rc;
}

/* The membership's transports are up: from now on a reshape fails them (at once when one came
 * already). */
static void go_live(cohort_comm *c) {
  pthread_mutex_lock(&c->ctl.mu);
  c->live = 1;
  if (atomic_load(&c->ended) >= c->epoch) coll_reshape(c, c->epoch, "reshape while connecting");
  pthread_mutex_unlock(&c->ctl.mu);
  /* A peer lost while this rank computes between collectives: `broken` at once (engine.h). */
  int rc = 0;
  if (c->eng.reshape_on_loss && c->size > 1 && !atomic_load(&c->eng.failed))
    rc = coll_watch_start(&c->eng, c->size);
  if (rc != 0)
    base_log(BASE_LOG_WARN,
             "rank %d: no peer watch (%s): a peer lost between collectives is "
             "found at the next one",
             c->rank, cohort_strerror(rc));
}

static void free_group(coll_group *g) {
  free(g->ranks);
  memset(g, 0, sizeof *g);
}

/*
 * Ends the membership on this rank: fails what is in flight and queued (peers see the connections
 * close), waits until the progress thread has completed every queued request, then releases the
 * transports, the host groups and the peers' mappings of shared buffers.
 */
static void end_membership(cohort_comm *c) {
  coll_fail(&c->eng, COHORT_ERESHAPED, "rank %d: membership %d ended (cohort_comm_reform)", c->rank,
            c->epoch);
  coll_abort_transports(&c->eng, c->eng.errmsg); /* also when it had failed before */
  pthread_mutex_lock(&c->mu);
  while (c->head != NULL || c->busy) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  pthread_mutex_lock(&c->ctl.mu);
  c->live = 0;
  c->grow_epoch = -1; /* a grow deferred: this re-form is its end */
  c->ctl.deadline_ms = 0;
  c->grow_break_until_ms = 0; /* the step it was set for ended too */
  atomic_store(&c->grow_pending, 0);
  pthread_mutex_unlock(&c->ctl.mu);
  coll_watch_stop(&c->eng); /* nothing in flight now; before its fds close */
  c->eng.ntports = 0;
  coll_buf_orphan_all(c);
  coll_tcp_destroy(c->tcp);
  coll_shm_destroy(c->shm);
  c->tcp = NULL;
  c->shm = NULL;
  free_group(&c->local);
  free_group(&c->leaders);
  free_group(&c->cross);
  c->hier = 0;
  c->seq = 0;
  c->prep_op = NULL;
  c->prep_done = 0;
}

/* Replaces the failure state with err and a message (the reason cohort_comm_reform returns). */
static int set_failure(cohort_comm *c, int err, const char *msg) {
  coll_reset_failure(&c->eng);
  coll_fail(&c->eng, err, "rank %d: %s", c->rank, msg);
  return err;
}

static int reform_timeout_ms(void) {
  const char *v = getenv("COHORT_REFORM_TIMEOUT_MS");
  int ms = DEFAULT_REFORM_TIMEOUT_MS;
  if (v != NULL && base_parse_int(v, 1, 1 << 30, &ms) != 0) ms = DEFAULT_REFORM_TIMEOUT_MS;
  return ms;
}

/* Waits for the form of a membership after `old` (into *f), or the agent's stop, a malformed
 * message, the channel's end or the deadline. 0 or the error cohort_comm_reform returns. */
static int await_form(cohort_comm *c, int old, coll_ctl_msg *f) {
  int ms = reform_timeout_ms();
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  char msg[COLL_CTL_MAX + 100];
  coll_ctl *ctl = &c->ctl;
  int rc = 1;
  pthread_mutex_lock(&ctl->mu);
  while (rc == 1) {
    if (ctl->stopped) {
      snprintf(msg, sizeof msg, "the agent stopped the job: %s", ctl->why);
      rc = COHORT_EABORTED;
    } else if (ctl->bad) {
      snprintf(msg, sizeof msg, "re-forming: %s", ctl->why);
      ctl->bad = 0; /* reported once: a later call waits for a good form */
      rc = COHORT_EPROTO;
    } else if (ctl->form.verb == COLL_CTL_FORM && ctl->form.epoch > old) {
      *f = ctl->form;
      rc = 0;
    } else if (ctl->closed) {
      snprintf(msg, sizeof msg, "the agent's control channel closed while re-forming");
      rc = COHORT_EABORTED;
    } else if (pthread_cond_timedwait(&ctl->cv, &ctl->mu, &ts) == ETIMEDOUT) {
      snprintf(msg, sizeof msg, "no new membership within %d ms (COHORT_REFORM_TIMEOUT_MS)", ms);
      rc = -ETIMEDOUT;
    }
  }
  pthread_mutex_unlock(&ctl->mu);
  return rc == 0 ? 0 : set_failure(c, rc, msg);
}

/* The communicator's arrays sized for the new membership f. */
static int resize(cohort_comm *c, const coll_ctl_msg *f) {
  size_t n = (size_t)f->size;
  const coll_tport_ops **ops = calloc(n, sizeof *ops);
  void **t = calloc(n, sizeof *t);
  unsigned char *bits = calloc(n, 1);
  char *job = strdup(f->job);
  if (ops == NULL || t == NULL || bits == NULL || job == NULL) {
    free(ops);
    free(t);
    free(bits);
    free(job);
    return -ENOMEM;
  }
  free(c->eng.peer_ops);
  free(c->eng.peer_t);
  free(c->newbits);
  free(c->job_id);
  c->eng.peer_ops = ops;
  c->eng.peer_t = t;
  c->newbits = bits;
  c->job_id = job;
  return 0;
}

/* 1 for the errors of a bootstrap whose peer went away or never came. */
static int lost_peer(int rc) {
  return rc == COHORT_EPEER || rc == -ECONNREFUSED || rc == -ECONNRESET || rc == -ECONNABORTED ||
         rc == -EPIPE || rc == -ENOTCONN || rc == -EHOSTUNREACH || rc == -ETIMEDOUT;
}

/* Connects the membership f in place: its rank, size, store, job and round. */
static int join_membership(cohort_comm *c, const coll_ctl_msg *f) {
  int rc = resize(c, f);
  if (rc != 0) return set_failure(c, rc, "out of memory while re-forming");
  pthread_mutex_lock(&c->ctl.mu);
  c->epoch = f->epoch;
  pthread_mutex_unlock(&c->ctl.mu);
  c->rank = c->eng.rank = f->rank;
  c->size = f->size;
  c->world = (coll_group){.n = f->size, .me = f->rank, .ranks = NULL};
  c->newbits[c->rank] = (unsigned char)c->self_new;
  cohort_comm_config cfg = {.rank = f->rank,
                            .size = f->size,
                            .store_addr = f->store,
                            .job_id = c->job_id,
                            .token = c->token,
                            .timeout_ms = c->timeout_ms,
                            .transport = c->transport,
                            .restart = f->epoch};
  coll_reset_failure(&c->eng);
  rc = c->size > 1 ? coll_bootstrap(c, &cfg) : 0;
  if (lost_peer(rc)) rc = COHORT_ERESHAPED; /* a member lost while connecting: the agent re-forms */
  if (rc != 0) {
    char msg[200];
    snprintf(msg, sizeof msg, "connecting membership %d (rank %d of %d) failed: %s", f->epoch,
             f->rank, f->size, cohort_strerror(rc));
    return set_failure(c, rc, msg);
  }
  go_live(c);
  return 0;
}

/* Answers formed: the agent counts the re-form done (or a worker started ahead joined). */
static void say_formed(cohort_comm *c) {
  coll_ctl_send(&c->ctl, "formed epoch=%d step=%lld", c->epoch, (long long)c->step);
  base_log(BASE_LOG_INFO, "rank %d of %d: membership %d formed", c->rank, c->size, c->epoch);
}

/* Memberships in a row that may end while a worker connects its first. */
#define FIRST_FORM_TRIES 100

/* Connects the next form's membership until one holds, from rc (COHORT_ERESHAPED: the one in
 * c->epoch ended while connecting, or none yet when c->epoch < 0), and answers formed. */
static int form_until_joined(cohort_comm *c, int rc) {
  for (int i = 0; i < FIRST_FORM_TRIES && rc == COHORT_ERESHAPED; i++) {
    int after = c->epoch;
    if (after >= 0) { /* a member lost, another node joining: ready, and the next one */
      end_membership(c);
      coll_ctl_send(&c->ctl, "ready epoch=%d step=%lld", after, (long long)c->step);
    }
    coll_ctl_msg f;
    rc = await_form(c, after, &f);
    if (rc == 0) rc = join_membership(c, &f);
  }
  if (rc == COHORT_ERESHAPED)
    return set_failure(c, rc, "100 memberships in a row ended before this rank connected one");
  if (rc == 0) say_formed(c);
  return rc;
}

int coll_first_form(cohort_comm *c) {
  return form_until_joined(c, COHORT_ERESHAPED);
}

int coll_first_connect(cohort_comm *c, const cohort_comm_config *cfg) {
  int rc = c->size > 1 ? coll_bootstrap(c, cfg) : 0;
  if (rc == 0) {
    go_live(c);
    return 0;
  }
  /* It ended: the agent's reshape came, or a member's connection broke (the agent learns of that
   * loss, from this `ready` too). A bootstrap that only timed out is the caller's error, as is
   * any without a channel: nothing says that another membership will come. */
  int ended = rc == COHORT_ERESHAPED || (lost_peer(rc) && rc != -ETIMEDOUT) ||
              atomic_load(&c->ended) >= c->epoch;
  if (c->ctl.fd < 0 || !ended) return rc;
  base_log(BASE_LOG_INFO,
           "rank %d: membership %d ended while connecting (%s): waiting for the next", c->rank,
           c->epoch, cohort_strerror(rc));
  return form_until_joined(c, COHORT_ERESHAPED);
}

COHORT_API int cohort_comm_reform(cohort_comm *c) {
  if (c == NULL) return -EINVAL;
  if (c->ctl.fd < 0) return -ENOTSUP;
  int old = c->epoch;
  end_membership(c);
  /* Failing to send means the agent is gone: the wait below sees the channel closed. */
  coll_ctl_send(&c->ctl, "ready epoch=%d step=%lld", old, (long long)c->step);
  coll_ctl_msg f;
  int rc = await_form(c, old, &f);
  if (rc == 0) rc = join_membership(c, &f);
  if (rc != 0) return rc;
  say_formed(c);
  return 0;
}

COHORT_API int cohort_comm_defer_grow(cohort_comm *c, int on) {
  if (c == NULL) return -EINVAL;
  if (c->ctl.fd < 0) return -ENOTSUP;
  int ms = DEFAULT_GROW_DEFER_MS;
  const char *v = getenv("COHORT_GROW_DEFER_MS");
  if (on && v != NULL && v[0] != '\0' && base_parse_int(v, 0, 1 << 30, &ms) != 0) {
    base_log(BASE_LOG_ERROR, "COHORT_GROW_DEFER_MS=%.20s is not a number of milliseconds", v);
    return COHORT_ENOENV;
  }
  pthread_mutex_lock(&c->ctl.mu);
  c->grow_defer_ms = on ? ms : 0;
  if (!on && c->grow_epoch >= 0) on_grow_late(c); /* pending: it ends the membership now */
  pthread_mutex_unlock(&c->ctl.mu);
  return 0;
}

COHORT_API int cohort_comm_grow_break_for(cohort_comm *c, int ms) {
  if (c == NULL || ms < 0) return -EINVAL;
  if (c->ctl.fd < 0) return -ENOTSUP;
  pthread_mutex_lock(&c->ctl.mu);
  c->grow_break_until_ms = ms > 0 ? base_now_ms() + ms : 0;
  /* A grow came after the last boundary's agreement: nothing of this step has run yet (a peer
   * that broke first may have ended the membership already: it ends all the same). */
  int now = ms > 0 && c->grow_epoch >= 0;
  if (now)
    coll_reshape(c, c->grow_epoch,
                 "a node joins, pending as a step begins: it ends the step "
                 "(cohort_comm_grow_break_for)");
  pthread_mutex_unlock(&c->ctl.mu);
  return now;
}

COHORT_API int cohort_comm_grow_pending(const cohort_comm *c) {
  return c == NULL ? -EINVAL : atomic_load(&((cohort_comm *)c)->grow_pending);
}

COHORT_API int cohort_comm_epoch(const cohort_comm *c) {
  return c == NULL ? -EINVAL : c->epoch;
}

COHORT_API int cohort_comm_is_new(const cohort_comm *c, int rank) {
  if (c == NULL || rank < 0 || rank >= c->size) return -EINVAL;
  return c->newbits[rank] != 0;
}

COHORT_API int cohort_comm_mark_new(cohort_comm *c) {
  if (c == NULL) return -EINVAL;
  c->self_new = 1;
  c->newbits[c->rank] = 1;
  return 0;
}

COHORT_API int cohort_comm_set_step(cohort_comm *c, int64_t step) {
  if (c == NULL) return -EINVAL;
  c->step = step < 0 ? -1 : step;
  return 0;
}

/* Every rank's new bit, bytes and pieces, agreed: 0, COHORT_EMISMATCH when the sizes or the
 * pieces' layout differ, or an error. */
static int agree_bits(cohort_comm *c, size_t bytes, uint64_t layout) {
  int n = c->size;
  int64_t *all = malloc((size_t)n * 3 * sizeof *all);
  if (all == NULL) return -ENOMEM;
  int64_t mine[3] = {c->self_new, (int64_t)bytes, (int64_t)layout};
  int rc = n > 1 ? cohort_allgather(c, mine, all, 3, COHORT_I64) : 0;
  if (n == 1) memcpy(all, mine, sizeof mine);
  for (int i = 0; i < n && rc == 0; i++) {
    if (all[3 * i + 1] != (int64_t)bytes || all[3 * i + 2] != (int64_t)layout)
      rc = COHORT_EMISMATCH;
    c->newbits[i] = all[3 * i] != 0;
  }
  free(all);
  return rc;
}

/* The chain of the transfer: the donor (lowest rank not new), then every new rank in order. Returns
 * its length (1: nobody to send to) or COHORT_ENOSTATE. */
static int make_chain(cohort_comm *c) {
  coll_group *g = &c->xfer;
  free_group(g);
  g->ranks = malloc((size_t)c->size * sizeof(int));
  if (g->ranks == NULL) return -ENOMEM;
  g->me = -1;
  for (int i = 0; i < c->size && g->n == 0; i++)
    if (!c->newbits[i]) g->ranks[g->n++] = i;
  if (g->n == 0) return COHORT_ENOSTATE;
  for (int i = 0; i < c->size; i++)
    if (c->newbits[i]) g->ranks[g->n++] = i;
  for (int i = 0; i < g->n; i++)
    if (g->ranks[i] == c->rank) g->me = i;
  return g->n;
}

/* The pieces' sizes, hashed (FNV-1a over their lengths): ranks that pass the same total in other
 * pieces would misalign the chain. */
static uint64_t layout_of(const cohort_iov *iov, int n, size_t *bytes) {
  uint64_t h = 1469598103934665603ull;
  *bytes = 0;
  for (int i = 0; i < n; i++) {
    *bytes += iov[i].len;
    if (iov[i].len == 0) continue;
    for (int k = 0; k < 8; k++)
      h = (h ^ ((uint64_t)iov[i].len >> (8 * k) & 0xff)) * 1099511628211ull;
  }
  return h;
}

COHORT_API int cohort_comm_state_transferv(cohort_comm *c, const cohort_iov *iov, int n) {
  if (c == NULL || n < 0 || (iov == NULL && n > 0)) return -EINVAL;
  for (int i = 0; i < n; i++)
    if (iov[i].base == NULL && iov[i].len > 0) return -EINVAL;
  size_t bytes;
  uint64_t layout = layout_of(iov, n, &bytes);
  int rc = agree_bits(c, bytes, layout);
  if (rc == 0) rc = make_chain(c);
  if (rc <= 1) return rc < 0 ? rc : 0;
  /* One chain per piece, each pipelined; a failure ends the rest on every rank of the chain. */
  for (int i = 0; i < n && rc >= 0; i++) {
    if (iov[i].len == 0) continue;
    coll_op o = {.kind = COLL_TRANSFER,
                 .send = iov[i].base,
                 .recv = iov[i].base,
                 .count = iov[i].len,
                 .dtype = COHORT_U8,
                 .wire = COHORT_U8,
                 .op = COHORT_SUM,
                 .root = c->xfer.ranks[0]};
    int orc = coll_start(c, &o, NULL);
    rc = orc != 0 ? orc : rc;
  }
  /* The ranks outside the chain learn here that it ended, and how. */
  int32_t v = rc > 0 ? 0 : rc;
  int arc = cohort_allreduce(c, &v, &v, 1, COHORT_I32, COHORT_MIN);
  rc = arc != 0 ? arc : v;
  if (rc == 0) {
    memset(c->newbits, 0, (size_t)c->size);
    c->self_new = 0;
  }
  return rc;
}

COHORT_API int cohort_comm_state_transfer(cohort_comm *c, void *buf, size_t bytes) {
  if (c == NULL || (buf == NULL && bytes > 0)) return -EINVAL;
  cohort_iov one = {buf, bytes};
  return cohort_comm_state_transferv(c, &one, 1);
}

/* watch.c - heartbeats and failure propagation between agents. */
#include "agent/watch.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "rdzv/join.h"
#include "store/store.h"

/* The shortest slice of the wait on the fail key (the others last until the next heartbeat). */
#define WAIT_SLICE_MIN_MS 20
#define WAIT_SLICE_MAX_MS 200 /* of a wait that watch_stop cannot cut short */
#define OP_MIN_MS 200         /* the shortest deadline of a heartbeat or a check */
#define OP_TIMEOUT_MS 2000
/* etcd whose members answer but cannot serve (no leader: an election, or quorum lost) is
 * given this long beyond the heartbeat timeout before it counts as lost. etcd's election
 * timeout is 1 s by default; an election takes one to a few of them. */
#define ELECTION_GRACE_MS 5000

struct agent_watch {
  watch_opts o;
  store_client *client;
  pthread_t thread;
  int started;
  int interruptible; /* watch_stop cuts the client's wait short (the built-in store) */
  pthread_mutex_t lock;
  int stop;
  int failed;
  int store_lost; /* the failure is the store's silence */
  char report[WATCH_REPORT_MAX];
  int64_t *last_value;
  int64_t *last_change;
  int64_t last_sweep; /* when check_nodes last read the counters */
};

static int stop_requested(agent_watch *w) {
  pthread_mutex_lock(&w->lock);
  int s = w->stop;
  pthread_mutex_unlock(&w->lock);
  return s;
}

static void set_failure(agent_watch *w, const char *text, int store_lost) {
  pthread_mutex_lock(&w->lock);
  if (!w->failed) {
    w->failed = 1;
    w->store_lost = store_lost;
    base_strlcpy(w->report, text, sizeof w->report);
  }
  pthread_mutex_unlock(&w->lock);
  unsigned char b = WATCH_NOTIFY_BYTE;
  ssize_t k = write(w->o.notify_fd, &b, 1);
  (void)k;
}

static int read_text(store_client *c, const char *key, char *buf, size_t len) {
  void *val = NULL;
  size_t n = 0;
  int rc = store_get(c, key, &val, &n, base_deadline_in(OP_TIMEOUT_MS));
  if (rc != 0) return rc;
  size_t k = n < len - 1 ? n : len - 1;
  memcpy(buf, val, k);
  buf[k] = '\0';
  free(val);
  return 0;
}

static int publish(store_client *c, const char *job_id, int round, const char *report, char *winner,
                   size_t winner_len) {
  char key[STORE_KEY_MAX];
  rdzv_key(key, sizeof key, job_id, round, "fail");
  void *cur = NULL;
  size_t curlen = 0;
  int rc = store_cas(c, key, NULL, 0, report, strlen(report), &cur, &curlen,
                     base_deadline_in(OP_TIMEOUT_MS));
  if (rc == 0 && cur != NULL) {
    size_t k = curlen < winner_len - 1 ? curlen : winner_len - 1;
    memcpy(winner, cur, k);
    winner[k] = '\0';
  } else {
    base_strlcpy(winner, report, winner_len);
  }
  free(cur);
  return rc;
}

/*
 * A node that finished its work stops beating without being lost: its done
 * key is there, or the round's "alldone" (with etcd, a node that saw it
 * leaves, and its lease takes its heartbeat and done keys with it, while a
 * slower node may still be watching; "alldone" outlives it: cluster.c).
 */
static int node_done(agent_watch *w, int k) {
  char keys[2][STORE_KEY_MAX], suffix[32];
  snprintf(suffix, sizeof suffix, "done/%d", k);
  rdzv_key(keys[0], sizeof keys[0], w->o.job_id, w->o.round, suffix);
  rdzv_key(keys[1], sizeof keys[1], w->o.job_id, w->o.round, "alldone");
  const char *kp[2] = {keys[0], keys[1]};
  void *vals[2] = {NULL, NULL};
  size_t lens[2];
  if (store_get_many(w->client, kp, 2, vals, lens, base_deadline_in(OP_TIMEOUT_MS)) != 0) return 0;
  int done = vals[0] != NULL || vals[1] != NULL;
  free(vals[0]);
  free(vals[1]);
  return done;
}

/* A silent node k: lost unless it finished; 1 with the report that counts in text. */
static int node_silent(agent_watch *w, int k, int64_t now, char *text, size_t len) {
  const watch_opts *o = &w->o;
  if (node_done(w, k)) {
    w->last_change[k] = now;
    w->last_value[k] = -1; /* its key gone with it: silent again only after a whole timeout */
    return 0;
  }
  char report[WATCH_REPORT_MAX];
  if (w->last_value[k] >= 0 && rdzv_backend_is_etcd(o->backend))
    snprintf(report, sizeof report,
             "node %d (%s) lost: its etcd lease expired (not renewed for the heartbeat timeout, "
             "%.1f s)",
             k, o->hostnames[k], (double)o->lost_after_ms / 1000.0);
  else
    snprintf(report, sizeof report, "node %d (%s) lost: no heartbeat for %.1f s", k,
             o->hostnames[k], (double)(now - w->last_change[k]) / 1000.0);
  publish(w->client, o->job_id, o->round, report, text, len);
  return 1;
}

/*
 * A node's silence counts only while the store answered this one: after
 * sweeps that could not read (an etcd election, say, when no node could
 * beat either), every node's silence is shortened by the time unread.
 */
static int64_t check_period(const agent_watch *w);

static void forgive_outage(agent_watch *w, int64_t now) {
  int64_t period = check_period(w), unread = now - w->last_sweep - period;
  w->last_sweep = now;
  if (unread <= period) return;
  for (int k = 0; k < w->o.nnodes; k++)
    w->last_change[k] = w->last_change[k] + unread < now ? w->last_change[k] + unread : now;
}

/*
 * Node 0 reads the other nodes' heartbeat counters, all in one pipelined
 * round trip. A counter that has not moved for lost_after_ms (its node not
 * done) is published as the failure, and the report that counts is
 * returned in text: 1, else 0; with etcd, a key seen once and now gone
 * (its node's lease expired) is lost at once, and one never seen is lost
 * after lost_after_ms. The other nodes leave the sweep to node 0
 * (N reads per period instead of N²): they learn of a loss from the fail
 * key, and of node 0's from its store falling silent (store_silent) or, with
 * etcd, from node 0's own key, which they read (first == 0, n == 1).
 * *answered: when the store last answered, this read's time if it did;
 * -1 when the read failed.
 */
static int check_nodes(agent_watch *w, int64_t deadline, int64_t *answered, char *text,
                       size_t len) {
  const watch_opts *o = &w->o;
  if (o->nnodes < 2 || (o->my_node != 0 && !rdzv_backend_is_etcd(o->backend))) return 0;
  int first = o->my_node == 0 ? 1 : 0;
  size_t n = o->my_node == 0 ? (size_t)o->nnodes - 1 : 1;
  char(*keys)[STORE_KEY_MAX] = calloc(n, sizeof *keys);
  const char **kp = calloc(n, sizeof *kp);
  void **vals = calloc(n, sizeof *vals);
  size_t *lens = calloc(n, sizeof *lens);
  int lost = 0;
  if (keys == NULL || kp == NULL || vals == NULL || lens == NULL) goto out;
  for (size_t i = 0; i < n; i++) {
    char suffix[32];
    snprintf(suffix, sizeof suffix, "hb/%zu", i + (size_t)first);
    rdzv_key(keys[i], sizeof keys[i], o->job_id, o->round, suffix);
    kp[i] = keys[i];
  }
  if (store_get_many(w->client, kp, n, vals, lens, deadline) != 0) {
    lost = -1;
    goto out;
  }
  int64_t now = base_now_ms();
  *answered = now;
  forgive_outage(w, now);
  for (size_t i = 0; i < n && !lost; i++) {
    int k = (int)i + first;
    char num[32] = "";
    if (vals[i] != NULL) memcpy(num, vals[i], lens[i] < sizeof num - 1 ? lens[i] : sizeof num - 1);
    int64_t v = -1;
    if (vals[i] != NULL && base_parse_i64(num, INT64_MIN, INT64_MAX, &v) != 0) v = -1;
    if (rdzv_backend_is_etcd(o->backend) && v < 0 && w->last_value[k] >= 0)
      lost = node_silent(w, k, now, text, len); /* its lease took its key */
    else if (v != w->last_value[k] || (v >= 0 && rdzv_backend_is_etcd(o->backend))) {
      w->last_value[k] = v;
      w->last_change[k] = now;
    } else if (now - w->last_change[k] >= o->lost_after_ms) {
      lost = node_silent(w, k, now, text, len);
    }
  }
out:
  for (size_t i = 0; vals != NULL && i < n; i++) free(vals[i]);
  free(vals);
  free(lens);
  free(kp);
  free(keys);
  return lost;
}

/* The watcher's state between two turns of its loop. */
typedef struct watch_clock {
  int64_t next_hb, next_check;
  int64_t last_ok; /* last answer from the store */
  int64_t beats;   /* this node's heartbeat count, the value of its key */
  /* When the first beat or check that failed since the last success began (0: none). Until
   * one succeeds, both are tried again within WAIT_SLICE_MAX_MS with shorter deadlines
   * (op_deadline: an etcd member gone, an election: the requests go round the members about
   * as quickly as the waits of 200 ms used to make them). */
  int64_t failing_since;
} watch_clock;

/* How a beat or check begun at start went: 1 answered, 0 unanswered, -1 not made. */
static void note_answer(watch_clock *t, int64_t start, int ok) {
  if (ok > 0) t->last_ok = base_now_ms(), t->failing_since = 0;
  if (ok == 0 && t->failing_since == 0) t->failing_since = start;
}

/* What one look found: nothing, a failure, or the store itself gone. */
enum { SEEN_NOTHING, SEEN_FAILURE, SEEN_STORE_LOST };

/*
 * SEEN_STORE_LOST with the report in text when the store has not answered
 * for lost_after_ms: cut off from node 0 (its agent gone or our link down),
 * or from etcd. With etcd the silence counts from the first request left
 * unanswered, not from the last answer (a node asks every third of the
 * timeout: counted from the last answer, an election would have a third
 * less time), and etcd whose members answer without serving (no leader: an
 * election) is given ELECTION_GRACE_MS more.
 */
static int store_silent(agent_watch *w, const watch_clock *t, int64_t now, char *text, size_t len) {
  const watch_opts *o = &w->o;
  int on_etcd = rdzv_backend_is_etcd(o->backend);
  int64_t silent = on_etcd ? (t->failing_since > 0 ? now - t->failing_since : 0) : now - t->last_ok;
  if (silent < o->lost_after_ms) return SEEN_NOTHING;
  if (!on_etcd) {
    snprintf(text, len, "node 0 (%s) lost: no answer from the rendezvous store for %.1f s",
             o->hostnames[0], (double)silent / 1000.0);
    return SEEN_STORE_LOST;
  }
  int busy = rdzv_backend_answered(o->backend) >= t->failing_since;
  if (busy && silent < o->lost_after_ms + ELECTION_GRACE_MS) return SEEN_NOTHING;
  snprintf(text, len, "lost %s: %s for %.1f s", rdzv_backend_name(o->backend),
           busy ? "its members answer but serve nothing (no leader)" : "no answer",
           (double)silent / 1000.0);
  return SEEN_STORE_LOST;
}

/*
 * An operation's deadline: OP_TIMEOUT_MS or a third of the heartbeat
 * timeout, whichever is shorter ("most"), but not past the moment the store
 * would count as lost (so that its silence is seen then), and at least
 * OP_MIN_MS. One operation held by a member that cannot serve (a follower
 * whose leader just died) must leave time to try the others: in trouble,
 * most shared among etcd's members (with 3 and a 2 s timeout, 222 ms). With
 * one member there is nothing to go round, and a request given up early is
 * work a loaded etcd did for nothing: the deadline stays whole.
 */
static int64_t op_deadline(const agent_watch *w, const watch_clock *t) {
  int64_t now = base_now_ms(), d = t->last_ok + w->o.lost_after_ms;
  int64_t most = w->o.lost_after_ms / 3 < OP_TIMEOUT_MS ? w->o.lost_after_ms / 3 : OP_TIMEOUT_MS;
  if (rdzv_backend_is_etcd(w->o.backend)) d = now + most; /* silence counts from a failure */
  if (t->failing_since > 0) most /= rdzv_backend_members(w->o.backend);
  if (d < now + OP_MIN_MS || most < OP_MIN_MS) return now + OP_MIN_MS;
  return d < now + most ? d : now + most;
}

/*
 * How often this node puts its count. With etcd, every third of the
 * heartbeat timeout, as often as its lease is kept alive (rdzv/backend.c),
 * rather than every heartbeat period: a counter still moves well within
 * the timeout, and a put is a write through etcd's log (each node's was
 * 2 a second, the most costly of its requests). Node 0 still reads the
 * counters every heartbeat period.
 */
static int64_t beat_period(const agent_watch *w) {
  int64_t third = w->o.lost_after_ms / 3;
  return rdzv_backend_is_etcd(w->o.backend) && third > w->o.heartbeat_ms ? third
                                                                         : w->o.heartbeat_ms;
}

/*
 * How often this node reads the counters it checks: node 0 everyone's
 * every heartbeat period; with etcd, the others node 0's as often as it
 * moves (beat_period), not every heartbeat (a read a node every 500 ms
 * for a counter that moves every 1.7 s by default): node 0's loss is seen
 * at most a beat period after the heartbeat timeout.
 */
static int64_t check_period(const agent_watch *w) {
  return w->o.my_node == 0 ? w->o.heartbeat_ms : beat_period(w);
}

/*
 * Bumps this node's heartbeat when due: puts its count (a put of the whole
 * value, which the etcd client may send again when an answer is lost).
 * With etcd, once: the key lives under this agent's lease, which its
 * keeper renews every third of the heartbeat timeout (rdzv/backend.c), and
 * goes when the lease expires; the checks take its absence for the loss
 * (a count put every third of the timeout was a write through etcd's log
 * a node, beside the renewal, for what the lease already says).
 */
static void beat(agent_watch *w, const char *my_hb, watch_clock *t) {
  if (base_now_ms() < t->next_hb) return;
  char count[32];
  int n = snprintf(count, sizeof count, "%lld", (long long)++t->beats);
  int64_t start = base_now_ms();
  int put = store_set(w->client, my_hb, count, (size_t)n, op_deadline(w, t)) == 0;
  note_answer(t, start, put);
  t->next_hb = base_now_ms() + (t->failing_since > 0 ? WAIT_SLICE_MAX_MS : beat_period(w));
  if (put && rdzv_backend_is_etcd(w->o.backend)) t->next_hb = INT64_MAX;
}

/*
 * Where a slice of the wait on the fail key ends: when the next heartbeat
 * or check is due (one wait a heartbeat period, not one every 200 ms as
 * before), the wait being cut short at the job's end (watch_stop; etcd's
 * too, whose watch is held from one slice to the next: a slice costs etcd
 * nothing). A wait that could not be cut short would last at most
 * WAIT_SLICE_MAX_MS, so that the job's end did not wait out a longer one
 * (32 agents through etcd ended 0.3-0.6 s later with slices of up to
 * 500 ms).
 */
static int64_t slice_end(const agent_watch *w, const watch_clock *t) {
  int64_t now = base_now_ms(), next = t->next_hb < t->next_check ? t->next_hb : t->next_check;
  if (!w->interruptible && next > now + WAIT_SLICE_MAX_MS) next = now + WAIT_SLICE_MAX_MS;
  return next > now + WAIT_SLICE_MIN_MS ? next : now + WAIT_SLICE_MIN_MS;
}

/* One slice of waiting on the fail key: what it saw, with the report in text. */
static int wait_fail_key(agent_watch *w, const char *fail_key, const watch_clock *t, char *text,
                         size_t len) {
  const char *keys[1] = {fail_key};
  int rc = store_wait(w->client, keys, 1, slice_end(w, t));
  /* etcd failing a wait (every member refusing, an election) is lost only when store_silent
   * says so; the built-in store failing one is node 0 gone. */
  if (rc == -ETIMEDOUT || (rc != 0 && rdzv_backend_is_etcd(w->o.backend))) return SEEN_NOTHING;
  if (rc != 0) {
    snprintf(text, len, "node 0 (%s) lost: the rendezvous store stopped answering (%s)",
             w->o.hostnames[0], cohort_strerror(rc));
    return SEEN_STORE_LOST;
  }
  if (read_text(w->client, fail_key, text, len) != 0)
    base_strlcpy(text, "the job failed on another node (its report could not be read)", len);
  return SEEN_FAILURE;
}

static void *watch_main(void *arg) {
  agent_watch *w = arg;
  const watch_opts *o = &w->o;
  char fail_key[STORE_KEY_MAX], my_hb[STORE_KEY_MAX], suffix[64];
  rdzv_key(fail_key, sizeof fail_key, o->job_id, o->round, "fail");
  snprintf(suffix, sizeof suffix, "hb/%d", o->my_node);
  rdzv_key(my_hb, sizeof my_hb, o->job_id, o->round, suffix);
  int64_t now = base_now_ms();
  watch_clock t = {.next_check = now + check_period(w), .last_ok = now};
  char text[WATCH_REPORT_MAX];
  while (!stop_requested(w)) {
    int seen = wait_fail_key(w, fail_key, &t, text, sizeof text);
    if (seen == SEEN_NOTHING) {
      beat(w, my_hb, &t);
      seen = store_silent(w, &t, base_now_ms(), text, sizeof text);
    }
    if (stop_requested(w)) break; /* watch_stop interrupted the wait: no failure */
    if (seen != SEEN_NOTHING) {
      set_failure(w, text, seen == SEEN_STORE_LOST);
      break;
    }
    now = base_now_ms();
    if (now < t.next_check) continue;
    int64_t read_at = 0;
    int checked = check_nodes(w, op_deadline(w, &t), &read_at, text, sizeof text);
    if (checked > 0) {
      set_failure(w, text, 0);
      break;
    }
    note_answer(&t, now, checked < 0 ? 0 : read_at > 0 ? 1 : -1);
    t.next_check = base_now_ms() + (t.failing_since > 0 ? WAIT_SLICE_MAX_MS : check_period(w));
  }
  return NULL;
}

int agent_watch_start(const watch_opts *o, agent_watch **out) {
  *out = NULL;
  agent_watch *w = calloc(1, sizeof *w);
  if (w == NULL) return -ENOMEM;
  w->o = *o;
  pthread_mutex_init(&w->lock, NULL);
  w->last_value = calloc((size_t)o->nnodes, sizeof *w->last_value);
  w->last_change = calloc((size_t)o->nnodes, sizeof *w->last_change);
  int rc = -ENOMEM;
  if (w->last_value == NULL || w->last_change == NULL) goto fail;
  int64_t now = base_now_ms();
  w->last_sweep = now;
  for (int k = 0; k < o->nnodes; k++) {
    w->last_value[k] = -1;
    w->last_change[k] = now;
  }
  /* The store has just answered the join: silent for the heartbeat timeout, it is lost. */
  int64_t patience = o->lost_after_ms > OP_TIMEOUT_MS ? o->lost_after_ms : OP_TIMEOUT_MS;
  rc = rdzv_backend_connect(o->backend, base_deadline_in(patience), &w->client, NULL, 0);
  if (rc != 0) goto fail;
  /* So that watch_stop need not wait out a slice of the wait (etcd's client: it does). */
  w->interruptible = store_client_interruptible(w->client) == 0;
  rc = -pthread_create(&w->thread, NULL, watch_main, w);
  if (rc != 0) goto fail;
  w->started = 1;
  *out = w;
  return 0;
fail:
  store_client_close(w->client);
  free(w->last_value);
  free(w->last_change);
  pthread_mutex_destroy(&w->lock);
  free(w);
  return rc;
}

int agent_watch_failure(agent_watch *w, char *buf, size_t len) {
  if (w == NULL) return 0;
  pthread_mutex_lock(&w->lock);
  int f = w->failed;
  if (f) base_strlcpy(buf, w->report, len);
  pthread_mutex_unlock(&w->lock);
  return f;
}

int agent_watch_store_lost(agent_watch *w) {
  if (w == NULL) return 0;
  pthread_mutex_lock(&w->lock);
  int lost = w->store_lost;
  pthread_mutex_unlock(&w->lock);
  return lost;
}

void agent_watch_stop(agent_watch *w) {
  if (w == NULL) return;
  pthread_mutex_lock(&w->lock);
  w->stop = 1;
  pthread_mutex_unlock(&w->lock);
  store_client_interrupt(w->client);
  if (w->started) pthread_join(w->thread, NULL);
  store_client_close(w->client);
  free(w->last_value);
  free(w->last_change);
  pthread_mutex_destroy(&w->lock);
  free(w);
}

int agent_watch_publish_failure(rdzv_backend *backend, const char *job_id, int round,
                                const char *report, char *winner, size_t winner_len) {
  store_client *c = NULL;
  int rc = rdzv_backend_connect(backend, base_deadline_in(OP_TIMEOUT_MS), &c, NULL, 0);
  if (rc != 0) {
    base_strlcpy(winner, report, winner_len);
    return rc;
  }
  rc = publish(c, job_id, round, report, winner, winner_len);
  store_client_close(c);
  return rc;
}

/*
 * swarm_etcd.c - many simulated nodes meeting through etcd, as `cohort run
 * --rdzv-backend etcd` agents do.
 *
 * The etcd counterpart of swarm.c. Every simulated node is a thread with the
 * agents' own code: an rdzv_backend on etcd (its lease, kept alive by a
 * thread of its own), rdzv_join() with the first joiner planning, then the
 * watch of src/agent/watch.c in etcd mode (waiting on "fail" in slices that
 * end at the next check, the client's watch held between them; it puts
 * its heartbeat key once, under its lease, and reads node 0's every third
 * of its lease's TTL, node 0 everyone's every heartbeat). etcd (Debian's etcd-server)
 * runs as a child process on a loopback port, started and removed here, so
 * that its CPU time, memory and RPC counts can be read. One connection per
 * simulated node (an agent has two: its main thread's and its watcher's).
 *
 * Figures (one line of key=value pairs on stdout, the names of swarm.c):
 *   rendezvous_ms  from the release of all nodes until the last has its plan
 *   hb_cpu_pct     etcd's CPU during `--hold` seconds of heartbeats and waits
 *   hb_req_per_s   the nodes' store calls per second from the start of the
 *                  watches to the failure
 *   etcd_rpc_per_s the RPCs etcd started per second in that window (its
 *                  grpc_server_started_total, from its /metrics: what the
 *                  calls cost it, a wait's watch included); per_node: /N;
 *                  put_per_node_s: those of them that are writes (Put);
 *                  range_, txn_, watch_, keepalive_per_node_s: the reads
 *                  of one key, of several (and a wait's read), the watches
 *                  opened and the lease renewals
 *   cpu_us_per_node_s  etcd's CPU in that window per node and second
 *   fail_max_ms    from the write of the failure until the last node has
 *                  seen it (fail_med_ms: the median node)
 *   rss_b_per_conn etcd's RSS growth from before the nodes connected to the
 *                  end of the hold, per node
 * With --exit 1 or 2, once every node has seen the failure, the nodes end
 * the round as agents whose workers succeeded do (src/agent/cluster.c:
 * done keys, the "ndone" count, "alldone", then leaving), and:
 *   exit_ms        from their release until the last has closed its backend
 *   exit_rpc_per_node  the RPCs etcd started meanwhile, per node (its
 *                  lease's revocation included); exit_put_, exit_range_,
 *                  exit_txn_, exit_watch_per_node as above
 * --exit 1: the leaving of now (each node records it under "alldone"'s
 * lease, the last revokes that lease, nobody waits); --exit 2: as before
 * 8bfaa35 (each node writes its exit key and waits, 3 s at most, until
 * every node's exit key is there or its heartbeat key gone, reading the
 * keys still awaited every 100 ms).
 * A run that does not complete within --timeout prints "incomplete" and
 * exits 1: no figures for it.
 *
 * usage: swarm_etcd [--nodes N] [--hold S] [--timeout S] [--heartbeat MS] [--slice MS]
 *                   [--put MS] [--before 1] [--exit 1|2] [--beat-lease 0|1]
 *
 * As src/agent/watch.c by default: the waits on "fail" last until the next
 * check; a node puts its heartbeat key once (the lease says it is alive),
 * node 0 checks every heartbeat (--heartbeat, 500 ms), the others every
 * third of the lease's TTL (--put). --beat-lease 0: as watch.c before the
 * lease said it, a node puts its count every --put ms too. --before 1: as
 * watch.c before the held watch (d8f85c2): the waits last at most 200 ms
 * and every node checks every heartbeat (built
 * against that tree, whose client reads and watches again every wait, for
 * the figures before). --slice: waits of that many ms.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "rdzv/backend.h"
#include "rdzv/join.h"
#include "store/store.h"

#define JOB "swarm"
#define WAIT_SLICE_MIN_MS 20  /* src/agent/watch.c's */
#define WAIT_SLICE_MAX_MS 200 /* watch.c's before, when etcd's wait could not be cut short */
#define LEASE_MS 5000         /* each node's lease: cohort run's default --heartbeat-timeout */
#define OP_MS 10000

typedef struct swarm_opts {
  int nodes;
  double hold_s;
  int timeout_s;
  int heartbeat_ms;
  int slice_ms;   /* --slice; 0: until the next put or check */
  int put_ms;     /* --put: how often a node puts its count */
  int before;     /* --before 1: watch.c's waits and checks before the held watch */
  int exit;       /* --exit: 0 none, 1 the end of a round as now, 2 as before 8bfaa35 */
  int beat_lease; /* --beat-lease 1: the heartbeat key put once, liveness left to the lease */
} swarm_opts;

/* What the nodes share: the phases, released by the main thread. */
typedef struct swarm {
  swarm_opts o;
  char endpoint[64];
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int phase; /* 0 connect, 1 join, 2 hold (then fail), 3 exit */
  int connected, joined, failures, watched;
  int64_t deadline_ms; /* of the whole run */
  int64_t fail_at;     /* when the failure was written (0: not yet) */
  long calls;          /* store calls during the hold */
  int hold_open;
  int64_t watch_from; /* when the watches began */
} swarm;

typedef struct node {
  swarm *s;
  int index;
  int64_t planned_at, fail_seen_at, left_at;
  int ended; /* --exit: it saw "alldone" */
  pthread_t th;
} node;

static void die(const char *what) {
  fprintf(stderr, "swarm_etcd: %s\n", what);
  exit(2);
}

/* ---- etcd as a child process ---- */

static pid_t etcd_pid;
static char etcd_dir[64];

static int free_port(void) {
  int port = 0;
  return base_free_port("127.0.0.1", &port) == 0 ? port : 0;
}

static void etcd_stop(void) {
  if (etcd_pid > 0) {
    kill(etcd_pid, SIGKILL);
    waitpid(etcd_pid, NULL, 0);
    etcd_pid = 0;
  }
  if (etcd_dir[0] != '\0') {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", etcd_dir);
    if (system(cmd) != 0) fprintf(stderr, "swarm_etcd: cannot remove %s\n", etcd_dir);
  }
}

/* Starts etcd on two free loopback ports; its client endpoint into s->endpoint. */
static void etcd_start(swarm *s) {
  snprintf(etcd_dir, sizeof etcd_dir, "/tmp/cohort-swarm-etcd-XXXXXX");
  if (mkdtemp(etcd_dir) == NULL) die("mkdtemp");
  int cport = free_port(), pport = free_port();
  if (cport == 0 || pport == 0 || cport == pport) die("no free port");
  char curl[64], purl[64], cluster[80], data[96];
  snprintf(curl, sizeof curl, "http://127.0.0.1:%d", cport);
  snprintf(purl, sizeof purl, "http://127.0.0.1:%d", pport);
  snprintf(cluster, sizeof cluster, "s=%s", purl);
  snprintf(data, sizeof data, "%s/data", etcd_dir);
  snprintf(s->endpoint, sizeof s->endpoint, "127.0.0.1:%d", cport);
  etcd_pid = fork();
  if (etcd_pid < 0) die("fork");
  if (etcd_pid == 0) {
    if (freopen("/dev/null", "w", stderr) == NULL || freopen("/dev/null", "w", stdout) == NULL)
      _exit(127);
    execlp("etcd", "etcd", "--name", "s", "--data-dir", data, "--listen-client-urls", curl,
           "--advertise-client-urls", curl, "--listen-peer-urls", purl,
           "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster, (char *)NULL);
    _exit(127);
  }
  atexit(etcd_stop);
}

/* Waits until etcd answers (a put through the client); dies after 30 s. */
static void etcd_ready(const swarm *s) {
  etcd_opts eo = {.endpoints = s->endpoint};
  rdzv_backend *b = NULL;
  store_client *c = NULL;
  char err[256];
  if (rdzv_backend_etcd(&eo, "probe", 5000, &b) != 0) die("backend");
  if (rdzv_backend_connect(b, base_deadline_in(30000), &c, err, sizeof err) != 0) {
    fprintf(stderr, "swarm_etcd: etcd does not answer: %s\n", err);
    exit(2);
  }
  store_client_close(c);
  rdzv_backend_close(b);
}

/* The methods counted apart (etcd's grpc_method names). */
enum { M_PUT, M_RANGE, M_TXN, M_WATCH, M_KEEPALIVE, M_COUNT };
static const char *const method_names[M_COUNT] = {"Put", "Range", "Txn", "Watch", "LeaseKeepAlive"};

/* The RPCs etcd has started (the sum of its grpc_server_started_total counters; by[m] those
 * of method_names[m]), -1 if unread. */
static double etcd_rpcs(const swarm *s, double *by) {
  char cmd[128], line[512];
  snprintf(cmd, sizeof cmd, "curl -s -m 5 http://%s/metrics", s->endpoint);
  FILE *f = popen(cmd, "r");
  if (f == NULL) return -1;
  double total = 0;
  int seen = 0;
  for (int m = 0; m < M_COUNT; m++) by[m] = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, "grpc_server_started_total{", 26) != 0) continue;
    const char *v = strrchr(line, ' ');
    if (v == NULL) continue;
    total += atof(v + 1), seen = 1;
    for (int m = 0; m < M_COUNT; m++) {
      char want[64];
      snprintf(want, sizeof want, "grpc_method=\"%s\"", method_names[m]);
      if (strstr(line, want) != NULL) by[m] += atof(v + 1);
    }
  }
  return pclose(f) == 0 && seen ? total : -1;
}

/* /proc/PID/stat's utime + stime, in clock ticks; and VmRSS in KiB. */
static long proc_ticks(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  long ut = 0, st = 0;
  if (p == NULL ||
      sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &ut, &st) != 2)
    return -1;
  return ut + st;
}

static long proc_rss_kib(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kib = -1;
  while (f != NULL && fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "VmRSS: %ld", &kib) == 1) break;
  if (f != NULL) fclose(f);
  return kib;
}

/* ---- one simulated node ---- */

static void wait_phase(swarm *s, int phase) {
  pthread_mutex_lock(&s->lock);
  while (s->phase < phase) pthread_cond_wait(&s->cond, &s->lock);
  pthread_mutex_unlock(&s->lock);
}

static void bump(swarm *s, int *counter) {
  pthread_mutex_lock(&s->lock);
  (*counter)++;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

static int join(node *n, store_client *c) {
  swarm *s = n->s;
  rdzv_join_opts jo = {.job_id = JOB,
                       .round = 0,
                       .claimed_rank = -1,
                       .nproc = 1,
                       .nnodes_min = s->o.nodes,
                       .nnodes_max = s->o.nodes,
                       .first_plans = 1,
                       .store_port = 1,
                       .my_host = "127.0.0.1",
                       .deadline_ms = s->deadline_ms};
  rdzv_plan plan;
  char err[256] = "";
  int rc = rdzv_join(c, &jo, &plan, err, sizeof err);
  if (rc != 0) {
    fprintf(stderr, "swarm_etcd: node %d: join: %s\n", n->index, err[0] ? err : strerror(-rc));
    return rc;
  }
  n->planned_at = base_now_ms();
  int me = plan.my_index;
  rdzv_plan_free(&plan);
  return me;
}

/* Node 0 reads everyone's counter, the others node 0's (watch.c's check_nodes). Calls made. */
static long check(node *n, store_client *c, int me, const char *const *hb, void **vals,
                  size_t *lens) {
  size_t k = me == 0 ? (size_t)n->s->o.nodes : 1;
  if (store_get_many(c, hb, k, vals, lens, base_deadline_in(OP_MS)) == 0)
    for (size_t i = 0; i < k; i++) free(vals[i]);
  return 1;
}

/* Where this slice of the wait on "fail" ends: --slice, or the next put or check. */
static int64_t slice_end(const swarm *s, int64_t next_put, int64_t next_check) {
  if (s->o.slice_ms > 0) return base_deadline_in(s->o.slice_ms);
  int64_t next = next_put < next_check ? next_put : next_check;
  if (s->o.before && next > base_deadline_in(WAIT_SLICE_MAX_MS))
    next = base_deadline_in(WAIT_SLICE_MAX_MS);
  return next > base_deadline_in(WAIT_SLICE_MIN_MS) ? next : base_deadline_in(WAIT_SLICE_MIN_MS);
}

/* The watch until the failure is seen or the run's deadline passes. */
static void watch(node *n, store_client *c, int me) {
  swarm *s = n->s;
  int nn = s->o.nodes;
  char fail_key[STORE_KEY_MAX], **hbk = calloc((size_t)nn, sizeof *hbk);
  void **vals = calloc((size_t)nn, sizeof *vals);
  size_t *lens = calloc((size_t)nn, sizeof *lens);
  if (hbk == NULL || vals == NULL || lens == NULL) die("out of memory");
  for (int k = 0; k < nn; k++) {
    char suffix[32];
    snprintf(suffix, sizeof suffix, "hb/%d", k);
    hbk[k] = malloc(STORE_KEY_MAX);
    if (hbk[k] == NULL) die("out of memory");
    rdzv_key(hbk[k], STORE_KEY_MAX, JOB, 0, suffix);
  }
  rdzv_key(fail_key, sizeof fail_key, JOB, 0, "fail");
  const char *keys[1] = {fail_key};
  /* watch.c's check_period: node 0 every heartbeat, the others as often as node 0 puts */
  int check_ms = me == 0 || s->o.before ? s->o.heartbeat_ms : s->o.put_ms;
  int64_t next_put = 0, next_check = base_deadline_in(check_ms), beats = 0;
  long calls = 0;
  while (base_deadline_left(s->deadline_ms) > 0) {
    int rc = store_wait(c, keys, 1, slice_end(s, next_put, next_check));
    calls++;
    if (rc == 0) {
      n->fail_seen_at = base_now_ms();
      break;
    }
    if (base_now_ms() >= next_put) { /* watch.c's beat: a put of its count */
      char text[32];
      int len = snprintf(text, sizeof text, "%lld", (long long)++beats);
      int put = store_set(c, hbk[me], text, (size_t)len, base_deadline_in(OP_MS));
      calls++;
      /* --beat-lease 1: put once; the lease says the node is alive */
      next_put = s->o.beat_lease && put == 0 ? INT64_MAX : base_now_ms() + s->o.put_ms;
    }
    if (base_now_ms() >= next_check) {
      calls += check(n, c, me, (const char *const *)hbk, vals, lens);
      next_check = base_now_ms() + check_ms;
    }
  }
  pthread_mutex_lock(&s->lock);
  s->calls += calls;
  pthread_mutex_unlock(&s->lock);
  for (int k = 0; k < nn; k++) free(hbk[k]);
  free(hbk);
  free(vals);
  free(lens);
}

/* ---- the end of the round (--exit) ---- */

/* Keys "swarm/0/<what>/<k>" for every node k (malloc'ed, freed with free_keys). */
static char **round_keys(int nn, const char *what) {
  char **k = calloc((size_t)nn, sizeof *k);
  if (k == NULL) die("out of memory");
  for (int i = 0; i < nn; i++) {
    char suffix[64];
    snprintf(suffix, sizeof suffix, "%s/%d", what, i);
    if ((k[i] = malloc(STORE_KEY_MAX)) == NULL) die("out of memory");
    rdzv_key(k[i], STORE_KEY_MAX, JOB, 0, suffix);
  }
  return k;
}

static void free_keys(char **k, int nn) {
  for (int i = 0; i < nn; i++) free(k[i]);
  free(k);
}

/* From keys[from] on, the first absent (n when none) in one read; -1 when etcd did not answer
 * (cluster.c's first_absent). */
static int first_absent(store_client *c, char **keys, int from, int n) {
  int m = n - from, there = 0;
  void **vals = calloc((size_t)m, sizeof *vals);
  size_t *lens = calloc((size_t)m, sizeof *lens);
  if (vals == NULL || lens == NULL) die("out of memory");
  int rc = store_get_many(c, (const char *const *)keys + from, (size_t)m, vals, lens,
                          base_deadline_in(OP_MS));
  while (rc == 0 && there < m && vals[there] != NULL) there++;
  for (int i = 0; rc == 0 && i < m; i++) free(vals[i]);
  free(vals);
  free(lens);
  return rc != 0 ? -1 : from + there;
}

/* cluster.c's agent_cluster_wait_done: the done key, the count, "alldone" by the last (on a
 * lease of its own now, its own lease before), a wait on "alldone" in 200 ms turns; 1 once it
 * was seen. */
static int wait_all_done(swarm *s, rdzv_backend *b, store_client *c, int me, const char *all) {
  int nn = s->o.nodes;
  char **done = round_keys(nn, "done"), count[STORE_KEY_MAX];
  rdzv_key(count, sizeof count, JOB, 0, "ndone");
  int64_t mine = 0;
  int announced = 0, seen = 0;
  while (!seen && base_deadline_left(s->deadline_ms) > 0) {
    int64_t dl = base_deadline_in(OP_MS);
    if (mine == 0 && store_set(c, done[me], "1", 1, dl) == 0 &&
        store_add(c, count, 1, &mine, dl) != 0)
      mine = 0;
    if (mine >= nn && !announced && first_absent(c, done, 0, nn) == nn)
      announced = (s->o.exit == 2 || rdzv_backend_linger(b, c, NULL, 60000) == 0) &&
                  store_set(c, all, "1", 1, dl) == 0;
    seen = store_wait(c, &all, 1, base_deadline_in(200)) == 0;
  }
  free_keys(done, nn);
  return seen;
}

/* cluster.c's leave_etcd: the leaving recorded under "alldone"'s lease, no wait. */
static void leave_now(swarm *s, rdzv_backend *b, store_client *c, int me, const char *all) {
  int nn = s->o.nodes;
  char **left = round_keys(nn, "left"), count[STORE_KEY_MAX];
  rdzv_key(count, sizeof count, JOB, 0, "nleft");
  int64_t dl = base_deadline_in(OP_MS), n = 0;
  if (rdzv_backend_linger(b, c, all, 0) == 0 && store_set(c, left[me], "1", 1, dl) == 0 &&
      store_add(c, count, 1, &n, dl) == 0 && n >= nn && first_absent(c, left, 0, nn) == nn)
    rdzv_backend_linger_end(b, c, dl);
  free_keys(left, nn);
}

/* cluster.c's wait_nodes_left before 8bfaa35: the exit key, then until every node's exit key
 * is there or its heartbeat key gone (3 s at most). */
static void leave_before(swarm *s, store_client *c, int me) {
  int nn = s->o.nodes;
  char **exits = round_keys(nn, "exit"), **hb = round_keys(nn, "hb");
  store_set(c, exits[me], "1", 1, base_deadline_in(2000));
  int64_t deadline = base_deadline_in(3000);
  for (int from = 0; base_deadline_left(deadline) > 0;) {
    if ((from = first_absent(c, exits, from, nn)) < 0 || from == nn) break;
    void *v = NULL;
    size_t len = 0;
    if (store_get(c, hb[from], &v, &len, deadline) == -ENOENT)
      from++;
    else
      store_wait(c, (const char *const *)exits + from, 1, base_deadline_in(100));
    free(v);
  }
  free_keys(exits, nn);
  free_keys(hb, nn);
}

static void end_round(node *n, rdzv_backend *b, store_client *c, int me) {
  char all[STORE_KEY_MAX];
  rdzv_key(all, sizeof all, JOB, 0, "alldone");
  n->ended = wait_all_done(n->s, b, c, me, all);
  if (!n->ended) return;
  if (n->s->o.exit == 1)
    leave_now(n->s, b, c, me, all);
  else
    leave_before(n->s, c, me);
}

static void *node_main(void *arg) {
  node *n = arg;
  swarm *s = n->s;
  etcd_opts eo = {.endpoints = s->endpoint};
  rdzv_backend *b = NULL;
  store_client *c = NULL;
  char err[256];
  int ok = rdzv_backend_etcd(&eo, JOB, LEASE_MS, &b) == 0 &&
           rdzv_backend_connect(b, s->deadline_ms, &c, err, sizeof err) == 0;
  if (!ok) bump(s, &s->failures);
  bump(s, &s->connected);
  wait_phase(s, 1);
  int me = ok ? join(n, c) : -1;
  if (me < 0 && ok) bump(s, &s->failures);
  bump(s, &s->joined);
  wait_phase(s, 2);
  if (me >= 0) watch(n, c, me);
  if (s->o.exit > 0) {
    bump(s, &s->watched);
    wait_phase(s, 3);
    if (me >= 0 && n->fail_seen_at > 0) end_round(n, b, c, me);
  }
  store_client_close(c);
  rdzv_backend_close(b);
  n->left_at = base_now_ms();
  return NULL;
}

/* ---- the run ---- */

static void set_phase(swarm *s, int phase) {
  pthread_mutex_lock(&s->lock);
  s->phase = phase;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

/* Waits until *counter reaches s->o.nodes or the deadline; 0 or -ETIMEDOUT. */
static int wait_count(swarm *s, int *counter) {
  pthread_mutex_lock(&s->lock);
  while (*counter < s->o.nodes && base_deadline_left(s->deadline_ms) > 0) {
    pthread_mutex_unlock(&s->lock);
    base_sleep_ms(5);
    pthread_mutex_lock(&s->lock);
  }
  int rc = *counter < s->o.nodes ? -ETIMEDOUT : 0;
  pthread_mutex_unlock(&s->lock);
  return rc;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Writes the failure through a backend of its own, kept (with its lease, which the key
 * lives under) until every node has seen it; the time it was written. */
static int64_t write_failure(swarm *s, rdzv_backend **b, store_client **c) {
  etcd_opts eo = {.endpoints = s->endpoint};
  char err[256], key[STORE_KEY_MAX];
  if (rdzv_backend_etcd(&eo, JOB, 5000, b) != 0 ||
      rdzv_backend_connect(*b, s->deadline_ms, c, err, sizeof err) != 0)
    die("cannot connect to write the failure");
  rdzv_key(key, sizeof key, JOB, 0, "fail");
  int64_t t0 = base_now_ms();
  if (store_set(*c, key, "x", 1, base_deadline_in(OP_MS)) != 0) die("cannot write the failure");
  return t0;
}

static void parse_args(int argc, char **argv, swarm_opts *o) {
  *o = (swarm_opts){.nodes = 64,
                    .hold_s = 3,
                    .timeout_s = 120,
                    .heartbeat_ms = 500,
                    .put_ms = LEASE_MS / 3,
                    .beat_lease = 1};
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *a = argv[i], *v = argv[i + 1];
    int64_t ms;
    if (strcmp(a, "--nodes") == 0 && base_parse_int(v, 2, 65536, &o->nodes) == 0) continue;
    if (strcmp(a, "--hold") == 0 && base_parse_seconds(v, 3600, &ms) == 0) {
      o->hold_s = (double)ms / 1000.0;
      continue;
    }
    if (strcmp(a, "--timeout") == 0 && base_parse_int(v, 1, 3600, &o->timeout_s) == 0) continue;
    if (strcmp(a, "--heartbeat") == 0 && base_parse_int(v, 10, 60000, &o->heartbeat_ms) == 0)
      continue;
    if (strcmp(a, "--slice") == 0 && base_parse_int(v, 1, 60000, &o->slice_ms) == 0) continue;
    if (strcmp(a, "--put") == 0 && base_parse_int(v, 10, 60000, &o->put_ms) == 0) continue;
    if (strcmp(a, "--before") == 0 && base_parse_int(v, 0, 1, &o->before) == 0) continue;
    if (strcmp(a, "--exit") == 0 && base_parse_int(v, 0, 2, &o->exit) == 0) continue;
    if (strcmp(a, "--beat-lease") == 0 && base_parse_int(v, 0, 1, &o->beat_lease) == 0) continue;
    fprintf(stderr, "swarm_etcd: bad option %s %s\n", a, v);
    exit(2);
  }
  if (argc % 2 == 0)
    die("usage: swarm_etcd [--nodes N] [--hold S] [--timeout S] [--heartbeat MS] [--slice MS] "
        "[--put MS] [--before 1] [--exit 1|2] [--beat-lease 0|1]");
}

static void print_figures(swarm *s, node *nodes, int64_t released, int64_t fail_at, double cpu,
                          double rpc_s, const double *by_s, double rss_per) {
  int nn = s->o.nodes;
  int64_t last_plan = 0, *fail = malloc((size_t)nn * sizeof *fail);
  if (fail == NULL) die("out of memory");
  for (int i = 0; i < nn; i++) {
    if (nodes[i].planned_at > last_plan) last_plan = nodes[i].planned_at;
    fail[i] = nodes[i].fail_seen_at - fail_at;
  }
  qsort(fail, (size_t)nn, sizeof *fail, cmp_i64);
  printf("nodes=%d rendezvous_ms=%lld hb_cpu_pct=%.1f hb_req_per_s=%.0f etcd_rpc_per_s=%.0f "
         "etcd_rpc_per_node_s=%.2f put_per_node_s=%.2f range_per_node_s=%.2f "
         "txn_per_node_s=%.2f watch_per_node_s=%.2f keepalive_per_node_s=%.2f "
         "cpu_us_per_node_s=%.0f fail_max_ms=%lld fail_med_ms=%lld rss_b_per_conn=%.0f "
         "rss_b_per_node=%.0f",
         nn, (long long)(last_plan - released), cpu,
         (double)s->calls * 1000.0 / (double)(fail_at - s->watch_from), rpc_s, rpc_s / nn,
         by_s[M_PUT] / nn, by_s[M_RANGE] / nn, by_s[M_TXN] / nn, by_s[M_WATCH] / nn,
         by_s[M_KEEPALIVE] / nn, cpu * 1e4 / nn, (long long)fail[nn - 1], (long long)fail[nn / 2],
         rss_per, rss_per);
  free(fail);
  if (s->o.exit == 0) printf("\n");
}

int main(int argc, char **argv) {
  swarm s;
  memset(&s, 0, sizeof s);
  parse_args(argc, argv, &s.o);
  pthread_mutex_init(&s.lock, NULL);
  pthread_cond_init(&s.cond, NULL);
  s.deadline_ms = base_deadline_in((int64_t)s.o.timeout_s * 1000);
  signal(SIGPIPE, SIG_IGN);
  etcd_start(&s);
  etcd_ready(&s);
  long rss0 = proc_rss_kib(etcd_pid);
  int nn = s.o.nodes;
  node *nodes = calloc((size_t)nn, sizeof *nodes);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  for (int i = 0; i < nn; i++) {
    nodes[i] = (node){.s = &s, .index = i};
    if (pthread_create(&nodes[i].th, &attr, node_main, &nodes[i]) != 0) die("pthread_create");
  }
  int rc = wait_count(&s, &s.connected);
  int64_t released = base_now_ms();
  set_phase(&s, 1);
  if (rc == 0) rc = wait_count(&s, &s.joined);
  set_phase(&s, 2);
  s.watch_from = base_now_ms();
  base_sleep_ms(1000); /* the nodes' first heartbeats: the watches are all set up */
  long t0 = proc_ticks(etcd_pid);
  double p0[M_COUNT], p1[M_COUNT], r0 = etcd_rpcs(&s, p0);
  int64_t h0 = base_now_ms();
  base_sleep_ms((int64_t)(s.o.hold_s * 1000));
  long t1 = proc_ticks(etcd_pid), rss1 = proc_rss_kib(etcd_pid);
  double r1 = etcd_rpcs(&s, p1), held = (double)(base_now_ms() - h0) / 1000.0;
  rdzv_backend *fb = NULL;
  store_client *fc = NULL;
  int64_t fail_at = rc == 0 && s.failures == 0 ? write_failure(&s, &fb, &fc) : 0;
  double x0[M_COUNT], x1[M_COUNT], rx0 = 0, rx1 = 0;
  int64_t exit_from = 0, exit_to = 0;
  if (s.o.exit > 0) { /* every node has seen the failure: the end of the round */
    if (rc == 0) rc = wait_count(&s, &s.watched);
    rx0 = etcd_rpcs(&s, x0);
    exit_from = base_now_ms();
    set_phase(&s, 3);
  }
  for (int i = 0; i < nn; i++) pthread_join(nodes[i].th, NULL);
  int ended = 0;
  for (int i = 0; i < nn; i++) {
    ended += nodes[i].ended;
    if (nodes[i].left_at > exit_to) exit_to = nodes[i].left_at;
  }
  if (s.o.exit > 0) rx1 = etcd_rpcs(&s, x1);
  store_client_close(fc);
  rdzv_backend_close(fb);
  int seen = 0;
  for (int i = 0; i < nn; i++) seen += nodes[i].fail_seen_at > 0;
  if (rc != 0 || s.failures > 0 || seen < nn || t0 < 0 || t1 < 0 || r0 < 0 || r1 < 0 ||
      (s.o.exit > 0 && (ended < nn || rx0 < 0 || rx1 < 0))) {
    printf("incomplete: %d of %d joined, %d failed, %d saw the failure, %d saw alldone", s.joined,
           nn, s.failures, seen, ended);
    /* nodes that never saw "alldone" (--exit 2: it went with its writer's lease) wait on it
     * with a held watch, which costs no request: what the others' exit cost is still told */
    if (s.o.exit > 0 && seen == nn && rx0 >= 0 && rx1 >= 0)
      printf(" (the exit so far: rpc_per_node=%.2f)", (rx1 - rx0) / nn);
    printf("\n");
    return 1;
  }
  double cpu = 100.0 * (double)(t1 - t0) / (double)sysconf(_SC_CLK_TCK) / held;
  double by_s[M_COUNT];
  for (int m = 0; m < M_COUNT; m++) by_s[m] = (p1[m] - p0[m]) / held;
  print_figures(&s, nodes, released, fail_at, cpu, (r1 - r0) / held, by_s,
                (double)(rss1 - rss0) * 1024.0 / nn);
  if (s.o.exit > 0)
    printf(" exit_ms=%lld exit_rpc_per_node=%.2f exit_put_per_node=%.2f exit_range_per_node=%.2f "
           "exit_txn_per_node=%.2f exit_watch_per_node=%.2f\n",
           (long long)(exit_to - exit_from), (rx1 - rx0) / nn, (x1[M_PUT] - x0[M_PUT]) / nn,
           (x1[M_RANGE] - x0[M_RANGE]) / nn, (x1[M_TXN] - x0[M_TXN]) / nn,
           (x1[M_WATCH] - x0[M_WATCH]) / nn);
  free(nodes);
  return 0;
}

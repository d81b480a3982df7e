/*
 * test_etcd.c - the etcd client (src/rdzv/etcd.c) against a real etcd that
 * tests/test_etcd.sh starts on loopback.
 *
 * usage: test_etcd basic ENDPOINTS        every operation, counters from forked processes
 *        test_etcd failover ENDPOINTS     the first endpoint dead: requests go to the others
 *        test_etcd auth ENDPOINTS USER PASSWORD   right and wrong passwords
 *        test_etcd tls ENDPOINTS CA CERT KEY      HTTPS with a client certificate, and without
 *        test_etcd down ENDPOINTS         nothing listens: one line, within the deadline
 *        test_etcd hung ENDPOINTS PID     etcd PID stopped: a lost backend closes at once
 *        test_etcd replay -               waits against a fake etcd on loopback (no etcd
 *                                         needed): a wait's watch is held for the next
 *                                         wait, which sees what it reports
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "cohort/cohort.h"
#include "rdzv/backend.h"
#include "rdzv/etcd.h"
#include "store/store.h"
#include "tests/check.h"

static char prefix[64];

static etcd *open_or_die(const etcd_opts *o) {
  char err[512];
  etcd *e = NULL;
  int rc = etcd_connect(o, base_deadline_in(10000), &e, err, sizeof err);
  if (rc != 0) {
    fprintf(stderr, "connect: %s\n", err);
    exit(1);
  }
  return e;
}

static int value_is(etcd *e, const char *key, const char *want) {
  void *v = NULL;
  size_t n = 0;
  int rc = etcd_get(e, key, &v, &n, base_deadline_in(5000));
  int ok = rc == 0 && n == strlen(want) && memcmp(v, want, n) == 0;
  if (!ok)
    fprintf(stderr, "  %s: rc %d, '%.*s' (want '%s')\n", key, rc, (int)n, v ? (char *)v : "", want);
  free(v);
  return ok;
}

static void test_kv(etcd *e) {
  int64_t d = base_deadline_in(5000);
  void *v = NULL;
  size_t n = 0;
  CHECK(etcd_get(e, "absent", &v, &n, d) == -ENOENT);
  CHECK(etcd_put(e, "a", "one", 3, 0, d) == 0 && value_is(e, "a", "one"));
  CHECK(etcd_put(e, "empty", "", 0, 0, d) == 0 && value_is(e, "empty", ""));
  unsigned char bin[256];
  for (int i = 0; i < 256; i++) bin[i] = (unsigned char)i;
  CHECK(etcd_put(e, "bin", bin, sizeof bin, 0, d) == 0);
  CHECK(etcd_get(e, "bin", &v, &n, d) == 0 && n == 256 && memcmp(v, bin, 256) == 0);
  free(v);
  /* get_many over more keys than one transaction holds */
  const char *keys[300];
  char names[300][16];
  for (int i = 0; i < 300; i++) {
    snprintf(names[i], sizeof names[i], "m%d", i);
    keys[i] = names[i];
    if (i % 3 == 0) etcd_put(e, names[i], names[i], strlen(names[i]), 0, d);
  }
  void *vals[300];
  size_t lens[300];
  CHECK(etcd_get_many(e, keys, 300, vals, lens, base_deadline_in(10000)) == 0);
  int right = 1;
  for (int i = 0; i < 300; i++) {
    if (i % 3 == 0)
      right &=
          vals[i] != NULL && lens[i] == strlen(names[i]) && !memcmp(vals[i], names[i], lens[i]);
    else
      right &= vals[i] == NULL && lens[i] == 0;
    free(vals[i]);
  }
  CHECK(right);
  CHECK(etcd_delete(e, "a", d) == 0 && etcd_get(e, "a", &v, &n, d) == -ENOENT);
  CHECK(etcd_delete(e, "a", d) == -ENOENT);
}

static void test_cas(etcd *e) {
  int64_t d = base_deadline_in(5000);
  void *cur = NULL;
  size_t len = 0;
  CHECK(etcd_cas(e, "c", NULL, 0, "first", 5, 0, &cur, &len, d) == 0);
  CHECK(cur != NULL && len == 5 && memcmp(cur, "first", 5) == 0);
  free(cur);
  CHECK(etcd_cas(e, "c", NULL, 0, "second", 6, 0, &cur, &len, d) == 0);
  CHECK(cur != NULL && len == 5 && memcmp(cur, "first", 5) == 0); /* not replaced */
  free(cur);
  CHECK(etcd_cas(e, "c", "wrong", 5, "x", 1, 0, &cur, &len, d) == 0 && len == 5);
  free(cur);
  CHECK(etcd_cas(e, "c", "first", 5, "third", 5, 0, NULL, NULL, d) == 0 &&
        value_is(e, "c", "third"));
}

/* Counters: reads, additions, refusals; 4 processes x 25 additions each on top of 5 come
 * to exactly 105; a deleted counter starts again. */
static void test_add(const etcd_opts *o) {
  etcd *e = open_or_die(o);
  int64_t r = -1;
  CHECK(etcd_add(e, "n", 0, 0, &r, base_deadline_in(5000)) == 0 && r == 0);
  CHECK(etcd_add(e, "n", 5, 0, &r, base_deadline_in(5000)) == 0 && r == 5);
  CHECK(etcd_add(e, "n", 0, 0, &r, base_deadline_in(5000)) == 0 && r == 5);
  CHECK(value_is(e, "n", "5")); /* a counter reads as its count */
  CHECK(etcd_add(e, "n", -1, 0, &r, base_deadline_in(5000)) == -EINVAL);
  CHECK(etcd_add(e, "n", ETCD_ADD_MAX + 1, 0, &r, base_deadline_in(5000)) == -EINVAL);
  CHECK(etcd_add(e, "gone", 3, 0, &r, base_deadline_in(5000)) == 0 && r == 3);
  CHECK(etcd_delete(e, "gone", base_deadline_in(5000)) == 0);
  CHECK(etcd_add(e, "gone", 1, 0, &r, base_deadline_in(5000)) == 0 && r == 1);
  etcd_close(e);
  pid_t kids[4];
  for (int k = 0; k < 4; k++) {
    if ((kids[k] = fork()) == 0) {
      etcd *c = open_or_die(o);
      int bad = 0;
      for (int i = 0; i < 25; i++)
        bad |= etcd_add(c, "n", 1, 0, NULL, base_deadline_in(20000)) != 0;
      etcd_close(c);
      _exit(bad);
    }
  }
  int all_ok = 1;
  for (int k = 0; k < 4; k++) {
    int st = 0;
    waitpid(kids[k], &st, 0);
    all_ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  CHECK(all_ok);
  e = open_or_die(o);
  CHECK(etcd_add(e, "n", 0, 0, &r, base_deadline_in(5000)) == 0 && r == 105);
  CHECK(value_is(e, "n", "105"));
  etcd_close(e);
}

static void test_wait(const etcd_opts *o) {
  etcd *e = open_or_die(o);
  const char *keys[] = {"w1", "w2"};
  CHECK(etcd_wait(e, keys, 2, base_deadline_in(300)) == -ETIMEDOUT);
  pid_t kid = fork();
  if (kid == 0) {
    etcd *c = open_or_die(o);
    base_sleep_ms(300);
    etcd_put(c, "w1", "1", 1, 0, base_deadline_in(5000));
    base_sleep_ms(200);
    etcd_put(c, "w2", "2", 1, 0, base_deadline_in(5000));
    etcd_close(c);
    _exit(0);
  }
  int64_t t0 = base_now_ms();
  CHECK(etcd_wait(e, keys, 2, base_deadline_in(10000)) == 0);
  CHECK(base_now_ms() - t0 >= 450); /* not before the second key existed */
  waitpid(kid, NULL, 0);
  etcd_close(e);
}

/* A key under a lease lives while it is kept alive and goes with it. */
static void test_lease(etcd *e) {
  int64_t id = 0, id2 = 0;
  CHECK(etcd_lease_grant(e, 2, &id, base_deadline_in(5000)) == 0 && id != 0);
  CHECK(etcd_put(e, "leased", "x", 1, id, base_deadline_in(5000)) == 0);
  for (int i = 0; i < 6; i++) { /* 3 s, longer than the TTL */
    base_sleep_ms(500);
    CHECK(etcd_lease_keepalive(e, id, base_deadline_in(5000)) == 0);
  }
  CHECK(value_is(e, "leased", "x"));
  CHECK(etcd_lease_revoke(e, id, base_deadline_in(5000)) == 0);
  void *v = NULL;
  size_t n;
  CHECK(etcd_get(e, "leased", &v, &n, base_deadline_in(5000)) == -ENOENT);
  CHECK(etcd_lease_keepalive(e, id, base_deadline_in(5000)) == -ENOENT);
  /* A write under the lease gone: -ENOENT, and etcd's own words (not "malformed data"). */
  CHECK_EQ_INT(etcd_put(e, "leased", "x", 1, id, base_deadline_in(5000)), -ENOENT);
  CHECK(strstr(etcd_error(e), "requested lease not found") != NULL);
  /* Left alone, it expires and takes its key. */
  CHECK(etcd_lease_grant(e, 1, &id2, base_deadline_in(5000)) == 0);
  CHECK(etcd_put(e, "leased2", "y", 1, id2, base_deadline_in(5000)) == 0);
  int gone = 0;
  for (int i = 0; i < 40 && !gone; i++) {
    base_sleep_ms(250);
    gone = etcd_get(e, "leased2", &v, &n, base_deadline_in(5000)) == -ENOENT;
    if (!gone) free(v);
  }
  CHECK(gone);
  CHECK(etcd_lease_keepalive(e, id2, base_deadline_in(5000)) == -ENOENT);
}

/* The key's lease, 0 when absent or unreadable. */
static int64_t lease_at(etcd *e, const char *key) {
  int64_t lease = 0;
  return etcd_lease_of(e, key, &lease, base_deadline_in(5000)) == 0 ? lease : 0;
}

/*
 * A guest (cohort stop, stacks) grants no lease: what it writes takes the
 * lease of the anchor an agent's backend wrote, and goes when that agent
 * closes its backend.
 */
static void test_guest(const etcd_opts *o) {
  char job[64], pfx[96], err[512] = "";
  snprintf(job, sizeof job, "guest-%d", (int)getpid());
  snprintf(pfx, sizeof pfx, "/cohort/%s/", job);
  etcd_opts eo = *o, po = *o;
  eo.prefix = NULL;
  po.prefix = pfx;
  etcd *e = open_or_die(&po);
  rdzv_backend *agent = NULL, *guest = NULL;
  store_client *ac = NULL, *gc = NULL;
  int64_t count = 0, dl = base_deadline_in(10000);
  CHECK(rdzv_backend_etcd_guest(&eo, job, "", &guest) == -EINVAL);
  CHECK(rdzv_backend_etcd(&eo, job, 5000, &agent) == 0);
  CHECK(rdzv_backend_etcd_guest(&eo, job, "anchor", &guest) == 0);
  CHECK(rdzv_backend_connect(guest, dl, &gc, err, sizeof err) == 0);
  CHECK(store_set(gc, "early", "1", 1, dl) == -ENOENT); /* no anchor yet: nothing written */
  CHECK(lease_at(e, "early") == 0);
  CHECK(rdzv_backend_connect(agent, dl, &ac, err, sizeof err) == 0);
  CHECK(store_set(ac, "anchor", "a", 1, dl) == 0);
  CHECK(store_set(gc, "stop", "s", 1, dl) == 0);
  CHECK(store_cas(gc, "fail", NULL, 0, "f", 1, NULL, NULL, dl) == 0);
  CHECK(store_add(gc, "counter", 1, &count, dl) == 0 && count == 1);
  int64_t mine = lease_at(e, "anchor");
  CHECK(mine != 0);
  CHECK(lease_at(e, "stop") == mine && lease_at(e, "fail") == mine);
  CHECK(lease_at(e, "counter") == mine);
  store_client_close(ac);
  rdzv_backend_close(agent); /* revokes its lease: the guest's keys go too */
  CHECK(lease_at(e, "stop") == 0 && lease_at(e, "fail") == 0 && lease_at(e, "counter") == 0);
  CHECK(store_set(gc, "late", "1", 1, dl) == -ENOENT);
  store_client_close(gc);
  rdzv_backend_close(guest);
  /* An agent whose lease is gone (expired under a busy etcd, here revoked behind its back):
   * its writes fail, and the store client says why in etcd's words. */
  CHECK(rdzv_backend_etcd(&eo, job, 5000, &agent) == 0);
  CHECK(rdzv_backend_connect(agent, dl, &ac, err, sizeof err) == 0);
  CHECK(store_set(ac, "mine", "1", 1, dl) == 0);
  CHECK(etcd_lease_revoke(e, lease_at(e, "mine"), dl) == 0);
  CHECK_EQ_INT(store_set(ac, "mine", "2", 1, dl), -ENOENT);
  CHECK(strstr(store_client_error(ac), "etcdserver: requested lease not found") != NULL);
  store_client_close(ac);
  rdzv_backend_close(agent);
  etcd_close(e);
}

/* Two jobs with their own prefixes do not see each other's keys. */
static void test_prefix(const etcd_opts *o) {
  etcd_opts other = *o;
  other.prefix = "/cohort/other-job/";
  etcd *a = open_or_die(o), *b = open_or_die(&other);
  void *v = NULL;
  size_t n;
  etcd_put(a, "mine", "1", 1, 0, base_deadline_in(5000));
  CHECK(etcd_get(b, "mine", &v, &n, base_deadline_in(5000)) == -ENOENT);
  etcd_close(a);
  etcd_close(b);
}

static int basic(const etcd_opts *o) {
  etcd *e = open_or_die(o);
  test_kv(e);
  test_cas(e);
  test_lease(e);
  etcd_close(e);
  test_add(o);
  test_wait(o);
  test_prefix(o);
  test_guest(o);
  return check_report();
}

/* The first endpoint is dead: every operation still works, on the next one. */
static int failover(const etcd_opts *o) {
  etcd *e = open_or_die(o);
  CHECK(strcmp(etcd_endpoint(e), o->endpoints) != 0);
  test_kv(e);
  test_cas(e);
  etcd_close(e);
  return check_report();
}

static int auth(const etcd_opts *o, const char *user, const char *password) {
  etcd_opts ok = *o, wrong = *o, none = *o;
  ok.user = wrong.user = user;
  ok.password = password;
  wrong.password = "not-the-password";
  char err[512] = "";
  etcd *e = NULL;
  int rc = etcd_connect(&wrong, base_deadline_in(5000), &e, err, sizeof err);
  CHECK(rc == COHORT_EAUTH);
  CHECK(strstr(err, "etcd ") == err && strchr(err, '\n') == NULL);
  fprintf(stderr, "wrong password: %s\n", err);
  rc = etcd_connect(&none, base_deadline_in(5000), &e, err, sizeof err);
  CHECK(rc == COHORT_EAUTH);
  fprintf(stderr, "no user: %s\n", err);
  e = open_or_die(&ok);
  test_kv(e);
  test_cas(e);
  etcd_close(e);
  return check_report();
}

static int tls(const etcd_opts *o, const char *ca, const char *cert, const char *key) {
  etcd_opts good = *o, nocert = *o;
  good.cacert = nocert.cacert = ca;
  good.cert = cert;
  good.key = key;
  etcd *e = open_or_die(&good);
  test_kv(e);
  etcd_close(e);
  char err[512] = "";
  int rc = etcd_connect(&nocert, base_deadline_in(3000), &e, err, sizeof err);
  CHECK(rc != 0);
  fprintf(stderr, "without a client certificate: %s\n", err);
  rc = etcd_connect(o, base_deadline_in(3000), &e, err, sizeof err); /* plain HTTP */
  CHECK(rc != 0);
  fprintf(stderr, "over HTTP: %s\n", err);
  return check_report();
}

static int down(const etcd_opts *o) {
  char err[512] = "";
  etcd *e = NULL;
  int64_t t0 = base_now_ms();
  int rc = etcd_connect(o, base_deadline_in(1500), &e, err, sizeof err);
  int64_t took = base_now_ms() - t0;
  CHECK(rc == -ETIMEDOUT || rc == -ECONNREFUSED);
  CHECK(took >= 1400 && took < 15000); /* its deadline (1.5 s), not the test's timeout */
  CHECK(strstr(err, o->endpoints) != NULL && strchr(err, '\n') == NULL);
  fprintf(stderr, "down: %s (%lld ms)\n", err, (long long)took);
  etcd_opts bad = *o;
  bad.endpoints = "no-port-here";
  CHECK(etcd_connect(&bad, base_deadline_in(500), &e, err, sizeof err) == -EINVAL);
  CHECK(strstr(err, "bad etcd endpoints") != NULL);
  return check_report();
}

/*
 * An etcd that stops answering (SIGSTOP to its pid) while the lease keeper renews: once the store
 * is called lost, closing the backend cuts the renewal under way short (etcd_interrupt), rather
 * than waiting for its deadline (the lease's expiry: about 9 s of it would be left). The bound,
 * 2 s, leaves a busy machine room and still tells the two apart.
 */
static int hung(const etcd_opts *o, pid_t etcd_pid) {
  char job[64], err[512] = "";
  snprintf(job, sizeof job, "hung-%d", (int)getpid());
  etcd_opts eo = *o;
  eo.prefix = NULL;
  rdzv_backend *b = NULL;
  store_client *c = NULL;
  CHECK(rdzv_backend_etcd(&eo, job, 15000, &b) == 0);
  CHECK(rdzv_backend_connect(b, base_deadline_in(10000), &c, err, sizeof err) == 0);
  store_client_close(c);
  CHECK(kill(etcd_pid, SIGSTOP) == 0);
  base_sleep_ms(5300); /* the keeper's first renewal began at 5 s and hangs until 10 s */
  rdzv_backend_lost(b);
  int64_t t0 = base_now_ms();
  rdzv_backend_close(b);
  int64_t took = base_now_ms() - t0;
  CHECK(kill(etcd_pid, SIGCONT) == 0);
  fprintf(stderr, "hung: close took %lld ms\n", (long long)took);
  CHECK(took < 2000);
  return check_report();
}

/* ---- a fake etcd: the revisions of a replay ---- */

#define FAKE_LOG_MAX 16

typedef struct fake_etcd {
  atomic_int put; /* the key is there from revision 13 on, and a watch reports it */
  int lfd, port, nlog;
  char log[FAKE_LOG_MAX][512]; /* "PATH BODY" of each request, in order */
} fake_etcd;

static void fake_send(int fd, const char *body, int close_after) {
  char head[256];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n%s",
                   close_after ? "\r\n" : "");
  if (!close_after)
    n += snprintf(head + n, sizeof head - (size_t)n, "Content-Length: %zu\r\n\r\n", strlen(body));
  if (send(fd, head, (size_t)n, MSG_NOSIGNAL) < 0 || send(fd, body, strlen(body), MSG_NOSIGNAL) < 0)
    return;
}

/* One request: its path and body into the log; 0 when the connection ended first. */
static int fake_read(int fd, fake_etcd *f, char *path, size_t plen) {
  char buf[4096];
  size_t got = 0;
  char *end = NULL;
  while (end == NULL && got < sizeof buf - 1) {
    ssize_t k = recv(fd, buf + got, sizeof buf - 1 - got, 0);
    if (k <= 0) return 0;
    got += (size_t)k;
    buf[got] = '\0';
    end = strstr(buf, "\r\n\r\n");
  }
  const char *cl = strstr(buf, "Content-Length: ");
  size_t want = cl != NULL ? (size_t)atoi(cl + 16) : 0, head = (size_t)(end - buf) + 4;
  while (got - head < want && got < sizeof buf - 1) {
    ssize_t k = recv(fd, buf + got, sizeof buf - 1 - got, 0);
    if (k <= 0) return 0;
    got += (size_t)k;
    buf[got] = '\0';
  }
  if (sscanf(buf, "POST %255s", path) != 1 || plen < 256) return 0;
  if (f->nlog < FAKE_LOG_MAX)
    snprintf(f->log[f->nlog++], sizeof f->log[0], "%s %s", path, buf + head);
  return 1;
}

/* A watch: "created" at revision 12 (two revisions came after the read: their events, if any
 * were the key's, would follow), then the key's put once f->put is set. */
static void fake_watch(fake_etcd *f, int fd) {
  fake_send(fd, "{\"result\":{\"header\":{\"revision\":\"12\"},\"created\":true}}\n", 1);
  for (int sent = 0;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char b[64];
    if (poll(&p, 1, 20) > 0 && recv(fd, b, sizeof b, 0) <= 0) return;
    const char *ev = "{\"result\":{\"header\":{\"revision\":\"13\"},\"events\":[{\"kv\":"
                     "{\"key\":\"eA==\",\"value\":\"eA==\"}}]}}\n";
    if (!sent && atomic_load(&f->put) && send(fd, ev, strlen(ev), MSG_NOSIGNAL) > 0) sent = 1;
  }
}

/* Every key absent at revision 10, there from 13 once f->put is set; watches as fake_watch. */
static void *fake_main(void *arg) {
  fake_etcd *f = arg;
  for (;;) {
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    char path[256];
    if (fake_read(fd, f, path, sizeof path)) {
      if (strcmp(path, "/v3/watch") == 0) {
        fake_watch(f, fd);
      } else if (strcmp(path, "/v3/kv/txn") == 0 && atomic_load(&f->put)) {
        fake_send(fd,
                  "{\"header\":{\"revision\":\"13\"},\"succeeded\":true,\"responses\":"
                  "[{\"response_range\":{\"header\":{\"revision\":\"13\"},\"kvs\":[{\"key\":"
                  "\"eA==\",\"value\":\"eA==\",\"version\":\"1\"}]}}]}",
                  0);
      } else if (strcmp(path, "/v3/kv/txn") == 0) {
        fake_send(fd,
                  "{\"header\":{\"revision\":\"10\"},\"succeeded\":true,\"responses\":"
                  "[{\"response_range\":{\"header\":{\"revision\":\"10\"}}}]}",
                  0);
      } else {
        fake_send(fd, "{\"header\":{\"revision\":\"10\"}}", 0);
      }
    }
    close(fd);
  }
}

/*
 * A wait that times out leaves its watch open, from the revision after its
 * read, and the next wait on the key listens on: it sends nothing (a read
 * and a new watch a slice cost etcd 10 requests a second per waiting node),
 * and it sees what the watch reports between the two waits. No watch ever
 * starts after the read's revision (one from the "created" answer's would
 * skip the events etcd still had to replay: a node of the swarm at 128
 * nodes once never saw the job's failure that way).
 */
static int replay(void) {
  static fake_etcd f;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  f.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (f.lfd < 0 || bind(f.lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(f.lfd, 8) != 0 ||
      getsockname(f.lfd, (struct sockaddr *)&a, &al) != 0) {
    perror("fake etcd");
    return 1;
  }
  pthread_t th;
  if (pthread_create(&th, NULL, fake_main, &f) != 0) return 1;
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", ntohs(a.sin_port));
  etcd_opts o = {.endpoints = ep, .prefix = prefix};
  etcd *e = open_or_die(&o);
  const char *keys[1] = {"fail"};
  CHECK_EQ_INT(etcd_wait(e, keys, 1, base_deadline_in(300)), -ETIMEDOUT);
  int before = f.nlog;
  CHECK_EQ_INT(etcd_wait(e, keys, 1, base_deadline_in(300)), -ETIMEDOUT);
  CHECK_EQ_INT(f.nlog, before); /* listened on: no read, no new watch */
  atomic_store(&f.put, 1);      /* between two waits: the held watch reports it */
  base_sleep_ms(100);
  CHECK_EQ_INT(etcd_wait(e, keys, 1, base_deadline_in(5000)), 0);
  int watches = 0;
  for (int i = 0; i < f.nlog; i++) {
    if (strncmp(f.log[i], "/v3/watch ", 10) != 0) continue;
    watches++;
    CHECK(strstr(f.log[i], "\"start_revision\":\"11\"") != NULL);
  }
  CHECK_EQ_INT(watches, 1);
  etcd_close(e);
  shutdown(f.lfd, SHUT_RDWR);
  close(f.lfd);
  pthread_join(th, NULL);
  return check_report();
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: test_etcd MODE ENDPOINTS [...]\n");
    return 2;
  }
  snprintf(prefix, sizeof prefix, "/cohort/test-%d/", (int)getpid());
  etcd_opts o = {.endpoints = argv[2], .prefix = prefix};
  const char *mode = argv[1];
  if (strcmp(mode, "basic") == 0) return basic(&o);
  if (strcmp(mode, "failover") == 0) return failover(&o);
  if (strcmp(mode, "auth") == 0 && argc == 5) return auth(&o, argv[3], argv[4]);
  if (strcmp(mode, "tls") == 0 && argc == 6) return tls(&o, argv[3], argv[4], argv[5]);
  if (strcmp(mode, "down") == 0) return down(&o);
  if (strcmp(mode, "hung") == 0 && argc == 4) return hung(&o, (pid_t)atoi(argv[3]));
  if (strcmp(mode, "replay") == 0) return replay();
  fprintf(stderr, "test_etcd: bad arguments\n");
  return 2;
}

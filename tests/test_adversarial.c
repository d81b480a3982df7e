/*
 * test_adversarial.c - the store under hostile clients while real work runs.
 *
 * A child process hosts a store_server with a job token (limits as below).
 * While forked attackers run against it:
 *   - idle:    waves of 300 connections that never send a byte (each must be
 *              cut by the server at its handshake deadline);
 *   - slow:    writers that send a valid HELLO one byte per second;
 *   - huge:    frame headers with lengths near 2^32 and just above/at the
 *              frame limit (the last followed by 64 KiB and a stall);
 *   - random:  random bytes, alone or after a valid HELLO;
 *   - unauth:  valid frames (SET, GET, ADD, CAS, DELETE, WAIT) without AUTH,
 *              after a HELLO, after an AUTH without MAC, after a wrong MAC;
 *   - replay:  the bytes a real, authenticated client sent (captured by a
 *              relay in this process), replayed on new connections;
 * eight real store clients run a rendezvous-like sequence (add, set, wait,
 * get, cas) for several rounds, and a real `cohort run --nproc-per-node 2`
 * job whose workers use their agent's store runs to the end.
 *
 * Afterwards: every real client and the job succeeded; the server's VmRSS
 * and fd count (sampled from /proc/PID every 50 ms throughout) stayed within
 * the limits documented in docs/reliability.md; its fds went back to the
 * baseline once the attackers left; every attacker got only errors (never
 * an OK beyond HELLO), and none of the keys they tried to set exists, nor
 * was the key the replayed session had set changed back.
 *
 * Usage: test_adversarial PATH_TO_COHORT
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "base/base.h"
#include "base/net.h"
#include "check.h"
#include "store_fork.h"
#include "cohort/cohort.h"
#include "proc.h"
#include "store/store.h"
#include "store/proto.h"

#define TOKEN "adversarial-test-token-7f3a"
/* The server's limits in this test (docs/reliability.md states the bounds). */
#define MAX_CONNS 512
#define MAX_BYTES ((size_t)32 << 20)
#define IO_MS 2000
#define N_IDLE 300
#define N_REAL 8
#define ROUNDS 15
#define ATTACK_MS 9000

static const char *cohort_bin;
static int port;

/* ---- raw sockets ---- */

static int raw_connect(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}

static int send_all(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

/*
 * Reads one response frame's status byte (and discards its payload).
 * Returns the status, -1 when the server closed the connection, -2 on a
 * timeout or a malformed frame.
 */
static int read_status(int fd) {
  uint8_t hdr[4];
  size_t got = 0;
  while (got < 4) {
    ssize_t r = recv(fd, hdr + got, 4 - got, 0);
    if (r == 0) return -1;
    if (r < 0) return errno == EINTR ? -2 : (errno == ECONNRESET ? -1 : -2);
    got += (size_t)r;
  }
  uint32_t len = store_load_u32(hdr);
  if (len == 0 || len > 4096) return -2;
  uint8_t body[4096];
  got = 0;
  while (got < len) {
    ssize_t r = recv(fd, body + got, len - got, 0);
    if (r <= 0) return -2;
    got += (size_t)r;
  }
  return body[0];
}

/* Waits until the server closes fd (reading and discarding). 1 closed, 0 not within ms. */
static int wait_closed(int fd, int ms) {
  int64_t deadline = base_now_ms() + ms;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int left = base_deadline_left(deadline);
    if (left <= 0) return 0;
    if (poll(&p, 1, left) <= 0) continue;
    char buf[4096];
    ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno == ECONNRESET)) return 1;
  }
}

/* ---- frames ---- */

static size_t fr_begin(store_buf *b) {
  return store_buf_begin_frame(b);
}

static void fr_hello(store_buf *b) {
  size_t f = fr_begin(b);
  store_buf_u8(b, STORE_OP_HELLO);
  store_buf_u8(b, STORE_PROTO_VERSION);
  uint8_t nonce[STORE_NONCE_LEN];
  base_random_bytes(nonce, sizeof nonce);
  store_buf_put(b, nonce, sizeof nonce);
  store_buf_end_frame(b, f);
}

static void fr_set(store_buf *b, const char *k, const char *v) {
  size_t f = fr_begin(b);
  store_buf_u8(b, STORE_OP_SET);
  store_buf_key(b, k, strlen(k));
  store_buf_value(b, v, strlen(v));
  store_buf_end_frame(b, f);
}

static void fr_key_op(store_buf *b, uint8_t op, const char *k) {
  size_t f = fr_begin(b);
  store_buf_u8(b, op);
  store_buf_key(b, k, strlen(k));
  store_buf_end_frame(b, f);
}

static void fr_add(store_buf *b, const char *k, int64_t d) {
  size_t f = fr_begin(b);
  store_buf_u8(b, STORE_OP_ADD);
  store_buf_key(b, k, strlen(k));
  store_buf_u64(b, (uint64_t)d);
  store_buf_end_frame(b, f);
}

static void fr_cas(store_buf *b, const char *k, const char *v) {
  size_t f = fr_begin(b);
  store_buf_u8(b, STORE_OP_CAS);
  store_buf_key(b, k, strlen(k));
  store_buf_u8(b, 0);
  store_buf_value(b, v, strlen(v));
  store_buf_end_frame(b, f);
}

static void fr_wait(store_buf *b, const char *k) {
  size_t f = fr_begin(b);
  store_buf_u8(b, STORE_OP_WAIT);
  store_buf_u32(b, 100);
  store_buf_u32(b, 1);
  store_buf_key(b, k, strlen(k));
  store_buf_end_frame(b, f);
}

static void fr_auth(store_buf *b, int with_mac) {
  size_t f = fr_begin(b);
  store_buf_u8(b, STORE_OP_AUTH);
  store_buf_u8(b, with_mac ? STORE_MAC_LEN : 0);
  if (with_mac) {
    uint8_t mac[STORE_MAC_LEN];
    base_random_bytes(mac, sizeof mac);
    store_buf_put(b, mac, sizeof mac);
  }
  store_buf_end_frame(b, f);
}

/* The keys the attackers try to create; none may exist afterwards. */
static const char *const evil_keys[] = {"adv/set", "adv/add", "adv/cas", "adv/random",
                                        "rdzv0/node/0"};

/* ---- attackers (each a process; exit 0 when the server behaved) ---- */

static int64_t attack_end;

/*
 * Connections that never send a byte: they take slots only until the
 * handshake deadline (io_timeout from accept), then the server cuts them.
 * Waves of N_IDLE until the end of the attack window.
 */
static int attack_idle(void) {
  static int fds[N_IDLE];
  int bad = 0;
  while (base_now_ms() + IO_MS + 1500 < attack_end) {
    int n = 0;
    for (int i = 0; i < N_IDLE; i++) {
      fds[i] = raw_connect();
      if (fds[i] >= 0) n++;
    }
    if (n < N_IDLE) {
      fprintf(stderr, "idle attacker: only %d of %d connections were accepted\n", n, N_IDLE);
      bad = 1;
    }
    /* Each is cut at io_timeout; a busy server has up to ten times that. */
    int64_t until = base_now_ms() + 10 * IO_MS;
    int cut = 0;
    for (int i = 0; i < N_IDLE; i++) {
      if (fds[i] < 0) continue;
      int left = (int)(until - base_now_ms());
      cut += wait_closed(fds[i], left > 0 ? left : 0);
      close(fds[i]);
    }
    if (cut != n) {
      fprintf(stderr, "idle attacker: %d of %d silent connections still open after %d ms\n",
              n - cut, n, 10 * IO_MS);
      bad = 1;
    }
  }
  return bad;
}

/* One byte a second: the server must cut it at io_timeout, long before the hello is complete
 * (bound: ten times io_timeout). */
static int attack_slow(void) {
  int bad = 0;
  while (base_now_ms() + IO_MS + 2000 < attack_end) {
    int fd = raw_connect();
    if (fd < 0) return 1;
    store_buf b = {0};
    fr_hello(&b);
    int64_t t0 = base_now_ms();
    int cut = 0;
    for (size_t i = 0; i < b.len && !cut; i++) {
      if (send(fd, b.p + i, 1, MSG_NOSIGNAL) != 1)
        cut = 1;
      else if (wait_closed(fd, 1000))
        cut = 1;
    }
    int64_t dt = base_now_ms() - t0;
    if (!cut || dt > 10 * IO_MS) {
      fprintf(stderr, "slow attacker: cut=%d after %lld ms (io timeout %d ms)\n", cut,
              (long long)dt, IO_MS);
      bad = 1;
    }
    store_buf_free(&b);
    close(fd);
  }
  return bad;
}

static int attack_huge(void) {
  static const uint32_t lens[] = {0xffffffffu, 0xfffffff0u,         0x80000000u,
                                  0x7fffffffu, STORE_FRAME_MAX + 1, 0};
  int bad = 0;
  while (base_now_ms() < attack_end - 500) {
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
      int fd = raw_connect();
      if (fd < 0) return 1;
      uint8_t h[4] = {(uint8_t)(lens[i] >> 24), (uint8_t)(lens[i] >> 16), (uint8_t)(lens[i] >> 8),
                      (uint8_t)lens[i]};
      send_all(fd, h, 4);
      int st = read_status(fd);
      /* PROTO and a close, or just a close: never anything else. */
      if (st != STORE_ST_PROTO && st != -1) {
        fprintf(stderr, "huge attacker: length 0x%08x answered %d\n", lens[i], st);
        bad = 1;
      }
      close(fd);
      base_sleep_ms(5);
    }
    /* Exactly the limit: accepted as a header, 64 KiB sent, then a stall. */
    int fd = raw_connect();
    if (fd < 0) return 1;
    uint8_t h[4] = {(uint8_t)(STORE_FRAME_MAX >> 24), (uint8_t)(STORE_FRAME_MAX >> 16),
                    (uint8_t)(STORE_FRAME_MAX >> 8), (uint8_t)STORE_FRAME_MAX};
    static uint8_t junk[65536];
    send_all(fd, h, 4);
    send_all(fd, junk, sizeof junk);
    if (!wait_closed(fd, 10 * IO_MS)) {
      fprintf(stderr, "huge attacker: a stalled maximal frame was not cut\n");
      bad = 1;
    }
    close(fd);
  }
  return bad;
}

static int attack_random(void) {
  uint64_t seed = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull;
  int bad = 0;
  while (base_now_ms() < attack_end - 500) {
    int fd = raw_connect();
    if (fd < 0) return 1;
    uint8_t buf[512];
    size_t n = 1 + (size_t)(seed % sizeof buf);
    for (size_t i = 0; i < n; i++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      buf[i] = (uint8_t)(seed >> 56);
    }
    store_buf b = {0};
    if (seed & 1) fr_hello(&b);
    store_buf_put(&b, buf, n);
    send_all(fd, b.p, b.len);
    shutdown(fd, SHUT_WR);
    /* Every answer is an error or a HELLO's OK; then the server closes. */
    for (int k = 0; k < 8; k++) {
      int st = read_status(fd);
      if (st == -1) break;
      if (st == STORE_ST_OK && k == 0 && (seed & 1)) continue;
      if (st != STORE_ST_PROTO && st != STORE_ST_AUTH) {
        fprintf(stderr, "random attacker: answer %d\n", st);
        bad = 1;
        break;
      }
    }
    store_buf_free(&b);
    close(fd);
    base_sleep_ms(5); /* hostile, but not a CPU hog on a shared CI machine */
  }
  return bad;
}

static int attack_unauth(void) {
  int bad = 0, round = 0;
  while (base_now_ms() < attack_end - 500) {
    int fd = raw_connect();
    if (fd < 0) return 1;
    store_buf b = {0};
    int mode = round++ % 4; /* no HELLO, HELLO only, AUTH without MAC, wrong MAC */
    int expect_hello = mode != 0;
    if (mode != 0) fr_hello(&b);
    if (mode >= 2) fr_auth(&b, mode == 3);
    fr_set(&b, "adv/set", "evil");
    fr_key_op(&b, STORE_OP_GET, "secret/job");
    fr_add(&b, "adv/add", 1);
    fr_cas(&b, "adv/cas", "evil");
    fr_key_op(&b, STORE_OP_DELETE, "secret/job");
    fr_wait(&b, "secret/job");
    fr_set(&b, "rdzv0/node/0", "evil");
    send_all(fd, b.p, b.len);
    for (int k = 0; k < 16; k++) {
      int st = read_status(fd);
      if (st == -1) break;
      if (st == STORE_ST_OK && expect_hello && k == 0) continue;
      if (st != STORE_ST_AUTH && st != STORE_ST_PROTO) {
        fprintf(stderr, "unauthenticated attacker (mode %d): answer %d to frame %d\n", mode, st, k);
        bad = 1;
        break;
      }
    }
    store_buf_free(&b);
    close(fd);
    base_sleep_ms(5);
  }
  return bad;
}

/* The replay attacker gets the captured bytes through a file. */
static char replay_path[256];

static int attack_replay(void) {
  FILE *f = fopen(replay_path, "rb");
  if (f == NULL) return 1;
  static uint8_t cap[65536];
  size_t n = fread(cap, 1, sizeof cap, f);
  fclose(f);
  int bad = 0;
  while (base_now_ms() < attack_end - 500) {
    int fd = raw_connect();
    if (fd < 0) return 1;
    send_all(fd, cap, n);
    /* HELLO is answered (a fresh server nonce); the replayed AUTH must fail. */
    int st0 = read_status(fd), st1 = read_status(fd);
    int st2 = read_status(fd);
    if (st0 != STORE_ST_OK || st1 != STORE_ST_AUTH || st2 != -1) {
      fprintf(stderr, "replay attacker: answers %d %d %d (want 0 %d closed)\n", st0, st1, st2,
              STORE_ST_AUTH);
      bad = 1;
    }
    close(fd);
    base_sleep_ms(20);
  }
  return bad;
}

/*
 * Captures what a real client sends: a relay between a store_client and the
 * server, recording the client's bytes. The client (a child) connects with
 * the token and sets replay/k = original.
 */
static int capture_real_session(void) {
  int lfd = -1, lport = 0;
  if (base_tcp_listen("127.0.0.1", 0, 4, &lfd, &lport) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    store_client *c = NULL;
    char err[256];
    if (store_client_connect("127.0.0.1", lport, TOKEN, base_deadline_in(5000), &c, err,
                             sizeof err) != 0) {
      fprintf(stderr, "capture client: %s\n", err);
      _exit(1);
    }
    int rc = store_set(c, "replay/k", "original", 8, base_deadline_in(5000));
    store_client_close(c);
    _exit(rc == 0 ? 0 : 1);
  }
  struct pollfd p = {.fd = lfd, .events = POLLIN};
  int cfd = -1, sfd = -1;
  if (poll(&p, 1, 5000) == 1) cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (cfd >= 0) sfd = raw_connect();
  FILE *out = fopen(replay_path, "wb");
  int64_t deadline = base_now_ms() + 10000;
  while (cfd >= 0 && sfd >= 0 && out != NULL && base_now_ms() < deadline) {
    struct pollfd q[2] = {{.fd = cfd, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
    if (poll(q, 2, 1000) <= 0) continue;
    uint8_t buf[65536];
    if (q[0].revents) {
      ssize_t r = recv(cfd, buf, sizeof buf, 0);
      if (r <= 0) break;
      fwrite(buf, 1, (size_t)r, out);
      send_all(sfd, buf, (size_t)r);
    }
    if (q[1].revents) {
      ssize_t r = recv(sfd, buf, sizeof buf, 0);
      if (r <= 0) break;
      send_all(cfd, buf, (size_t)r);
    }
  }
  if (out) fclose(out);
  if (cfd >= 0) close(cfd);
  if (sfd >= 0) close(sfd);
  close(lfd);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* ---- the real work ---- */

static int real_client(int id) {
  store_client *c = NULL;
  char err[256];
  if (store_client_connect("127.0.0.1", port, TOKEN, base_deadline_in(10000), &c, err,
                           sizeof err) != 0) {
    fprintf(stderr, "real client %d: %s\n", id, err);
    return 1;
  }
  for (int r = 0; r < ROUNDS; r++) {
    char key[64], val[64];
    int64_t dl = base_deadline_in(20000), joined = 0;
    snprintf(key, sizeof key, "rdzv%d/joined", r);
    if (store_add(c, key, 1, &joined, dl) != 0) goto fail;
    snprintf(key, sizeof key, "rdzv%d/node/%d", r + 1, id);
    snprintf(val, sizeof val, "node %d round %d", id, r);
    if (store_set(c, key, val, strlen(val), dl) != 0) goto fail;
    char keys[N_REAL][64];
    const char *kp[N_REAL];
    for (int i = 0; i < N_REAL; i++) {
      snprintf(keys[i], sizeof keys[i], "rdzv%d/node/%d", r + 1, i);
      kp[i] = keys[i];
    }
    if (store_wait(c, kp, N_REAL, dl) != 0) goto fail;
    for (int i = 0; i < N_REAL; i++) {
      void *v = NULL;
      size_t len = 0;
      char want[64];
      snprintf(want, sizeof want, "node %d round %d", i, r);
      if (store_get(c, kp[i], &v, &len, dl) != 0) goto fail;
      int ok = len == strlen(want) && memcmp(v, want, len) == 0;
      free(v);
      if (!ok) {
        fprintf(stderr, "real client %d: wrong value for %s\n", id, kp[i]);
        goto fail;
      }
    }
    /* One leader per round, decided by compare-and-set. */
    snprintf(key, sizeof key, "rdzv%d/leader", r);
    snprintf(val, sizeof val, "%d", id);
    if (store_cas(c, key, NULL, 0, val, strlen(val), NULL, NULL, dl) != 0) goto fail;
    base_sleep_ms(ATTACK_MS / ROUNDS / 2);
  }
  store_client_close(c);
  return 0;
fail:
  fprintf(stderr, "real client %d failed\n", id);
  store_client_close(c);
  return 1;
}

/* A real job under `cohort run`: its two workers meet in their agent's store. */
static int real_job(void) {
  char script[512];
  snprintf(script, sizeof script,
           "\"$0\" store set w/$RANK up >/dev/null && \"$0\" store wait w/0 w/1 >/dev/null && "
           "\"$0\" store add done >/dev/null && \"$0\" store wait w/0 w/1 done");
  char *argv[] = {(char *)cohort_bin, "run", "--nproc-per-node", "2", "--", "sh", "-c", script,
                  (char *)cohort_bin, NULL};
  proc_result r;
  if (proc_run(argv, NULL, 60000, &r) != 0) return 1;
  int code = proc_exit_code(&r);
  if (code != 0) fprintf(stderr, "cohort run exited %d:\n%s%s\n", code, r.out, r.err);
  proc_result_free(&r);
  return code == 0 ? 0 : 1;
}

/* ---- the server's process ---- */

static long vm_rss_kb(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return -1;
  long kb = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
  fclose(f);
  return kb;
}

static int fd_count(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(path);
  if (d == NULL) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

typedef int (*role_fn)(void);

static pid_t spawn(role_fn fn) {
  pid_t pid = fork();
  if (pid == 0) _exit(fn());
  return pid;
}

static int real_id;
static int real_main(void) {
  return real_client(real_id);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_adversarial PATH_TO_COHORT\n");
    return 2;
  }
  cohort_bin = argv[1];
  signal(SIGPIPE, SIG_IGN);
  /* The idle attacker alone holds N_IDLE sockets. */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4096) {
    rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  snprintf(replay_path, sizeof replay_path, "/tmp/cohort-adv-replay.%d", (int)getpid());

  store_server_opts so = {.bind_host = "127.0.0.1",
                          .token = TOKEN,
                          .max_conns = MAX_CONNS,
                          .io_timeout_ms = IO_MS,
                          .max_bytes = MAX_BYTES};
  store_fork server;
  int started = store_fork_start(&so, 1, &server) == 0;
  CHECK(started);
  if (!started) return check_report();
  pid_t srv = server.pid;
  port = server.port;
  base_sleep_ms(200);
  long rss0 = vm_rss_kb(srv);
  int fds0 = fd_count(srv);
  printf("server pid %d port %d: baseline VmRSS %ld KiB, %d fds\n", (int)srv, port, rss0, fds0);

  /* A secret the attackers try to read, and the real session to replay. */
  store_client *admin = NULL;
  char err[256];
  CHECK(store_client_connect("127.0.0.1", port, TOKEN, base_deadline_in(5000), &admin, err,
                             sizeof err) == 0);
  CHECK(store_set(admin, "secret/job", "s3cret", 6, base_deadline_in(5000)) == 0);
  CHECK(capture_real_session() == 0);
  /* Changed after the capture: a successful replay would set it back. */
  CHECK(store_set(admin, "replay/k", "changed", 7, base_deadline_in(5000)) == 0);

  attack_end = base_now_ms() + ATTACK_MS;
  static const struct {
    const char *name;
    role_fn fn;
    int copies;
  } attackers[] = {{"idle", attack_idle, 1},     {"slow", attack_slow, 4},
                   {"huge", attack_huge, 2},     {"random", attack_random, 2},
                   {"unauth", attack_unauth, 2}, {"replay", attack_replay, 1}};
  enum { MAXP = 32 };
  pid_t apids[MAXP];
  const char *anames[MAXP];
  int na = 0;
  for (size_t i = 0; i < sizeof attackers / sizeof attackers[0]; i++)
    for (int k = 0; k < attackers[i].copies; k++) {
      anames[na] = attackers[i].name;
      apids[na++] = spawn(attackers[i].fn);
    }
  base_sleep_ms(300); /* the attack is under way before the real work starts */
  pid_t rpids[N_REAL];
  for (int i = 0; i < N_REAL; i++) {
    real_id = i;
    rpids[i] = spawn(real_main);
  }
  pid_t job = spawn(real_job);

  /* Sample the server while everything runs. */
  long rss_max = rss0;
  int fds_max = fds0;
  int64_t until = attack_end + 1000;
  while (base_now_ms() < until) {
    long r = vm_rss_kb(srv);
    int f = fd_count(srv);
    if (r > rss_max) rss_max = r;
    if (f > fds_max) fds_max = f;
    base_sleep_ms(50);
  }

  int real_ok = 0, job_ok = 0;
  for (int i = 0; i < N_REAL; i++) {
    int st = 0;
    waitpid(rpids[i], &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) real_ok++;
  }
  int st = 0;
  waitpid(job, &st, 0);
  job_ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
  int attackers_ok = 0;
  for (int i = 0; i < na; i++) {
    st = 0;
    waitpid(apids[i], &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
      attackers_ok++;
    else
      fprintf(stderr, "attacker %s: the server misbehaved (status %d)\n", anames[i], st);
  }
  printf("real clients ok: %d/%d; cohort run job ok: %d; attackers that saw only errors: %d/%d\n",
         real_ok, N_REAL, job_ok, attackers_ok, na);
  CHECK_EQ_INT(real_ok, N_REAL);
  CHECK(job_ok);
  CHECK_EQ_INT(attackers_ok, na);

  /* Nothing an attacker sent reached the table. */
  for (size_t i = 0; i < sizeof evil_keys / sizeof evil_keys[0]; i++) {
    void *v = NULL;
    size_t len = 0;
    /* (The real clients' records start at rdzv1/, so rdzv0/node/0 is only the attackers'.) */
    int rc = store_get(admin, evil_keys[i], &v, &len, base_deadline_in(5000));
    CHECK_EQ_INT(rc, -ENOENT);
    free(v);
  }
  void *v = NULL;
  size_t len = 0;
  CHECK(store_get(admin, "secret/job", &v, &len, base_deadline_in(5000)) == 0 && len == 6 &&
        memcmp(v, "s3cret", 6) == 0);
  free(v);
  v = NULL;
  CHECK(store_get(admin, "replay/k", &v, &len, base_deadline_in(5000)) == 0 && len == 7 &&
        memcmp(v, "changed", 7) == 0);
  free(v);
  store_client_close(admin);

  /* Once the attackers are gone the server holds no more fds than at the start. */
  int fds_after = -1;
  for (int i = 0; i < 60; i++) {
    fds_after = fd_count(srv);
    if (fds_after <= fds0) break;
    base_sleep_ms(100);
  }
  long rss_after = vm_rss_kb(srv);
  printf("server peak VmRSS %ld KiB (+%ld), peak fds %d; after: %ld KiB, %d fds\n", rss_max,
         rss_max - rss0, fds_max, rss_after, fds_after);
  /* Limits (docs/reliability.md): fds <= max_conns + baseline; memory growth
   * <= max_bytes + max_conns * 8 KiB (a 4 KiB read buffer and the connection
   * state each) + 16 MiB of allocator slack. */
  CHECK(fds_max <= fds0 + MAX_CONNS);
  CHECK(rss_max - rss0 <= (long)(MAX_BYTES / 1024) + MAX_CONNS * 8 + 16 * 1024);
  CHECK(fds_after <= fds0);

  FILE *fig =
      getenv("COHORT_RELIABILITY_OUT") ? fopen(getenv("COHORT_RELIABILITY_OUT"), "w") : NULL;
  if (fig != NULL) {
    fprintf(fig,
            "attackers=%d attackers_ok=%d real=%d real_ok=%d job_ok=%d rss0_kb=%ld rss_max_kb=%ld "
            "fds0=%d fds_max=%d fds_after=%d\n",
            na, attackers_ok, N_REAL, real_ok, job_ok, rss0, rss_max, fds0, fds_max, fds_after);
    fclose(fig);
  }

  CHECK_EQ_INT(store_fork_stop(&server), 0);
  unlink(replay_path);
  return check_report();
}

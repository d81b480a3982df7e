/*
 * comm.c - the public communicator API: configuration, bootstrap through the
 * rendezvous store, the ordered operation queue and its progress thread.
 *
 * Bootstrap: every rank listens on a TCP port and publishes
 * "<job>/<restart>/coll/<n>/addr/<rank>" = "<host:port> <host identity>
 * <cookie>" (n counts the communicators this process created, identical on
 * every rank). Once all addresses are in the store, rank i connects to every
 * j < i and accepts every j > i, proving itself with j's cookie (the cookie
 * is only known through the authenticated store). Ranks with the same host
 * identity (hostname, boot id, network namespace, /dev/shm file system) share one memory
 * segment; the TCP connections stay open between them to notice deaths.
 *
 * Operations execute one at a time in submission order: on the caller's
 * thread when nothing is queued (lowest latency for blocking calls), else on
 * the communicator's progress thread, which is what lets an asynchronous
 * allreduce proceed while the caller computes.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "coll/coll.h"
#include "store/store.h"

#define HELLO_MAGIC 0x48524843u /* "CHRH" */
#define COOKIE_LEN 16
#define DEFAULT_TIMEOUT_MS 60000
#define DEFAULT_THRESHOLD (128u * 1024u)
#define DEFAULT_SLICE (512u * 1024u)
#define DEFAULT_STAGING (512u * 1024u)
#define DEFAULT_SHM_CHAN (1u << 20)
#define DEFAULT_SPIN_US 10

static atomic_int comm_counter;

/* ---- configuration ---- */

COHORT_API int cohort_comm_config_from_env(cohort_comm_config *cfg) {
  if (cfg == NULL) return -EINVAL;
  memset(cfg, 0, sizeof *cfg);
  const char *rank = getenv("RANK"), *size = getenv("WORLD_SIZE");
  const char *store = getenv("COHORT_STORE"), *job = getenv("COHORT_JOB_ID");
  if (rank == NULL || size == NULL || store == NULL || job == NULL || job[0] == '\0')
    return COHORT_ENOENV;
  if (base_parse_int(size, 1, 1 << 20, &cfg->size) != 0 ||
      base_parse_int(rank, 0, cfg->size - 1, &cfg->rank) != 0)
    return COHORT_ENOENV;
  cfg->store_addr = store;
  cfg->job_id = job;
  cfg->token = getenv("COHORT_TOKEN");
  const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
  if (restart != NULL && base_parse_int(restart, 0, 1 << 30, &cfg->restart) != 0)
    return COHORT_ENOENV;
  const char *to = getenv("COHORT_TIMEOUT_MS");
  if (to != NULL && base_parse_int(to, 1, 1 << 30, &cfg->timeout_ms) != 0) return COHORT_ENOENV;
  const char *tr = getenv("COHORT_TRANSPORT");
  if (tr == NULL || strcmp(tr, "auto") == 0)
    cfg->transport = COHORT_TRANSPORT_AUTO;
  else if (strcmp(tr, "tcp") == 0)
    cfg->transport = COHORT_TRANSPORT_TCP;
  else if (strcmp(tr, "shm") == 0)
    cfg->transport = COHORT_TRANSPORT_SHM;
  else
    return COHORT_ENOENV;
  return 0;
}

static int env_size(const char *name, uint64_t min, uint64_t max, size_t *out) {
  const char *v = getenv(name);
  if (v == NULL || v[0] == '\0') return 0;
  uint64_t x;
  if (base_parse_size(v, &x) != 0 || x < min || x > max) return COHORT_ENOENV;
  *out = (size_t)x;
  return 0;
}

/* ---- bootstrap helpers ---- */

/* Host identity: hostname, boot id, network namespace and the /dev/shm file system. */
static void host_identity(char *out, size_t outlen) {
  char host[128] = "?", boot[64] = "?";
  gethostname(host, sizeof host - 1);
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, boot, sizeof boot - 1);
    boot[n > 0 ? n : 0] = '\0';
    for (char *p = boot; *p; p++)
      if (*p == '\n') *p = '\0';
    close(fd);
  }
  /* The /dev/shm a rank sees, rather than its mount namespace: `ip netns exec` gives every
   * process a mount namespace of its own, yet they share one /dev/shm. */
  struct stat net = {0}, shm = {0};
  stat("/proc/self/ns/net", &net);
  stat("/dev/shm", &shm);
  /* COHORT_HOST_SALT: ranks with different salts count as different hosts (tests emulate
   * several hosts on one machine with it; they then talk TCP over loopback). */
  const char *salt = getenv("COHORT_HOST_SALT");
  snprintf(out, outlen, "%s|%s|%llu|%llu:%llu|%.32s", host, boot, (unsigned long long)net.st_ino,
           (unsigned long long)shm.st_dev, (unsigned long long)shm.st_ino, salt ? salt : "");
  for (char *p = out; *p; p++)
    if (*p == ' ') *p = '_';
}

/* The local address the kernel would use to reach host:port (a UDP connect sends nothing). */
static int local_addr_towards(const char *host, int port, char *out, size_t outlen) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  if (getaddrinfo(host, ps, &hints, &res) != 0) return -EHOSTUNREACH;
  int rc = -EHOSTUNREACH;
  for (struct addrinfo *ai = res; ai != NULL && rc != 0; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
      rc = base_sockaddr_str((struct sockaddr *)&ss, out, outlen, NULL);
    close(fd);
  }
  freeaddrinfo(res);
  return rc;
}

typedef struct peer_info {
  char host[BASE_HOST_MAX];
  int port;
  char hostid[320];
  unsigned char cookie[COOKIE_LEN];
} peer_info;

static int parse_peer(const char *val, size_t len, peer_info *p) {
  char buf[1024], addr[BASE_HOST_MAX + 16], cookie[2 * COOKIE_LEN + 1];
  if (len >= sizeof buf) return COHORT_EPROTO;
  memcpy(buf, val, len);
  buf[len] = '\0';
  if (sscanf(buf, "%271s %319s %32s", addr, p->hostid, cookie) != 3) return COHORT_EPROTO;
  if (base_split_hostport(addr, p->host, sizeof p->host, &p->port, 0) != 0) return COHORT_EPROTO;
  if (strlen(cookie) != 2 * COOKIE_LEN) return COHORT_EPROTO;
  for (int i = 0; i < COOKIE_LEN; i++) {
    unsigned v;
    if (sscanf(cookie + 2 * i, "%2x", &v) != 1) return COHORT_EPROTO;
    p->cookie[i] = (unsigned char)v;
  }
  return 0;
}

typedef struct hello {
  uint32_t magic;
  uint32_t rank;
  unsigned char cookie[COOKIE_LEN];
} hello;

static int accept_peers(int lfd, int rank, int size, const unsigned char *cookie, int *fds,
                        int64_t deadline) {
  int need = size - 1 - rank;
  while (need > 0) {
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    int n = poll(&p, 1, base_deadline_left(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) return -ETIMEDOUT;
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) continue;
    hello h;
    /* A stranger gets a short deadline so it cannot hold the bootstrap. */
    int64_t hd = base_now_ms() + 5000 < deadline ? base_now_ms() + 5000 : deadline;
    if (base_read_full(fd, &h, sizeof h, hd) != 0 || h.magic != HELLO_MAGIC ||
        h.rank <= (uint32_t)rank || h.rank >= (uint32_t)size || fds[h.rank] >= 0 ||
        memcmp(h.cookie, cookie, COOKIE_LEN) != 0) {
      close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fds[h.rank] = fd;
    need--;
  }
  return 0;
}

static void sanitize(const char *in, char *out, size_t outlen) {
  size_t i = 0;
  for (; in[i] && i + 1 < outlen; i++) {
    char ch = in[i];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
             ch == '-' || ch == '_' || ch == '.';
    out[i] = ok ? ch : '_';
  }
  out[i] = '\0';
}

/*
 * Shared memory among local ranks: local[0] creates the segment and tells the
 * others over TCP ('R'); each maps it and answers ('M' or 'F'); the creator
 * unlinks the name once all have answered, so nothing is left in /dev/shm
 * even if the job later crashes.
 */
static int setup_shm(cohort_comm *c, const cohort_comm_config *cfg, int k, const int *local,
                     int nlocal, int me, int *fds, size_t chan, int want_cma, int64_t deadline) {
  char job[101], name[200];
  sanitize(cfg->job_id, job, sizeof job);
  snprintf(name, sizeof name, "/cohort-%s-%d-%d-%d", job, cfg->restart, k, local[0]);
  int rc = 0;
  if (want_cma) coll_shm_allow_pull();
  if (me == 0) {
    shm_unlink(name); /* a leftover of a crashed earlier run with the same name */
    rc = coll_shm_create(name, 1, local, nlocal, me, c->size, chan, &c->shm);
    char msg = rc == 0 ? 'R' : 'F';
    for (int i = 1; i < nlocal; i++) {
      int w = base_write_full(fds[local[i]], &msg, 1, deadline);
      if (rc == 0 && w != 0) rc = w;
    }
    for (int i = 1; i < nlocal && rc == 0; i++) {
      char ans = 0;
      int r = base_read_full(fds[local[i]], &ans, 1, deadline);
      if (r != 0)
        rc = r;
      else if (ans != 'M')
        rc = COHORT_EPEER;
    }
    shm_unlink(name);
    /* Every rank has mapped the segment and published its pid: decide on single copy. */
    if (rc == 0) {
      coll_shm_set_hdr_cma(c->shm, want_cma && coll_shm_probe_cma(c->shm));
      msg = 'G';
      for (int i = 1; i < nlocal && rc == 0; i++)
        rc = base_write_full(fds[local[i]], &msg, 1, deadline);
    }
  } else {
    char msg = 0;
    rc = base_read_full(fds[local[0]], &msg, 1, deadline);
    if (rc == 0 && msg != 'R') rc = COHORT_EPEER;
    if (rc == 0) rc = coll_shm_create(name, 0, local, nlocal, me, c->size, chan, &c->shm);
    char ans = rc == 0 ? 'M' : 'F';
    int w = base_write_full(fds[local[0]], &ans, 1, deadline);
    if (rc == 0) rc = w;
    if (rc == 0) rc = base_read_full(fds[local[0]], &msg, 1, deadline);
    if (rc == 0 && msg != 'G') rc = COHORT_EPEER;
  }
  if (rc == 0) coll_shm_set_cma(c->shm, coll_shm_hdr_cma(c->shm));
  return rc;
}

static void *progress_main(void *arg);

/*
 * Host groups of the hierarchical allreduce. Ranks with one host identity
 * share memory and form a host (with COHORT_TRANSPORT=tcp every rank is its
 * own host); every rank derives the same groups from the published
 * identities. The leader of a host is its lowest rank.
 */
static int make_groups(cohort_comm *c, const peer_info *peers, int by_host, int hier_on) {
  int n = c->size;
  c->local.ranks = malloc((size_t)n * sizeof(int));
  c->leaders.ranks = malloc((size_t)n * sizeof(int));
  if (c->local.ranks == NULL || c->leaders.ranks == NULL) return -ENOMEM;
  c->local.n = c->leaders.n = 0;
  c->local.me = c->leaders.me = -1;
  for (int i = 0; i < n; i++) {
    int first = 1;
    for (int j = 0; j < i && first; j++)
      if (by_host && strcmp(peers[i].hostid, peers[j].hostid) == 0) first = 0;
    if (first) {
      if (i == c->rank) c->leaders.me = c->leaders.n;
      c->leaders.ranks[c->leaders.n++] = i;
    }
    if (i == c->rank || (by_host && strcmp(peers[i].hostid, peers[c->rank].hostid) == 0)) {
      if (i == c->rank) c->local.me = c->local.n;
      c->local.ranks[c->local.n++] = i;
    }
  }
  int nhosts = c->leaders.n;
  c->hier = hier_on && nhosts > 1 && nhosts < n;
  if (!c->hier) return 0;
  /* Hosts of equal size (every rank counts every host, so all agree): the rank with my local
   * index on every host, in leader order, for the reduce-scatter form. */
  c->cross.ranks = malloc((size_t)nhosts * sizeof(int));
  if (c->cross.ranks == NULL) return -ENOMEM;
  int uniform = 1;
  for (int h = 0; h < nhosts; h++) {
    int lead = c->leaders.ranks[h], k = 0;
    for (int i = lead; i < n; i++) {
      if (strcmp(peers[i].hostid, peers[lead].hostid) != 0) continue;
      if (k == c->local.me) c->cross.ranks[h] = i;
      k++;
    }
    if (k != c->local.n) uniform = 0;
  }
  if (!uniform) {
    free(c->cross.ranks);
    c->cross.ranks = NULL;
    return 0;
  }
  c->cross.n = nhosts;
  for (int h = 0; h < nhosts; h++)
    if (c->cross.ranks[h] == c->rank) c->cross.me = h;
  return 0;
}

static int bootstrap(cohort_comm *c, const cohort_comm_config *cfg) {
  int64_t deadline = base_deadline_in(c->timeout_ms);
  int n = c->size, rc = 0, lfd = -1, lport = 0;
  int k = atomic_fetch_add(&comm_counter, 1);
  store_client *sc = NULL;
  peer_info *peers = calloc((size_t)n, sizeof *peers);
  int *fds = malloc((size_t)n * sizeof(int));
  char **keys = calloc((size_t)n, sizeof(char *));
  int *local = malloc((size_t)n * sizeof(int));
  if (peers == NULL || fds == NULL || keys == NULL || local == NULL) {
    rc = -ENOMEM;
    goto out;
  }
  for (int i = 0; i < n; i++) fds[i] = -1;

  char shost[BASE_HOST_MAX], myhost[BASE_HOST_MAX];
  int sport;
  if (cfg->store_addr == NULL ||
      base_split_hostport(cfg->store_addr, shost, sizeof shost, &sport, 0) != 0) {
    rc = COHORT_ENOENV;
    goto out;
  }
  rc = store_client_connect(shost, sport, cfg->token, deadline, &sc, NULL, 0);
  if (rc != 0) goto out;
  const char *hostenv = getenv("COHORT_COLL_HOST");
  if (hostenv != NULL && hostenv[0] != '\0')
    base_strlcpy(myhost, hostenv, sizeof myhost);
  else if ((rc = local_addr_towards(shost, sport, myhost, sizeof myhost)) != 0)
    goto out;
  rc = base_tcp_listen(myhost, 0, n + 16, &lfd, &lport);
  if (rc != 0) goto out;

  peer_info *me = &peers[c->rank];
  host_identity(me->hostid, sizeof me->hostid);
  rc = base_random_bytes(me->cookie, COOKIE_LEN);
  if (rc != 0) goto out;
  char addr[BASE_HOST_MAX + 16], hex[2 * COOKIE_LEN + 1], val[700];
  base_join_hostport(myhost, lport, addr, sizeof addr);
  base_hex(me->cookie, COOKIE_LEN, hex);
  int vlen = snprintf(val, sizeof val, "%s %s %s", addr, me->hostid, hex);
  for (int i = 0; i < n; i++) {
    keys[i] = malloc(STORE_KEY_MAX);
    if (keys[i] == NULL) {
      rc = -ENOMEM;
      goto out;
    }
    snprintf(keys[i], STORE_KEY_MAX, "%s/%d/coll/%d/addr/%d", cfg->job_id, cfg->restart, k, i);
  }
  rc = store_set(sc, keys[c->rank], val, (size_t)vlen, deadline);
  if (rc == 0) rc = store_wait(sc, (const char *const *)keys, (size_t)n, deadline);
  for (int i = 0; i < n && rc == 0; i++) {
    if (i == c->rank) continue;
    void *v = NULL;
    size_t vl = 0;
    rc = store_get(sc, keys[i], &v, &vl, deadline);
    if (rc == 0) rc = parse_peer(v, vl, &peers[i]);
    free(v);
  }
  if (rc != 0) goto out;
  store_client_close(sc);
  sc = NULL;

  /* Mesh: connect down, accept up. Connects complete through the listen backlog. */
  for (int j = 0; j < c->rank; j++) {
    rc = base_tcp_connect(peers[j].host, peers[j].port, deadline, &fds[j]);
    if (rc != 0) goto out;
    hello h = {.magic = HELLO_MAGIC, .rank = (uint32_t)c->rank};
    memcpy(h.cookie, peers[j].cookie, COOKIE_LEN);
    rc = base_write_full(fds[j], &h, sizeof h, deadline);
    if (rc != 0) goto out;
  }
  rc = accept_peers(lfd, c->rank, n, me->cookie, fds, deadline);
  if (rc != 0) goto out;

  /* Same-host group. */
  int nlocal = 0, myidx = 0;
  for (int i = 0; i < n; i++) {
    if (cfg->transport == COHORT_TRANSPORT_TCP && i != c->rank) continue;
    if (strcmp(peers[i].hostid, me->hostid) == 0) {
      if (i == c->rank) myidx = nlocal;
      local[nlocal++] = i;
    }
  }
  if (cfg->transport == COHORT_TRANSPORT_SHM && nlocal != n) {
    rc = -EXDEV; /* shared memory required but ranks are on several hosts */
    goto out;
  }
  if (nlocal > 1) {
    size_t chan = DEFAULT_SHM_CHAN;
    rc = env_size("COHORT_SHM_CHANNEL", 4096, 1u << 30, &chan);
    if (rc != 0) goto out;
    size_t p2 = 4096;
    while (p2 < chan) p2 <<= 1;
    /* Off by default: on the 2-core test machine it measured slower than the rings. */
    size_t cma = 0;
    rc = env_size("COHORT_SHM_CMA", 0, 1, &cma);
    if (rc != 0) goto out;
    rc = setup_shm(c, cfg, k, local, nlocal, myidx, fds, p2, (int)cma, deadline);
    if (rc != 0) goto out;
    size_t spin = DEFAULT_SPIN_US;
    rc = env_size("COHORT_SHM_SPIN_US", 0, 1000000, &spin);
    if (rc != 0) goto out;
    coll_shm_set_spin(c->shm, (int)spin);
  }
  rc = coll_tcp_create(c->rank, n, fds, c->staging_bytes, &c->tcp);
  if (rc != 0) goto out;
  size_t hier_on = 1;
  rc = env_size("COHORT_HIER", 0, 1, &hier_on);
  if (rc == 0) rc = make_groups(c, peers, cfg->transport != COHORT_TRANSPORT_TCP, (int)hier_on);
  if (rc != 0) goto out;
  base_log(BASE_LOG_INFO, "rank %d: %d peer(s) over shared memory%s, %d over TCP (listening on %s)",
           c->rank, nlocal > 1 ? nlocal - 1 : 0, coll_shm_cma(c->shm) ? " (single copy)" : "",
           n - (nlocal > 1 ? nlocal : 1), addr);
  if (c->hier)
    base_log(BASE_LOG_INFO, "rank %d: hierarchical allreduce over %d hosts (%d rank(s) here, %s)",
             c->rank, c->leaders.n, c->local.n,
             c->cross.ranks != NULL ? "reduce-scatter form" : "leader form");
  for (int i = 0; i < n; i++) {
    if (coll_shm_has(c->shm, i)) {
      c->peer_ops[i] = &coll_shm_ops;
      c->peer_t[i] = c->shm;
    } else {
      c->peer_ops[i] = &coll_tcp_ops;
      c->peer_t[i] = c->tcp;
    }
  }
out:
  if (sc != NULL) store_client_close(sc);
  if (lfd >= 0) close(lfd);
  if (fds != NULL)
    for (int i = 0; i < n; i++)
      if (fds[i] >= 0) close(fds[i]);
  if (keys != NULL)
    for (int i = 0; i < n; i++) free(keys[i]);
  free(keys);
  free(fds);
  free(peers);
  free(local);
  return rc;
}

COHORT_API int cohort_comm_create(const cohort_comm_config *cfg, cohort_comm **out) {
  if (out == NULL) return -EINVAL;
  *out = NULL;
  if (cfg == NULL || cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size ||
      cfg->timeout_ms < 0 || cfg->job_id == NULL || cfg->job_id[0] == '\0' ||
      strlen(cfg->job_id) > 200 || (unsigned)cfg->transport > COHORT_TRANSPORT_SHM)
    return -EINVAL;
  cohort_comm *c = calloc(1, sizeof *c);
  if (c == NULL) return -ENOMEM;
  c->rank = cfg->rank;
  c->size = cfg->size;
  c->world = (coll_group){.n = cfg->size, .me = cfg->rank, .ranks = NULL};
  c->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : DEFAULT_TIMEOUT_MS;
  c->algo_threshold = DEFAULT_THRESHOLD;
  c->slice_bytes = DEFAULT_SLICE;
  c->staging_bytes = DEFAULT_STAGING;
  pthread_mutex_init(&c->err_mu, NULL);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  int rc = env_size("COHORT_ALGO_THRESHOLD", 0, (uint64_t)1 << 40, &c->algo_threshold);
  if (rc == 0) rc = env_size("COHORT_SLICE", 4096, 1u << 30, &c->slice_bytes);
  if (rc != 0) goto fail;
  c->slice_bytes = (c->slice_bytes + 7u) & ~(size_t)7u;
  /* Scratch: two slices; latency algorithms reuse it when the message fits. */
  c->scratch_bytes = 2 * c->slice_bytes;
  c->scratch = malloc(c->scratch_bytes);
  c->peer_ops = calloc((size_t)c->size, sizeof *c->peer_ops);
  c->peer_t = calloc((size_t)c->size, sizeof *c->peer_t);
  if (c->scratch == NULL || c->peer_ops == NULL || c->peer_t == NULL) {
    rc = -ENOMEM;
    goto fail;
  }
  if (c->size > 1) {
    rc = bootstrap(c, cfg);
    if (rc != 0) goto fail;
  }
  if (pthread_create(&c->thread, NULL, progress_main, c) != 0) {
    rc = -EAGAIN;
    goto fail;
  }
  c->thread_started = 1;
  *out = c;
  return 0;
fail:
  cohort_comm_destroy(c);
  return rc;
}

COHORT_API int cohort_comm_create_from_env(cohort_comm **out) {
  if (out == NULL) return -EINVAL;
  *out = NULL;
  cohort_comm_config cfg;
  int rc = cohort_comm_config_from_env(&cfg);
  if (rc != 0) return rc;
  return cohort_comm_create(&cfg, out);
}

COHORT_API void cohort_comm_destroy(cohort_comm *c) {
  if (c == NULL) return;
  if (c->thread_started) {
    pthread_mutex_lock(&c->mu);
    int pending = c->head != NULL || c->busy;
    pthread_mutex_unlock(&c->mu);
    /* Queued work cannot finish usefully once the owner is leaving: fail it fast. */
    if (pending) cohort_comm_abort(c);
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
  }
  coll_tcp_destroy(c->tcp);
  coll_shm_destroy(c->shm);
  free(c->scratch);
  free(c->peer_ops);
  free(c->peer_t);
  free(c->local.ranks);
  free(c->leaders.ranks);
  free(c->cross.ranks);
  pthread_mutex_destroy(&c->err_mu);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

COHORT_API void cohort_comm_abort(cohort_comm *c) {
  if (c == NULL) return;
  coll_fail(c, COHORT_EABORTED, "rank %d: aborted by the application (cohort_comm_abort)", c->rank);
  coll_shm_wake_self(c->shm);
}

COHORT_API int cohort_comm_rank(const cohort_comm *c) {
  return c == NULL ? -EINVAL : c->rank;
}

COHORT_API int cohort_comm_size(const cohort_comm *c) {
  return c == NULL ? -EINVAL : c->size;
}

COHORT_API int cohort_comm_set_timeout(cohort_comm *c, int timeout_ms) {
  if (c == NULL || timeout_ms <= 0) return -EINVAL;
  pthread_mutex_lock(&c->mu);
  c->timeout_ms = timeout_ms;
  pthread_mutex_unlock(&c->mu);
  return 0;
}

COHORT_API const char *cohort_comm_error_message(const cohort_comm *c) {
  if (c == NULL) return "";
  return atomic_load(&((cohort_comm *)c)->failed) ? c->errmsg : "";
}

/* ---- execution ---- */

static int execute(cohort_comm *c, const coll_op *op) {
  if (atomic_load(&c->failed)) return COHORT_EABORTED;
  coll_ctx x = {.comm = c,
                .op = op,
                .seq = c->seq++,
                .deadline_ms = 0, /* set when it first waits: no clock read when it never does */
                .es = cohort_dtype_size(op->dtype)};
  int rc = coll_run_op(&x);
  if (rc != 0 && !atomic_load(&c->failed))
    coll_fail(c, rc, "rank %d: %s #%u failed: %s", c->rank, coll_kind_name(op->kind), x.seq,
              cohort_strerror(rc));
  return rc;
}

static void *progress_main(void *arg) {
  cohort_comm *c = arg;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (!c->stop && (c->head == NULL || c->busy)) pthread_cond_wait(&c->cv, &c->mu);
    if (c->head == NULL || c->busy) break; /* stopping with nothing left */
    cohort_request *r = c->head;
    c->head = r->next;
    if (c->head == NULL) c->tail = NULL;
    c->busy = 1;
    pthread_mutex_unlock(&c->mu);
    int rc = execute(c, &r->op);
    pthread_mutex_lock(&c->mu);
    c->busy = 0;
    r->result = rc;
    r->done = 1;
    pthread_cond_broadcast(&c->cv);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

static int check_op(cohort_comm *c, coll_op *op) {
  if ((unsigned)op->dtype >= COHORT_DTYPE_COUNT || (unsigned)op->op >= COHORT_REDOP_COUNT)
    return -EINVAL;
  size_t es = cohort_dtype_size(op->dtype);
  size_t total = op->count;
  if (op->kind == COLL_REDUCE_SCATTER || op->kind == COLL_ALLGATHER) {
    if (total > SIZE_MAX / (size_t)c->size) return COHORT_ELIMIT;
    total *= (size_t)c->size;
  }
  if (total > (SIZE_MAX / 2) / es) return COHORT_ELIMIT;
  int rooted = op->kind == COLL_BROADCAST || op->kind == COLL_REDUCE;
  if (rooted && (op->root < 0 || op->root >= c->size)) return -EINVAL;
  if (op->count > 0) {
    int need_recv = op->kind != COLL_REDUCE || op->root == c->rank;
    if ((op->send == NULL && op->kind != COLL_BROADCAST) || (need_recv && op->recv == NULL))
      return -EINVAL;
  }
  return 0;
}

/* Validates, then runs now (idle communicator) or queues and waits. */
static int start(cohort_comm *c, coll_op *op, cohort_request **req) {
  if (req != NULL) *req = NULL;
  if (c == NULL) return -EINVAL;
  int rc = check_op(c, op);
  if (rc != 0) {
    /* Peers would wait for this rank until their deadline: tell them now. */
    char msg[64];
    snprintf(msg, sizeof msg, "%s", cohort_strerror(rc));
    return coll_fail(c, rc, "rank %d called %s with invalid arguments (%s)", c->rank,
                     coll_kind_name(op->kind), msg);
  }
  if (atomic_load(&c->failed)) return COHORT_EABORTED;
  pthread_mutex_lock(&c->mu);
  op->timeout_ms = c->timeout_ms;
  if (req == NULL && c->head == NULL && !c->busy) {
    c->busy = 1;
    pthread_mutex_unlock(&c->mu);
    rc = execute(c, op);
    pthread_mutex_lock(&c->mu);
    c->busy = 0;
    /* Only the progress thread waits for `busy` to clear, and only with work queued: waking it
     * for nothing would cost a context switch per blocking call. */
    if (c->head != NULL) pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return rc;
  }
  cohort_request local = {0}, *r = &local;
  if (req != NULL) {
    r = calloc(1, sizeof *r);
    if (r == NULL) {
      pthread_mutex_unlock(&c->mu);
      return -ENOMEM;
    }
  }
  r->comm = c;
  r->op = *op;
  if (c->tail != NULL)
    c->tail->next = r;
  else
    c->head = r;
  c->tail = r;
  pthread_cond_broadcast(&c->cv);
  if (req != NULL) {
    pthread_mutex_unlock(&c->mu);
    *req = r;
    return 0;
  }
  while (!r->done) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  return r->result;
}

COHORT_API int cohort_request_test(cohort_request *req, int *done) {
  if (req == NULL || done == NULL) return -EINVAL;
  pthread_mutex_lock(&req->comm->mu);
  *done = req->done;
  pthread_mutex_unlock(&req->comm->mu);
  return 0;
}

COHORT_API int cohort_request_wait(cohort_request *req) {
  if (req == NULL) return 0;
  cohort_comm *c = req->comm;
  pthread_mutex_lock(&c->mu);
  while (!req->done) pthread_cond_wait(&c->cv, &c->mu);
  int rc = req->result;
  pthread_mutex_unlock(&c->mu);
  free(req);
  return rc;
}

/* ---- the collectives ---- */

#define OP(k, s, r, n, dt, o, rt)                                                                  \
  (coll_op) {                                                                                      \
    .kind = (k), .send = (s), .recv = (r), .count = (n), .dtype = (dt), .op = (o), .root = (rt)    \
  }

COHORT_API int cohort_allreduce(cohort_comm *c, const void *send, void *recv, size_t count,
                                cohort_dtype dtype, cohort_redop op) {
  coll_op o = OP(COLL_ALLREDUCE, send, recv, count, dtype, op, -1);
  return start(c, &o, NULL);
}

COHORT_API int cohort_reduce_scatter(cohort_comm *c, const void *send, void *recv, size_t recvcount,
                                     cohort_dtype dtype, cohort_redop op) {
  coll_op o = OP(COLL_REDUCE_SCATTER, send, recv, recvcount, dtype, op, -1);
  return start(c, &o, NULL);
}

COHORT_API int cohort_allgather(cohort_comm *c, const void *send, void *recv, size_t sendcount,
                                cohort_dtype dtype) {
  coll_op o = OP(COLL_ALLGATHER, send, recv, sendcount, dtype, COHORT_SUM, -1);
  return start(c, &o, NULL);
}

COHORT_API int cohort_broadcast(cohort_comm *c, void *buf, size_t count, cohort_dtype dtype,
                                int root) {
  coll_op o = OP(COLL_BROADCAST, buf, buf, count, dtype, COHORT_SUM, root);
  return start(c, &o, NULL);
}

COHORT_API int cohort_reduce(cohort_comm *c, const void *send, void *recv, size_t count,
                             cohort_dtype dtype, cohort_redop op, int root) {
  coll_op o = OP(COLL_REDUCE, send, recv, count, dtype, op, root);
  return start(c, &o, NULL);
}

COHORT_API int cohort_barrier(cohort_comm *c) {
  coll_op o = OP(COLL_BARRIER, NULL, NULL, 0, COHORT_U8, COHORT_SUM, -1);
  return start(c, &o, NULL);
}

COHORT_API int cohort_iallreduce(cohort_comm *c, const void *send, void *recv, size_t count,
                                 cohort_dtype dtype, cohort_redop op, cohort_request **req) {
  if (req == NULL) return -EINVAL;
  coll_op o = OP(COLL_ALLREDUCE, send, recv, count, dtype, op, -1);
  return start(c, &o, req);
}

COHORT_API int cohort_ireduce_scatter(cohort_comm *c, const void *send, void *recv,
                                      size_t recvcount, cohort_dtype dtype, cohort_redop op,
                                      cohort_request **req) {
  if (req == NULL) return -EINVAL;
  coll_op o = OP(COLL_REDUCE_SCATTER, send, recv, recvcount, dtype, op, -1);
  return start(c, &o, req);
}

COHORT_API int cohort_iallgather(cohort_comm *c, const void *send, void *recv, size_t sendcount,
                                 cohort_dtype dtype, cohort_request **req) {
  if (req == NULL) return -EINVAL;
  coll_op o = OP(COLL_ALLGATHER, send, recv, sendcount, dtype, COHORT_SUM, -1);
  return start(c, &o, req);
}

COHORT_API int cohort_ibroadcast(cohort_comm *c, void *buf, size_t count, cohort_dtype dtype,
                                 int root, cohort_request **req) {
  if (req == NULL) return -EINVAL;
  coll_op o = OP(COLL_BROADCAST, buf, buf, count, dtype, COHORT_SUM, root);
  return start(c, &o, req);
}

/*
 * bootstrap.c - connects the ranks of a new communicator: host identity, the
 * address exchange through the rendezvous store, the TCP mesh, the host
 * groups and the shared-memory handshake.
 *
 * Every rank listens on a TCP port and publishes
 * "<job>/<restart>/coll/<n>/addr/<rank>" = "<host:port> <host identity>
 * <cookie>" (n counts the communicators this process created, identical on
 * every rank). Once all addresses are in the store, rank i connects to every
 * j < i and accepts every j > i, proving itself with j's cookie (the cookie
 * is only known through the authenticated store). Ranks with the same host
 * identity (hostname, boot id, network namespace, /dev/shm file system) share
 * one memory segment; the TCP connections stay open between them to notice
 * deaths.
 *
 * This is the only file besides comm.c (create and destroy) that knows which
 * transports exist: a new transport is set up here and chosen per peer in
 * pick_transports().
 */
#include <errno.h>
#include <fcntl.h>
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
#define DEFAULT_SHM_CHAN (1u << 20)

static atomic_int comm_counter;

int coll_env_size(const char *name, uint64_t min, uint64_t max, size_t *out) {
  const char *v = getenv(name);
  if (v == NULL || v[0] == '\0') return 0;
  uint64_t x;
  if (base_parse_size(v, &x) != 0 || x < min || x > max) return COHORT_ENOENV;
  *out = (size_t)x;
  return 0;
}

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

typedef struct peer_info {
  char host[BASE_HOST_MAX];
  int port;
  char hostid[320];
  unsigned char cookie[COOKIE_LEN];
  int is_new; /* it has no training state (cohort_comm_is_new) */
} peer_info;

static int parse_peer(const char *val, size_t len, peer_info *p) {
  char buf[1024], addr[BASE_HOST_MAX + 16], cookie[2 * COOKIE_LEN + 1];
  if (len >= sizeof buf) return COHORT_EPROTO;
  memcpy(buf, val, len);
  buf[len] = '\0';
  p->is_new = 0;
  int k = sscanf(buf, "%271s %319s %32s %d", addr, p->hostid, cookie, &p->is_new);
  if (k < 3 || p->is_new < 0 || p->is_new > 1) return COHORT_EPROTO;
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

/* How often (ms) a re-formable communicator's bootstrap looks whether its membership already ended
 * (the agent's reshape): waits are cut into slices this long. */
#define CANCEL_SLICE_MS 200

/* COHORT_ERESHAPED when the membership being connected ended already, else 0. */
static int cancelled(cohort_comm *c) {
  return c->ctl.fd >= 0 && atomic_load(&c->ended) >= c->epoch ? COHORT_ERESHAPED : 0;
}

/* The end of the next slice of a wait until deadline. */
static int64_t slice_end(const cohort_comm *c, int64_t deadline) {
  if (c->ctl.fd < 0) return deadline;
  int64_t end = base_now_ms() + CANCEL_SLICE_MS;
  return end < deadline ? end : deadline;
}

static int accept_peers(cohort_comm *c, int lfd, const unsigned char *cookie, int *fds,
                        int64_t deadline) {
  int rank = c->rank, size = c->size, need = size - 1 - rank;
  while (need > 0) {
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    int n = poll(&p, 1, base_deadline_left(slice_end(c, deadline)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0 && cancelled(c)) return COHORT_ERESHAPED;
    if (n == 0 && base_now_ms() < deadline) continue;
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

/* Mesh: connect down, accept up. Connects complete through the listen backlog. */
static int connect_mesh(cohort_comm *c, const peer_info *peers, int lfd, int *fds,
                        int64_t deadline) {
  for (int j = 0; j < c->rank; j++) {
    int rc = base_tcp_connect(peers[j].host, peers[j].port, deadline, &fds[j]);
    if (rc != 0) return rc;
    hello h = {.magic = HELLO_MAGIC, .rank = (uint32_t)c->rank};
    memcpy(h.cookie, peers[j].cookie, COOKIE_LEN);
    rc = base_write_full(fds[j], &h, sizeof h, deadline);
    if (rc != 0) return rc;
  }
  return accept_peers(c, lfd, peers[c->rank].cookie, fds, deadline);
}

/* The store's host and port, and the address to listen on: COHORT_COLL_HOST or the local address
 * that routes to the store. */
static int pick_addresses(const cohort_comm_config *cfg, char *shost, int *sport, char *myhost) {
  if (cfg->store_addr == NULL ||
      base_split_hostport(cfg->store_addr, shost, BASE_HOST_MAX, sport, 0) != 0)
    return COHORT_ENOENV;
  const char *hostenv = getenv("COHORT_COLL_HOST");
  if (hostenv != NULL && hostenv[0] != '\0') {
    base_strlcpy(myhost, hostenv, BASE_HOST_MAX);
    return 0;
  }
  char remote[BASE_HOST_MAX];
  return base_route_addrs(shost, *sport, myhost, BASE_HOST_MAX, remote, sizeof remote);
}

/* Waits until every key is in the store, a slice at a time when the membership may end meanwhile.
 */
static int wait_all(cohort_comm *c, store_client *sc, char **keys, int64_t deadline) {
  for (;;) {
    int rc = store_wait(sc, (const char *const *)keys, (size_t)c->size, slice_end(c, deadline));
    if (rc != -ETIMEDOUT || base_now_ms() >= deadline) return rc;
    if (cancelled(c)) return COHORT_ERESHAPED;
  }
}

/* Publishes this rank's "<addr> <hostid> <cookie> <new>" (peers[rank] filled) and reads everyone's.
 */
static int exchange(cohort_comm *c, const cohort_comm_config *cfg, int k, const char *shost,
                    int sport, const char *addr, peer_info *peers, int64_t deadline) {
  char hex[2 * COOKIE_LEN + 1], val[700];
  int n = c->size, rc;
  store_client *sc = NULL;
  char **keys = calloc((size_t)n, sizeof(char *));
  if (keys == NULL) return -ENOMEM;
  rc = store_client_connect(shost, sport, cfg->token, deadline, &sc, NULL, 0);
  for (int i = 0; i < n && rc == 0; i++) {
    keys[i] = malloc(STORE_KEY_MAX);
    if (keys[i] == NULL)
      rc = -ENOMEM;
    else
      snprintf(keys[i], STORE_KEY_MAX, "%s/%d/coll/%d/addr/%d", cfg->job_id, cfg->restart, k, i);
  }
  const peer_info *me = &peers[c->rank];
  base_hex(me->cookie, COOKIE_LEN, hex);
  int vlen = snprintf(val, sizeof val, "%s %s %s %d", addr, me->hostid, hex, me->is_new);
  if (rc == 0) rc = store_set(sc, keys[c->rank], val, (size_t)vlen, deadline);
  if (rc == 0) rc = wait_all(c, sc, keys, deadline);
  for (int i = 0; i < n && rc == 0; i++) {
    if (i == c->rank) continue;
    void *v = NULL;
    size_t vl = 0;
    rc = store_get(sc, keys[i], &v, &vl, deadline);
    if (rc == 0) rc = parse_peer(v, vl, &peers[i]);
    free(v);
  }
  if (sc != NULL) store_client_close(sc);
  for (int i = 0; i < n; i++) free(keys[i]);
  free(keys);
  return rc;
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

/* The creator's side of the handshake (see setup_shm). */
static int shm_handshake_creator(cohort_comm *c, const char *name, const int *fds, size_t chan,
                                 int64_t deadline) {
  const int *local = c->local.ranks;
  int nlocal = c->local.n;
  shm_unlink(name); /* a leftover of a crashed earlier run with the same name */
  int rc = coll_shm_create(name, 1, local, nlocal, 0, c->size, chan, &c->shm);
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
  /* Every rank has mapped the segment and published its pid: can each read and write the others?
   * Each rank probes from its own side ('P', answered 'Y' or 'N'). */
  msg = 'P';
  for (int i = 1; i < nlocal && rc == 0; i++)
    rc = base_write_full(fds[local[i]], &msg, 1, deadline);
  int all = rc == 0 && coll_shm_probe_cma(c->shm);
  for (int i = 1; i < nlocal && rc == 0; i++) {
    char ans = 0;
    rc = base_read_full(fds[local[i]], &ans, 1, deadline);
    if (rc == 0 && ans != 'Y' && ans != 'N') rc = COHORT_EPEER;
    if (ans != 'Y') all = 0;
  }
  if (rc == 0) {
    coll_shm_set_hdr_cma(c->shm, all);
    msg = 'G';
    for (int i = 1; i < nlocal && rc == 0; i++)
      rc = base_write_full(fds[local[i]], &msg, 1, deadline);
  }
  return rc;
}

static int shm_handshake_other(cohort_comm *c, const char *name, const int *fds, size_t chan,
                               int64_t deadline) {
  int lead = c->local.ranks[0];
  char msg = 0;
  int rc = base_read_full(fds[lead], &msg, 1, deadline);
  if (rc == 0 && msg != 'R') rc = COHORT_EPEER;
  if (rc == 0)
    rc = coll_shm_create(name, 0, c->local.ranks, c->local.n, c->local.me, c->size, chan, &c->shm);
  char ans = rc == 0 ? 'M' : 'F';
  int w = base_write_full(fds[lead], &ans, 1, deadline);
  if (rc == 0) rc = w;
  if (rc == 0) rc = base_read_full(fds[lead], &msg, 1, deadline);
  if (rc == 0 && msg != 'P') rc = COHORT_EPEER;
  if (rc == 0) {
    ans = coll_shm_probe_cma(c->shm) ? 'Y' : 'N';
    rc = base_write_full(fds[lead], &ans, 1, deadline);
  }
  if (rc == 0) rc = base_read_full(fds[lead], &msg, 1, deadline);
  if (rc == 0 && msg != 'G') rc = COHORT_EPEER;
  return rc;
}

/*
 * Shared memory among the ranks of c->local: local[0] creates the segment and
 * tells the others over TCP ('R'); each maps it and answers ('M' or 'F'); the
 * creator unlinks the name once all have answered, so nothing is left in
 * /dev/shm even if the job later crashes, asks every rank to probe
 * process_vm_readv/writev to all the others ('P', answered 'Y' or 'N') and
 * publishes the decision, on only if all succeeded ('G').
 */
static int setup_shm(cohort_comm *c, const cohort_comm_config *cfg, int k, const int *fds,
                     int64_t deadline) {
  size_t chan = DEFAULT_SHM_CHAN, cma = 0, spin = COLL_SHM_SPIN_US;
  int rc = coll_env_size("COHORT_SHM_CHANNEL", 4096, 1u << 30, &chan);
  /* The rings' payloads by address are off by default: on the 2-core test machine they measured
   * slower than the rings. */
  if (rc == 0) rc = coll_env_size("COHORT_SHM_CMA", 0, 1, &cma);
  if (rc == 0) rc = coll_env_size("COHORT_SHM_SPIN_US", 0, 1000000, &spin);
  if (rc != 0) return rc;
  size_t p2 = 4096;
  while (p2 < chan) p2 <<= 1;
  char job[101], name[200];
  sanitize(cfg->job_id, job, sizeof job);
  snprintf(name, sizeof name, "/cohort-%s-%d-%d-%d", job, cfg->restart, k, c->local.ranks[0]);
  /* process_vm_readv/writev between the local ranks, probed in the handshake: the direct
   * allreduce's one-sided access to ordinary buffers, and with COHORT_SHM_CMA=1 the rings' large
   * payloads by address. */
  coll_shm_allow_pull((int)cma);
  rc = c->local.me == 0 ? shm_handshake_creator(c, name, fds, p2, deadline)
                        : shm_handshake_other(c, name, fds, p2, deadline);
  if (rc != 0) return rc;
  coll_shm_set_cma(c->shm, cma && coll_shm_hdr_cma(c->shm));
  coll_shm_set_spin(c->shm, (int)spin);
  coll_shm_watch(c->shm, fds);
  return 0;
}

/* Every host's rank with my local index, in leader order, when all hosts have as many ranks
 * (every rank counts every host, so all agree); else c->cross stays empty. */
static int make_cross(cohort_comm *c, const peer_info *peers) {
  int nhosts = c->leaders.n;
  c->cross.ranks = malloc((size_t)nhosts * sizeof(int));
  if (c->cross.ranks == NULL) return -ENOMEM;
  int uniform = 1;
  for (int h = 0; h < nhosts; h++) {
    int lead = c->leaders.ranks[h], k = 0;
    for (int i = lead; i < c->size; i++) {
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

/*
 * Host groups. Ranks with one host identity share memory and form a host
 * (with COHORT_TRANSPORT=tcp every rank is its own host); every rank derives
 * the same groups from the published identities. The leader of a host is its
 * lowest rank. c->local is also the set of shared-memory peers.
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
  return c->hier ? make_cross(c, peers) : 0;
}

/* Each peer's transport: shared memory for the ranks of this host, TCP for the others. */
static void pick_transports(cohort_comm *c) {
  c->eng.tport_ops[c->eng.ntports] = &coll_tcp_ops;
  c->eng.tport_t[c->eng.ntports++] = c->tcp;
  if (c->shm != NULL) {
    c->eng.tport_ops[c->eng.ntports] = &coll_shm_ops;
    c->eng.tport_t[c->eng.ntports++] = c->shm;
  }
  for (int i = 0; i < c->size; i++) {
    int shm = coll_shm_has(c->shm, i);
    c->eng.peer_ops[i] = shm ? &coll_shm_ops : &coll_tcp_ops;
    c->eng.peer_t[i] = shm ? (void *)c->shm : (void *)c->tcp;
  }
}

static void log_setup(const cohort_comm *c, const char *addr) {
  int nshm = c->shm != NULL ? c->local.n - 1 : 0;
  int reach = c->shm != NULL && coll_shm_hdr_cma(c->shm);
  base_log(BASE_LOG_INFO,
           "rank %d: %d peer(s) over shared memory%s%s, %d over TCP (listening on %s)", c->rank,
           nshm, reach ? " (one-sided access)" : "",
           coll_shm_cma(c->shm) ? " (large payloads by address)" : "", c->size - 1 - nshm, addr);
  if (c->hier)
    base_log(BASE_LOG_INFO, "rank %d: hierarchical allreduce over %d hosts (%d rank(s) here, %s)",
             c->rank, c->leaders.n, c->local.n,
             c->cross.ranks != NULL ? "reduce-scatter form" : "leader form");
}

/* Groups, shared memory and TCP over the connected mesh (fds, which TCP takes over). */
static int setup_transports(cohort_comm *c, const cohort_comm_config *cfg, int k,
                            const peer_info *peers, int *fds, int64_t deadline) {
  size_t hier_on = 1;
  int rc = coll_env_size("COHORT_HIER", 0, 1, &hier_on);
  if (rc == 0) rc = make_groups(c, peers, cfg->transport != COHORT_TRANSPORT_TCP, (int)hier_on);
  if (rc != 0) return rc;
  if (cfg->transport == COHORT_TRANSPORT_SHM && c->local.n != c->size)
    return -EXDEV; /* shared memory required but ranks are on several hosts */
  if (c->local.n > 1) {
    rc = setup_shm(c, cfg, k, fds, deadline);
    if (rc != 0) return rc;
  }
  rc = coll_tcp_create(c->rank, c->size, fds, c->staging_bytes, &c->tcp);
  if (rc != 0) return rc;
  pick_transports(c);
  return 0;
}

int coll_bootstrap(cohort_comm *c, const cohort_comm_config *cfg) {
  int64_t deadline = base_deadline_in(c->timeout_ms);
  int n = c->size, lfd = -1, lport = 0, sport;
  /* The store keys' <n>: this communicator's, kept across re-forms (a newcomer's first communicator
   * meets the survivors' first). */
  if (c->boot_k < 0) c->boot_k = atomic_fetch_add(&comm_counter, 1);
  int k = c->boot_k;
  char shost[BASE_HOST_MAX], myhost[BASE_HOST_MAX], addr[BASE_HOST_MAX + 16];
  peer_info *peers = calloc((size_t)n, sizeof *peers);
  int *fds = malloc((size_t)n * sizeof(int));
  int rc = peers == NULL || fds == NULL ? -ENOMEM : 0;
  for (int i = 0; i < n && fds != NULL; i++) fds[i] = -1;
  if (rc == 0) rc = pick_addresses(cfg, shost, &sport, myhost);
  if (rc == 0) rc = base_tcp_listen(myhost, 0, n + 16, &lfd, &lport);
  if (rc != 0) goto out;
  host_identity(peers[c->rank].hostid, sizeof peers[c->rank].hostid);
  peers[c->rank].is_new = c->self_new;
  base_join_hostport(myhost, lport, addr, sizeof addr);
  snprintf(c->host, sizeof c->host, "%s", myhost);
  rc = base_random_bytes(peers[c->rank].cookie, COOKIE_LEN);
  if (rc == 0) rc = exchange(c, cfg, k, shost, sport, addr, peers, deadline);
  if (rc == 0) rc = connect_mesh(c, peers, lfd, fds, deadline);
  if (rc == 0) rc = setup_transports(c, cfg, k, peers, fds, deadline);
  for (int i = 0; i < n && rc == 0; i++) c->newbits[i] = (unsigned char)peers[i].is_new;
  if (rc == 0) log_setup(c, addr);
out:
  if (lfd >= 0) close(lfd);
  for (int i = 0; i < n && fds != NULL; i++)
    if (fds[i] >= 0) close(fds[i]);
  free(fds);
  free(peers);
  return rc;
}

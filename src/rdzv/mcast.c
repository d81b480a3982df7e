/*
 * mcast.c - discovery by UDP multicast on one network segment, for
 * clusters where nobody knows node 0's address in advance.
 *
 * The node hosting the store announces it periodically until the agent
 * stops the publisher; joiners listen until they hear their job's
 * announcement. Nothing depends on start order: a joiner that starts first
 * keeps listening, one that starts late hears the next announcement (and
 * the announcer answers candidates at once). When no node has rank 0, all
 * nodes send candidate datagrams during a settle window and the lowest node
 * id hosts; the others wait for any announcement of their job, so even
 * nodes whose windows saw different sets of candidates end with one store.
 *
 * Datagram (docs/rdzv.md), all integers big-endian:
 *   0  4  magic "CHRV"          16  4  claimed rank (-1: none)
 *   4  1  version (1)           20  2  store port (0 in a candidate)
 *   5  1  kind (1 announce,     22  1  host length H (0 in a candidate)
 *         2 candidate)          23  1  reserved (0)
 *   6  1  flags (bit 0: MAC)    24  J  job id
 *   7  1  job id length J       24+J H host
 *   8  8  node id               then 32 bytes HMAC-SHA256(token, all before) if flagged
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "base/crypto.h"
#include "rdzv/internal.h"

#define DEFAULT_SETTLE_MS 1000
#define CANDIDATE_PERIOD_MS 100
#define ANNOUNCE_PERIOD_MS 200
#define JOINER_ASK_MS 500
#define FLAG_MAC 0x01
#define MAX_RANK 1000000

/* ---- the datagram codec (pure) ---- */

static void put_u16(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}
static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (24 - 8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (56 - 8 * i));
}
static uint32_t get_u16(const uint8_t *p) {
  return (uint32_t)p[0] << 8 | p[1];
}
static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | p[i];
  return v;
}

static int word_bytes_ok(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] <= ' ' || p[i] > '~') return 0;
  return 1;
}

static int has_token(const char *token) {
  return token != NULL && token[0] != '\0';
}

int rdzv_dgram_encode(const rdzv_dgram *d, const char *token, uint8_t *buf, size_t cap) {
  size_t jlen = strlen(d->job_id), hlen = strlen(d->host);
  if (!rdzv_job_id_valid(d->job_id)) return -EINVAL;
  if (d->kind == RDZV_ANNOUNCE) {
    if (d->port < 1 || d->port > 65535 || hlen >= BASE_HOST_MAX) return -EINVAL;
    if (hlen > 0 && !rdzv_word_valid(d->host, BASE_HOST_MAX - 1)) return -EINVAL;
  } else if (d->kind == RDZV_CANDIDATE) {
    if (d->port != 0 || hlen != 0) return -EINVAL;
  } else {
    return -EINVAL;
  }
  if (d->claimed_rank < -1 || d->claimed_rank >= MAX_RANK) return -EINVAL;
  size_t len = RDZV_DGRAM_HEADER + jlen + hlen + (has_token(token) ? RDZV_MAC_LEN : 0);
  if (len > cap) return -EINVAL;
  memcpy(buf, RDZV_DGRAM_MAGIC, 4);
  buf[4] = RDZV_DGRAM_VERSION;
  buf[5] = (uint8_t)d->kind;
  buf[6] = has_token(token) ? FLAG_MAC : 0;
  buf[7] = (uint8_t)jlen;
  put_u64(buf + 8, d->node_id);
  put_u32(buf + 16, (uint32_t)d->claimed_rank);
  put_u16(buf + 20, (uint32_t)d->port);
  buf[22] = (uint8_t)hlen;
  buf[23] = 0;
  memcpy(buf + RDZV_DGRAM_HEADER, d->job_id, jlen);
  memcpy(buf + RDZV_DGRAM_HEADER + jlen, d->host, hlen);
  size_t body = RDZV_DGRAM_HEADER + jlen + hlen;
  if (has_token(token) && base_hmac_sha256(token, strlen(token), buf, body, buf + body) != 0)
    return -ENOMEM;
  return (int)len;
}

int rdzv_dgram_parse(const uint8_t *buf, size_t len, const char *token, rdzv_dgram *out) {
  memset(out, 0, sizeof *out);
  if (len < RDZV_DGRAM_HEADER || memcmp(buf, RDZV_DGRAM_MAGIC, 4) != 0 ||
      buf[4] != RDZV_DGRAM_VERSION)
    return COHORT_EPROTO;
  int kind = buf[5], flags = buf[6];
  size_t jlen = buf[7], hlen = buf[22];
  if ((kind != RDZV_ANNOUNCE && kind != RDZV_CANDIDATE) || (flags & ~FLAG_MAC) != 0 ||
      buf[23] != 0 || jlen == 0 || jlen > RDZV_JOB_ID_MAX)
    return COHORT_EPROTO;
  size_t body = RDZV_DGRAM_HEADER + jlen + hlen;
  size_t want = body + ((flags & FLAG_MAC) ? RDZV_MAC_LEN : 0);
  if (len != want) return COHORT_EPROTO;
  int32_t rank = (int32_t)get_u32(buf + 16);
  int port = (int)get_u16(buf + 20);
  if (rank < -1 || rank >= MAX_RANK) return COHORT_EPROTO;
  if (kind == RDZV_ANNOUNCE && port == 0) return COHORT_EPROTO;
  if (kind == RDZV_CANDIDATE && (port != 0 || hlen != 0)) return COHORT_EPROTO;
  const uint8_t *job = buf + RDZV_DGRAM_HEADER, *host = job + jlen;
  if (!word_bytes_ok(job, jlen) || !word_bytes_ok(host, hlen)) return COHORT_EPROTO;
  memcpy(out->job_id, job, jlen);
  out->job_id[jlen] = '\0';
  if (!rdzv_job_id_valid(out->job_id)) return COHORT_EPROTO;
  /* Structure first, then authenticity: a token mismatch is reported only for well-formed bytes. */
  if (has_token(token)) {
    if (!(flags & FLAG_MAC)) return COHORT_EAUTH;
    if (!base_hmac_sha256_ok(token, strlen(token), buf, body, buf + body)) return COHORT_EAUTH;
    out->authenticated = 1;
  } else if (flags & FLAG_MAC) {
    return COHORT_EAUTH; /* the sender has a token we lack: not our job's configuration */
  }
  out->kind = kind;
  out->node_id = get_u64(buf + 8);
  out->claimed_rank = rank;
  out->port = port;
  memcpy(out->host, host, hlen);
  out->host[hlen] = '\0';
  return 0;
}

/* ---- group, route, interface ---- */

int rdzv_mcast_group_for_job(const char *job_id, char *addr, size_t addrlen, int *port) {
  uint8_t h[BASE_SHA256_LEN];
  int rc = base_sha256(job_id, strlen(job_id), h);
  if (rc != 0) return rc;
  /* 239.255.0.0/16 is the IPv4 organization-local scope (RFC 2365). */
  snprintf(addr, addrlen, "239.255.%u.%u", h[0], h[1]);
  *port = 29500 + (int)(get_u16(h + 2) % 1000);
  return 0;
}

int rdzv_route_iface(const char *proc_root, const char *group, char *ifname, size_t iflen) {
  struct in_addr g;
  if (inet_pton(AF_INET, group, &g) != 1) return -EINVAL;
  char path[512];
  snprintf(path, sizeof path, "%s/net/route", proc_root ? proc_root : "/proc");
  FILE *f = fopen(path, "re");
  if (f == NULL) return -errno;
  char line[512];
  int best_bits = -1;
  unsigned long best_metric = 0;
  int found = 0;
  /* The header line fails the scan below and is skipped like any malformed line. */
  while (fgets(line, sizeof line, f) != NULL) {
    char name[IF_NAMESIZE + 8];
    unsigned int dest, gw, flags, refcnt, use, metric, mask;
    if (sscanf(line, "%23s %x %x %x %u %u %u %x", name, &dest, &gw, &flags, &refcnt, &use, &metric,
               &mask) != 8)
      continue;
    if (!(flags & 0x1) || strlen(name) >= iflen) continue; /* RTF_UP */
    /* The kernel prints addresses and masks as the in-memory (network order) u32. */
    if ((g.s_addr & mask) != dest) continue;
    int bits = __builtin_popcount(mask);
    if (bits > best_bits || (bits == best_bits && metric < best_metric)) {
      best_bits = bits;
      best_metric = metric;
      base_strlcpy(ifname, name, iflen);
      found = 1;
    }
  }
  fclose(f);
  return found ? 0 : -ENOENT;
}

/* The first IPv4 address of interface name, as text and as in_addr. */
static int iface_addr(const char *name, char *addr, size_t addrlen, struct in_addr *in) {
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) return -errno;
  int rc = -EADDRNOTAVAIL;
  for (struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
    if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET || strcmp(i->ifa_name, name) != 0)
      continue;
    const struct sockaddr_in *sin = (const void *)i->ifa_addr;
    *in = sin->sin_addr;
    inet_ntop(AF_INET, &sin->sin_addr, addr, (socklen_t)addrlen);
    rc = 0;
    break;
  }
  freeifaddrs(ifs);
  return rc;
}

uint64_t rdzv_node_id(void) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static uint64_t id;
  static pid_t owner;
  pthread_mutex_lock(&mu);
  if (owner != getpid() || id == 0) {
    /* Zero is avoided so that "no id" can never win an election. */
    do {
      if (base_random_bytes(&id, sizeof id) != 0) id = (uint64_t)base_now_us() ^ (uint64_t)getpid();
    } while (id == 0);
    owner = getpid();
  }
  uint64_t v = id;
  pthread_mutex_unlock(&mu);
  return v;
}

/* Where and how a node talks multicast. */
typedef struct mc_ctx {
  struct sockaddr_in group;
  char group_str[64];
  char ifname[IF_NAMESIZE];
  unsigned ifindex;
  char addr[INET_ADDRSTRLEN]; /* the interface's IPv4 address */
  struct in_addr in;
  int fd;
  /* datagrams ignored, for the debug log */
  unsigned other_job, malformed, unauthenticated;
} mc_ctx;

static int mc_setup(const rdzv_opts *o, const char *proc_root, mc_ctx *c, char *errbuf,
                    size_t errlen) {
  memset(c, 0, sizeof *c);
  c->fd = -1;
  if (!rdzv_job_id_valid(o->job_id))
    return rdzv_err(
        errbuf, errlen, -EINVAL,
        "multicast discovery needs a job id (--job): it keeps jobs on one network apart");
  char host[BASE_HOST_MAX];
  int port;
  if (o->mcast_group != NULL) {
    if (base_split_hostport(o->mcast_group, host, sizeof host, &port, 0) != 0)
      return rdzv_err(errbuf, errlen, -EINVAL, "multicast group '%.60s' is not ADDR:PORT",
                      o->mcast_group);
  } else if (rdzv_mcast_group_for_job(o->job_id, host, sizeof host, &port) != 0) {
    return rdzv_err(errbuf, errlen, -ENOMEM, "no memory to derive the multicast group");
  }
  c->group.sin_family = AF_INET;
  c->group.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, host, &c->group.sin_addr) != 1 ||
      !IN_MULTICAST(ntohl(c->group.sin_addr.s_addr)))
    return rdzv_err(errbuf, errlen, -EINVAL,
                    "multicast group '%.60s' is not an IPv4 multicast address (224.0.0.0/4)", host);
  base_join_hostport(host, port, c->group_str, sizeof c->group_str);
  if (o->iface != NULL) {
    if (strlen(o->iface) >= sizeof c->ifname)
      return rdzv_err(errbuf, errlen, -EINVAL, "interface name '%.40s' is too long", o->iface);
    base_strlcpy(c->ifname, o->iface, sizeof c->ifname);
  } else {
    int rc = rdzv_route_iface(proc_root, host, c->ifname, sizeof c->ifname);
    if (rc != 0)
      return rdzv_err(errbuf, errlen, rc == -ENOENT ? -ENETUNREACH : rc,
                      "no route to multicast group %s: give --iface or add a default route", host);
  }
  c->ifindex = if_nametoindex(c->ifname);
  if (c->ifindex == 0)
    return rdzv_err(errbuf, errlen, -ENODEV, "no network interface named '%s'", c->ifname);
  if (iface_addr(c->ifname, c->addr, sizeof c->addr, &c->in) != 0)
    return rdzv_err(errbuf, errlen, -EADDRNOTAVAIL, "interface %s has no IPv4 address", c->ifname);
  return 0;
}

/* Opens the socket: bound to the group's port, a member of the group on the interface. */
static int mc_open(mc_ctx *c, char *errbuf, size_t errlen) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return rdzv_err(errbuf, errlen, -errno, "socket: %s", cohort_strerror(-errno));
  int one = 1, zero = 0, ttl = 1;
  struct ip_mreqn mr = {0};
  mr.imr_multiaddr = c->group.sin_addr;
  mr.imr_ifindex = (int)c->ifindex;
  struct ip_mreqn mif = {0};
  mif.imr_ifindex = (int)c->ifindex;
  const char *what = NULL;
  /* SO_REUSEADDR lets several agents on one host (other jobs, tests) share the port. Binding
   * to the group address keeps unicast and other groups' traffic off this socket. */
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
    what = "SO_REUSEADDR";
  else if (bind(fd, (const struct sockaddr *)&c->group, sizeof c->group) != 0)
    what = "bind";
  else if (setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mr, sizeof mr) != 0)
    what = "joining the group";
  else if (setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &mif, sizeof mif) != 0)
    what = "IP_MULTICAST_IF";
  else if (setsockopt(fd, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof ttl) != 0)
    what = "IP_MULTICAST_TTL";
  else if (setsockopt(fd, IPPROTO_IP, IP_MULTICAST_LOOP, &one, sizeof one) != 0)
    what = "IP_MULTICAST_LOOP";
  else if (setsockopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, &zero, sizeof zero) != 0)
    what = "IP_MULTICAST_ALL";
  if (what != NULL) {
    int rc = -errno;
    close(fd);
    return rdzv_err(errbuf, errlen, rc, "multicast %s on %s (%s): %s", c->group_str, c->ifname,
                    what, cohort_strerror(rc));
  }
  c->fd = fd;
  return 0;
}

static int mc_send(mc_ctx *c, const rdzv_dgram *d, const char *token) {
  uint8_t buf[RDZV_DGRAM_MAX];
  int len = rdzv_dgram_encode(d, token, buf, sizeof buf);
  if (len < 0) return len;
  if (sendto(c->fd, buf, (size_t)len, 0, (const struct sockaddr *)&c->group, sizeof c->group) < 0)
    return -errno;
  return 0;
}

/*
 * Receives one datagram of this job from another node, waiting until
 * deadline. Returns 0 (d filled, *from the sender's address), -ETIMEDOUT,
 * or -errno. Other jobs', malformed and unauthenticated datagrams are
 * counted and skipped.
 */
static int mc_recv(mc_ctx *c, const char *job_id, const char *token, int64_t deadline,
                   rdzv_dgram *d, char *from, size_t fromlen) {
  uint64_t self = rdzv_node_id();
  for (;;) {
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int n = poll(&p, 1, base_deadline_left(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) return -ETIMEDOUT;
    uint8_t buf[RDZV_DGRAM_MAX + 1];
    struct sockaddr_in src;
    socklen_t sl = sizeof src;
    ssize_t r = recvfrom(c->fd, buf, sizeof buf, 0, (struct sockaddr *)&src, &sl);
    if (r < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return -errno;
    }
    int rc = rdzv_dgram_parse(buf, (size_t)r, token, d);
    if (rc == COHORT_EPROTO) {
      c->malformed++;
      continue;
    }
    if (rc == COHORT_EAUTH) {
      c->unauthenticated++;
      continue;
    }
    if (strcmp(d->job_id, job_id) != 0) {
      c->other_job++;
      continue;
    }
    if (d->node_id == self) continue; /* our own, looped back */
    inet_ntop(AF_INET, &src.sin_addr, from, (socklen_t)fromlen);
    return 0;
  }
}

static void mc_close(mc_ctx *c) {
  if (c->other_job || c->malformed || c->unauthenticated)
    base_log(BASE_LOG_DEBUG,
             "rdzv mcast %s: ignored %u datagrams of other jobs, %u malformed, %u unauthenticated",
             c->group_str, c->other_job, c->malformed, c->unauthenticated);
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
}

/* A jittered period: p * [0.75, 1.25). */
static int jitter(int p) {
  uint16_t r = 0;
  base_random_bytes(&r, sizeof r);
  return p * 3 / 4 + (int)(r % (unsigned)(p / 2 > 0 ? p / 2 : 1));
}

static int become_host(const rdzv_opts *o, mc_ctx *c, const char *why, rdzv_target *t, char *errbuf,
                       size_t errlen) {
  t->host_store = 1;
  base_strlcpy(t->host, c->addr, sizeof t->host);
  int rc = base_free_port(c->addr, &t->port);
  if (rc != 0)
    return rdzv_err(errbuf, errlen, rc, "no free port on %s: %s", c->addr, cohort_strerror(rc));
  rdzv_source(t, "multicast %s on %s: hosting (%s), job %.30s", c->group_str, c->ifname, why,
              o->job_id);
  return 0;
}

static void take_announce(const mc_ctx *c, const rdzv_dgram *d, const char *from, rdzv_target *t) {
  base_strlcpy(t->host, d->host[0] ? d->host : from, sizeof t->host);
  t->port = d->port;
  t->host_store = 0;
  char hp[BASE_HOST_MAX + 16];
  base_join_hostport(t->host, t->port, hp, sizeof hp);
  rdzv_source(t, "multicast %s on %s: store %.60s", c->group_str, c->ifname, hp);
}

int rdzv_mcast_discover_root(const rdzv_opts *o, const char *proc_root, rdzv_target *t,
                             char *errbuf, size_t errlen) {
  mc_ctx c;
  int rc = mc_setup(o, proc_root, &c, errbuf, errlen);
  if (rc != 0) return rc;
  t->node_rank = o->node_rank;
  t->nnodes_min = o->nnodes_min;
  t->nnodes_max = o->nnodes_max;
  if (o->node_rank == 0) return become_host(o, &c, "node rank 0", t, errbuf, errlen);
  if ((rc = mc_open(&c, errbuf, errlen)) != 0) return rc;
  int64_t deadline = rdzv_deadline(o);
  rdzv_dgram d;
  char from[INET_ADDRSTRLEN];
  if (o->node_rank < 0) {
    /* Election: candidates during the settle window; an announcement ends it at once. */
    int settle = o->settle_ms > 0 ? o->settle_ms : DEFAULT_SETTLE_MS;
    int64_t window_end = base_now_ms() + settle;
    if (window_end > deadline) window_end = deadline;
    uint64_t self = rdzv_node_id(), lowest = self;
    rdzv_dgram cand = {.kind = RDZV_CANDIDATE, .node_id = self, .claimed_rank = -1};
    base_strlcpy(cand.job_id, o->job_id, sizeof cand.job_id);
    int64_t next_send = base_now_ms();
    /* The distinct candidates heard (each sends every period): for the log line only. */
    uint64_t heard[64];
    unsigned seen = 0;
    while (base_now_ms() < window_end) {
      if (base_now_ms() >= next_send) {
        rc = mc_send(&c, &cand, o->token);
        if (rc != 0) {
          mc_close(&c);
          return rdzv_err(errbuf, errlen, rc, "sending to %s on %s: %s", c.group_str, c.ifname,
                          cohort_strerror(rc));
        }
        next_send = base_now_ms() + jitter(CANDIDATE_PERIOD_MS);
      }
      int64_t until = next_send < window_end ? next_send : window_end;
      rc = mc_recv(&c, o->job_id, o->token, until, &d, from, sizeof from);
      if (rc == -ETIMEDOUT) continue;
      if (rc != 0) break;
      if (d.kind == RDZV_ANNOUNCE) {
        take_announce(&c, &d, from, t);
        mc_close(&c);
        return 0;
      }
      /* Only nodes without a rank stand for election; ranked joiners send candidates too. */
      if (d.claimed_rank != -1) continue;
      unsigned k = 0;
      while (k < seen && heard[k] != d.node_id) k++;
      if (k == seen && seen < sizeof heard / sizeof heard[0]) heard[seen++] = d.node_id;
      if (d.node_id < lowest) lowest = d.node_id;
    }
    if (rc != 0 && rc != -ETIMEDOUT) {
      mc_close(&c);
      return rdzv_err(errbuf, errlen, rc, "receiving on %s: %s", c.group_str, cohort_strerror(rc));
    }
    if (lowest == self) {
      mc_close(&c);
      char why[64];
      snprintf(why, sizeof why, "lowest node id of %s%u candidates",
               seen == sizeof heard / sizeof heard[0] ? "at least " : "", seen + 1);
      return become_host(o, &c, why, t, errbuf, errlen);
    }
  }
  /* A joiner: wait for any announcement of this job. Its own candidates, sent now and then,
   * make a running announcer answer at once instead of at its next period. */
  rdzv_dgram ask = {
      .kind = RDZV_CANDIDATE, .node_id = rdzv_node_id(), .claimed_rank = o->node_rank};
  base_strlcpy(ask.job_id, o->job_id, sizeof ask.job_id);
  int64_t next_ask = base_now_ms();
  for (;;) {
    if (base_now_ms() >= next_ask) {
      /* A failed send only loses the shortcut: the periodic announcements still come. */
      (void)mc_send(&c, &ask, o->token);
      next_ask = base_now_ms() + jitter(JOINER_ASK_MS);
    }
    int64_t until = next_ask < deadline ? next_ask : deadline;
    rc = mc_recv(&c, o->job_id, o->token, until, &d, from, sizeof from);
    if (rc == -ETIMEDOUT && base_now_ms() < deadline) continue;
    if (rc != 0) break;
    if (d.kind == RDZV_ANNOUNCE) {
      take_announce(&c, &d, from, t);
      mc_close(&c);
      return 0;
    }
  }
  unsigned ign = c.other_job + c.malformed + c.unauthenticated, unauth = c.unauthenticated;
  mc_close(&c);
  if (rc == -ETIMEDOUT)
    return rdzv_err(errbuf, errlen, -ETIMEDOUT,
                    "no store announced for job %.40s on %s via %s before the deadline (%u other "
                    "datagrams ignored, %u failed authentication)",
                    o->job_id, c.group_str, c.ifname, ign, unauth);
  return rdzv_err(errbuf, errlen, rc, "receiving on %s: %s", c.group_str, cohort_strerror(rc));
}

int rdzv_mcast_discover(const rdzv_opts *opts, rdzv_target *out, char *errbuf, size_t errlen) {
  return rdzv_mcast_discover_root(opts, NULL, out, errbuf, errlen);
}

/* ---- the announcer ---- */

struct rdzv_mcast_pub {
  mc_ctx c;
  pthread_t thread;
  int wake[2]; /* written by stop */
  char *token;
  char job_id[RDZV_JOB_ID_MAX + 1];
  rdzv_dgram announce;
};

/* What the wake pipe says: 0 for 'q' (announce only when asked), 1 for stop. */
static int woken_to_stop(rdzv_mcast_pub *p) {
  char b = 'x';
  ssize_t k = read(p->wake[0], &b, 1);
  return !(k == 1 && b == 'q');
}

static void *announcer_main(void *arg) {
  rdzv_mcast_pub *p = arg;
  int64_t next = base_now_ms(), last = 0;
  int quiet = 0; /* the job has formed: answer the nodes and tools that ask, nothing more */
  for (;;) {
    int64_t now = base_now_ms();
    if (now >= next) {
      /* A failed send (interface briefly down) is retried at the next period. */
      int rc = mc_send(&p->c, &p->announce, p->token);
      if (rc != 0) base_log(BASE_LOG_DEBUG, "rdzv mcast announce: %s", cohort_strerror(rc));
      last = now;
      next = quiet ? INT64_MAX : now + jitter(ANNOUNCE_PERIOD_MS);
    }
    struct pollfd fds[2] = {{.fd = p->wake[0], .events = POLLIN},
                            {.fd = p->c.fd, .events = POLLIN}};
    int wait = next == INT64_MAX ? -1 : (int)(next - now > 0 ? next - now : 0);
    int n = poll(fds, 2, wait);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    if (fds[0].revents) {
      if (woken_to_stop(p)) break;
      quiet = 1;
      next = INT64_MAX;
    }
    if (fds[1].revents) {
      rdzv_dgram d;
      char from[INET_ADDRSTRLEN];
      int rc = mc_recv(&p->c, p->job_id, p->token, base_now_ms(), &d, from, sizeof from);
      /* A candidate of this job is a node looking for the store: answer now, at most every
       * 50 ms, rather than at the next period. */
      if (rc == 0 && d.kind == RDZV_CANDIDATE && next > last + 50)
        next = last + 50 > base_now_ms() ? last + 50 : base_now_ms();
    }
  }
  return NULL;
}

int rdzv_mcast_publish_start(const rdzv_opts *o, const char *advertise_host, int store_port,
                             rdzv_mcast_pub **out, char *errbuf, size_t errlen) {
  *out = NULL;
  rdzv_mcast_pub *p = calloc(1, sizeof *p);
  if (p == NULL) return rdzv_err(errbuf, errlen, -ENOMEM, "out of memory");
  p->wake[0] = p->wake[1] = -1;
  int rc = mc_setup(o, NULL, &p->c, errbuf, errlen);
  if (rc != 0) goto out;
  if (advertise_host != NULL && advertise_host[0] != '\0' &&
      !rdzv_word_valid(advertise_host, BASE_HOST_MAX - 1)) {
    rc = rdzv_err(errbuf, errlen, -EINVAL, "advertised host '%.60s' is not a host name",
                  advertise_host);
    goto out;
  }
  base_strlcpy(p->job_id, o->job_id, sizeof p->job_id);
  p->announce.kind = RDZV_ANNOUNCE;
  p->announce.node_id = rdzv_node_id();
  p->announce.claimed_rank = o->node_rank;
  p->announce.port = store_port;
  base_strlcpy(p->announce.job_id, o->job_id, sizeof p->announce.job_id);
  base_strlcpy(p->announce.host, advertise_host && advertise_host[0] ? advertise_host : p->c.addr,
               sizeof p->announce.host);
  if (has_token(o->token) && (p->token = strdup(o->token)) == NULL) {
    rc = rdzv_err(errbuf, errlen, -ENOMEM, "out of memory");
    goto out;
  }
  uint8_t probe[RDZV_DGRAM_MAX];
  if ((rc = rdzv_dgram_encode(&p->announce, p->token, probe, sizeof probe)) < 0) {
    rc = rdzv_err(errbuf, errlen, rc, "cannot encode the announcement");
    goto out;
  }
  if ((rc = mc_open(&p->c, errbuf, errlen)) != 0) goto out;
  if (pipe2(p->wake, O_CLOEXEC) != 0) {
    rc = rdzv_err(errbuf, errlen, -errno, "pipe: %s", cohort_strerror(-errno));
    goto out;
  }
  if ((rc = pthread_create(&p->thread, NULL, announcer_main, p)) != 0) {
    rc = rdzv_err(errbuf, errlen, -rc, "cannot start the announcer thread");
    goto out;
  }
  *out = p;
  return 0;
out:
  if (p->wake[0] >= 0) close(p->wake[0]);
  if (p->wake[1] >= 0) close(p->wake[1]);
  mc_close(&p->c);
  free(p->token);
  free(p);
  return rc;
}

void rdzv_mcast_publish_quiet(rdzv_mcast_pub *p) {
  if (p == NULL) return;
  ssize_t w;
  do w = write(p->wake[1], "q", 1);
  while (w < 0 && errno == EINTR);
}

void rdzv_mcast_publish_stop(rdzv_mcast_pub *p) {
  if (p == NULL) return;
  ssize_t w;
  do w = write(p->wake[1], "x", 1);
  while (w < 0 && errno == EINTR);
  pthread_join(p->thread, NULL);
  close(p->wake[0]);
  close(p->wake[1]);
  mc_close(&p->c);
  free(p->token);
  free(p);
}

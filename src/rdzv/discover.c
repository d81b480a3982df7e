/*
 * discover.c - rdzv_discover(): picks the method, the static method
 * (--master HOST:PORT), and the publisher front end.
 */
#include "rdzv/discover.h"

#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "rdzv/internal.h"

/* How long the static method waits for a name to resolve before calling it "not this host". */
#define RESOLVE_TIMEOUT_MS 3000

int rdzv_err(char *errbuf, size_t errlen, int rc, const char *fmt, ...) {
  if (errbuf != NULL && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, errlen, fmt, ap);
    va_end(ap);
  }
  return rc;
}

void rdzv_source(rdzv_target *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->source, sizeof t->source, fmt, ap);
  va_end(ap);
}

int rdzv_word_valid(const char *s, size_t max) {
  if (s == NULL) return 0;
  size_t n = strlen(s);
  if (n == 0 || n > max) return 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] <= ' ' || s[i] > '~') return 0;
  return 1;
}

int rdzv_job_id_valid(const char *job_id) {
  if (job_id == NULL) return 0;
  size_t n = strlen(job_id);
  if (n == 0 || n > RDZV_JOB_ID_MAX) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = job_id[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    if (!ok) return 0;
  }
  return 1;
}

/*
 * getaddrinfo() has no deadline and a slow resolver can block for many
 * seconds, so the lookup runs in a detached thread; on timeout the caller
 * walks away and whichever side finishes last frees the shared state.
 */
typedef struct resolve_job {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs, done, rc;
  struct addrinfo *res;
  char host[BASE_HOST_MAX];
} resolve_job;

static void resolve_unref(resolve_job *j) {
  pthread_mutex_lock(&j->mu);
  int left = --j->refs;
  pthread_mutex_unlock(&j->mu);
  if (left > 0) return;
  if (j->res) freeaddrinfo(j->res);
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cv);
  free(j);
}

static void *resolve_main(void *arg) {
  resolve_job *j = arg;
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(j->host, NULL, &hints, &res);
  pthread_mutex_lock(&j->mu);
  j->rc = rc;
  j->res = res;
  j->done = 1;
  pthread_cond_signal(&j->cv);
  pthread_mutex_unlock(&j->mu);
  resolve_unref(j);
  return NULL;
}

/* 1 when one of the addresses in res belongs to a local interface. */
static int addrs_are_local(const struct addrinfo *res) {
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) return 0;
  int local = 0;
  for (const struct addrinfo *ai = res; ai != NULL && !local; ai = ai->ai_next) {
    for (struct ifaddrs *i = ifs; i != NULL && !local; i = i->ifa_next) {
      if (i->ifa_addr == NULL || i->ifa_addr->sa_family != ai->ai_family) continue;
      if (ai->ai_family == AF_INET) {
        const struct sockaddr_in *a = (const void *)ai->ai_addr, *b = (const void *)i->ifa_addr;
        local = a->sin_addr.s_addr == b->sin_addr.s_addr;
      } else if (ai->ai_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)ai->ai_addr, *b = (const void *)i->ifa_addr;
        local = memcmp(&a->sin6_addr, &b->sin6_addr, sizeof a->sin6_addr) == 0;
      }
    }
  }
  freeifaddrs(ifs);
  return local;
}

int rdzv_host_is_local(const char *host, int timeout_ms) {
  if (host == NULL || host[0] == '\0' || strlen(host) >= BASE_HOST_MAX) return 0;
  /* The node's own name, also followed by a domain (pod "job-0" and service "job-0.job"). */
  char self[BASE_HOST_MAX] = "";
  if (gethostname(self, sizeof self - 1) == 0 && self[0] != '\0') {
    size_t n = strlen(self);
    if (strcmp(host, self) == 0 || (strncmp(host, self, n) == 0 && host[n] == '.')) return 1;
  }
  resolve_job *j = calloc(1, sizeof *j);
  if (j == NULL) return 0;
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv, NULL);
  j->refs = 2;
  base_strlcpy(j->host, host, sizeof j->host);
  pthread_t th;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&th, &attr, resolve_main, j) != 0) {
    pthread_attr_destroy(&attr);
    j->refs = 1;
    resolve_unref(j);
    return 0;
  }
  pthread_attr_destroy(&attr);
  int64_t deadline = base_deadline_in(timeout_ms);
  int local = 0;
  pthread_mutex_lock(&j->mu);
  while (!j->done && base_deadline_left(deadline) > 0) {
    /* Condition variables wait on CLOCK_REALTIME; short slices keep this deadline monotonic. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int slice = base_deadline_left(deadline);
    if (slice > 50) slice = 50;
    ts.tv_nsec += (long)slice * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
  }
  if (j->done && j->rc == 0) local = addrs_are_local(j->res);
  pthread_mutex_unlock(&j->mu);
  resolve_unref(j);
  return local;
}

void rdzv_own_addr(const rdzv_opts *o, char *out, size_t len) {
  base_strlcpy(out, "127.0.0.1", len);
  if (o->local_addr != NULL && o->local_addr[0] != '\0') {
    base_strlcpy(out, o->local_addr, len);
    return;
  }
  char route_if[IF_NAMESIZE] = "";
  if (rdzv_route_iface(NULL, "0.0.0.0", route_if, sizeof route_if) != 0) route_if[0] = '\0';
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) return;
  int found = 0; /* 1: an up non-loopback address, 2: the default route's */
  for (struct ifaddrs *i = ifs; i != NULL && found < 2; i = i->ifa_next) {
    if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
        (i->ifa_flags & IFF_LOOPBACK))
      continue;
    int rank = strcmp(i->ifa_name, route_if) == 0 ? 2 : 1;
    if (rank <= found) continue;
    const struct sockaddr_in *sin = (const void *)i->ifa_addr;
    char a[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &sin->sin_addr, a, sizeof a) == NULL) continue;
    base_strlcpy(out, a, len);
    found = rank;
  }
  freeifaddrs(ifs);
}

/* etcd: the first endpoint stands for the store (routes, the job id); nobody hosts. */
/* The smallest of the comma-separated endpoints in list (so that the job id, derived
 * from it, does not depend on the order each node lists them in). */
static int least_endpoint(const char *list, char *out, size_t len) {
  out[0] = '\0';
  for (const char *p = list; *p != '\0';) {
    size_t n = strcspn(p, ",");
    if (n == 0 || n >= len) return -1;
    if (out[0] == '\0' || strncmp(p, out, n) < 0 || (strncmp(p, out, n) == 0 && out[n] != '\0')) {
      memcpy(out, p, n);
      out[n] = '\0';
    }
    p += n;
    if (*p == ',') p++;
  }
  return out[0] != '\0' ? 0 : -1;
}

static int discover_etcd(const rdzv_opts *o, rdzv_target *t, char *errbuf, size_t errlen) {
  char least[BASE_HOST_MAX + 16];
  if (o->master == NULL || least_endpoint(o->master, least, sizeof least) != 0)
    return rdzv_err(errbuf, errlen, -EINVAL,
                    "etcd needs its endpoints (--rdzv-endpoint HOST:PORT,...)");
  if (base_split_hostport(least, t->host, sizeof t->host, &t->port, 0) != 0 || t->host[0] == '\0')
    return rdzv_err(errbuf, errlen, -EINVAL, "etcd endpoint '%.60s' is not HOST:PORT", least);
  t->host_store = 0;
  t->node_rank = o->node_rank;
  t->nnodes_min = o->nnodes_min;
  t->nnodes_max = o->nnodes_max;
  rdzv_source(t, "etcd %.100s", o->master);
  return 0;
}

static int discover_static(const rdzv_opts *o, rdzv_target *t, char *errbuf, size_t errlen) {
  if (o->master == NULL)
    return rdzv_err(errbuf, errlen, -EINVAL,
                    "no scheduler environment found: give --master HOST:PORT (node 0's address), "
                    "--rdzv-file PATH or multicast");
  if (base_split_hostport(o->master, t->host, sizeof t->host, &t->port, 0) != 0 ||
      t->host[0] == '\0')
    return rdzv_err(errbuf, errlen, -EINVAL,
                    "--master '%.60s' is not HOST:PORT (IPv6 as [ADDR]:PORT, port 1..65535)",
                    o->master);
  t->node_rank = o->node_rank;
  t->nnodes_min = o->nnodes_min;
  t->nnodes_max = o->nnodes_max;
  if (o->node_rank >= 0) {
    t->host_store = o->node_rank == 0;
  } else {
    /* A name that does not resolve yet (a headless service before its pod is ready) is
     * not an error: this node is then a joiner, and the join retries until its deadline. */
    int timeout = RESOLVE_TIMEOUT_MS;
    if (o->deadline_ms > 0) {
      int left = base_deadline_left(o->deadline_ms);
      if (left < timeout) timeout = left;
    }
    t->host_store = rdzv_host_is_local(t->host, timeout);
  }
  char hp[BASE_HOST_MAX + 16];
  base_join_hostport(t->host, t->port, hp, sizeof hp);
  if (o->node_rank >= 0)
    rdzv_source(t, "static --master %.80s, node rank %d", hp, o->node_rank);
  else
    rdzv_source(t, "static --master %.80s (%s)", hp,
                t->host_store ? "a local address: hosting" : "not local: joining");
  return 0;
}

static int check_opts(const rdzv_opts *o, char *errbuf, size_t errlen) {
  if (o->node_rank < -1)
    return rdzv_err(errbuf, errlen, -EINVAL, "--node-rank %d is negative", o->node_rank);
  if (o->nnodes_min < 0 || o->nnodes_max < o->nnodes_min)
    return rdzv_err(errbuf, errlen, -EINVAL, "--nnodes %d:%d is not MIN:MAX with MIN <= MAX",
                    o->nnodes_min, o->nnodes_max);
  if (o->node_rank >= 0 && o->nnodes_max > 0 && o->node_rank >= o->nnodes_max)
    return rdzv_err(errbuf, errlen, -EINVAL, "--node-rank %d is not below --nnodes %d",
                    o->node_rank, o->nnodes_max);
  if (o->job_id != NULL && !rdzv_job_id_valid(o->job_id))
    return rdzv_err(errbuf, errlen, -EINVAL,
                    "job id '%.40s' must be 1..%d characters of A-Z a-z 0-9 . _ -", o->job_id,
                    RDZV_JOB_ID_MAX);
  return 0;
}

int rdzv_discover(const rdzv_opts *opts, char *const envp[], rdzv_target *out, char *errbuf,
                  size_t errlen) {
  if (errbuf != NULL && errlen > 0) errbuf[0] = '\0';
  memset(out, 0, sizeof *out);
  out->node_rank = -1;
  int rc = check_opts(opts, errbuf, errlen);
  if (rc != 0) return rc;
  switch (opts->method) {
  case RDZV_AUTO:
    rc = rdzv_env_discover(opts, envp, out, errbuf, errlen);
    if (rc != -ENOENT) return rc;
    memset(out, 0, sizeof *out);
    out->node_rank = -1;
    /* Nothing to go by at all: -ENOENT, so a caller can tell "single node" from bad input. */
    if (opts->master == NULL)
      return rdzv_err(errbuf, errlen, -ENOENT,
                      "no scheduler environment found (Slurm, Kubernetes, Open MPI, "
                      "MASTER_ADDR) and no --master HOST:PORT given: give node 0's address "
                      "with --master (torchrun's --rdzv-endpoint or --master-addr), or "
                      "--discover mcast|file|etcd");
    return discover_static(opts, out, errbuf, errlen);
  case RDZV_STATIC:
    return discover_static(opts, out, errbuf, errlen);
  case RDZV_ENV:
    rc = rdzv_env_discover(opts, envp, out, errbuf, errlen);
    if (rc == -ENOENT)
      return rdzv_err(errbuf, errlen, -ENOENT,
                      "no scheduler environment found (Slurm SLURM_JOB_ID/SLURM_NODEID, Kubernetes "
                      "JOB_COMPLETION_INDEX, MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, Open MPI)");
    return rc;
  case RDZV_FILE:
    return rdzv_file_discover(opts, out, errbuf, errlen);
  case RDZV_MCAST:
    return rdzv_mcast_discover(opts, out, errbuf, errlen);
  case RDZV_ETCD:
    return discover_etcd(opts, out, errbuf, errlen);
  }
  return rdzv_err(errbuf, errlen, -EINVAL, "unknown rendezvous method %d", (int)opts->method);
}

/* ---- publishing ---- */

struct rdzv_publisher {
  rdzv_method method;
  rdzv_mcast_pub *mcast; /* RDZV_MCAST: the announcer thread */
};

int64_t rdzv_deadline(const rdzv_opts *opts) {
  return opts->deadline_ms > 0 ? opts->deadline_ms : base_deadline_in(300000);
}

int rdzv_publish_start(const rdzv_opts *opts, const char *advertise_host, int store_port,
                       rdzv_publisher **out, char *errbuf, size_t errlen) {
  if (errbuf != NULL && errlen > 0) errbuf[0] = '\0';
  *out = NULL;
  if (store_port < 1 || store_port > 65535)
    return rdzv_err(errbuf, errlen, -EINVAL, "store port %d is not in 1..65535", store_port);
  if (opts->method == RDZV_MCAST) {
    rdzv_publisher *p = calloc(1, sizeof *p);
    if (p == NULL) return rdzv_err(errbuf, errlen, -ENOMEM, "out of memory");
    p->method = RDZV_MCAST;
    if (advertise_host == NULL) advertise_host = opts->local_addr;
    int rc = rdzv_mcast_publish_start(opts, advertise_host, store_port, &p->mcast, errbuf, errlen);
    if (rc != 0) {
      free(p);
      return rc;
    }
    *out = p;
    return 0;
  }
  if (opts->method != RDZV_FILE) return 0;
  if (opts->rdzv_file == NULL || !rdzv_job_id_valid(opts->job_id))
    return rdzv_err(errbuf, errlen, -EINVAL, "the rendezvous file needs --rdzv-file and a job id");
  /* An address, not the host name: another node's resolver may map the name elsewhere. */
  char host[BASE_HOST_MAX] = "";
  if (advertise_host != NULL && advertise_host[0] != '\0' && strlen(advertise_host) < sizeof host)
    base_strlcpy(host, advertise_host, sizeof host);
  else
    rdzv_own_addr(opts, host, sizeof host);
  if (!rdzv_word_valid(host, sizeof host - 1))
    return rdzv_err(errbuf, errlen, -EINVAL, "advertised address '%.60s' is not a host address",
                    host);
  int rc = rdzv_file_publish(opts->rdzv_file, opts->job_id, host, store_port, opts->token, errbuf,
                             errlen);
  if (rc != 0) return rc;
  rdzv_publisher *p = calloc(1, sizeof *p);
  if (p == NULL) return rdzv_err(errbuf, errlen, -ENOMEM, "out of memory");
  p->method = RDZV_FILE;
  *out = p;
  return 0;
}

void rdzv_publish_quiet(rdzv_publisher *pub) {
  if (pub != NULL && pub->method == RDZV_MCAST) rdzv_mcast_publish_quiet(pub->mcast);
}

void rdzv_publish_stop(rdzv_publisher *pub) {
  if (pub == NULL) return;
  if (pub->method == RDZV_MCAST) rdzv_mcast_publish_stop(pub->mcast);
  free(pub);
}

/* backend.c - the built-in store or etcd behind the store's calls; see backend.h. */
#include "rdzv/backend.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "base/net.h"

struct rdzv_backend {
  int is_etcd;
  char name[1200];
  /* the built-in store */
  char host[BASE_HOST_MAX];
  int port;
  char *token;
  /* etcd */
  char *endpoints, *cacert, *cert, *key, *user, *password;
  char prefix[128];
  char anchor[STORE_KEY_MAX]; /* a guest's: the key whose lease its writes take; "" none */
  int ttl_s;
  _Atomic int64_t answered; /* when a member last answered anything (etcd_opts.answered) */
  pthread_mutex_t lock;
  pthread_cond_t wake;
  int64_t lease; /* 0 until the first connection granted it */
  pthread_t keeper;
  etcd *renewer; /* the keeper's connection, made before it starts; then the keeper's */
  int keeping, stop;
  int lost;                /* the store is gone: no revoke on the way out */
  struct etcd_conn *conns; /* every open connection, for rdzv_backend_linger (under lock) */
};

static char *dup_or_null(const char *s) {
  return s != NULL ? strdup(s) : NULL;
}

/* The lock and the keeper's wake-up, on the monotonic clock. */
static void init_sync(rdzv_backend *b) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&b->wake, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&b->lock, NULL);
}

int rdzv_backend_store(const char *host, int port, const char *token, rdzv_backend **out) {
  rdzv_backend *b = calloc(1, sizeof *b);
  if (b == NULL) return -ENOMEM;
  base_strlcpy(b->host, host, sizeof b->host);
  b->port = port;
  b->token = dup_or_null(token);
  char addr[BASE_HOST_MAX + 8];
  base_join_hostport(host, port, addr, sizeof addr);
  snprintf(b->name, sizeof b->name, "the rendezvous store at %s", addr);
  init_sync(b);
  *out = b;
  return 0;
}

int rdzv_backend_etcd(const etcd_opts *o, const char *job_id, int64_t ttl_ms, rdzv_backend **out) {
  rdzv_backend *b = calloc(1, sizeof *b);
  if (b == NULL) return -ENOMEM;
  b->is_etcd = 1;
  b->endpoints = dup_or_null(o->endpoints);
  b->cacert = dup_or_null(o->cacert);
  b->cert = dup_or_null(o->cert);
  b->key = dup_or_null(o->key);
  b->user = dup_or_null(o->user);
  b->password = dup_or_null(o->password);
  snprintf(b->prefix, sizeof b->prefix, "/cohort/%s/", job_id);
  b->ttl_s = (int)((ttl_ms + 999) / 1000);
  if (b->ttl_s < 2) b->ttl_s = 2;
  snprintf(b->name, sizeof b->name, "etcd %s", o->endpoints ? o->endpoints : "");
  init_sync(b);
  *out = b;
  return 0;
}

int rdzv_backend_etcd_guest(const etcd_opts *o, const char *job_id, const char *anchor,
                            rdzv_backend **out) {
  if (anchor == NULL || anchor[0] == '\0' || strlen(anchor) >= STORE_KEY_MAX) return -EINVAL;
  int rc = rdzv_backend_etcd(o, job_id, 2000, out);
  if (rc == 0) base_strlcpy((*out)->anchor, anchor, sizeof(*out)->anchor);
  return rc;
}

int rdzv_backend_is_etcd(const rdzv_backend *b) {
  return b->is_etcd;
}

const char *rdzv_backend_name(const rdzv_backend *b) {
  return b->name;
}

int rdzv_backend_members(const rdzv_backend *b) {
  int n = 1;
  for (const char *p = b->is_etcd && b->endpoints != NULL ? b->endpoints : ""; *p != '\0'; p++)
    n += *p == ',';
  return n;
}

int64_t rdzv_backend_answered(rdzv_backend *b) {
  return b->is_etcd ? atomic_load(&b->answered) : 0;
}

/* ---- etcd behind the store's calls ---- */

typedef struct etcd_conn {
  etcd *e;
  rdzv_backend *b;
  store_client *client; /* the store's calls over it */
  struct etcd_conn *next;
  /* rdzv_backend_linger: the writes take the lease of linger_anchor, or ("") one of
   * linger_ttl_s of their own; linger_lease once known */
  int lingering;
  char linger_anchor[STORE_KEY_MAX];
  int linger_ttl_s;
  int64_t linger_lease;
} etcd_conn;

static int64_t lease_of(rdzv_backend *b) {
  pthread_mutex_lock(&b->lock);
  int64_t l = b->lease;
  pthread_mutex_unlock(&b->lock);
  return l;
}

/* The lease of a lingering connection's writes: found (or granted) at its first write. */
static int linger_lease(etcd_conn *c, int64_t *lease, int64_t deadline) {
  int rc = 0;
  if (c->linger_lease == 0 && c->linger_anchor[0] != '\0')
    rc = etcd_lease_of(c->e, c->linger_anchor, &c->linger_lease, deadline);
  else if (c->linger_lease == 0)
    rc = etcd_lease_grant(c->e, c->linger_ttl_s, &c->linger_lease, deadline);
  if (rc == 0 && c->linger_lease == 0) rc = -ENOENT; /* the anchor has no lease */
  *lease = c->linger_lease;
  return rc;
}

/* The lease a write takes: the agent's own, a lingering connection's, or a guest's anchor's
 * (see backend.h). */
static int write_lease(etcd_conn *c, int64_t *lease, int64_t deadline) {
  if (c->lingering) return linger_lease(c, lease, deadline);
  if (c->b->anchor[0] == '\0') {
    *lease = lease_of(c->b);
    return 0;
  }
  return etcd_lease_of(c->e, c->b->anchor, lease, deadline);
}

static int op_set(void *impl, const char *key, const void *val, size_t len, int64_t deadline) {
  etcd_conn *c = impl;
  int64_t lease;
  int rc = write_lease(c, &lease, deadline);
  return rc != 0 ? rc : etcd_put(c->e, key, val, len, lease, deadline);
}

static int op_get(void *impl, const char *key, void **val, size_t *len, int64_t deadline) {
  return etcd_get(((etcd_conn *)impl)->e, key, val, len, deadline);
}

static int op_wait(void *impl, const char *const *keys, size_t n, int64_t deadline) {
  return etcd_wait(((etcd_conn *)impl)->e, keys, n, deadline);
}

static int op_add(void *impl, const char *key, int64_t delta, int64_t *result, int64_t deadline) {
  etcd_conn *c = impl;
  int64_t lease = 0;
  int rc = delta > 0 ? write_lease(c, &lease, deadline) : 0;
  return rc != 0 ? rc : etcd_add(c->e, key, delta, lease, result, deadline);
}

static int op_cas(void *impl, const char *key, const void *expected, size_t elen,
                  const void *desired, size_t dlen, void **current, size_t *curlen,
                  int64_t deadline) {
  etcd_conn *c = impl;
  int64_t lease;
  int rc = write_lease(c, &lease, deadline);
  if (rc != 0) return rc;
  return etcd_cas(c->e, key, expected, elen, desired, dlen, lease, current, curlen, deadline);
}

static int op_get_many(void *impl, const char *const *keys, size_t n, void **vals, size_t *lens,
                       int64_t deadline) {
  return etcd_get_many(((etcd_conn *)impl)->e, keys, n, vals, lens, deadline);
}

static int op_del(void *impl, const char *key, int64_t deadline) {
  return etcd_delete(((etcd_conn *)impl)->e, key, deadline);
}

static void op_close(void *impl) {
  etcd_conn *c = impl;
  pthread_mutex_lock(&c->b->lock);
  for (etcd_conn **p = &c->b->conns; *p != NULL; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  pthread_mutex_unlock(&c->b->lock);
  etcd_close(c->e);
  free(c);
}

static void op_interrupt(void *impl) {
  etcd_interrupt(((etcd_conn *)impl)->e);
}

static const char *op_error(void *impl) {
  return etcd_error(((etcd_conn *)impl)->e);
}

static const store_ops etcd_ops = {op_set,      op_get, op_wait,  op_add,       op_cas,
                                   op_get_many, op_del, op_close, op_interrupt, op_error};

static void etcd_options(rdzv_backend *b, etcd_opts *o) {
  *o = (etcd_opts){.endpoints = b->endpoints,
                   .prefix = b->prefix,
                   .cacert = b->cacert,
                   .cert = b->cert,
                   .key = b->key,
                   .user = b->user,
                   .password = b->password,
                   .answered = &b->answered};
}

/* ---- the lease ---- */

/* A renewal may take until this long before the lease would expire, and at least this long:
 * a busy etcd answers late, and a renewal given up on is work etcd did for nothing (1,024
 * nodes' leases expired when renewals were cut at 200 ms). */
#define RENEW_MARGIN_MS 250

/* Renews the lease, renewed last at last_ok; 0 or the error (-ECANCELED: closing). */
static int renew(rdzv_backend *b, etcd *e, int64_t lease, int64_t last_ok) {
  int64_t deadline = last_ok + (int64_t)b->ttl_s * 1000 - RENEW_MARGIN_MS;
  if (deadline < base_deadline_in(RENEW_MARGIN_MS)) deadline = base_deadline_in(RENEW_MARGIN_MS);
  return etcd_lease_keepalive(e, lease, deadline);
}

/* Renews the lease every third of its TTL until told to stop; then revokes it, unless the store
 * is lost. */
static void *keep_lease(void *arg) {
  rdzv_backend *b = arg;
  int warned = 0, renewed = 1;
  int64_t last_ok = base_now_ms(); /* granted just before */
  pthread_mutex_lock(&b->lock);
  while (!b->stop) {
    /* A third of the TTL after a renewal; soon after one that failed (an election, a member
     * gone), which would otherwise leave the lease a third of its TTL to live. */
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    int64_t ns = until.tv_nsec + (renewed ? (int64_t)b->ttl_s * 1000000000 / 3 : 50000000);
    until.tv_sec += ns / 1000000000;
    until.tv_nsec = ns % 1000000000;
    pthread_cond_timedwait(&b->wake, &b->lock, &until);
    if (b->stop) break;
    int64_t lease = b->lease;
    pthread_mutex_unlock(&b->lock);
    int rc = renew(b, b->renewer, lease, last_ok);
    renewed = rc != -ETIMEDOUT && rc != -ECONNREFUSED && rc != -ECANCELED;
    if (rc == 0) last_ok = base_now_ms();
    if (rc == -ENOENT && !warned++)
      base_log(BASE_LOG_WARN, "the etcd lease of this agent expired: its keys are gone");
    pthread_mutex_lock(&b->lock);
  }
  int64_t lease = b->lease;
  int lost = b->lost;
  etcd_resume(b->renewer); /* after close's interrupt, which it made holding the lock */
  pthread_mutex_unlock(&b->lock);
  if (!lost) etcd_lease_revoke(b->renewer, lease, base_deadline_in(2000));
  etcd_close(b->renewer);
  return NULL;
}

/*
 * The first connection grants the lease and starts keeping it. The keeper's own connection is
 * made here, within the caller's deadline: a renewal must end before the lease would, which
 * may be too short for an authentication (bcrypt in etcd) on a busy member.
 */
static int ensure_lease(rdzv_backend *b, etcd *e, int64_t deadline) {
  pthread_mutex_lock(&b->lock);
  int rc = 0;
  if (b->lease == 0) {
    etcd_opts o;
    etcd_options(b, &o);
    int64_t id = 0;
    rc = etcd_connect(&o, deadline, &b->renewer, NULL, 0);
    if (rc == 0) rc = etcd_lease_grant(e, b->ttl_s, &id, deadline);
    if (rc == 0) {
      b->lease = id;
      rc = -pthread_create(&b->keeper, NULL, keep_lease, b);
      b->keeping = rc == 0;
    }
    if (rc != 0) {
      etcd_close(b->renewer);
      b->renewer = NULL;
    }
  }
  pthread_mutex_unlock(&b->lock);
  return rc;
}

static int connect_etcd(rdzv_backend *b, int64_t deadline, store_client **out, char *err,
                        size_t errlen) {
  etcd_opts o;
  etcd_options(b, &o);
  etcd_conn *c = calloc(1, sizeof *c);
  if (c == NULL) return -ENOMEM;
  c->b = b;
  int rc = etcd_connect(&o, deadline, &c->e, err, errlen);
  if (rc == 0 && b->anchor[0] == '\0' && (rc = ensure_lease(b, c->e, deadline)) != 0 && err != NULL)
    snprintf(err, errlen, "%s: cannot grant a lease: %s", b->name, cohort_strerror(rc));
  if (rc == 0) rc = store_client_wrap(&etcd_ops, c, out);
  if (rc != 0) {
    etcd_close(c->e);
    free(c);
    return rc;
  }
  c->client = *out;
  pthread_mutex_lock(&b->lock);
  c->next = b->conns;
  b->conns = c;
  pthread_mutex_unlock(&b->lock);
  return 0;
}

int rdzv_backend_connect(rdzv_backend *b, int64_t deadline_ms, store_client **out, char *err,
                         size_t errlen) {
  if (b->is_etcd) return connect_etcd(b, deadline_ms, out, err, errlen);
  return store_client_connect(b->host, b->port, b->token, deadline_ms, out, err, errlen);
}

/* The etcd connection behind client, NULL when it is not one of b's. */
static etcd_conn *conn_of(rdzv_backend *b, store_client *client) {
  pthread_mutex_lock(&b->lock);
  etcd_conn *c = b->conns;
  while (c != NULL && c->client != client) c = c->next;
  pthread_mutex_unlock(&b->lock);
  return c;
}

int rdzv_backend_linger(rdzv_backend *b, store_client *client, const char *anchor, int64_t ttl_ms) {
  if (!b->is_etcd) return 0;
  etcd_conn *c = conn_of(b, client);
  if (c == NULL || (anchor != NULL && strlen(anchor) >= sizeof c->linger_anchor)) return -EINVAL;
  if (c->lingering) return 0; /* it keeps its lease */
  c->lingering = 1;
  base_strlcpy(c->linger_anchor, anchor != NULL ? anchor : "", sizeof c->linger_anchor);
  c->linger_ttl_s = (int)((ttl_ms + 999) / 1000);
  if (c->linger_ttl_s < 2) c->linger_ttl_s = 2;
  c->linger_lease = 0;
  return 0;
}

int rdzv_backend_linger_end(rdzv_backend *b, store_client *client, int64_t deadline_ms) {
  if (!b->is_etcd) return 0;
  etcd_conn *c = conn_of(b, client);
  if (c == NULL || !c->lingering) return -EINVAL;
  int rc = c->linger_lease != 0 ? etcd_lease_revoke(c->e, c->linger_lease, deadline_ms) : 0;
  c->lingering = 0, c->linger_lease = 0;
  return rc;
}

void rdzv_backend_lost(rdzv_backend *b) {
  if (b == NULL) return;
  pthread_mutex_lock(&b->lock);
  b->lost = 1;
  pthread_mutex_unlock(&b->lock);
}

void rdzv_backend_close(rdzv_backend *b) {
  if (b == NULL) return;
  pthread_mutex_lock(&b->lock);
  b->stop = 1;
  if (b->keeping) etcd_interrupt(b->renewer); /* a renewal under way ends at once */
  pthread_cond_signal(&b->wake);
  pthread_mutex_unlock(&b->lock);
  if (b->keeping) pthread_join(b->keeper, NULL);
  pthread_mutex_destroy(&b->lock);
  pthread_cond_destroy(&b->wake);
  if (b->token != NULL) memset(b->token, 0, strlen(b->token));
  if (b->password != NULL) memset(b->password, 0, strlen(b->password));
  free(b->token);
  free(b->endpoints);
  free(b->cacert);
  free(b->cert);
  free(b->key);
  free(b->user);
  free(b->password);
  free(b);
}

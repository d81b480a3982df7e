/*
 * etcd.h - a client of etcd v3 through its JSON gateway (HTTP or HTTPS with
 * libcurl, jansson for the bodies): the key-value operations the agents'
 * rendezvous uses, with the built-in store's meanings (store.h), plus
 * leases. `--rdzv-backend etcd` speaks through it (rdzv/backend.h,
 * docs/rdzv.md).
 *
 * Keys are the caller's, under the prefix given at connect time (a job's
 * keys live under "/cohort/<job>/" so that jobs sharing an etcd stay apart).
 * Values are bytes.
 *
 * Endpoints: a comma-separated list of HOST:PORT (IPv6 as [ADDR]:PORT). A
 * request that cannot reach one member (refused, reset, timed out) is sent
 * to the next; it fails only when none answered before its deadline. A
 * request is retried only where that is safe: reads, puts of a whole value,
 * and the compare-and-set transactions (their compare makes a replay a
 * no-op or a visible failure); with several members, one that has not
 * answered such a request within its share of the time left (at least
 * 1 s) is left for the next. Every request requires a leader (etcd's
 * "hasleader"): a member without one (an election under way, or quorum
 * lost) answers 503 at once, and the request moves on. etcd_add is a put counted by the key's
 * version: an addition whose answer was lost after etcd applied it (a
 * member dying at that moment) is added again; a counter read across such
 * a failure may be one high.
 *
 * Security: with a CA file the endpoints are spoken to over HTTPS, with a
 * client certificate and key when given (etcd's --client-cert-auth); with
 * a user and password the client authenticates (/v3/auth/authenticate) and
 * sends the token with every request, authenticating again when etcd says
 * the token expired.
 *
 * Errors: 0 or negative: -ENOENT (absent key, expired lease), -ETIMEDOUT
 * (the deadline passed), -ECONNREFUSED (no endpoint answered), COHORT_EAUTH
 * (wrong user or password, a permission refused, a certificate refused),
 * COHORT_EPROTO (an answer that is not etcd's JSON), -ENOMEM, -EINVAL. On
 * failure err (when given) holds one line naming the endpoints and the cause.
 *
 * Thread safety: one etcd handle per thread (etcd_interrupt excepted).
 */
#ifndef COHORT_RDZV_ETCD_H
#define COHORT_RDZV_ETCD_H

#include <stddef.h>
#include <stdint.h>

typedef struct etcd etcd;

typedef struct etcd_opts {
  const char *endpoints;  /* "host:2379[,host:2379...]" */
  const char *prefix;     /* prepended to every key, e.g. "/cohort/job1/"; NULL: "" */
  const char *cacert;     /* CA file: speak HTTPS ("": HTTPS with the system's CAs); NULL: HTTP */
  const char *cert, *key; /* client certificate and its key (PEM), or NULL */
  const char *user, *password; /* NULL: no authentication */
  /* When not NULL: set to base_now_ms() whenever a member answers anything at all (an error,
   * a 503 during an election), so that a caller can tell etcd busy from etcd gone. */
  _Atomic int64_t *answered;
} etcd_opts;

/*
 * Reaches the first endpoint that answers (retrying every endpoint with
 * backoff until deadline_ms) and authenticates. Returns 0 and *out, or an
 * error with one line in err.
 */
int etcd_connect(const etcd_opts *o, int64_t deadline_ms, etcd **out, char *err, size_t errlen);
void etcd_close(etcd *e);

/* The endpoint requests go to now ("host:port"). */
const char *etcd_endpoint(const etcd *e);

/* Puts key = val, attached to lease (0: none). */
int etcd_put(etcd *e, const char *key, const void *val, size_t len, int64_t lease,
             int64_t deadline_ms);
/* *val malloc'ed (caller frees); -ENOENT when absent. */
int etcd_get(etcd *e, const char *key, void **val, size_t *len, int64_t deadline_ms);
/* The lease key is attached to (0: none); -ENOENT when key is absent. */
int etcd_lease_of(etcd *e, const char *key, int64_t *lease, int64_t deadline_ms);
/* n keys in one transaction (one round trip for up to 128 keys); absent: NULL and 0. */
int etcd_get_many(etcd *e, const char *const *keys, size_t n, void **vals, size_t *lens,
                  int64_t deadline_ms);
/* Deletes key; -ENOENT when it was absent. */
int etcd_delete(etcd *e, const char *key, int64_t deadline_ms);
/*
 * When key's value equals expected (absent when expected is NULL), replaces
 * it with desired (attached to lease). *current (malloc'ed; NULL when
 * absent; may be NULL) gets the value after the transaction either way.
 */
int etcd_cas(etcd *e, const char *key, const void *expected, size_t elen, const void *desired,
             size_t dlen, int64_t lease, void **current, size_t *curlen, int64_t deadline_ms);
/*
 * Counts: adds delta (0 to ETCD_ADD_MAX; 0 reads) to the counter at key;
 * *result the new count (may be NULL). The count is the key's version in
 * etcd (how many times it was put since it was created), so concurrent
 * additions never retry. The key holds a mark that etcd_get and
 * etcd_get_many read back as the count in decimal, as the built-in store's
 * counters read. A counter restarts when its key is deleted or the lease it
 * lives under (the last adder's) expires.
 */
#define ETCD_ADD_MAX 1024
int etcd_add(etcd *e, const char *key, int64_t delta, int64_t lease, int64_t *result,
             int64_t deadline_ms);
/*
 * Waits until every key has existed: reads them, then watches the first
 * one missing (etcd's watch stream, from the revision of that read, so no
 * change between the two is missed) and reads again, from that key on,
 * when it changes (a key seen once is not read again); -ETIMEDOUT at the
 * deadline. The watch outlives the call: the next wait on that one key
 * listens on without a read or a new watch (a watcher waiting in slices
 * costs etcd nothing between changes). It goes when its key changes, its
 * stream ends, or a request finds its member failing.
 */
int etcd_wait(etcd *e, const char *const *keys, size_t n, int64_t deadline_ms);

/* The last failure in one line, etcd's own message where it gave one ("" none yet). */
const char *etcd_error(const etcd *e);

/*
 * From another thread: cuts short the request or wait under way on e, and
 * fails every later one with -ECANCELED, until etcd_resume (from e's own
 * thread). For a watcher whose wait must end at once at the job's end.
 */
void etcd_interrupt(etcd *e);
void etcd_resume(etcd *e);

/* A lease of ttl_s seconds (etcd may raise it to its minimum). */
int etcd_lease_grant(etcd *e, int ttl_s, int64_t *id, int64_t deadline_ms);
/* Renews the lease; -ENOENT when it has expired (its keys are gone). */
int etcd_lease_keepalive(etcd *e, int64_t id, int64_t deadline_ms);
/* Ends the lease at once, deleting its keys. */
int etcd_lease_revoke(etcd *e, int64_t id, int64_t deadline_ms);

#endif

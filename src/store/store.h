/*
 * store.h - the rendezvous key-value store: server and client.
 *
 * The agent of node 0 hosts a store_server; agents and workers talk to it
 * with store_client. Keys are strings (1..STORE_KEY_MAX bytes, no NUL),
 * values are bytes (0..STORE_VALUE_MAX). The wire protocol is documented in
 * docs/store-protocol.md.
 *
 * Errors: 0 or negative codes (-errno or COHORT_E*), see cohort_strerror().
 * Besides those listed per function, any call may return a transport error
 * (-ECONNRESET, -ETIMEDOUT, ...), COHORT_EPROTO, COHORT_ELIMIT (a key or
 * value over the limits above, or the server's memory limit) or -EINVAL (an
 * empty key). After a transport error or a timeout the client drops its
 * connection and the next call connects again (same host, token, backoff);
 * a connection the server closed while idle is replaced before the next
 * request is sent, so a request is never sent twice.
 *
 * A client is used by one thread at a time; the server runs its own thread
 * (which blocks all signals) and its functions are called from one thread.
 */
#ifndef COHORT_STORE_STORE_H
#define COHORT_STORE_STORE_H

#include <stddef.h>
#include <stdint.h>

#define STORE_KEY_MAX 512
#define STORE_VALUE_MAX (1u << 20)
#define STORE_TOKEN_MAX 256

typedef struct store_server store_server;
typedef struct store_client store_client;

typedef struct store_server_opts {
  const char *bind_host; /* NULL/"" : all IPv4 addresses; "127.0.0.1" for local jobs */
  int port;              /* 0 picks a free port */
  const char *token;     /* NULL: no authentication */
  int max_conns;         /* 0: default (65,536: two a node of 16,384) */
  int idle_timeout_ms;   /* 0: default; a connection silent this long is closed */
  int io_timeout_ms;     /* 0: default; a frame must arrive whole within this */
  size_t max_bytes;      /* 0: default; total bytes of keys+values held */
} store_server_opts;

/*
 * Starts a server on its own thread. Errors: those of bind/listen (e.g.
 * -EADDRINUSE), -EINVAL for negative options or a token over
 * STORE_TOKEN_MAX bytes. The server logs (base_log, warn) one line for every
 * connection it closes because of the peer's behaviour.
 */
int store_server_start(const store_server_opts *opts, store_server **out);
/* The bound port. */
int store_server_port(const store_server *srv);
/* Stops the thread, closes every connection, frees everything. NULL ok. */
void store_server_stop(store_server *srv);

/*
 * Connects to host:port, retrying with backoff until deadline_ms (absolute,
 * base_now_ms()), then authenticates with token (NULL: none). On failure the
 * error is -ETIMEDOUT/-ECONNREFUSED/... or COHORT_EAUTH, and errbuf (when
 * non-NULL) receives a one-line description naming the address.
 */
int store_client_connect(const char *host, int port, const char *token, int64_t deadline_ms,
                         store_client **out, char *errbuf, size_t errlen);
void store_client_close(store_client *c);

/*
 * Lets another thread cut a client's waits short (the agent's watcher, which
 * waits on the failure key in slices, stops at once at the job's end instead
 * of at the end of its slice). store_client_interruptible() prepares c (an
 * eventfd) and is called before c is shared; 0, or -ENOTSUP for a wrapped
 * backend (store_client_wrap) without an interrupt op, -EMFILE, ....
 * store_client_interrupt() may be called from any thread while c is open:
 * the store's answer being awaited (store_wait, store_get, ...) and every
 * later call fail with -ECANCELED. A wrapped backend without an interrupt op
 * is left alone: its calls end at their deadlines.
 */
int store_client_interruptible(store_client *c);
void store_client_interrupt(store_client *c);

/*
 * A wrapped backend's own words for its last failure (etcd's message, say
 * "etcdserver: requested lease not found"), for the one line a caller
 * prints; "" for the built-in store, whose errors the codes say.
 */
const char *store_client_error(store_client *c);

/* Per-call deadline (absolute, ms). Operations fail with -ETIMEDOUT after it. */
int store_set(store_client *c, const char *key, const void *val, size_t len, int64_t deadline_ms);
/*
 * This connection's will: when its client goes away (closes or resets the
 * connection, or dies) the server sets key to val (4096 bytes at most), as
 * SET would, waking its waiters; not when the server closes the connection
 * itself (a limit, a malformed request) or stops. A later call replaces the
 * will. -ENOTSUP on a client of another backend (etcd).
 */
int store_will(store_client *c, const char *key, const void *val, size_t len, int64_t deadline_ms);
/* *val is malloc'ed (caller frees); -ENOENT when the key is absent. */
int store_get(store_client *c, const char *key, void **val, size_t *len, int64_t deadline_ms);
/*
 * Waits until every key exists; -ETIMEDOUT at the deadline (a deadline in
 * the past checks once). At most 4096 keys. The server gets the time left
 * as a relative timeout; if it never answers, the call gives up 2 s after
 * the deadline.
 */
int store_wait(store_client *c, const char *const *keys, size_t nkeys, int64_t deadline_ms);
/*
 * Adds delta to the integer counter at key (absent = 0); returns the new
 * value in *result (may be NULL). Counters are stored as decimal text, so
 * store_get() reads "42". -EINVAL when the value is not such a number,
 * -ERANGE when the sum overflows int64.
 */
int store_add(store_client *c, const char *key, int64_t delta, int64_t *result,
              int64_t deadline_ms);
/*
 * Compare-and-set: when the current value equals `expected` (absent when
 * expected == NULL), replace it with `desired`. *current (malloc'ed, may be
 * NULL when absent) receives the value after the operation either way.
 * Returns 0 whether or not the value was replaced: the caller compares
 * *current with desired (current/curlen may be NULL when not needed).
 */
int store_cas(store_client *c, const char *key, const void *expected, size_t elen,
              const void *desired, size_t dlen, void **current, size_t *curlen,
              int64_t deadline_ms);
/*
 * Reads n keys in one go: the GET requests are pipelined (sent without
 * waiting for the answers, which are read meanwhile), so n keys cost about
 * one round trip instead of n. vals[i] receives a malloc'ed copy (caller
 * frees) and lens[i] its length, or NULL and 0 when the key is absent. On
 * any error every vals[i] is NULL.
 */
int store_get_many(store_client *c, const char *const *keys, size_t n, void **vals, size_t *lens,
                   int64_t deadline_ms);
/* Deletes key; -ENOENT when absent. */
int store_delete(store_client *c, const char *key, int64_t deadline_ms);
int store_ping(store_client *c, int64_t deadline_ms);

/*
 * Another key-value backend behind the same calls (the way nng's
 * transports are ops tables): store_client_wrap() makes a client whose
 * operations are ops' over impl, with the meanings above; the wrapper
 * checks keys and values as for the store, and store_client_close() calls
 * ops->close(impl). rdzv/backend.c puts etcd here, so the agent talks to
 * either through one set of calls. ping is a get of a key that need not
 * exist. interrupt and error may be NULL (see store_client_interrupt and
 * store_client_error).
 */
typedef struct store_ops {
  int (*set)(void *impl, const char *key, const void *val, size_t len, int64_t deadline_ms);
  int (*get)(void *impl, const char *key, void **val, size_t *len, int64_t deadline_ms);
  int (*wait)(void *impl, const char *const *keys, size_t n, int64_t deadline_ms);
  int (*add)(void *impl, const char *key, int64_t delta, int64_t *result, int64_t deadline_ms);
  int (*cas)(void *impl, const char *key, const void *expected, size_t elen, const void *desired,
             size_t dlen, void **current, size_t *curlen, int64_t deadline_ms);
  int (*get_many)(void *impl, const char *const *keys, size_t n, void **vals, size_t *lens,
                  int64_t deadline_ms);
  int (*del)(void *impl, const char *key, int64_t deadline_ms);
  void (*close)(void *impl);
  void (*interrupt)(void *impl);
  const char *(*error)(void *impl);
} store_ops;

int store_client_wrap(const store_ops *ops, void *impl, store_client **out);

#endif

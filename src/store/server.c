/*
 * server.c - the store server: one thread, one poll() loop.
 *
 * Every connection has a read buffer (at most one frame beyond what has been
 * processed) and a write buffer. Requests are handled in arrival order; a
 * WAIT that cannot be answered yet parks its connection (its later requests
 * stay buffered) until the keys exist or its deadline passes. The thread is
 * stopped through a self-pipe. Misbehaving connections are closed with one
 * warning line naming the peer and the reason; nothing a peer sends can stop
 * the loop.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>

#include "base/base.h"
#include "base/net.h"
#include "store/store.h"
#include "store/auth.h"
#include "store/proto.h"

#define DEFAULT_MAX_CONNS 1024
#define DEFAULT_IDLE_MS (600 * 1000)
#define DEFAULT_IO_MS (10 * 1000)
#define DEFAULT_MAX_BYTES ((size_t)256 << 20)
/* Read buffers have this size; bigger frames grow them for their duration. */
#define INBUF_MIN 4096
/* Stop handling a connection's requests while this much output is unsent. */
#define OUT_HIGH_WATER (64 * 1024)
/* Bytes charged per entry besides its key and value (node, table slot). */
#define ENTRY_OVERHEAD 64

typedef struct entry {
  struct entry *next;
  uint64_t hash;
  uint8_t *val;
  uint32_t vlen;
  uint16_t klen;
  char key[]; /* klen bytes + NUL */
} entry;

enum { CONN_HELLO, CONN_AUTH, CONN_READY };

typedef struct conn {
  int fd;
  int state;
  char peer[BASE_HOST_MAX + 8];
  uint8_t *in;
  size_t in_len, in_cap;
  store_buf out;
  size_t out_off;
  size_t out_charged; /* bytes of out's capacity counted in buf_bytes */
  int closing;        /* flush the output, then close (after an error reply) */
  int64_t accepted_ms;
  int64_t last_active_ms; /* last byte read or response completed */
  int64_t frame_start_ms; /* first byte of an incomplete frame; 0: none */
  int64_t write_stall_ms; /* since output has been pending without progress */
  uint8_t cnonce[STORE_NONCE_LEN];
  uint8_t snonce[STORE_NONCE_LEN];
  /* A parked WAIT: its key fields, how many, and the first not yet present. */
  int waiting;
  int64_t wait_deadline_ms;
  uint8_t *wait_keys;
  size_t wait_keys_len;
  size_t wait_pos;
} conn;

struct store_server {
  int lfd;
  int port;
  int pipe_rd, pipe_wr;
  pthread_t thread;
  int thread_started;
  char *token;
  size_t token_len;
  int max_conns;
  int idle_ms, io_ms;
  size_t max_bytes;
  entry **buckets;
  size_t nbuckets, nentries;
  size_t data_bytes; /* keys + values + overhead held */
  size_t buf_bytes;  /* read buffers beyond INBUF_MIN, write buffers beyond OUT_HIGH_WATER, parked
                        WAIT keys */
  uint64_t seed;
  conn **conns;
  size_t nconns;
  int again; /* a parked connection was answered: look at its buffered input soon */
  int64_t accept_pause_until;
};

/* ---- the table ---- */

static uint64_t hash_key(const store_server *s, const uint8_t *k, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull ^ s->seed;
  for (size_t i = 0; i < n; i++) {
    h ^= k[i];
    h *= 0x100000001b3ull;
  }
  return h ^ (h >> 29);
}

static entry **find_slot(store_server *s, const uint8_t *k, size_t n, uint64_t h) {
  entry **pp = &s->buckets[h & (s->nbuckets - 1)];
  for (; *pp != NULL; pp = &(*pp)->next) {
    entry *e = *pp;
    if (e->hash == h && e->klen == n && memcmp(e->key, k, n) == 0) return pp;
  }
  return pp;
}

static entry *lookup(store_server *s, store_bytes key) {
  return *find_slot(s, key.p, key.len, hash_key(s, key.p, key.len));
}

static size_t entry_cost(size_t klen, size_t vlen) {
  return ENTRY_OVERHEAD + klen + 1 + vlen;
}

static void grow_table(store_server *s) {
  size_t nb = s->nbuckets * 2;
  entry **b = calloc(nb, sizeof *b);
  if (b == NULL) return; /* longer chains, still correct */
  for (size_t i = 0; i < s->nbuckets; i++) {
    entry *e = s->buckets[i];
    while (e != NULL) {
      entry *next = e->next;
      e->next = b[e->hash & (nb - 1)];
      b[e->hash & (nb - 1)] = e;
      e = next;
    }
  }
  free(s->buckets);
  s->buckets = b;
  s->nbuckets = nb;
}

/*
 * Sets key to value. Returns 1 when the key was created, 0 when replaced,
 * COHORT_ELIMIT when the memory limit would be passed, -ENOMEM.
 */
static int put(store_server *s, store_bytes key, const void *val, size_t vlen) {
  uint64_t h = hash_key(s, key.p, key.len);
  entry **pp = find_slot(s, key.p, key.len, h);
  entry *e = *pp;
  size_t old = e ? entry_cost(e->klen, e->vlen) : 0;
  size_t cost = entry_cost(key.len, vlen);
  if (s->data_bytes - old + cost > s->max_bytes) return COHORT_ELIMIT;
  uint8_t *copy = malloc(vlen ? vlen : 1);
  if (copy == NULL) return -ENOMEM;
  if (vlen) memcpy(copy, val, vlen);
  if (e != NULL) {
    free(e->val);
    e->val = copy;
    e->vlen = (uint32_t)vlen;
    s->data_bytes = s->data_bytes - old + cost;
    return 0;
  }
  e = malloc(sizeof *e + key.len + 1);
  if (e == NULL) {
    free(copy);
    return -ENOMEM;
  }
  e->next = NULL;
  e->hash = h;
  e->val = copy;
  e->vlen = (uint32_t)vlen;
  e->klen = (uint16_t)key.len;
  memcpy(e->key, key.p, key.len);
  e->key[key.len] = '\0';
  *pp = e;
  s->nentries++;
  s->data_bytes += cost;
  if (s->nentries > s->nbuckets) grow_table(s);
  return 1;
}

static int del(store_server *s, store_bytes key) {
  entry **pp = find_slot(s, key.p, key.len, hash_key(s, key.p, key.len));
  entry *e = *pp;
  if (e == NULL) return -ENOENT;
  *pp = e->next;
  s->data_bytes -= entry_cost(e->klen, e->vlen);
  s->nentries--;
  free(e->val);
  free(e);
  return 0;
}

/* ---- connections ---- */

static void conn_log(const conn *c, const char *what) {
  base_log(BASE_LOG_WARN, "store: closing connection from %s: %s", c->peer, what);
}

/* Counts a big write buffer against the memory limit (small ones are free). */
static void charge_out(store_server *s, conn *c) {
  size_t want = c->out.cap > OUT_HIGH_WATER ? c->out.cap - OUT_HIGH_WATER : 0;
  s->buf_bytes = s->buf_bytes - c->out_charged + want;
  c->out_charged = want;
}

static void conn_free(store_server *s, conn *c) {
  close(c->fd);
  s->buf_bytes -= c->out_charged;
  if (c->in_cap > INBUF_MIN) s->buf_bytes -= c->in_cap - INBUF_MIN;
  if (c->waiting) s->buf_bytes -= c->wait_keys_len;
  free(c->in);
  free(c->wait_keys);
  store_buf_free(&c->out);
  free(c);
}

/* Appends a response frame holding only a status. */
static void reply_status(conn *c, uint8_t st) {
  size_t f = store_buf_begin_frame(&c->out);
  store_buf_u8(&c->out, st);
  store_buf_end_frame(&c->out, f);
}

/* Logs why, answers with status st and closes once the answer is sent. */
static void reject(conn *c, uint8_t st, const char *why) {
  conn_log(c, why);
  reply_status(c, st);
  c->closing = 1;
}

static int wait_satisfied(store_server *s, conn *c) {
  store_request fake = {.keys = {c->wait_keys, c->wait_keys_len}};
  store_bytes k;
  size_t pos = c->wait_pos;
  while (store_proto_next_key(&fake, &pos, &k)) {
    if (lookup(s, k) == NULL) return 0;
    c->wait_pos = pos;
  }
  return 1;
}

static void unpark(store_server *s, conn *c, uint8_t st) {
  reply_status(c, st);
  s->buf_bytes -= c->wait_keys_len;
  free(c->wait_keys);
  c->wait_keys = NULL;
  c->wait_keys_len = 0;
  c->waiting = 0;
  s->again = 1;
}

/* A key appeared: answer every parked WAIT whose keys now all exist. */
static void wake_waiters(store_server *s) {
  for (size_t i = 0; i < s->nconns; i++) {
    conn *c = s->conns[i];
    if (c->waiting && wait_satisfied(s, c)) unpark(s, c, STORE_ST_OK);
  }
}

/* Parses a stored decimal counter: optional '-', 1..19 digits, nothing else. */
static int parse_counter(const uint8_t *p, size_t n, int64_t *out) {
  char tmp[24];
  if (n == 0 || n >= sizeof tmp) return -EINVAL;
  memcpy(tmp, p, n);
  tmp[n] = '\0';
  return base_parse_i64(tmp, INT64_MIN, INT64_MAX, out) == 0 ? 0 : -EINVAL;
}

static void handle_hello(store_server *s, conn *c, const store_request *r) {
  if (r->version != STORE_PROTO_VERSION) {
    char why[96];
    snprintf(why, sizeof why, "unsupported protocol version %u (server speaks %d)", r->version,
             STORE_PROTO_VERSION);
    reject(c, STORE_ST_PROTO, why);
    return;
  }
  memcpy(c->cnonce, r->nonce.p, STORE_NONCE_LEN);
  if (base_random_bytes(c->snonce, sizeof c->snonce) != 0) {
    reject(c, STORE_ST_PROTO, "no random bytes for a nonce");
    return;
  }
  size_t f = store_buf_begin_frame(&c->out);
  store_buf_u8(&c->out, STORE_ST_OK);
  store_buf_u8(&c->out, STORE_PROTO_VERSION);
  store_buf_u8(&c->out, s->token ? 1 : 0);
  store_buf_put(&c->out, c->snonce, sizeof c->snonce);
  store_buf_end_frame(&c->out, f);
  c->state = s->token ? CONN_AUTH : CONN_READY;
}

static void handle_auth(store_server *s, conn *c, const store_request *r) {
  if (r->mac.len == 0) {
    reject(c, STORE_ST_AUTH, "authentication failed: the client has no token");
    return;
  }
  if (!store_auth_ok(s->token, s->token_len, STORE_AUTH_CLIENT_LABEL, c->cnonce, c->snonce,
                     r->mac.p)) {
    reject(c, STORE_ST_AUTH, "authentication failed: wrong token (or a replayed message)");
    return;
  }
  uint8_t proof[STORE_MAC_LEN];
  if (store_auth_mac(s->token, s->token_len, STORE_AUTH_SERVER_LABEL, c->cnonce, c->snonce,
                     proof) != 0) {
    reject(c, STORE_ST_PROTO, "no memory for the server's proof");
    return;
  }
  size_t f = store_buf_begin_frame(&c->out);
  store_buf_u8(&c->out, STORE_ST_OK);
  store_buf_put(&c->out, proof, sizeof proof);
  store_buf_end_frame(&c->out, f);
  c->state = CONN_READY;
}

static void handle_request(store_server *s, conn *c, const store_request *r) {
  store_buf *o = &c->out;
  size_t f;
  entry *e;
  int rc;
  switch (r->op) {
  case STORE_OP_PING:
    reply_status(c, STORE_ST_OK);
    return;
  case STORE_OP_SET:
    rc = put(s, r->key, r->value.p, r->value.len);
    if (rc < 0) {
      reply_status(c, STORE_ST_LIMIT);
      return;
    }
    reply_status(c, STORE_ST_OK);
    if (rc == 1) wake_waiters(s);
    return;
  case STORE_OP_GET:
    e = lookup(s, r->key);
    if (e == NULL) {
      reply_status(c, STORE_ST_NOTFOUND);
      return;
    }
    if (e->vlen > OUT_HIGH_WATER && s->buf_bytes + e->vlen > s->max_bytes) {
      reply_status(c, STORE_ST_LIMIT); /* too many big answers are waiting to be sent */
      return;
    }
    f = store_buf_begin_frame(o);
    store_buf_u8(o, STORE_ST_OK);
    store_buf_value(o, e->val, e->vlen);
    store_buf_end_frame(o, f);
    return;
  case STORE_OP_ADD: {
    int64_t cur = 0;
    e = lookup(s, r->key);
    if (e != NULL && parse_counter(e->val, e->vlen, &cur) != 0) {
      reply_status(c, STORE_ST_INVALID);
      return;
    }
    int64_t next;
    if (__builtin_add_overflow(cur, r->delta, &next)) {
      reply_status(c, STORE_ST_RANGE);
      return;
    }
    /* Counters are stored as decimal text, so GET shows them readably. */
    char text[24];
    int n = snprintf(text, sizeof text, "%lld", (long long)next);
    rc = put(s, r->key, text, (size_t)n);
    if (rc < 0) {
      reply_status(c, STORE_ST_LIMIT);
      return;
    }
    f = store_buf_begin_frame(o);
    store_buf_u8(o, STORE_ST_OK);
    store_buf_u64(o, (uint64_t)next);
    store_buf_end_frame(o, f);
    if (rc == 1) wake_waiters(s);
    return;
  }
  case STORE_OP_CAS: {
    e = lookup(s, r->key);
    int match = r->has_expected ? (e != NULL && e->vlen == r->expected.len &&
                                   memcmp(e->val, r->expected.p, e->vlen) == 0)
                                : e == NULL;
    rc = 0;
    if (match) {
      rc = put(s, r->key, r->value.p, r->value.len);
      if (rc < 0) {
        reply_status(c, STORE_ST_LIMIT);
        return;
      }
      e = lookup(s, r->key);
    }
    f = store_buf_begin_frame(o);
    store_buf_u8(o, STORE_ST_OK);
    store_buf_u8(o, e != NULL);
    if (e != NULL) store_buf_value(o, e->val, e->vlen);
    store_buf_end_frame(o, f);
    if (rc == 1) wake_waiters(s);
    return;
  }
  case STORE_OP_DELETE:
    reply_status(c, del(s, r->key) == 0 ? STORE_ST_OK : STORE_ST_NOTFOUND);
    return;
  case STORE_OP_WAIT: {
    c->wait_keys = (uint8_t *)r->keys.p; /* borrowed for the first check only */
    c->wait_keys_len = r->keys.len;
    c->wait_pos = 0;
    int done = wait_satisfied(s, c);
    c->wait_keys = NULL;
    if (done || r->timeout_ms == 0) {
      c->wait_keys_len = 0;
      reply_status(c, done ? STORE_ST_OK : STORE_ST_TIMEOUT);
      return;
    }
    if (s->buf_bytes + r->keys.len > s->max_bytes || (c->wait_keys = malloc(r->keys.len)) == NULL) {
      c->wait_keys_len = 0;
      reply_status(c, STORE_ST_LIMIT);
      return;
    }
    memcpy(c->wait_keys, r->keys.p, r->keys.len);
    s->buf_bytes += r->keys.len;
    c->waiting = 1;
    c->wait_deadline_ms = base_now_ms() + r->timeout_ms;
    return;
  }
  default:
    reject(c, STORE_ST_PROTO, "unexpected request type");
    return;
  }
}

static void handle_frame(store_server *s, conn *c, const uint8_t *body, size_t len) {
  store_request r;
  char why[128];
  if (store_proto_parse_request(body, len, &r, why, sizeof why) != 0) {
    reject(c, STORE_ST_PROTO, why);
    return;
  }
  switch (c->state) {
  case CONN_HELLO:
    if (r.op != STORE_OP_HELLO) {
      reject(c, s->token ? STORE_ST_AUTH : STORE_ST_PROTO,
             s->token ? "request before authentication" : "request before HELLO");
      return;
    }
    handle_hello(s, c, &r);
    return;
  case CONN_AUTH:
    if (r.op != STORE_OP_AUTH) {
      reject(c, STORE_ST_AUTH, "request before authentication");
      return;
    }
    handle_auth(s, c, &r);
    return;
  default:
    if (r.op == STORE_OP_HELLO || r.op == STORE_OP_AUTH) {
      reject(c, STORE_ST_PROTO, "repeated handshake");
      return;
    }
    handle_request(s, c, &r);
    return;
  }
}

/* Handles the complete frames in the read buffer while the connection may. */
static void process_input(store_server *s, conn *c, int64_t now) {
  size_t off = 0;
  while (!c->closing && !c->waiting && c->out.len - c->out_off < OUT_HIGH_WATER) {
    uint32_t blen;
    char why[128];
    int rc =
        store_proto_frame(c->in + off, c->in_len - off, STORE_FRAME_MAX, &blen, why, sizeof why);
    if (rc < 0) {
      reject(c, STORE_ST_PROTO, why);
      break;
    }
    if (rc == 0) break;
    handle_frame(s, c, c->in + off + STORE_HEADER_LEN, blen);
    off += STORE_HEADER_LEN + blen;
  }
  if (c->out.oom) {
    conn_log(c, "out of memory for the response");
    c->closing = 2; /* close at once */
  }
  charge_out(s, c);
  if (off > 0) {
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    c->frame_start_ms = 0;
  }
  /* Give back a big buffer once the big frame is gone. */
  if (c->in_cap > INBUF_MIN && c->in_len <= INBUF_MIN) {
    uint8_t *p = realloc(c->in, INBUF_MIN);
    if (p != NULL) {
      s->buf_bytes -= c->in_cap - INBUF_MIN;
      c->in = p;
      c->in_cap = INBUF_MIN;
    }
  }
  if (c->in_len > 0 && c->frame_start_ms == 0) c->frame_start_ms = now;
  if (c->in_len == 0) c->frame_start_ms = 0;
}

/* Is a whole frame buffered (so a stall is ours, not the client's)? */
static int have_frame(const conn *c) {
  uint32_t blen;
  return store_proto_frame(c->in, c->in_len, STORE_FRAME_MAX, &blen, NULL, 0) != 0;
}

/*
 * Makes room for the frame being received. Returns 0, or -1 when the
 * connection must close (the reason is logged).
 */
static int reserve_input(store_server *s, conn *c) {
  size_t want = INBUF_MIN;
  uint32_t blen = 0;
  char why[128];
  int rc = store_proto_frame(c->in, c->in_len, STORE_FRAME_MAX, &blen, why, sizeof why);
  if (rc < 0) {
    /* Sent right away: nothing else is read from this client. */
    reject(c, STORE_ST_PROTO, why);
    return 0;
  }
  if (blen > 0 && STORE_HEADER_LEN + (size_t)blen > want) want = STORE_HEADER_LEN + blen;
  if (c->in_cap >= want) return 0;
  /* Only growth beyond INBUF_MIN is charged, so every client gets a small buffer. */
  size_t extra = want - (c->in_cap > INBUF_MIN ? c->in_cap : INBUF_MIN);
  if (extra > 0 && s->buf_bytes + extra > s->max_bytes) {
    conn_log(c, "server buffer memory limit reached");
    return -1;
  }
  uint8_t *p = realloc(c->in, want);
  if (p == NULL) {
    conn_log(c, "out of memory for the request");
    return -1;
  }
  s->buf_bytes += extra;
  c->in = p;
  c->in_cap = want;
  return 0;
}

/* Reads what the socket has. Returns 0, or -1 when the connection must close. */
static int conn_read(store_server *s, conn *c, int64_t now) {
  for (int rounds = 0; rounds < 16; rounds++) {
    if (c->closing) return 0;
    if (reserve_input(s, c) != 0) return -1;
    if (c->closing) return 0;
    if (c->in_len == c->in_cap) return 0;
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      base_log(BASE_LOG_INFO, "store: connection from %s: %s", c->peer, cohort_strerror(-errno));
      return -1;
    }
    if (n == 0) {
      if (c->in_len > 0)
        base_log(BASE_LOG_INFO, "store: %s closed the connection mid-frame", c->peer);
      return -1;
    }
    size_t space = c->in_cap - c->in_len;
    if (c->in_len == 0) c->frame_start_ms = now;
    c->in_len += (size_t)n;
    c->last_active_ms = now;
    if (have_frame(c)) process_input(s, c, now);
    /*
     * A short read drained the socket: save the recv() that would say EAGAIN,
     * but size the buffer for the frame now (or refuse it) so that the next
     * poll() waits for the right thing.
     */
    if ((size_t)n < space) return c->closing || reserve_input(s, c) == 0 ? 0 : -1;
  }
  return 0;
}

/* Writes pending output. Returns 0, or -1 when the connection must close. */
static int conn_write(store_server *s, conn *c, int64_t now) {
  while (c->out_off < c->out.len) {
    ssize_t n = send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (c->write_stall_ms == 0) c->write_stall_ms = now;
        return 0;
      }
      return -1;
    }
    c->out_off += (size_t)n;
    c->write_stall_ms = now;
  }
  c->out.len = 0;
  c->out_off = 0;
  c->write_stall_ms = 0;
  c->last_active_ms = now;
  /* Requests held back while the output was full can go on now. */
  if (c->in_len > 0) s->again = 1;
  if (c->out.cap > OUT_HIGH_WATER) {
    store_buf_free(&c->out);
    charge_out(s, c);
  }
  return c->closing ? -1 : 0;
}

/* Applies the time limits. Returns -1 when the connection must close. */
static int conn_check_time(store_server *s, conn *c, int64_t now) {
  char why[128];
  if (c->waiting && now >= c->wait_deadline_ms) unpark(s, c, STORE_ST_TIMEOUT);
  if (c->out.len > c->out_off) {
    if (c->write_stall_ms != 0 && now - c->write_stall_ms >= s->io_ms) {
      snprintf(why, sizeof why, "client did not read its responses for %d ms", s->io_ms);
      conn_log(c, why);
      return -1;
    }
    return 0;
  }
  if (c->closing) return 0;
  if (c->state != CONN_READY && now - c->accepted_ms >= s->io_ms) {
    snprintf(why, sizeof why, "no handshake within %d ms", s->io_ms);
    conn_log(c, why);
    return -1;
  }
  if (c->in_len > 0 && !have_frame(c)) {
    if (now - c->frame_start_ms >= s->io_ms) {
      snprintf(why, sizeof why, "incomplete frame (%zu bytes) for %d ms: slow or stalled client",
               c->in_len, s->io_ms);
      conn_log(c, why);
      return -1;
    }
    return 0;
  }
  if (!c->waiting && c->in_len == 0 && now - c->last_active_ms >= s->idle_ms) {
    snprintf(why, sizeof why, "idle for %d ms", s->idle_ms);
    conn_log(c, why);
    return -1;
  }
  return 0;
}

/* When conn_check_time() next has something to do. */
static int64_t conn_next_time(const store_server *s, const conn *c) {
  int64_t t = INT64_MAX;
  if (c->waiting) t = c->wait_deadline_ms;
  if (c->out.len > c->out_off) {
    if (c->write_stall_ms != 0 && c->write_stall_ms + s->io_ms < t)
      t = c->write_stall_ms + s->io_ms;
    return t;
  }
  if (c->closing) return t;
  if (c->state != CONN_READY && c->accepted_ms + s->io_ms < t) t = c->accepted_ms + s->io_ms;
  if (c->in_len > 0 && !have_frame(c)) {
    if (c->frame_start_ms + s->io_ms < t) t = c->frame_start_ms + s->io_ms;
  } else if (!c->waiting && c->in_len == 0 && c->last_active_ms + s->idle_ms < t) {
    t = c->last_active_ms + s->idle_ms;
  }
  return t;
}

static void accept_all(store_server *s, int64_t now) {
  for (int i = 0; i < 64; i++) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        /* The pending connection stays queued; retry shortly instead of spinning. */
        base_log(BASE_LOG_WARN, "store: accept: %s", cohort_strerror(-errno));
        s->accept_pause_until = now + 100;
      }
      return;
    }
    char host[BASE_HOST_MAX] = "?";
    int port = 0;
    base_sockaddr_str((struct sockaddr *)&ss, host, sizeof host, &port);
    char peer[BASE_HOST_MAX + 8];
    base_join_hostport(host, port, peer, sizeof peer);
    if (s->nconns >= (size_t)s->max_conns) {
      /* Say why before closing, so the client reports the limit, not a reset. */
      uint8_t frame[5] = {0, 0, 0, 1, STORE_ST_LIMIT};
      ssize_t w = send(fd, frame, sizeof frame, MSG_NOSIGNAL);
      (void)w;
      close(fd);
      base_log(BASE_LOG_WARN, "store: refusing connection from %s: connection limit (%d) reached",
               peer, s->max_conns);
      continue;
    }
    conn *c = calloc(1, sizeof *c);
    uint8_t *in = malloc(INBUF_MIN);
    conn **arr = realloc(s->conns, (s->nconns + 1) * sizeof *arr);
    if (c == NULL || in == NULL || arr == NULL) {
      free(c);
      free(in);
      if (arr != NULL) s->conns = arr;
      close(fd);
      base_log(BASE_LOG_WARN, "store: refusing connection from %s: out of memory", peer);
      continue;
    }
    s->conns = arr;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    c->in = in;
    c->in_cap = INBUF_MIN;
    c->state = CONN_HELLO;
    base_strlcpy(c->peer, peer, sizeof c->peer);
    c->accepted_ms = now;
    c->last_active_ms = now;
    s->conns[s->nconns++] = c;
  }
}

static void *server_main(void *arg) {
  store_server *s = arg;
  struct pollfd *pfds = NULL;
  size_t pfds_cap = 0;
  for (;;) {
    int64_t now = base_now_ms();
    /* Time limits first: they may answer WAITs or drop connections. */
    for (size_t i = 0; i < s->nconns;) {
      conn *c = s->conns[i];
      if (conn_check_time(s, c, now) != 0) {
        conn_free(s, c);
        s->conns[i] = s->conns[--s->nconns];
        continue;
      }
      i++;
    }
    /* Connections answered while parked may have requests queued. */
    while (s->again) {
      s->again = 0;
      for (size_t i = 0; i < s->nconns; i++) process_input(s, s->conns[i], now);
    }
    for (size_t i = 0; i < s->nconns;) {
      conn *c = s->conns[i];
      if (c->closing == 2 || (c->out.len > c->out_off && conn_write(s, c, now) != 0)) {
        conn_free(s, c);
        s->conns[i] = s->conns[--s->nconns];
        continue;
      }
      i++;
    }

    size_t need = s->nconns + 2;
    if (need > pfds_cap) {
      struct pollfd *np = realloc(pfds, need * sizeof *np);
      if (np == NULL) {
        base_sleep_ms(10);
        continue;
      }
      pfds = np;
      pfds_cap = need;
    }
    pfds[0] = (struct pollfd){.fd = s->pipe_rd, .events = POLLIN};
    pfds[1] = (struct pollfd){.fd = now >= s->accept_pause_until ? s->lfd : -1, .events = POLLIN};
    int64_t next = now >= s->accept_pause_until ? INT64_MAX : s->accept_pause_until;
    for (size_t i = 0; i < s->nconns; i++) {
      conn *c = s->conns[i];
      short ev = 0;
      if (!c->closing && c->in_len < c->in_cap) ev |= POLLIN;
      if (c->out.len > c->out_off) ev |= POLLOUT;
      pfds[i + 2] = (struct pollfd){.fd = c->fd, .events = ev};
      int64_t t = conn_next_time(s, c);
      if (t < next) next = t;
    }
    int timeout = next == INT64_MAX ? -1 : base_deadline_left(next);
    if (s->again) timeout = 0;
    int n = poll(pfds, s->nconns + 2, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      base_log(BASE_LOG_ERROR, "store: poll: %s", cohort_strerror(-errno));
      base_sleep_ms(10);
      continue;
    }
    now = base_now_ms();
    if (pfds[0].revents) break;
    size_t nc = s->nconns; /* accepted connections are polled next round */
    for (size_t i = nc; i-- > 0;) {
      conn *c = s->conns[i];
      short re = pfds[i + 2].revents;
      int drop = 0;
      if (re & (POLLIN | POLLHUP | POLLERR)) drop = conn_read(s, c, now) != 0;
      /* A reset socket we cannot read from any more would wake poll() forever. */
      if (!drop && (re & (POLLHUP | POLLERR | POLLNVAL)) && !(re & POLLIN)) drop = 1;
      if (!drop && (re & (POLLHUP | POLLERR)) && c->in_len == c->in_cap) drop = 1;
      if (!drop) process_input(s, c, now);
      if (!drop && c->out.len > c->out_off) drop = conn_write(s, c, now) != 0;
      if (!drop && c->closing == 2) drop = 1;
      if (drop) {
        conn_free(s, c);
        s->conns[i] = s->conns[--s->nconns];
      }
    }
    if (pfds[1].revents) accept_all(s, now);
  }
  free(pfds);
  return NULL;
}

int store_server_start(const store_server_opts *opts, store_server **out) {
  *out = NULL;
  store_server_opts def = {0};
  if (opts == NULL) opts = &def;
  if (opts->token != NULL && strlen(opts->token) > STORE_TOKEN_MAX) return -EINVAL;
  if (opts->max_conns < 0 || opts->idle_timeout_ms < 0 || opts->io_timeout_ms < 0) return -EINVAL;
  store_server *s = calloc(1, sizeof *s);
  if (s == NULL) return -ENOMEM;
  s->lfd = s->pipe_rd = s->pipe_wr = -1;
  s->max_conns = opts->max_conns ? opts->max_conns : DEFAULT_MAX_CONNS;
  s->idle_ms = opts->idle_timeout_ms ? opts->idle_timeout_ms : DEFAULT_IDLE_MS;
  s->io_ms = opts->io_timeout_ms ? opts->io_timeout_ms : DEFAULT_IO_MS;
  s->max_bytes = opts->max_bytes ? opts->max_bytes : DEFAULT_MAX_BYTES;
  int rc;
  if (opts->token != NULL && opts->token[0] != '\0') {
    s->token = strdup(opts->token);
    if (s->token == NULL) {
      rc = -ENOMEM;
      goto fail;
    }
    s->token_len = strlen(s->token);
  }
  s->nbuckets = 256;
  s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
  if (s->buckets == NULL) {
    rc = -ENOMEM;
    goto fail;
  }
  if ((rc = base_random_bytes(&s->seed, sizeof s->seed)) != 0) goto fail;
  rc = base_tcp_listen(opts->bind_host, opts->port, 512, &s->lfd, &s->port);
  if (rc != 0) goto fail;
  if ((rc = base_set_nonblock(s->lfd, 1)) != 0) goto fail;
  int p[2];
  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
    rc = -errno;
    goto fail;
  }
  s->pipe_rd = p[0];
  s->pipe_wr = p[1];
  /* The loop thread takes no signals: they belong to the host program's thread. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  int perr = pthread_create(&s->thread, NULL, server_main, s);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (perr != 0) {
    rc = -perr;
    goto fail;
  }
  s->thread_started = 1;
  *out = s;
  return 0;
fail:
  store_server_stop(s);
  return rc;
}

int store_server_port(const store_server *srv) {
  return srv->port;
}

void store_server_stop(store_server *s) {
  if (s == NULL) return;
  if (s->thread_started) {
    char b = 1;
    ssize_t w = write(s->pipe_wr, &b, 1);
    (void)w;
    pthread_join(s->thread, NULL);
  }
  for (size_t i = 0; i < s->nconns; i++) conn_free(s, s->conns[i]);
  free(s->conns);
  if (s->buckets != NULL) {
    for (size_t i = 0; i < s->nbuckets; i++) {
      entry *e = s->buckets[i];
      while (e != NULL) {
        entry *next = e->next;
        free(e->val);
        free(e);
        e = next;
      }
    }
  }
  free(s->buckets);
  if (s->lfd >= 0) close(s->lfd);
  if (s->pipe_rd >= 0) close(s->pipe_rd);
  if (s->pipe_wr >= 0) close(s->pipe_wr);
  if (s->token) memset(s->token, 0, s->token_len);
  free(s->token);
  free(s);
}

/*
 * server.c - the store server: one thread, one epoll loop.
 *
 * The cost of an event does not depend on how many connections are open:
 * epoll reports only the sockets that are ready, a key's creation wakes only
 * the WAITs parked on that key (table.h), and every connection's next time
 * limit sits in a min-heap, so nothing walks the list of connections.
 *
 * Memory per connection: an idle connection holds its struct (about 0.4 KiB)
 * and a small output buffer; input is read into one shared scratch buffer
 * and only the rest of an incomplete frame (or requests held back behind a
 * parked WAIT) is copied into a buffer of its own, freed once processed.
 * GET answers of values above INLINE_MAX refer to the stored value instead
 * of copying it. Input beyond INBUF_FREE bytes, output beyond OUT_HIGH_WATER
 * and parked WAIT keys count against max_bytes with the data.
 *
 * Requests are handled in arrival order; a WAIT that cannot be answered yet
 * parks its connection (its later requests stay unread in the kernel or
 * buffered) until the keys exist or its deadline passes. The thread is
 * stopped through a self-pipe. Misbehaving connections are closed with one
 * warning line naming the peer and the reason; nothing a peer sends can stop
 * the loop.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "store/auth.h"
#include "store/proto.h"
#include "store/store.h"
#include "store/table.h"

/* A 16,384-node job (rdzv's RDZV_MAX_NODES) holds a join and a watch connection a node. */
#define DEFAULT_MAX_CONNS 65536
#define DEFAULT_IDLE_MS (600 * 1000)
#define DEFAULT_IO_MS (10 * 1000)
#define WILL_VALUE_MAX 4096
#define DEFAULT_MAX_BYTES ((size_t)256 << 20)
#define LISTEN_BACKLOG 4096
/* The shared read buffer; a connection reads at most this much per turn. */
#define SCRATCH_LEN (64 * 1024)
/* Input buffers up to this size are not charged: every client gets one. */
#define INBUF_FREE 4096
/* Stop handling a connection's requests while this much output is unsent. */
#define OUT_HIGH_WATER (64 * 1024)
/* GET answers with values up to this size are copied; bigger ones are shared. */
#define INLINE_MAX 512
#define MAX_EVENTS 256
#define ACCEPT_BATCH 256

enum { CONN_HELLO, CONN_AUTH, CONN_READY };

/* A shared value queued in the output after the buffer's first `at` bytes. */
typedef struct out_seg {
  size_t at;
  store_blob *blob;
} out_seg;

typedef struct conn {
  int fd;
  int state;
  int closing;     /* 1: flush the output, then close (after an error reply); 2: close now */
  uint32_t events; /* registered with epoll */
  size_t index;    /* in s->conns */
  char peer[64];
  /* Input not processed yet: the rest of a frame, or requests behind a WAIT. */
  uint8_t *in;
  size_t in_len, in_cap;
  /* Output: bytes, with shared values interleaved at their offsets. */
  store_buf out;
  size_t out_off; /* bytes of out sent */
  out_seg *segs;
  size_t nsegs, segs_cap;
  size_t seg_off;     /* bytes of segs[0] sent */
  size_t seg_bytes;   /* total length of the queued values */
  size_t out_charged; /* bytes of out's capacity counted in buf_bytes */
  int64_t accepted_ms;
  int64_t last_active_ms; /* last byte read or response completed */
  int64_t frame_start_ms; /* first byte of an incomplete frame; 0: none */
  int64_t write_stall_ms; /* since output has been pending without progress */
  /* WILL: set key to value when the client goes away (gone: it closed or reset the connection,
   * rather than the server closing it for a limit); the key's bytes, then the value's. */
  uint8_t *will;
  size_t will_key_len, will_len;
  int gone;
  uint8_t cnonce[STORE_NONCE_LEN];
  uint8_t snonce[STORE_NONCE_LEN];
  /* A parked WAIT: its key fields, and the first not yet seen. */
  int waiting;
  int64_t wait_deadline_ms;
  uint8_t *wait_keys;
  size_t wait_keys_len;
  size_t wait_pos;
  store_waiter waiter;
  /* The loop's bookkeeping. */
  size_t heap_pos; /* in s->heap, SIZE_MAX when not there */
  int64_t heap_at; /* never later than conn_next_time() */
  struct conn *next_dirty;
  int dirty;
} conn;

struct store_server {
  int lfd, epfd;
  int port;
  int pipe_rd, pipe_wr;
  pthread_t thread;
  int thread_started;
  char *token;
  size_t token_len;
  int max_conns;
  int stopping; /* store_server_stop: connections end without their wills */
  int idle_ms, io_ms;
  store_table table;
  size_t buf_bytes; /* charged input and output buffers, parked WAIT keys */
  conn **conns;
  size_t nconns, conns_cap;
  conn **heap;
  size_t nheap;
  conn *dirty; /* connections to settle before the next wait */
  int64_t accept_pause_until;
  uint8_t *scratch;
};

static int can_process(const conn *c);

/* ---- timers: a min-heap of connections by their next time limit ---- */

static void heap_set(store_server *s, size_t i, conn *c) {
  s->heap[i] = c;
  c->heap_pos = i;
}

static void heap_up(store_server *s, size_t i) {
  conn *c = s->heap[i];
  while (i > 0 && s->heap[(i - 1) / 2]->heap_at > c->heap_at) {
    heap_set(s, i, s->heap[(i - 1) / 2]);
    i = (i - 1) / 2;
  }
  heap_set(s, i, c);
}

static void heap_down(store_server *s, size_t i) {
  conn *c = s->heap[i];
  for (;;) {
    size_t l = 2 * i + 1, m = i;
    int64_t at = c->heap_at;
    if (l < s->nheap && s->heap[l]->heap_at < at) m = l, at = s->heap[l]->heap_at;
    if (l + 1 < s->nheap && s->heap[l + 1]->heap_at < at) m = l + 1;
    if (m == i) break;
    heap_set(s, i, s->heap[m]);
    i = m;
  }
  heap_set(s, i, c);
}

static void heap_remove(store_server *s, conn *c) {
  size_t i = c->heap_pos;
  if (i == SIZE_MAX) return;
  c->heap_pos = SIZE_MAX;
  conn *last = s->heap[--s->nheap];
  if (last == c) return;
  heap_set(s, i, last);
  heap_up(s, i);
  heap_down(s, last->heap_pos);
}

/* The heap has room for every connection (it grows with s->conns). */
static void heap_schedule(store_server *s, conn *c, int64_t at) {
  if (c->heap_pos != SIZE_MAX) {
    /* A later limit is left as it is: the entry fires early and is recomputed. */
    if (at >= c->heap_at) return;
    c->heap_at = at;
    heap_up(s, c->heap_pos);
    return;
  }
  if (at == INT64_MAX) return;
  c->heap_at = at;
  heap_set(s, s->nheap++, c);
  heap_up(s, c->heap_pos);
}

/* ---- connections ---- */

static void conn_log(const conn *c, const char *what) {
  base_log(BASE_LOG_WARN, "store: closing connection from %s: %s", c->peer, what);
}

static size_t unsent(const conn *c) {
  return c->out.len - c->out_off + c->seg_bytes - c->seg_off;
}

static void mark_dirty(store_server *s, conn *c) {
  if (c->dirty) return;
  c->dirty = 1;
  c->next_dirty = s->dirty;
  s->dirty = c;
}

/* Counts a big write buffer against the memory limit (small ones are free). */
static void charge_out(store_server *s, conn *c) {
  size_t want = c->out.cap > OUT_HIGH_WATER ? c->out.cap - OUT_HIGH_WATER : 0;
  s->buf_bytes = s->buf_bytes - c->out_charged + want;
  c->out_charged = want;
}

static size_t in_charge(size_t cap) {
  return cap > INBUF_FREE ? cap - INBUF_FREE : 0;
}

static void set_input(store_server *s, conn *c, uint8_t *p, size_t cap) {
  s->buf_bytes = s->buf_bytes - in_charge(c->in_cap) + in_charge(cap);
  c->in = p;
  c->in_cap = cap;
}

static void free_input(store_server *s, conn *c) {
  free(c->in);
  set_input(s, c, NULL, 0);
  c->in_len = 0;
}

static void end_wait(store_server *s, conn *c) {
  store_table_unwait(&s->table, &c->waiter);
  s->buf_bytes -= c->wait_keys_len;
  free(c->wait_keys);
  c->wait_keys = NULL;
  c->wait_keys_len = 0;
  c->waiting = 0;
}

static void key_created(store_server *s, store_bytes key);

/* A client that went away leaves its WILL's key behind (the agents' sign of a node lost). */
static void apply_will(store_server *s, conn *c) {
  if (c->will == NULL || !c->gone || s->stopping) return;
  store_bytes key = {.p = c->will, .len = c->will_key_len};
  if (store_table_put(&s->table, key, c->will + c->will_key_len, c->will_len) == 1)
    key_created(s, key);
}

static void conn_free(store_server *s, conn *c) {
  /* Explicitly: a forked child holding a copy of the socket would keep it in the set. */
  epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  heap_remove(s, c);
  if (c->waiting) end_wait(s, c);
  apply_will(s, c);
  free(c->will);
  free_input(s, c);
  for (size_t i = 0; i < c->nsegs; i++) store_blob_unref(&s->table, c->segs[i].blob);
  free(c->segs);
  s->buf_bytes -= c->out_charged;
  store_buf_free(&c->out);
  conn *last = s->conns[--s->nconns];
  s->conns[c->index] = last;
  last->index = c->index;
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

/* Queues a shared value after the bytes already in the output. */
static int queue_blob(conn *c, store_blob *b) {
  if (c->nsegs == c->segs_cap) {
    size_t cap = c->segs_cap ? 2 * c->segs_cap : 4;
    out_seg *p = realloc(c->segs, cap * sizeof *p);
    if (p == NULL) return -ENOMEM;
    c->segs = p;
    c->segs_cap = cap;
  }
  c->segs[c->nsegs++] = (out_seg){.at = c->out.len, .blob = store_blob_ref(b)};
  c->seg_bytes += b->len;
  return 0;
}

/* ---- WAIT ---- */

/*
 * Advances a WAIT over the keys that exist. Returns 1 when all exist, else
 * 0 with c->wait_pos at the first absent key, whose name is put in *missing.
 */
static int wait_advance(store_server *s, conn *c, const uint8_t *keys, size_t len,
                        store_bytes *missing) {
  store_request view = {.keys = {keys, len}};
  size_t pos = c->wait_pos;
  while (store_proto_next_key(&view, &pos, missing)) {
    if (store_table_get(&s->table, *missing) == NULL) return 0;
    c->wait_pos = pos;
  }
  return 1;
}

static void unpark(store_server *s, conn *c, uint8_t st) {
  reply_status(c, st);
  end_wait(s, c);
  mark_dirty(s, c);
}

/* Parks c on its first absent key, or answers it when none is left. */
static void park_next(store_server *s, conn *c) {
  store_bytes missing;
  if (wait_advance(s, c, c->wait_keys, c->wait_keys_len, &missing)) {
    unpark(s, c, STORE_ST_OK);
    return;
  }
  if (store_table_wait(&s->table, missing, &c->waiter) != 0) unpark(s, c, STORE_ST_LIMIT);
}

/* A key was created: its waiters move on to their next absent key, or are answered. */
static void key_created(store_server *s, store_bytes key) {
  store_waiter *w = store_table_take_waiters(&s->table, key);
  while (w != NULL) {
    store_waiter *next = w->next;
    conn *c = (conn *)((char *)w - offsetof(conn, waiter));
    park_next(s, c);
    w = next;
  }
}

static void handle_wait(store_server *s, conn *c, const store_request *r) {
  store_bytes missing;
  c->wait_pos = 0;
  if (wait_advance(s, c, r->keys.p, r->keys.len, &missing) || r->timeout_ms == 0) {
    reply_status(c, c->wait_pos == r->keys.len ? STORE_ST_OK : STORE_ST_TIMEOUT);
    return;
  }
  if (s->buf_bytes + r->keys.len > s->table.max_bytes ||
      (c->wait_keys = malloc(r->keys.len)) == NULL) {
    reply_status(c, STORE_ST_LIMIT);
    return;
  }
  memcpy(c->wait_keys, r->keys.p, r->keys.len);
  c->wait_keys_len = r->keys.len;
  s->buf_bytes += r->keys.len;
  c->waiting = 1;
  c->wait_deadline_ms = base_now_ms() + r->timeout_ms;
  if (store_table_wait(&s->table, missing, &c->waiter) != 0) unpark(s, c, STORE_ST_LIMIT);
}

/* ---- requests ---- */

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

/* Stores a value and answers status-only; wakes the key's waiters when it is new. */
static int store_value(store_server *s, conn *c, store_bytes key, const void *val, size_t len) {
  int rc = store_table_put(&s->table, key, val, len);
  if (rc < 0) {
    reply_status(c, STORE_ST_LIMIT);
    return rc;
  }
  if (rc == 1) key_created(s, key);
  return 0;
}

static void handle_get(conn *c, store_blob *b) {
  store_buf *o = &c->out;
  if (b == NULL) {
    reply_status(c, STORE_ST_NOTFOUND);
    return;
  }
  size_t f = store_buf_begin_frame(o);
  store_buf_u8(o, STORE_ST_OK);
  if (b->len <= INLINE_MAX) {
    store_buf_value(o, b->data, b->len);
    store_buf_end_frame(o, f);
    return;
  }
  store_buf_u32(o, b->len);
  /* The frame's length covers the value that follows from the shared blob. */
  store_buf_end_frame(o, f);
  if (!o->oom) {
    uint32_t n = (uint32_t)(o->len - f - STORE_HEADER_LEN) + b->len;
    o->p[f] = (uint8_t)(n >> 24);
    o->p[f + 1] = (uint8_t)(n >> 16);
    o->p[f + 2] = (uint8_t)(n >> 8);
    o->p[f + 3] = (uint8_t)n;
  }
  if (queue_blob(c, b) != 0) o->oom = 1;
}

static void handle_add(store_server *s, conn *c, const store_request *r) {
  int64_t cur = 0;
  store_blob *b = store_table_get(&s->table, r->key);
  if (b != NULL && parse_counter(b->data, b->len, &cur) != 0) {
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
  if (store_value(s, c, r->key, text, (size_t)n) != 0) return;
  size_t f = store_buf_begin_frame(&c->out);
  store_buf_u8(&c->out, STORE_ST_OK);
  store_buf_u64(&c->out, (uint64_t)next);
  store_buf_end_frame(&c->out, f);
}

static void handle_cas(store_server *s, conn *c, const store_request *r) {
  store_blob *b = store_table_get(&s->table, r->key);
  int match = r->has_expected ? (b != NULL && b->len == r->expected.len &&
                                 memcmp(b->data, r->expected.p, b->len) == 0)
                              : b == NULL;
  if (match) {
    if (store_value(s, c, r->key, r->value.p, r->value.len) != 0) return;
    b = store_table_get(&s->table, r->key);
  }
  size_t f = store_buf_begin_frame(&c->out);
  store_buf_u8(&c->out, STORE_ST_OK);
  store_buf_u8(&c->out, b != NULL);
  if (b != NULL) store_buf_value(&c->out, b->data, b->len);
  store_buf_end_frame(&c->out, f);
}

/* WILL: replaces the connection's will (a copy; WILL_VALUE_MAX bytes of value at most). */
static void handle_will(conn *c, const store_request *r) {
  uint8_t *w = r->value.len <= WILL_VALUE_MAX ? malloc(r->key.len + r->value.len + 1) : NULL;
  if (w == NULL) {
    reply_status(c, STORE_ST_LIMIT);
    return;
  }
  memcpy(w, r->key.p, r->key.len);
  if (r->value.len > 0) memcpy(w + r->key.len, r->value.p, r->value.len);
  free(c->will);
  c->will = w;
  c->will_key_len = r->key.len;
  c->will_len = r->value.len;
  reply_status(c, STORE_ST_OK);
}

static void handle_request(store_server *s, conn *c, const store_request *r) {
  switch (r->op) {
  case STORE_OP_PING:
    reply_status(c, STORE_ST_OK);
    return;
  case STORE_OP_SET:
    if (store_value(s, c, r->key, r->value.p, r->value.len) == 0) reply_status(c, STORE_ST_OK);
    return;
  case STORE_OP_GET:
    handle_get(c, store_table_get(&s->table, r->key));
    return;
  case STORE_OP_ADD:
    handle_add(s, c, r);
    return;
  case STORE_OP_CAS:
    handle_cas(s, c, r);
    return;
  case STORE_OP_DELETE:
    reply_status(c, store_table_del(&s->table, r->key) == 0 ? STORE_ST_OK : STORE_ST_NOTFOUND);
    return;
  case STORE_OP_WAIT:
    handle_wait(s, c, r);
    return;
  case STORE_OP_WILL:
    handle_will(c, r);
    return;
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

/* ---- input ---- */

static int can_process(const conn *c) {
  return !c->closing && !c->waiting && unsent(c) < OUT_HIGH_WATER;
}

/* Handles the complete frames at the start of buf while the connection may; returns the bytes used.
 */
static size_t process_bytes(store_server *s, conn *c, const uint8_t *buf, size_t len) {
  size_t off = 0;
  while (can_process(c)) {
    uint32_t blen;
    char why[128];
    int rc = store_proto_frame(buf + off, len - off, STORE_FRAME_MAX, &blen, why, sizeof why);
    if (rc < 0) {
      reject(c, STORE_ST_PROTO, why);
      break;
    }
    if (rc == 0) break;
    handle_frame(s, c, buf + off + STORE_HEADER_LEN, blen);
    off += STORE_HEADER_LEN + blen;
  }
  if (c->out.oom) {
    conn_log(c, "out of memory for the response");
    c->closing = 2;
  }
  charge_out(s, c);
  return off;
}

/*
 * Makes c->in hold `extra` more bytes, or the whole frame being received,
 * whichever is more. Returns 0, or -1 when the connection must close (the
 * reason is logged).
 */
static int reserve_input(store_server *s, conn *c, size_t extra) {
  uint32_t blen = 0;
  char why[128];
  size_t want = c->in_len + extra;
  if (store_proto_frame(c->in, c->in_len, STORE_FRAME_MAX, &blen, why, sizeof why) < 0) {
    /* Answered at once, nothing more read; but behind a parked request the answer waits its
     * turn (process_bytes gives it), so that no response follows the closing one. */
    if (can_process(c)) reject(c, STORE_ST_PROTO, why);
    return 0;
  }
  if (blen > 0 && STORE_HEADER_LEN + (size_t)blen > want) want = STORE_HEADER_LEN + blen;
  if (want < INBUF_FREE) want = INBUF_FREE;
  if (c->in_cap >= want) return 0;
  if (s->buf_bytes - in_charge(c->in_cap) + in_charge(want) > s->table.max_bytes) {
    conn_log(c, "server buffer memory limit reached");
    return -1;
  }
  uint8_t *p = realloc(c->in, want);
  if (p == NULL) {
    conn_log(c, "out of memory for the request");
    return -1;
  }
  set_input(s, c, p, want);
  return 0;
}

/* Handles what c->in holds, keeps the rest, frees the buffer once empty. */
static size_t process_input(store_server *s, conn *c, int64_t now) {
  if (c->in_len == 0) return 0;
  size_t used = process_bytes(s, c, c->in, c->in_len);
  if (used > 0) {
    memmove(c->in, c->in + used, c->in_len - used);
    c->in_len -= used;
    c->frame_start_ms = c->in_len > 0 ? now : 0;
  }
  if (c->in_len == 0) free_input(s, c);
  return used;
}

/* What a read step returns besides a byte count (> 0) and 0 for the end of the stream. */
enum { READ_ERRNO = -1, READ_CLOSE = -2, READ_STOP = -3 };

/* Reads the rest of a frame into c->in; *drained when the socket had no more. */
static ssize_t read_into_input(store_server *s, conn *c, int *drained) {
  if (reserve_input(s, c, 0) != 0) return READ_CLOSE;
  if (c->closing) return READ_STOP;
  size_t space = c->in_cap - c->in_len;
  ssize_t n = recv(c->fd, c->in + c->in_len, space, 0);
  if (n < 0) return READ_ERRNO;
  c->in_len += (size_t)n;
  *drained = (size_t)n < space;
  return n;
}

/* Reads into the scratch buffer, handles whole frames there, keeps the rest. */
static ssize_t read_scratch(store_server *s, conn *c, int64_t now, int *drained) {
  ssize_t n = recv(c->fd, s->scratch, SCRATCH_LEN, 0);
  if (n <= 0) return n < 0 ? READ_ERRNO : 0;
  *drained = n < SCRATCH_LEN;
  size_t used = process_bytes(s, c, s->scratch, (size_t)n);
  size_t rest = (size_t)n - used;
  if (rest == 0 || c->closing) return n;
  if (reserve_input(s, c, rest) != 0) return READ_CLOSE;
  if (c->closing) return n; /* a bad header, answered: the rest is dropped */
  memcpy(c->in, s->scratch + used, rest);
  c->in_len = rest;
  c->frame_start_ms = now;
  /* Size the buffer for the frame now (or refuse it), not at its next bytes. */
  return reserve_input(s, c, 0) == 0 ? n : READ_CLOSE;
}

/* Reads what the socket has while requests may be handled. Returns 0, or -1 to close. */
static int conn_read(store_server *s, conn *c, int64_t now) {
  for (int rounds = 0; rounds < 16 && can_process(c); rounds++) {
    int partial = c->in_len > 0, drained = 0;
    ssize_t n = partial ? read_into_input(s, c, &drained) : read_scratch(s, c, now, &drained);
    if (n == READ_STOP) return 0;
    if (n == READ_CLOSE) return -1;
    if (n == READ_ERRNO) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      base_log(BASE_LOG_INFO, "store: connection from %s: %s", c->peer, cohort_strerror(-errno));
      c->gone = 1;
      return -1;
    }
    if (n == 0) {
      c->gone = 1;
      if (c->in_len > 0)
        base_log(BASE_LOG_INFO, "store: %s closed the connection mid-frame", c->peer);
      return -1;
    }
    c->last_active_ms = now;
    if (partial) process_input(s, c, now);
    if (drained) return 0; /* saves the recv() that would say EAGAIN */
  }
  return 0;
}

/* ---- output ---- */

/* Marks n bytes as sent and drops the shared values that are done. */
static void consume_output(store_server *s, conn *c, size_t n) {
  for (;;) {
    while (c->nsegs > 0 && c->out_off == c->segs[0].at && c->seg_off == c->segs[0].blob->len) {
      c->seg_bytes -= c->segs[0].blob->len;
      store_blob_unref(&s->table, c->segs[0].blob);
      memmove(c->segs, c->segs + 1, (c->nsegs - 1) * sizeof *c->segs);
      c->nsegs--;
      c->seg_off = 0;
    }
    if (n == 0) return;
    size_t lim = c->nsegs > 0 ? c->segs[0].at : c->out.len;
    size_t k;
    if (c->out_off < lim) {
      k = lim - c->out_off < n ? lim - c->out_off : n;
      c->out_off += k;
    } else {
      size_t left = c->segs[0].blob->len - c->seg_off;
      k = left < n ? left : n;
      c->seg_off += k;
    }
    n -= k;
  }
}

/* The output as an iovec: bytes and shared values in order. */
static int output_iov(const conn *c, struct iovec *iov, int max) {
  int n = 0;
  size_t pos = c->out_off;
  size_t i = 0;
  for (; i < c->nsegs && n + 2 <= max; i++) {
    if (c->segs[i].at > pos) iov[n++] = (struct iovec){c->out.p + pos, c->segs[i].at - pos};
    pos = c->segs[i].at;
    size_t skip = i == 0 ? c->seg_off : 0;
    iov[n++] = (struct iovec){c->segs[i].blob->data + skip, c->segs[i].blob->len - skip};
  }
  if (i == c->nsegs && c->out.len > pos && n < max)
    iov[n++] = (struct iovec){c->out.p + pos, c->out.len - pos};
  return n;
}

/* Writes pending output. Returns 0, or -1 when the connection must close. */
static int conn_write(store_server *s, conn *c, int64_t now) {
  while (unsent(c) > 0) {
    struct iovec iov[16];
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)output_iov(c, iov, 16)};
    ssize_t n = sendmsg(c->fd, &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (c->write_stall_ms == 0) c->write_stall_ms = now;
        return 0;
      }
      return -1;
    }
    consume_output(s, c, (size_t)n);
    c->write_stall_ms = now;
  }
  consume_output(s, c, 0);
  c->out.len = 0;
  c->out_off = 0;
  c->write_stall_ms = 0;
  c->last_active_ms = now;
  if (c->out.cap > INBUF_FREE) {
    store_buf_free(&c->out);
    charge_out(s, c);
  }
  return c->closing ? -1 : 0;
}

/* ---- time limits ---- */

/* Applies the time limits. Returns -1 when the connection must close. */
static int conn_check_time(store_server *s, conn *c, int64_t now) {
  char why[128];
  if (c->waiting && now >= c->wait_deadline_ms) unpark(s, c, STORE_ST_TIMEOUT);
  if (unsent(c) > 0) {
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
  if (c->in_len > 0 && can_process(c)) {
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
  if (unsent(c) > 0) {
    if (c->write_stall_ms != 0 && c->write_stall_ms + s->io_ms < t)
      t = c->write_stall_ms + s->io_ms;
    return t;
  }
  if (c->closing) return t;
  if (c->state != CONN_READY && c->accepted_ms + s->io_ms < t) t = c->accepted_ms + s->io_ms;
  if (c->in_len > 0 && can_process(c)) {
    if (c->frame_start_ms + s->io_ms < t) t = c->frame_start_ms + s->io_ms;
  } else if (!c->waiting && c->in_len == 0 && c->last_active_ms + s->idle_ms < t) {
    t = c->last_active_ms + s->idle_ms;
  }
  return t;
}

/* ---- the loop ---- */

/* Registers the events c needs now: input while requests may be handled, output while pending. */
static void update_events(store_server *s, conn *c) {
  uint32_t ev = 0;
  if (can_process(c)) ev |= EPOLLIN;
  if (unsent(c) > 0) ev |= EPOLLOUT;
  /* A parked client that goes away is noticed without reading its requests. */
  if (c->waiting) ev |= EPOLLRDHUP;
  if (ev == c->events) return;
  struct epoll_event e = {.events = ev, .data.ptr = c};
  if (epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &e) == 0) c->events = ev;
}

/* Brings a connection up to date: buffered requests, output, events, timer. Frees it if done. */
static void conn_settle(store_server *s, conn *c, int64_t now) {
  c->dirty = 0;
  /* Requests held back by a full output go on once it is written. */
  for (int i = 0; i < 64 && c->closing != 2; i++) {
    size_t used = can_process(c) ? process_input(s, c, now) : 0;
    size_t before = unsent(c);
    if (before > 0 && conn_write(s, c, now) != 0) {
      conn_free(s, c);
      return;
    }
    if (used == 0 && unsent(c) == before) break;
  }
  if (c->closing == 2) {
    conn_free(s, c);
    return;
  }
  update_events(s, c);
  heap_schedule(s, c, conn_next_time(s, c));
}

static void drain_dirty(store_server *s, int64_t now) {
  while (s->dirty != NULL) {
    conn *c = s->dirty;
    s->dirty = c->next_dirty;
    conn_settle(s, c, now);
  }
}

static void run_timers(store_server *s, int64_t now) {
  while (s->nheap > 0 && s->heap[0]->heap_at <= now) {
    conn *c = s->heap[0];
    heap_remove(s, c);
    if (conn_check_time(s, c, now) != 0) c->closing = 2;
    mark_dirty(s, c); /* settling computes its next limit */
  }
}

static void conn_event(store_server *s, conn *c, uint32_t ev, int64_t now) {
  if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
    if (can_process(c)) {
      if (conn_read(s, c, now) != 0) c->closing = 2;
    } else if (ev & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
      /* Not reading (parked, or closing): the peer is gone, answer what can be. */
      if (unsent(c) > 0) conn_write(s, c, now);
      c->gone = 1;
      c->closing = 2;
    }
  }
  mark_dirty(s, c);
}

static int grow_conns(store_server *s) {
  if (s->nconns < s->conns_cap) return 0;
  size_t cap = s->conns_cap ? 2 * s->conns_cap : 64;
  conn **a = realloc(s->conns, cap * sizeof *a);
  if (a == NULL) return -ENOMEM;
  s->conns = a;
  conn **h = realloc(s->heap, cap * sizeof *h);
  if (h == NULL) return -ENOMEM;
  s->heap = h;
  s->conns_cap = cap;
  return 0;
}

static void refuse(int fd, const char *peer, const char *why) {
  /* Say why before closing, so the client reports the limit, not a reset. */
  uint8_t frame[5] = {0, 0, 0, 1, STORE_ST_LIMIT};
  ssize_t w = send(fd, frame, sizeof frame, MSG_NOSIGNAL);
  (void)w;
  close(fd);
  base_log(BASE_LOG_WARN, "store: refusing connection from %s: %s", peer, why);
}

static void add_conn(store_server *s, int fd, const char *peer, int64_t now) {
  char why[64];
  if (s->nconns >= (size_t)s->max_conns) {
    snprintf(why, sizeof why, "connection limit (%d) reached", s->max_conns);
    refuse(fd, peer, why);
    return;
  }
  conn *c = calloc(1, sizeof *c);
  if (c == NULL || grow_conns(s) != 0) {
    free(c);
    refuse(fd, peer, "out of memory");
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  c->fd = fd;
  c->state = CONN_HELLO;
  c->heap_pos = SIZE_MAX;
  base_strlcpy(c->peer, peer, sizeof c->peer);
  c->accepted_ms = now;
  c->last_active_ms = now;
  c->events = EPOLLIN;
  struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
  if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &e) != 0) {
    free(c);
    refuse(fd, peer, "cannot watch the socket");
    return;
  }
  c->index = s->nconns;
  s->conns[s->nconns++] = c;
  heap_schedule(s, c, conn_next_time(s, c));
}

static void accept_all(store_server *s, int64_t now) {
  for (int i = 0; i < ACCEPT_BATCH; i++) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        /* The pending connection stays queued; retry shortly instead of spinning. */
        base_log(BASE_LOG_WARN, "store: accept: %s", cohort_strerror(-errno));
        s->accept_pause_until = now + 100;
        struct epoll_event e = {.events = 0, .data.ptr = NULL};
        epoll_ctl(s->epfd, EPOLL_CTL_MOD, s->lfd, &e);
      }
      return;
    }
    char host[BASE_HOST_MAX] = "?";
    int port = 0;
    base_sockaddr_str((struct sockaddr *)&ss, host, sizeof host, &port);
    char peer[64];
    base_join_hostport(host, port, peer, sizeof peer);
    add_conn(s, fd, peer, now);
  }
}

/* The listening socket and the stop pipe are told apart by their data pointers. */
static char tag_listen, tag_stop;

static int loop_timeout(const store_server *s, int64_t now) {
  int64_t next = s->accept_pause_until > now ? s->accept_pause_until : INT64_MAX;
  if (s->nheap > 0 && s->heap[0]->heap_at < next) next = s->heap[0]->heap_at;
  return next == INT64_MAX ? -1 : base_deadline_left(next);
}

static void *server_main(void *arg) {
  store_server *s = arg;
  struct epoll_event evs[MAX_EVENTS];
  for (;;) {
    int64_t now = base_now_ms();
    if (s->accept_pause_until != 0 && now >= s->accept_pause_until) {
      s->accept_pause_until = 0;
      struct epoll_event e = {.events = EPOLLIN, .data.ptr = &tag_listen};
      epoll_ctl(s->epfd, EPOLL_CTL_MOD, s->lfd, &e);
    }
    run_timers(s, now);
    drain_dirty(s, now);
    int n = epoll_wait(s->epfd, evs, MAX_EVENTS, loop_timeout(s, now));
    if (n < 0) {
      if (errno == EINTR) continue;
      base_log(BASE_LOG_ERROR, "store: epoll_wait: %s", cohort_strerror(-errno));
      base_sleep_ms(10);
      continue;
    }
    now = base_now_ms();
    int accept_ready = 0;
    for (int i = 0; i < n; i++) {
      void *p = evs[i].data.ptr;
      if (p == &tag_stop) return NULL;
      if (p == &tag_listen)
        accept_ready = 1;
      else if (p != NULL)
        conn_event(s, p, evs[i].events, now);
    }
    drain_dirty(s, now);
    if (accept_ready) accept_all(s, now);
  }
}

/* Lets the process open as many descriptors as the server may hold connections. */
static void raise_fd_limit(int max_conns) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  rlim_t want = (rlim_t)max_conns + 256;
  if (rl.rlim_cur >= want || rl.rlim_cur == RLIM_INFINITY) return;
  rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
}

static int setup_loop(store_server *s, const store_server_opts *opts) {
  int rc = base_tcp_listen(opts->bind_host, opts->port, LISTEN_BACKLOG, &s->lfd, &s->port);
  if (rc != 0) return rc;
  if ((rc = base_set_nonblock(s->lfd, 1)) != 0) return rc;
  int p[2];
  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) return -errno;
  s->pipe_rd = p[0];
  s->pipe_wr = p[1];
  s->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (s->epfd < 0) return -errno;
  struct epoll_event e = {.events = EPOLLIN, .data.ptr = &tag_listen};
  if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->lfd, &e) != 0) return -errno;
  e.data.ptr = &tag_stop;
  if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->pipe_rd, &e) != 0) return -errno;
  return 0;
}

int store_server_start(const store_server_opts *opts, store_server **out) {
  *out = NULL;
  store_server_opts def = {0};
  if (opts == NULL) opts = &def;
  if (opts->token != NULL && strlen(opts->token) > STORE_TOKEN_MAX) return -EINVAL;
  if (opts->max_conns < 0 || opts->idle_timeout_ms < 0 || opts->io_timeout_ms < 0) return -EINVAL;
  store_server *s = calloc(1, sizeof *s);
  if (s == NULL) return -ENOMEM;
  s->lfd = s->epfd = s->pipe_rd = s->pipe_wr = -1;
  s->max_conns = opts->max_conns ? opts->max_conns : DEFAULT_MAX_CONNS;
  s->idle_ms = opts->idle_timeout_ms ? opts->idle_timeout_ms : DEFAULT_IDLE_MS;
  s->io_ms = opts->io_timeout_ms ? opts->io_timeout_ms : DEFAULT_IO_MS;
  int rc = store_table_init(&s->table, opts->max_bytes ? opts->max_bytes : DEFAULT_MAX_BYTES);
  if (rc != 0) goto fail;
  if (opts->token != NULL && opts->token[0] != '\0') {
    s->token = strdup(opts->token);
    rc = -ENOMEM;
    if (s->token == NULL) goto fail;
    s->token_len = strlen(s->token);
  }
  rc = -ENOMEM;
  if ((s->scratch = malloc(SCRATCH_LEN)) == NULL) goto fail;
  raise_fd_limit(s->max_conns);
  if ((rc = setup_loop(s, opts)) != 0) goto fail;
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
  s->stopping = 1;
  while (s->nconns > 0) conn_free(s, s->conns[s->nconns - 1]);
  free(s->conns);
  free(s->heap);
  store_table_free(&s->table);
  free(s->scratch);
  if (s->lfd >= 0) close(s->lfd);
  if (s->epfd >= 0) close(s->epfd);
  if (s->pipe_rd >= 0) close(s->pipe_rd);
  if (s->pipe_wr >= 0) close(s->pipe_wr);
  if (s->token) memset(s->token, 0, s->token_len);
  free(s->token);
  free(s);
}

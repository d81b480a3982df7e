/*
 * engine.c - drives the transfers of one algorithm step through the
 * transports: framing, mismatch detection, streaming reduction, deadline,
 * failure.
 *
 * Every message starts with a 32-byte header naming the collective (kind,
 * type, operator, root, count) and its sequence number; the receiver
 * compares it with its own call before touching the payload, so ranks that
 * called different collectives fail with COHORT_EMISMATCH naming the peer
 * instead of corrupting memory or hanging. Payloads are padded to 8 bytes (over
 * shared memory: header and payload to whole 64-byte cache lines).
 *
 * A step runs its sends and receives concurrently (a ring step sends to one
 * neighbour while receiving from the other) and reduces received bytes as
 * soon as whole elements have arrived, so reduction overlaps the transfer.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "coll/coll.h"

#define HDR_MAGIC 0x31544843u /* "CHT1" */
#define MAX_XFER 4

typedef struct coll_hdr {
  uint32_t magic;
  uint8_t kind, dtype, redop, flags;
  int32_t root;
  uint32_t seq;
  uint64_t count;
  uint64_t len;
} coll_hdr;
_Static_assert(sizeof(coll_hdr) == 32, "header is 32 bytes on the wire");

enum { XF_SEND = 1, XF_RECV, XF_RECV_REDUCE };

typedef struct xfer {
  int peer, mode;
  const char *sbuf;        /* send payload */
  char *dst;               /* receive destination */
  const char *local;       /* reduce: local operand */
  size_t len, padded, pos; /* pos counts header + padded payload */
  coll_hdr hdr;
  const coll_tport_ops *ops;
  void *t;
} xfer;

static const char zero_pad[64];

const char *coll_kind_name(int kind) {
  switch (kind) {
  case COLL_ALLREDUCE:
    return "allreduce";
  case COLL_REDUCE_SCATTER:
    return "reduce_scatter";
  case COLL_ALLGATHER:
    return "allgather";
  case COLL_BROADCAST:
    return "broadcast";
  case COLL_REDUCE:
    return "reduce";
  case COLL_BARRIER:
    return "barrier";
  default:
    return "unknown";
  }
}

static int kind_reduces(int kind) {
  return kind == COLL_ALLREDUCE || kind == COLL_REDUCE_SCATTER || kind == COLL_REDUCE;
}
static int kind_rooted(int kind) {
  return kind == COLL_BROADCAST || kind == COLL_REDUCE;
}

static void fill_hdr(const coll_ctx *x, coll_hdr *h, size_t len) {
  memset(h, 0, sizeof *h);
  h->magic = HDR_MAGIC;
  h->kind = (uint8_t)x->op->kind;
  h->dtype = (uint8_t)x->op->dtype;
  h->redop = kind_reduces(x->op->kind) ? (uint8_t)x->op->op : 0;
  h->root = kind_rooted(x->op->kind) ? x->op->root : -1;
  h->seq = x->seq;
  h->count = x->op->count;
  h->len = len;
}

/* "allreduce(count=10, float, sum)" */
static void describe(const coll_hdr *h, char *out, size_t outlen) {
  if (h->kind == COLL_BARRIER) {
    snprintf(out, outlen, "barrier");
    return;
  }
  int n = snprintf(out, outlen, "%s(count=%llu, %s", coll_kind_name(h->kind),
                   (unsigned long long)h->count, coll_dtype_name((cohort_dtype)h->dtype));
  if (n < 0 || (size_t)n >= outlen) return;
  if (kind_reduces(h->kind))
    n += snprintf(out + n, outlen - (size_t)n, ", %s", coll_redop_name((cohort_redop)h->redop));
  if (n < 0 || (size_t)n >= outlen) return;
  if (kind_rooted(h->kind)) n += snprintf(out + n, outlen - (size_t)n, ", root=%d", h->root);
  if (n < 0 || (size_t)n >= outlen) return;
  snprintf(out + n, outlen - (size_t)n, ")");
}

static int check_hdr(coll_ctx *x, xfer *v) {
  coll_hdr mine;
  fill_hdr(x, &mine, v->len);
  const coll_hdr *h = &v->hdr;
  char a[160], b[160];
  if (h->magic != HDR_MAGIC || h->kind < COLL_ALLREDUCE || h->kind > COLL_BARRIER ||
      h->dtype >= COHORT_DTYPE_COUNT || h->redop >= COHORT_REDOP_COUNT)
    return coll_fail(x->comm, COHORT_EPROTO, "rank %d: malformed message header from rank %d",
                     x->comm->rank, v->peer);
  if (h->seq != mine.seq || h->kind != mine.kind || h->dtype != mine.dtype ||
      h->redop != mine.redop || h->root != mine.root || h->count != mine.count) {
    describe(h, a, sizeof a);
    describe(&mine, b, sizeof b);
    return coll_fail(x->comm, COHORT_EMISMATCH,
                     "mismatched collectives: rank %d called %s as its collective #%u, rank %d "
                     "called %s as #%u",
                     v->peer, a, h->seq, x->comm->rank, b, mine.seq);
  }
  if (h->len != mine.len)
    return coll_fail(x->comm, COHORT_EMISMATCH,
                     "rank %d sent %llu bytes where rank %d expected %llu in %s #%u (different "
                     "COHORT_ALGO_THRESHOLD settings?)",
                     v->peer, (unsigned long long)h->len, x->comm->rank,
                     (unsigned long long)mine.len, coll_kind_name(mine.kind), mine.seq);
  return 0;
}

static int peer_error(coll_ctx *x, int peer, int err, const char *what) {
  cohort_comm *c = x->comm;
  int arank;
  char amsg[400];
  if (coll_shm_aborted(c->shm, &arank, amsg, sizeof amsg))
    return coll_fail(c, COHORT_EPEER, "rank %d aborted the communicator: %s", arank, amsg);
  if (err == COHORT_EPEER)
    return coll_fail(c, COHORT_EPEER,
                     "rank %d: lost the connection to rank %d (it died, exited or aborted) "
                     "while %s in %s #%u",
                     c->rank, peer, what, coll_kind_name(x->op->kind), x->seq);
  return coll_fail(c, err, "rank %d: %s with rank %d in %s #%u failed: %s", c->rank, what, peer,
                   coll_kind_name(x->op->kind), x->seq, cohort_strerror(err));
}

/* One non-blocking step of a transfer: bytes moved (>= 0) or an error. */
static long step(coll_ctx *x, xfer *v) {
  size_t total = sizeof(coll_hdr) + v->padded;
  if (v->mode == XF_SEND) {
    if (v->pos == 0 && total <= 64) {
      /* A small message as one piece: one copy into the ring instead of three. */
      char line[64];
      memcpy(line, &v->hdr, sizeof(coll_hdr));
      if (v->len) memcpy(line + sizeof(coll_hdr), v->sbuf, v->len);
      memset(line + sizeof(coll_hdr) + v->len, 0, v->padded - v->len);
      struct iovec one = {.iov_base = line, .iov_len = total};
      long n = v->ops->send(v->t, v->peer, &one, 1);
      if (n < 0) return peer_error(x, v->peer, (int)n, "sending");
      v->pos += (size_t)n; /* partly taken: the rest goes out from the pieces below */
      return n;
    }
    struct iovec iov[3];
    int k = 0;
    size_t pos = v->pos;
    if (pos < sizeof(coll_hdr)) {
      iov[k].iov_base = (char *)&v->hdr + pos;
      iov[k++].iov_len = sizeof(coll_hdr) - pos;
      pos = sizeof(coll_hdr);
    }
    size_t off = pos - sizeof(coll_hdr);
    if (off < v->len) {
      iov[k].iov_base = (void *)(v->sbuf + off);
      iov[k++].iov_len = v->len - off;
      off = v->len;
    }
    if (off < v->padded) {
      iov[k].iov_base = (void *)(zero_pad + (off - v->len));
      iov[k++].iov_len = v->padded - off;
    }
    long n = v->ops->send(v->t, v->peer, iov, k);
    if (n < 0) return peer_error(x, v->peer, (int)n, "sending");
    v->pos += (size_t)n;
    return n;
  }
  if (v->pos == 0 && v->ops == &coll_shm_ops && total <= 4096) {
    /* Small message already whole in the ring: header check, copy or reduce, and one release of
     * the ring space (each release is a cache line the sender must fetch back). */
    const void *data;
    long n = v->ops->peek(v->t, v->peer, &data);
    if (n < 0) return peer_error(x, v->peer, (int)n, "receiving");
    if ((size_t)n >= total) {
      memcpy(&v->hdr, data, sizeof(coll_hdr));
      int rc = check_hdr(x, v);
      if (rc != 0) return rc;
      const char *payload = (const char *)data + sizeof(coll_hdr);
      if (v->mode == XF_RECV) {
        if (v->len) memcpy(v->dst, payload, v->len);
      } else if (v->len) {
        coll_reduce(x->op->dtype, x->op->op, v->dst, v->local, payload, v->len / x->es);
      }
      v->ops->consume(v->t, v->peer, total);
      v->pos = total;
      return (long)total;
    }
  }
  long moved = 0;
  while (v->pos < total) {
    long n;
    if (v->pos < sizeof(coll_hdr)) {
      n = v->ops->recv(v->t, v->peer, (char *)&v->hdr + v->pos, sizeof(coll_hdr) - v->pos);
      if (n > 0 && v->pos + (size_t)n == sizeof(coll_hdr)) {
        int rc = check_hdr(x, v);
        if (rc != 0) return rc;
      }
    } else {
      size_t off = v->pos - sizeof(coll_hdr);
      if (off >= v->len) {
        char pad[64];
        n = v->ops->recv(v->t, v->peer, pad, v->padded - off);
      } else if (v->mode == XF_RECV) {
        n = v->ops->recv(v->t, v->peer, v->dst + off, v->len - off);
      } else {
        const void *data;
        n = v->ops->peek(v->t, v->peer, &data);
        if (n > 0) {
          size_t m = (size_t)n < v->len - off ? (size_t)n : v->len - off;
          m -= m % x->es;
          if (m > 0) {
            coll_reduce(x->op->dtype, x->op->op, v->dst + off, v->local + off, data, m / x->es);
            v->ops->consume(v->t, v->peer, m);
          }
          n = (long)m;
        }
      }
    }
    if (n < 0) return peer_error(x, v->peer, (int)n, "receiving");
    if (n == 0) break;
    v->pos += (size_t)n;
    moved += n;
  }
  return moved;
}

/* Polls before the full wait path when every pending transfer is on shared memory: a peer on
 * the other core usually answers within a few hundred nanoseconds, and the wait path reads the
 * clock. */
#define QUICK_POLLS 64

static int run(coll_ctx *x, xfer *v, int n) {
  cohort_comm *c = x->comm;
  int64_t last_live = 0;
  int polls = 0;
  for (int i = 0; i < n; i++) {
    v[i].ops = c->peer_ops[v[i].peer];
    v[i].t = c->peer_t[v[i].peer];
    v[i].padded = (v[i].len + 7u) & ~(size_t)7u;
    /* Shared memory: whole cache lines per message; a small one is exactly as long as the
     * transport's inline copy (48 bytes: the header and up to 16 bytes), so it travels
     * with the ring's head. */
    if (v[i].ops == &coll_shm_ops) {
      size_t t = sizeof(coll_hdr) + v[i].len;
      t = t <= 48 ? 48 : (t + 63u) & ~(size_t)63u;
      v[i].padded = t - sizeof(coll_hdr);
    }
    v[i].pos = 0;
    if (v[i].mode == XF_SEND) fill_hdr(x, &v[i].hdr, v[i].len);
  }
  for (;;) {
    int pending = 0, progressed = 0;
    for (int i = 0; i < n; i++) {
      if (v[i].pos == sizeof(coll_hdr) + v[i].padded) continue;
      long r = step(x, &v[i]);
      if (r < 0) return (int)r;
      if (r > 0) progressed = 1;
      if (v[i].pos < sizeof(coll_hdr) + v[i].padded) pending++;
    }
    if (pending == 0) return 0;
    if (atomic_load(&c->failed)) return COHORT_EABORTED;
    if (progressed) {
      polls = 0;
      continue;
    }
    if (polls < QUICK_POLLS) {
      int all_shm = 1;
      for (int i = 0; i < n; i++)
        if (v[i].pos < sizeof(coll_hdr) + v[i].padded && v[i].ops != &coll_shm_ops) all_shm = 0;
      if (all_shm) {
        polls++;
        coll_cpu_relax();
        continue;
      }
    }
    polls = 0;

    int arank;
    char amsg[400];
    if (coll_shm_aborted(c->shm, &arank, amsg, sizeof amsg))
      return coll_fail(c, COHORT_EPEER, "rank %d aborted the communicator: %s", arank, amsg);
    int64_t now = base_now_ms();
    /* The deadline starts when the operation first has to wait (see execute()). */
    if (x->deadline_ms == 0) x->deadline_ms = now + x->op->timeout_ms;
    if (last_live == 0) last_live = now;
    int first = -1;
    for (int i = 0; i < n && first < 0; i++)
      if (v[i].pos < sizeof(coll_hdr) + v[i].padded) first = i;
    if (now >= x->deadline_ms)
      return coll_fail(c, -ETIMEDOUT, "rank %d: %s #%u timed out after %d ms %s rank %d", c->rank,
                       coll_kind_name(x->op->kind), x->seq, x->op->timeout_ms,
                       v[first].mode == XF_SEND ? "sending to" : "waiting for data from",
                       v[first].peer);

    /* Block on the transport(s) of the pending transfers. */
    int peers[MAX_XFER], want[MAX_XFER], k = 0, mixed = 0;
    const coll_tport_ops *ops = NULL;
    void *t = NULL;
    for (int i = 0; i < n; i++) {
      if (v[i].pos == sizeof(coll_hdr) + v[i].padded) continue;
      if (ops != NULL && ops != v[i].ops) mixed = 1;
      ops = v[i].ops;
      t = v[i].t;
      peers[k] = v[i].peer;
      want[k++] = v[i].mode == XF_SEND ? COLL_WANT_SEND : COLL_WANT_RECV;
    }
    int64_t left64 = x->deadline_ms - now;
    int left = left64 > 100 ? 100 : (int)left64;
    int slice = mixed ? 1 : (left < 100 ? left : 100);
    int bad = -1, rc;
    if (mixed) {
      /* Rare (hierarchies): poll the TCP side briefly, then retry everything. */
      int tp[MAX_XFER], tw[MAX_XFER], tk = 0;
      for (int i = 0; i < k; i++)
        if (c->peer_ops[peers[i]] == &coll_tcp_ops) {
          tp[tk] = peers[i];
          tw[tk++] = want[i];
        }
      rc = coll_tcp_ops.wait(c->tcp, tp, tw, tk, slice, &bad);
    } else {
      rc = ops->wait(t, peers, want, k, slice, &bad);
    }
    if (rc < 0) return peer_error(x, bad >= 0 ? bad : peers[0], rc, "waiting");
    /* Shared memory says nothing when a peer dies: its TCP connection does. */
    now = base_now_ms();
    if (c->shm != NULL && now - last_live >= 50) {
      last_live = now;
      /* A peer that finished its part and exited may have left bytes in the ring for us:
       * it is lost only once nothing of it is left to read. */
      for (int i = 0; i < k; i++)
        if (c->peer_ops[peers[i]] == &coll_shm_ops && coll_tcp_peer_gone(c->tcp, peers[i]) &&
            !(want[i] == COLL_WANT_RECV && coll_shm_readable(c->shm, peers[i])))
          return peer_error(x, peers[i], COHORT_EPEER, "waiting");
    }
  }
}

int coll_send(coll_ctx *x, int peer, const void *buf, size_t len) {
  xfer v = {.peer = peer, .mode = XF_SEND, .sbuf = buf, .len = len};
  return run(x, &v, 1);
}

int coll_recv(coll_ctx *x, int peer, void *buf, size_t len) {
  xfer v = {.peer = peer, .mode = XF_RECV, .dst = buf, .len = len};
  return run(x, &v, 1);
}

int coll_recv_reduce(coll_ctx *x, int peer, const void *local, void *dst, size_t len) {
  xfer v = {.peer = peer, .mode = XF_RECV_REDUCE, .dst = dst, .local = local, .len = len};
  return run(x, &v, 1);
}

int coll_sendrecv(coll_ctx *x, int speer, const void *sbuf, size_t slen, int rpeer, void *rbuf,
                  size_t rlen) {
  xfer v[2] = {{.peer = speer, .mode = XF_SEND, .sbuf = sbuf, .len = slen},
               {.peer = rpeer, .mode = XF_RECV, .dst = rbuf, .len = rlen}};
  return run(x, v, 2);
}

int coll_sendrecv_reduce(coll_ctx *x, int speer, const void *sbuf, size_t slen, int rpeer,
                         const void *local, void *dst, size_t rlen) {
  xfer v[2] = {{.peer = speer, .mode = XF_SEND, .sbuf = sbuf, .len = slen},
               {.peer = rpeer, .mode = XF_RECV_REDUCE, .dst = dst, .local = local, .len = rlen}};
  return run(x, v, 2);
}

int coll_fail(cohort_comm *c, int err, const char *fmt, ...) {
  pthread_mutex_lock(&c->err_mu);
  int first = !atomic_load(&c->failed);
  if (first) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    va_end(ap);
    c->err = err;
    atomic_store(&c->failed, 1);
  }
  pthread_mutex_unlock(&c->err_mu);
  if (first) coll_abort_transports(c, c->errmsg);
  return err;
}

void coll_abort_transports(cohort_comm *c, const char *why) {
  if (c->shm != NULL) {
    char msg[400];
    snprintf(msg, sizeof msg, "%s", why);
    coll_shm_abort(c->shm, c->rank, msg);
  }
  coll_tcp_shutdown(c->tcp);
}

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
 *
 * An operation on f32 buffers whose wire type is 16 bits (op->wire !=
 * op->dtype; comm.c sends the ring algorithms' here, coll_wire_at_edges)
 * converts at the transfers: a send rounds its next piece of the f32 buffer
 * into a small stage on the stack just before the transport takes it, a
 * receive widens the arriving elements into the f32 destination, summing
 * them with the local operand rounded to the wire type, in the same pass.
 * The algorithms see f32 byte ranges; the peers see the bytes, and every
 * result holds the bits, of the same collective run on 16-bit buffers.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/base.h"
#include "coll/convert.h"
#include "coll/engine.h"
#include "coll/reduce.h"

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
  int conv;                /* f32 buffers, a 16-bit payload (x->op->wire): converted here */
  const char *sbuf;        /* send payload */
  char *dst;               /* receive destination; a converting send's rounded copy, or NULL */
  const char *local;       /* reduce: local operand */
  size_t len, padded, pos; /* len: payload bytes on the wire; pos counts header + padded payload */
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
  case COLL_TRANSFER:
    return "state_transfer";
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
  h->dtype = (uint8_t)x->op->wire; /* what travels: dtype, or its 16-bit wire type */
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

/* Every COHORT_EMISMATCH message starts so; a peer's abort that does is a mismatch here too. */
#define MISMATCH "mismatched collectives: "

/* A peer aborted the communicator: its reason's code where it names one, else COHORT_EPEER. */
static int fail_peer_aborted(coll_engine *e, int arank, const char *amsg) {
  int err = strncmp(amsg, MISMATCH, strlen(MISMATCH)) == 0 ? COHORT_EMISMATCH : COHORT_EPEER;
  return coll_fail(e, err, "rank %d aborted the communicator: %s", arank, amsg);
}

static int peer_error(coll_ctx *x, int peer, int err, const char *what);

static int check_hdr(coll_ctx *x, xfer *v) {
  coll_hdr mine;
  fill_hdr(x, &mine, v->len);
  const coll_hdr *h = &v->hdr;
  char a[160], b[160];
  /* The peer aborted where its next message would begin: its reason follows (tport.h). */
  if (memcmp(h, COLL_ABORT_HEAD, COLL_ABORT_MARK_LEN) == 0)
    return peer_error(x, v->peer, COHORT_EPEER, "receiving");
  if (h->magic != HDR_MAGIC || h->kind < COLL_ALLREDUCE || h->kind > COLL_TRANSFER ||
      h->dtype >= COHORT_DTYPE_COUNT || h->redop >= COHORT_REDOP_COUNT)
    return coll_fail(x->eng, COHORT_EPROTO, "rank %d: malformed message header from rank %d",
                     x->eng->rank, v->peer);
  if (h->seq != mine.seq || h->kind != mine.kind || h->dtype != mine.dtype ||
      h->redop != mine.redop || h->root != mine.root || h->count != mine.count) {
    describe(h, a, sizeof a);
    describe(&mine, b, sizeof b);
    return coll_fail(x->eng, COHORT_EMISMATCH,
                     MISMATCH "rank %d called %s as its collective #%u, rank %d called %s as #%u",
                     v->peer, a, h->seq, x->eng->rank, b, mine.seq);
  }
  if (h->len != mine.len)
    return coll_fail(x->eng, COHORT_EMISMATCH,
                     MISMATCH "rank %d sent %llu bytes where rank %d expected %llu in %s #%u "
                              "(different COHORT_ALGO_THRESHOLD settings?)",
                     v->peer, (unsigned long long)h->len, x->eng->rank,
                     (unsigned long long)mine.len, coll_kind_name(mine.kind), mine.seq);
  return 0;
}

static int peer_error(coll_ctx *x, int peer, int err, const char *what) {
  coll_engine *e = x->eng;
  int arank;
  char amsg[400];
  if (coll_peer_aborted(e, &arank, amsg, sizeof amsg)) return fail_peer_aborted(e, arank, amsg);
  if (err == COHORT_EPEER)
    return coll_fail(e, COHORT_EPEER,
                     "rank %d: lost the connection to rank %d (it died, exited or aborted) "
                     "while %s in %s #%u",
                     e->rank, peer, what, coll_kind_name(x->op->kind), x->seq);
  return coll_fail(e, err, "rank %d: %s with rank %d in %s #%u failed: %s", e->rank, what, peer,
                   coll_kind_name(x->op->kind), x->seq, cohort_strerror(err));
}

/* Wire elements a converting send rounds at a time into its stage on the stack (16 KiB): the
 * stage stays in the first-level cache between the rounding and the transport's copy. */
#define CONV_STAGE 8192

/* What is left of the header from v->pos, as the first of iov[*k]; returns the payload offset
 * the send goes on from. */
static size_t hdr_iov(xfer *v, struct iovec *iov, int *k) {
  if (v->pos >= sizeof(coll_hdr)) return v->pos - sizeof(coll_hdr);
  iov[*k].iov_base = (char *)&v->hdr + v->pos;
  iov[(*k)++].iov_len = sizeof(coll_hdr) - v->pos;
  return 0;
}

/* One non-blocking step of a converting send: each piece of the f32 buffer is rounded into the
 * stage just before the transport takes it; what the transport left of a piece is rounded again
 * the next time (the same bits). Bytes moved (>= 0) or an error. */
static long step_send_conv(coll_ctx *x, xfer *v) {
  uint16_t stage[CONV_STAGE];
  size_t total = sizeof(coll_hdr) + v->padded;
  long moved = 0;
  while (v->pos < total) {
    struct iovec iov[3];
    int k = 0;
    size_t want = 0, off = hdr_iov(v, iov, &k);
    if (off < v->len) {
      size_t e0 = off / 2, ne = v->len / 2 - e0;
      if (ne > CONV_STAGE) ne = CONV_STAGE;
      const float *src = (const float *)v->sbuf + e0;
      if (v->dst == NULL)
        coll_to_wire(x->op->wire, stage, src, ne);
      else if (coll_to_wire_changes(x->op->wire, stage, src, ne) || v->dst != v->sbuf)
        coll_from_wire(x->op->wire, (float *)v->dst + e0, stage, ne); /* the rounded copy */
      iov[k].iov_base = (char *)stage + (off & 1u);
      iov[k++].iov_len = ne * 2 - (off & 1u);
      off = (e0 + ne) * 2;
    }
    if (off >= v->len && off < v->padded) {
      iov[k].iov_base = (void *)(zero_pad + (off - v->len));
      iov[k++].iov_len = v->padded - off;
    }
    for (int i = 0; i < k; i++) want += iov[i].iov_len;
    long n = v->ops->send(v->t, v->peer, iov, k);
    if (n < 0) return peer_error(x, v->peer, (int)n, "sending");
    v->pos += (size_t)n;
    moved += n;
    if ((size_t)n < want) break;
  }
  return moved;
}

/* The payload of a small message (len <= 32 bytes) into out: copied, or rounded to the wire. */
static void small_payload(coll_ctx *x, const xfer *v, char *out) {
  if (!v->conv) {
    memcpy(out, v->sbuf, v->len);
    return;
  }
  uint16_t w[16];
  coll_to_wire(x->op->wire, w, (const float *)v->sbuf, v->len / 2);
  memcpy(out, w, v->len);
  if (v->dst != NULL) coll_from_wire(x->op->wire, (float *)v->dst, w, v->len / 2);
}

/* Received wire elements (n bytes at wire offset off) into a converting transfer's f32
 * destination: widened, or summed with the local operand. */
static void take_conv(coll_ctx *x, xfer *v, size_t off, const void *data, size_t n) {
  float *dst = (float *)v->dst + off / 2;
  if (v->mode == XF_RECV)
    coll_from_wire(x->op->wire, dst, data, n / 2);
  else
    coll_sum_from_wire(x->op->wire, dst, (const float *)v->local + off / 2, data, n / 2);
}

/* One non-blocking step of a send: bytes moved (>= 0) or an error. */
static long step_send(coll_ctx *x, xfer *v) {
  size_t total = sizeof(coll_hdr) + v->padded;
  if (v->pos == 0 && total <= 64) {
    /* A small message as one piece: one copy into the ring instead of three. */
    char line[64];
    memcpy(line, &v->hdr, sizeof(coll_hdr));
    if (v->len) small_payload(x, v, line + sizeof(coll_hdr));
    memset(line + sizeof(coll_hdr) + v->len, 0, v->padded - v->len);
    struct iovec one = {.iov_base = line, .iov_len = total};
    long n = v->ops->send(v->t, v->peer, &one, 1);
    if (n < 0) return peer_error(x, v->peer, (int)n, "sending");
    v->pos += (size_t)n; /* partly taken: the rest goes out from the pieces below */
    return n;
  }
  if (v->conv) return step_send_conv(x, v);
  struct iovec iov[3];
  int k = 0;
  size_t off = hdr_iov(v, iov, &k);
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

/* A small message already whole in the transport: header check, copy or reduce, and one release
 * of the transport's space (each release is a cache line the sender must fetch back). Returns
 * bytes taken (0: not whole yet) or an error. */
static long step_recv_whole(coll_ctx *x, xfer *v) {
  size_t total = sizeof(coll_hdr) + v->padded;
  const void *data;
  long n = v->ops->peek(v->t, v->peer, &data);
  if (n < 0) return peer_error(x, v->peer, (int)n, "receiving");
  if ((size_t)n >= total) {
    memcpy(&v->hdr, data, sizeof(coll_hdr));
    int rc = check_hdr(x, v);
    if (rc != 0) return rc;
    const char *payload = (const char *)data + sizeof(coll_hdr);
    if (v->conv) {
      if (v->len) take_conv(x, v, 0, payload, v->len);
    } else if (v->mode == XF_RECV) {
      if (v->len) memcpy(v->dst, payload, v->len);
    } else if (v->len) {
      coll_reduce(x->op->dtype, x->op->op, v->dst, v->local, payload, v->len / x->es);
    }
    v->ops->consume(v->t, v->peer, total);
    v->pos = total;
    return (long)total;
  }
  return 0;
}

/* One non-blocking step of a receive (reducing or not): bytes moved (>= 0) or an error. */
static long step(coll_ctx *x, xfer *v) {
  if (v->mode == XF_SEND) return step_send(x, v);
  size_t total = sizeof(coll_hdr) + v->padded;
  if (v->pos == 0 && total <= v->ops->peek_whole_max) {
    long n = step_recv_whole(x, v);
    if (n != 0) return n;
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
      } else if (v->conv) {
        const void *data;
        n = v->ops->peek(v->t, v->peer, &data);
        if (n > 0) {
          size_t m = (size_t)n < v->len - off ? (size_t)n : v->len - off;
          m -= m % 2;
          if (m > 0) {
            take_conv(x, v, off, data, m);
            v->ops->consume(v->t, v->peer, m);
          }
          n = (long)m;
        }
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

/* Polls before the full wait path when every pending transfer is on a polled transport (shared
 * memory): a peer on the other core usually answers within a few hundred nanoseconds, and the
 * wait path reads the clock. */
#define QUICK_POLLS 64
/* How often (ms) the peers of a wait are checked for liveness when their transport needs it. */
#define LIVENESS_MS 50

static int xfer_done(const xfer *v) {
  return v->pos == sizeof(coll_hdr) + v->padded;
}

static void xfer_start(coll_ctx *x, xfer *v) {
  coll_engine *e = x->eng;
  v->ops = e->peer_ops[v->peer];
  v->t = e->peer_t[v->peer];
  /* A converting transfer is given f32 bytes; half of them travel. */
  v->conv = x->op->wire != x->op->dtype;
  if (v->conv) v->len /= 2;
  size_t t = sizeof(coll_hdr) + v->len, a = v->ops->frame_align;
  t = t <= v->ops->frame_min ? v->ops->frame_min : (t + a - 1) / a * a;
  v->padded = t - sizeof(coll_hdr);
  v->pos = 0;
  if (v->mode == XF_SEND) fill_hdr(x, &v->hdr, v->len);
  if (v->mode == XF_SEND && v->ops->frame != NULL) v->ops->frame(v->t, v->peer, t);
}

static int all_polled(const xfer *v, int n) {
  for (int i = 0; i < n; i++)
    if (!xfer_done(&v[i]) && !v[i].ops->polled) return 0;
  return 1;
}

/* The pending transfers as (peer, want) lists; returns their number. */
static int pending_list(const xfer *v, int n, int *peers, int *want) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (xfer_done(&v[i])) continue;
    peers[k] = v[i].peer;
    want[k++] = v[i].mode == XF_SEND ? COLL_WANT_SEND : COLL_WANT_RECV;
  }
  return k;
}

/* Blocks on the transport(s) of the pending transfers for at most `left` ms. */
static int block(coll_ctx *x, const int *peers, const int *want, int k, int left) {
  coll_engine *e = x->eng;
  const coll_tport_ops *ops = e->peer_ops[peers[0]];
  int mixed = 0, bad = -1, rc = 0;
  for (int i = 1; i < k; i++)
    if (e->peer_ops[peers[i]] != ops) mixed = 1;
  if (!mixed) {
    rc = ops->wait(e->peer_t[peers[0]], peers, want, k, left < 100 ? left : 100, &bad);
  } else {
    /* Rare (hierarchies): wait briefly on the transports that block in the kernel, then retry
     * everything (the polled ones are re-polled by the caller). */
    for (int j = 0; j < e->ntports && rc == 0; j++) {
      if (e->tport_ops[j]->polled) continue;
      int tp[MAX_XFER], tw[MAX_XFER], tk = 0;
      for (int i = 0; i < k; i++)
        if (e->peer_ops[peers[i]] == e->tport_ops[j]) {
          tp[tk] = peers[i];
          tw[tk++] = want[i];
        }
      if (tk > 0) rc = e->tport_ops[j]->wait(e->tport_t[j], tp, tw, tk, 1, &bad);
    }
  }
  return rc < 0 ? peer_error(x, bad >= 0 ? bad : peers[0], rc, "waiting") : 0;
}

/* Some transports cannot see a peer die: ask theirs. A peer that finished its part and exited
 * may have left bytes for us: it is lost only once nothing of it is left to read. */
static int check_liveness(coll_ctx *x, const int *peers, const int *want, int k) {
  coll_engine *e = x->eng;
  for (int i = 0; i < k; i++) {
    const coll_tport_ops *ops = e->peer_ops[peers[i]];
    void *t = e->peer_t[peers[i]];
    if (ops->peer_gone != NULL && ops->peer_gone(t, peers[i]) &&
        !(want[i] == COLL_WANT_RECV && ops->pending(t, peers[i])))
      return peer_error(x, peers[i], COHORT_EPEER, "waiting");
  }
  return 0;
}

static int timed_out(coll_ctx *x, const xfer *v, int n) {
  int first = 0;
  while (first < n - 1 && xfer_done(&v[first])) first++;
  return coll_fail(x->eng, -ETIMEDOUT, "rank %d: %s #%u timed out after %d ms %s rank %d",
                   x->eng->rank, coll_kind_name(x->op->kind), x->seq, x->op->timeout_ms,
                   v[first].mode == XF_SEND ? "sending to" : "waiting for data from",
                   v[first].peer);
}

/* One pass over the transfers: 1 when one moved bytes, 0 when none did, or an error. *pending
 * counts the unfinished. */
static int advance(coll_ctx *x, xfer *v, int n, int *pending) {
  int progressed = 0;
  *pending = 0;
  for (int i = 0; i < n; i++) {
    if (xfer_done(&v[i])) continue;
    long r = step(x, &v[i]);
    if (r < 0) return (int)r;
    if (r > 0) progressed = 1;
    if (!xfer_done(&v[i])) (*pending)++;
  }
  return progressed;
}

static int run(coll_ctx *x, xfer *v, int n) {
  coll_engine *e = x->eng;
  int64_t last_live = 0;
  int polls = 0;
  for (int i = 0; i < n; i++) xfer_start(x, &v[i]);
  for (;;) {
    int pending, rc = advance(x, v, n, &pending);
    if (rc < 0) return rc;
    if (pending == 0) return 0;
    if (atomic_load(&e->failed)) return coll_later_err(e);
    if (rc > 0) {
      polls = 0;
      continue;
    }
    if (polls < QUICK_POLLS && all_polled(v, n)) {
      polls++;
      coll_cpu_relax();
      continue;
    }
    polls = 0;
    /* Rather than sleep, do the owner's idle work (a slice of it at a time). */
    if (e->idle != NULL && e->idle(e->idle_arg)) continue;

    int arank;
    char amsg[400];
    if (coll_peer_aborted(e, &arank, amsg, sizeof amsg)) return fail_peer_aborted(e, arank, amsg);
    int64_t now = base_now_ms();
    /* The deadline starts when the operation first has to wait (see execute()). */
    if (x->deadline_ms == 0) x->deadline_ms = now + x->op->timeout_ms;
    if (last_live == 0) last_live = now;
    if (now >= x->deadline_ms) return timed_out(x, v, n);

    int peers[MAX_XFER], want[MAX_XFER];
    int k = pending_list(v, n, peers, want);
    int64_t left = x->deadline_ms - now;
    rc = block(x, peers, want, k, left > 100 ? 100 : (int)left);
    if (rc != 0) return rc;
    now = base_now_ms();
    if (now - last_live >= LIVENESS_MS) {
      last_live = now;
      rc = check_liveness(x, peers, want, k);
      if (rc != 0) return rc;
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

int coll_sendrecv_rounded(coll_ctx *x, int speer, const void *sbuf, void *rounded, size_t slen,
                          int rpeer, void *rbuf, size_t rlen) {
  xfer v[2] = {{.peer = speer, .mode = XF_SEND, .sbuf = sbuf, .dst = rounded, .len = slen},
               {.peer = rpeer, .mode = XF_RECV, .dst = rbuf, .len = rlen}};
  return run(x, v, 2);
}

int coll_sendrecv_reduce(coll_ctx *x, int speer, const void *sbuf, size_t slen, int rpeer,
                         const void *local, void *dst, size_t rlen) {
  xfer v[2] = {{.peer = speer, .mode = XF_SEND, .sbuf = sbuf, .len = slen},
               {.peer = rpeer, .mode = XF_RECV_REDUCE, .dst = dst, .local = local, .len = rlen}};
  return run(x, v, 2);
}

int coll_one_sided(coll_ctx *x, int peer) {
  const coll_tport_ops *ops = x->eng->peer_ops[peer];
  return ops->reaches != NULL && ops->reaches(x->eng->peer_t[peer], peer);
}

int coll_get(coll_ctx *x, int peer, void *dst, uint64_t raddr, size_t len) {
  coll_engine *e = x->eng;
  if (atomic_load(&e->failed)) return coll_later_err(e);
  int rc = e->peer_ops[peer]->get(e->peer_t[peer], peer, dst, raddr, len);
  return rc < 0 ? peer_error(x, peer, rc, "reading memory") : 0;
}

int coll_put(coll_ctx *x, int peer, uint64_t raddr, const void *src, size_t len) {
  coll_engine *e = x->eng;
  if (atomic_load(&e->failed)) return coll_later_err(e);
  int rc = e->peer_ops[peer]->put(e->peer_t[peer], peer, raddr, src, len);
  return rc < 0 ? peer_error(x, peer, rc, "writing memory") : 0;
}

int coll_fail(coll_engine *e, int err, const char *fmt, ...) {
  int lost = e->reshape_on_loss && err == COHORT_EPEER;
  if (lost) err = COHORT_ERESHAPED;
  pthread_mutex_lock(&e->err_mu);
  int first = !atomic_load(&e->failed);
  if (first) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->errmsg, sizeof e->errmsg, fmt, ap);
    va_end(ap);
    e->err = err;
    atomic_store(&e->failed, 1);
  } else if (e->err == COHORT_ERESHAPED) {
    err = COHORT_ERESHAPED; /* what followed the membership's end is part of it */
  }
  pthread_mutex_unlock(&e->err_mu);
  if (first) coll_abort_transports(e, e->errmsg);
  if (first && lost && e->lost != NULL) e->lost(e->lost_arg, e->errmsg);
  return err;
}

int coll_later_err(coll_engine *e) {
  pthread_mutex_lock(&e->err_mu);
  int err =
      atomic_load(&e->failed) && e->err == COHORT_ERESHAPED ? COHORT_ERESHAPED : COHORT_EABORTED;
  pthread_mutex_unlock(&e->err_mu);
  return err;
}

void coll_reset_failure(coll_engine *e) {
  pthread_mutex_lock(&e->err_mu);
  atomic_store(&e->failed, 0);
  e->err = 0;
  e->errmsg[0] = '\0';
  pthread_mutex_unlock(&e->err_mu);
}

void coll_abort_transports(coll_engine *e, const char *why) {
  /* Shared memory before TCP (set up the other way round, bootstrap.c): a local peer that sees a
   * connection end finds the segment's reason already there. */
  for (int j = e->ntports - 1; j >= 0; j--) e->tport_ops[j]->abort(e->tport_t[j], e->rank, why);
}

int coll_peer_aborted(coll_engine *e, int *rank, char *msg, size_t msglen) {
  for (int j = 0; j < e->ntports; j++)
    if (e->tport_ops[j]->aborted != NULL &&
        e->tport_ops[j]->aborted(e->tport_t[j], rank, msg, msglen))
      return 1;
  return 0;
}

/* ---- the peer watch (engine.h) ---- */

void coll_op_begin(coll_engine *e) {
  coll_watch *w = &e->watch;
  for (int spins = 0;; spins++) {
    int idle = WATCH_IDLE;
    if (atomic_compare_exchange_weak(&w->state, &idle, WATCH_OP)) return;
    /* The watcher is looking at a hung-up peer's stream: rare, and microseconds. */
    if (spins < 64)
      coll_cpu_relax();
    else
      sched_yield();
  }
}

void coll_op_end(coll_engine *e) {
  coll_watch *w = &e->watch;
  atomic_store(&w->state, WATCH_IDLE);
  /* Paired with look(): either it sees the collective over, or this sees it waiting. */
  if (atomic_load(&w->waiting)) {
    uint64_t one = 1;
    while (write(w->wake_fd, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }
}

/* A peer whose watch fd hung up: 1 when it is lost, 0 when it said goodbye, -1 when a collective
 * is in flight (the engine reads its stream; the collective's end wakes the watcher). */
static int look(coll_engine *e, int peer) {
  coll_watch *w = &e->watch;
  int idle = WATCH_IDLE;
  atomic_store(&w->waiting, 1);
  if (!atomic_compare_exchange_strong(&w->state, &idle, WATCH_LOOK)) return -1;
  atomic_store(&w->waiting, 0);
  const coll_tport_ops *ops = e->peer_ops[peer];
  int bye = ops->said_bye != NULL && ops->said_bye(e->peer_t[peer], peer);
  atomic_store(&w->state, WATCH_IDLE);
  return !bye;
}

static void watch_lost(coll_engine *e, int peer) {
  int arank;
  char amsg[400];
  if (coll_peer_aborted(e, &arank, amsg, sizeof amsg)) {
    fail_peer_aborted(e, arank, amsg);
    return;
  }
  coll_fail(e, COHORT_EPEER,
            "rank %d: lost the connection to rank %d (it died, exited or aborted) while no "
            "collective was in flight",
            e->rank, peer);
}

/* The peers' watch fds into pf[1..] (pf[0]: the wake fd), their ranks into who; returns n. */
static int watch_set(coll_engine *e, struct pollfd *pf, int *who) {
  coll_watch *w = &e->watch;
  int n = 0;
  pf[n++] = (struct pollfd){.fd = w->wake_fd, .events = POLLIN};
  for (int p = 0; p < w->size; p++) {
    const coll_tport_ops *ops = e->peer_ops[p];
    if (p == e->rank || w->left[p] || ops == NULL || ops->watch_fd == NULL) continue;
    int fd = ops->watch_fd(e->peer_t[p], p);
    if (fd < 0) continue;
    pf[n] = (struct pollfd){.fd = fd, .events = POLLRDHUP};
    who[n++] = p;
  }
  return n;
}

/* Blocks until a peer hangs up (never for data), then looks; while a collective is in flight it
 * waits on the wake fd alone. Ends with the communicator's failure or coll_watch_stop. */
static void *watch_main(void *arg) {
  coll_engine *e = arg;
  coll_watch *w = &e->watch;
  struct pollfd *pf = malloc((size_t)(w->size + 1) * sizeof *pf);
  int *who = malloc((size_t)(w->size + 1) * sizeof *who);
  int defer = 0;
  while (pf != NULL && who != NULL && !atomic_load(&w->stop) && !atomic_load(&e->failed)) {
    int n = defer ? 1 : watch_set(e, pf, who);
    if (defer) pf[0] = (struct pollfd){.fd = w->wake_fd, .events = POLLIN};
    if (poll(pf, (nfds_t)n, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (pf[0].revents != 0) {
      uint64_t v;
      (void)!read(w->wake_fd, &v, sizeof v);
      defer = 0;
      continue;
    }
    for (int i = 1; i < n && !defer; i++) {
      if (pf[i].revents == 0) continue;
      int r = look(e, who[i]);
      if (r < 0) {
        defer = 1;
      } else if (r == 0) {
        w->left[who[i]] = 1;
      } else {
        watch_lost(e, who[i]);
        break;
      }
    }
  }
  free(pf);
  free(who);
  return NULL;
}

int coll_watch_start(coll_engine *e, int size) {
  coll_watch *w = &e->watch;
  if (w->started) return 0;
  atomic_store(&w->stop, 0);
  atomic_store(&w->waiting, 0);
  w->size = size;
  w->left = calloc((size_t)size, 1);
  w->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  int rc = w->left == NULL ? -ENOMEM : w->wake_fd < 0 ? -errno : 0;
  if (rc == 0) {
    /* Signals go to the program's threads, not to this one. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    if (pthread_create(&w->thread, NULL, watch_main, e) != 0) rc = -EAGAIN;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
  }
  if (rc != 0) {
    if (w->wake_fd >= 0) close(w->wake_fd);
    free(w->left);
    w->left = NULL;
    w->wake_fd = -1;
    return rc;
  }
  w->started = 1;
  return 0;
}

void coll_watch_stop(coll_engine *e) {
  coll_watch *w = &e->watch;
  if (!w->started) return;
  atomic_store(&w->stop, 1);
  uint64_t one = 1;
  while (write(w->wake_fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
  pthread_join(w->thread, NULL);
  close(w->wake_fd);
  w->wake_fd = -1;
  free(w->left);
  w->left = NULL;
  w->started = 0;
}

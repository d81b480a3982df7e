/*
 * algo.c - the collective algorithms. They see groups of ranks, byte ranges
 * and the engine's send/recv/sendrecv(+reduce) calls, nothing of transports.
 *
 * Every algorithm runs over a coll_group: the whole communicator, the ranks
 * of this host, or the host leaders (the lowest rank of every host).
 *
 * Choice by message size (comm->algo_threshold, COHORT_ALGO_THRESHOLD):
 *   allreduce      small: recursive doubling (non-powers of two fold the
 *                  extra ranks in first); large: ring reduce-scatter then
 *                  ring allgather, reducing into the output as bytes arrive.
 *                  Large, on several hosts with several ranks on some host
 *                  (comm->hier): hierarchical, shared memory inside a host
 *                  and TCP between hosts (see allreduce_hier below).
 *   reduce_scatter ring; out of place it is sliced so partial sums live in
 *                  two slice-sized scratch buffers, not a copy of the input.
 *   allgather      ring.
 *   broadcast      small: binomial tree; large: pipelined chain in slices.
 *   reduce         small: binomial tree; large: pipelined chain in slices.
 *   barrier        recursive doubling of headers only.
 *   state transfer pipelined chain in slices from the donor through the
 *                  new ranks (comm->xfer; reform.c), the others idle.
 * A large allreduce with all ranks on one host runs allreduce_direct instead:
 * each rank reduces its block straight from the peers' buffers and writes it
 * into theirs (one read of every input and one write of every output),
 * through the mappings when every buffer comes from cohort_mem_alloc, else
 * through the engine's one-sided access (coll_get/coll_put) where the
 * transport offers it.
 * Extra memory per rank is bounded: 2 slices of scratch plus, below the
 * threshold, one message-sized temporary (at most the threshold).
 *
 * `fin` arguments: the divisor that finishes an average (the world size), or
 * 0 when the caller finishes (a phase of the hierarchical allreduce).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"

/* Block b of `count` elements split over n ranks: offset and length in elements. */
static void block(size_t count, int n, int b, size_t *off, size_t *len) {
  size_t q = count / (size_t)n, r = count % (size_t)n;
  size_t ub = (size_t)b;
  *off = ub * q + (ub < r ? ub : r);
  *len = q + (ub < r ? 1 : 0);
}

static int mod(int a, int n) {
  return ((a % n) + n) % n;
}

/* World rank of group member i (i taken modulo the group size). */
static int at(const coll_group *g, int i) {
  i = mod(i, g->n);
  return g->ranks != NULL ? g->ranks[i] : i;
}

static void finish(coll_ctx *x, void *buf, size_t count, int fin) {
  if (fin > 0) coll_reduce_finish(x->op->dtype, x->op->op, buf, count, fin);
}

/* Temporary of up to the threshold for the latency algorithms. */
static void *small_tmp(coll_ctx *x, size_t bytes) {
  if (bytes <= x->comm->scratch_bytes) return x->comm->scratch;
  return malloc(bytes ? bytes : 1);
}
static void small_tmp_free(coll_ctx *x, void *p) {
  if (p != x->comm->scratch) free(p);
}

/* ---- allreduce ---- */

static int allreduce_rd(coll_ctx *x, const coll_group *g, const char *send, char *recv,
                        size_t count, int fin) {
  int n = g->n, r = g->me, rc = 0;
  size_t bytes = count * x->es;
  if (send != recv && bytes) memcpy(recv, send, bytes);
  char *tmp = small_tmp(x, bytes);
  if (tmp == NULL) return -ENOMEM;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  int rem = n - p, nid;
  /* Fold: among the first 2*rem ranks, evens hand their data to the odd rank above. */
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      rc = coll_send(x, at(g, r + 1), recv, bytes);
      if (rc == 0) rc = coll_recv(x, at(g, r + 1), recv, bytes);
      goto out;
    }
    rc = coll_recv_reduce(x, at(g, r - 1), recv, recv, bytes);
    if (rc != 0) goto out;
    nid = r / 2;
  } else {
    nid = r - rem;
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    int pn = nid ^ mask;
    int peer = at(g, pn < rem ? pn * 2 + 1 : pn + rem);
    /* Receive into tmp: recv is being sent at the same time. */
    rc = coll_sendrecv(x, peer, recv, bytes, peer, tmp, bytes);
    if (rc != 0) goto out;
    coll_reduce(x->op->dtype, x->op->op, recv, recv, tmp, count);
  }
  if (r < 2 * rem) rc = coll_send(x, at(g, r - 1), recv, bytes);
out:
  small_tmp_free(x, tmp);
  if (rc == 0) finish(x, recv, count, fin);
  return rc;
}

/* Ring reduce-scatter over the blocks of `count` split n ways: afterwards member r holds the
 * reduction of block r+1 in recv (the other blocks hold partials). */
static int ring_rs_blocks(coll_ctx *x, const coll_group *g, const char *send, char *recv,
                          size_t count) {
  int n = g->n, r = g->me, next = at(g, r + 1), prev = at(g, r - 1);
  size_t es = x->es;
  /* After step s rank r holds the partial of block r-s-1. */
  for (int s = 0; s < n - 1; s++) {
    int sb = mod(r - s, n), rb = mod(r - s - 1, n);
    size_t so, sl, ro, rl;
    block(count, n, sb, &so, &sl);
    block(count, n, rb, &ro, &rl);
    const char *sbuf = (s == 0 ? send : recv) + so * es;
    int rc =
        coll_sendrecv_reduce(x, next, sbuf, sl * es, prev, send + ro * es, recv + ro * es, rl * es);
    if (rc != 0) return rc;
  }
  return 0;
}

/* Ring allgather of the blocks: member r starts with block r+1 and ends with all of them. */
static int ring_ag_blocks(coll_ctx *x, const coll_group *g, char *recv, size_t count) {
  int n = g->n, r = g->me, next = at(g, r + 1), prev = at(g, r - 1);
  size_t es = x->es;
  for (int s = 0; s < n - 1; s++) {
    int sb = mod(r + 1 - s, n), rb = mod(r - s, n);
    size_t so, sl, ro, rl;
    block(count, n, sb, &so, &sl);
    block(count, n, rb, &ro, &rl);
    int rc = coll_sendrecv(x, next, recv + so * es, sl * es, prev, recv + ro * es, rl * es);
    if (rc != 0) return rc;
  }
  return 0;
}

static int allreduce_ring(coll_ctx *x, const coll_group *g, const char *send, char *recv,
                          size_t count, int fin) {
  int rc = ring_rs_blocks(x, g, send, recv, count);
  if (rc != 0) return rc;
  size_t oo, ol;
  block(count, g->n, mod(g->me + 1, g->n), &oo, &ol);
  finish(x, recv + oo * x->es, ol, fin);
  return ring_ag_blocks(x, g, recv, count);
}

/* ---- single-copy allreduce between shared buffers ---- */

/* Elements reduced per chunk: the inputs of a chunk and its result stay in the L2 cache. */
#define DIRECT_CHUNK_BYTES (64u * 1024u)

/* Where one local rank's buffers are: mapped here (shared buffers; NULL when not) and at its own
 * addresses (for one-sided access). */
typedef struct direct_at {
  const char *src;
  char *dst;
  uint64_t rsrc, rdst;
} direct_at;

/* Exchanges with every local peer where its send and recv are (the exchange is also the start
 * barrier: a peer's data is ready, and its recv free, once it sent). *mapped = 1 when every rank's
 * buffers are shared ones mapped here; *reach = 1 when every rank reaches all its peers' memory
 * through the transport. Every rank sees the same words, so all decide alike. */
static int direct_addresses(coll_ctx *x, const char *send, char *recv, size_t bytes, int reach_me,
                            int *mapped, int *reach, direct_at *at_) {
  cohort_comm *c = x->comm;
  const coll_group *g = &c->local;
  int n = g->n, me = g->me;
  size_t so = 0, ro = 0;
  int64_t mine[7] = {coll_buf_find(c, send, bytes, &so),
                     0,
                     coll_buf_find(c, recv, bytes, &ro),
                     0,
                     (int64_t)(uintptr_t)send,
                     (int64_t)(uintptr_t)recv,
                     reach_me};
  mine[1] = (int64_t)so;
  mine[3] = (int64_t)ro;
  int64_t all[7];
  *mapped = mine[0] >= 0 && mine[2] >= 0;
  *reach = reach_me;
  at_[me] = (direct_at){send, recv, (uint64_t)(uintptr_t)send, (uint64_t)(uintptr_t)recv};
  for (int s = 1; s < n; s++) {
    int to = mod(me + s, n), from = mod(me - s, n);
    int rc = coll_sendrecv(x, at(g, to), mine, sizeof mine, at(g, from), all, sizeof all);
    if (rc != 0) return rc;
    at_[from] = (direct_at){NULL, NULL, (uint64_t)all[4], (uint64_t)all[5]};
    if (!all[6]) *reach = 0;
    if (all[0] < 0 || all[2] < 0 || all[0] >= c->nbufs || all[2] >= c->nbufs ||
        c->bufs[all[0]].base == NULL || c->bufs[all[2]].base == NULL) {
      *mapped = 0;
      continue;
    }
    at_[from].src = c->bufs[all[0]].peer[from] + all[1];
    at_[from].dst = c->bufs[all[2]].peer[from] + all[3];
  }
  return 0;
}

/* Reduces this rank's block of every rank's send, chunk by chunk in the scratch buffer, and writes
 * each chunk of the result into every rank's recv. Every element is computed once (in rank order
 * from three ranks on), so all ranks end with the same bits. In place is safe: a chunk is read
 * whole before any rank's copy of it is written, and no other rank touches this block. */
static void direct_block(coll_ctx *x, const direct_at *at_, size_t count, int fin) {
  const coll_group *g = &x->comm->local;
  size_t es = x->es, off, len;
  block(count, g->n, g->me, &off, &len);
  /* Two ranks: the operators are commutative bit for bit on two operands, so the result goes
   * straight into this rank's recv (which may be its send, exactly); a float sum or average in
   * one pass into both ranks' recv, anything else copied to the peer's from there. */
  int two = g->n == 2, me = g->me;
  if (two &&
      coll_reduce_pair(x->op->dtype, x->op->op, at_[me].dst + off * es, at_[1 - me].dst + off * es,
                       at_[me].src + off * es, at_[1 - me].src + off * es, len, fin))
    return;
  size_t cb =
      DIRECT_CHUNK_BYTES < x->comm->scratch_bytes ? DIRECT_CHUNK_BYTES : x->comm->scratch_bytes;
  size_t chunk = cb / es;
  for (size_t o = off; o < off + len; o += chunk) {
    size_t k = off + len - o < chunk ? off + len - o : chunk, b = o * es;
    char *acc = two ? at_[me].dst + b : x->comm->scratch;
    coll_reduce(x->op->dtype, x->op->op, acc, two ? at_[me].src + b : at_[0].src + b,
                two ? at_[1 - me].src + b : at_[1].src + b, k);
    for (int r = 2; r < g->n; r++)
      coll_reduce(x->op->dtype, x->op->op, acc, acc, at_[r].src + b, k);
    finish(x, acc, k, fin);
    for (int r = 0; r < g->n; r++)
      if (acc != at_[r].dst + b) memcpy(at_[r].dst + b, acc, k * es);
  }
}

/* Elements per chunk of the one-sided path: a peer's chunk, this rank's and the result stay in the
 * L2 cache, and each system call moves enough to cost little. */
#define ONESIDED_CHUNK_BYTES (256u * 1024u)

/* direct_block for private buffers: the peers' chunks are read into the scratch buffer through the
 * transport (coll_get) and the result written into their recv (coll_put). The same order of
 * operands, so the same bits, as direct_block's chunked path. */
static int onesided_block(coll_ctx *x, const direct_at *at_, size_t count, int fin) {
  const coll_group *g = &x->comm->local;
  int n = g->n, me = g->me, rc = 0;
  size_t es = x->es, off, len, half = x->comm->scratch_bytes / 2;
  block(count, n, me, &off, &len);
  size_t chunk = (ONESIDED_CHUNK_BYTES < half ? ONESIDED_CHUNK_BYTES : half) / es;
  char *stage = x->comm->scratch, *tmp = stage + half;
  const char *send = at_[me].src;
  char *recv = at_[me].dst;
  for (size_t o = off; o < off + len && rc == 0; o += chunk) {
    size_t k = off + len - o < chunk ? off + len - o : chunk, b = o * es, kb = k * es;
    char *acc = n == 2 ? recv + b : tmp;
    if (n == 2) {
      /* Into this rank's recv, which may be its send: two-operand operators are commutative. */
      rc = coll_get(x, at(g, 1 - me), stage, at_[1 - me].rsrc + b, kb);
      if (rc == 0) coll_reduce(x->op->dtype, x->op->op, acc, send + b, stage, k);
    }
    /* More ranks in rank order: acc = in0 op in1, then op in2 and on; a peer's in0 goes straight
     * into acc, the others through stage. */
    const char *prev = NULL;
    for (int r = 0; n > 2 && r < n && rc == 0; r++) {
      const char *in = send + b;
      char *buf = r == 0 ? tmp : stage;
      if (r != me) {
        rc = coll_get(x, at(g, r), buf, at_[r].rsrc + b, kb);
        in = buf;
      }
      if (rc == 0 && r > 0) coll_reduce(x->op->dtype, x->op->op, tmp, prev, in, k);
      prev = r == 0 ? in : tmp;
    }
    if (rc != 0) break;
    finish(x, acc, k, fin);
    if (acc != recv + b) memcpy(recv + b, acc, kb);
    for (int r = 0; r < n && rc == 0; r++)
      if (r != me) rc = coll_put(x, at(g, r), at_[r].rdst + b, acc, kb);
  }
  return rc;
}

/* 1 when every local peer's memory is reached through its transport (one-sided access). */
static int reaches_peers(coll_ctx *x) {
  const coll_group *g = &x->comm->local;
  for (int i = 0; i < g->n; i++)
    if (i != g->me && !coll_one_sided(x, at(g, i))) return 0;
  return 1;
}

/* The direct allreduce when all ranks share this host: each rank reduces its block straight from
 * every rank's send and writes it into every rank's recv, through mappings when every rank's
 * buffers are shared (cohort_mem_alloc), else through the transport's one-sided access when it
 * reaches every peer. *done = 0 (and nothing changed) when neither. */
static int allreduce_direct(coll_ctx *x, const char *send, char *recv, size_t count, int fin,
                            int *done) {
  cohort_comm *c = x->comm;
  int n = c->local.n, mapped = 0, reach = 0;
  direct_at *at_ = calloc((size_t)n, sizeof *at_);
  size_t bytes = count * x->es, off;
  int reach_me = reaches_peers(x);
  /* Ordinary buffers that the peers will pin through process_vm_readv/writev: on 2 MiB pages,
   * before the exchange lets the peers start (coll_buf_collapse). */
  if (reach_me && coll_buf_find(c, send, bytes, &off) < 0) coll_buf_collapse(c, send, bytes);
  if (reach_me && send != recv && coll_buf_find(c, recv, bytes, &off) < 0)
    coll_buf_collapse(c, recv, bytes);
  int rc = at_ ? direct_addresses(x, send, recv, bytes, reach_me, &mapped, &reach, at_) : -ENOMEM;
  *done = rc == 0 && (mapped || reach);
  if (*done && mapped) {
    direct_block(x, at_, count, fin);
    c->single_copy_ops++;
  } else if (*done) {
    rc = onesided_block(x, at_, count, fin);
    c->one_sided_ops++;
  }
  /* Nobody returns (and reuses its buffers) before every rank has written its block. */
  if (*done && rc == 0) rc = allreduce_rd(x, &c->local, NULL, NULL, 0, 0);
  free(at_);
  return rc;
}

static int direct_possible(coll_ctx *x) {
  const cohort_comm *c = x->comm;
  return c->single_copy && c->local.n == c->size && (coll_bufs_shared(c) || reaches_peers(x));
}

/* ---- reduce-scatter ---- */

static int reduce_scatter_ring(coll_ctx *x, const coll_group *g, const char *send, char *recv,
                               size_t rc_count, int fin) {
  cohort_comm *c = x->comm;
  int n = g->n, r = g->me, next = at(g, r + 1), prev = at(g, r - 1);
  size_t es = x->es, bb = rc_count * es; /* block bytes */
  int in_place = send == recv;
  char *out = in_place ? recv + (size_t)r * bb : recv;
  if (in_place) {
    /* Partials live in the buffer itself: step s sends block r-s-1, receives block r-s-2. */
    for (int s = 0; s < n - 1; s++) {
      size_t sb = (size_t)mod(r - s - 1, n), rb = (size_t)mod(r - s - 2, n);
      int rc = coll_sendrecv_reduce(x, next, recv + sb * bb, bb, prev, recv + rb * bb,
                                    recv + rb * bb, bb);
      if (rc != 0) return rc;
    }
  } else {
    /* Sliced: partials of one slice of every block alternate between two scratch buffers. */
    size_t slice = c->slice_bytes / es;
    if (slice == 0) slice = 1;
    char *tmp[2] = {c->scratch, (char *)c->scratch + c->slice_bytes};
    /* One pass even for count 0, so the headers are still compared. */
    for (size_t lo = 0; lo == 0 || lo < rc_count; lo += slice) {
      size_t len = rc_count - lo < slice ? rc_count - lo : slice;
      size_t lb = len * es, lo_b = lo * es;
      for (int s = 0; s < n - 1; s++) {
        size_t sb = (size_t)mod(r - s - 1, n), rb = (size_t)mod(r - s - 2, n);
        const char *sbuf = s == 0 ? send + sb * bb + lo_b : tmp[(s - 1) % 2];
        char *dst = s == n - 2 ? out + lo_b : tmp[s % 2];
        int rc = coll_sendrecv_reduce(x, next, sbuf, lb, prev, send + rb * bb + lo_b, dst, lb);
        if (rc != 0) return rc;
      }
    }
  }
  finish(x, out, rc_count, fin);
  return 0;
}

/* ---- allgather ---- */

static int allgather_ring(coll_ctx *x, const coll_group *g, const char *send, char *recv,
                          size_t sc) {
  int n = g->n, r = g->me, next = at(g, r + 1), prev = at(g, r - 1);
  size_t bb = sc * x->es;
  char *own = recv + (size_t)r * bb;
  /* Travelling in 16 bits, this rank's own block is rounded too, as step 0 sends it (in place
   * and already holding wire values, it is only read). */
  int conv = x->op->wire != x->op->dtype;
  if (!conv && send != own && bb) memcpy(own, send, bb);
  for (int s = 0; s < n - 1; s++) {
    size_t sb = (size_t)mod(r - s, n), rb = (size_t)mod(r - s - 1, n);
    int rc = conv && s == 0
                 ? coll_sendrecv_rounded(x, next, send, own, bb, prev, recv + rb * bb, bb)
                 : coll_sendrecv(x, next, recv + sb * bb, bb, prev, recv + rb * bb, bb);
    if (rc != 0) return rc;
  }
  return 0;
}

/* ---- broadcast ---- */

static int broadcast_tree(coll_ctx *x, const coll_group *g, char *buf, size_t bytes, int root) {
  int n = g->n, vr = mod(g->me - root, n), mask = 1, rc;
  while (mask < n) {
    if (vr & mask) {
      rc = coll_recv(x, at(g, vr - mask + root), buf, bytes);
      if (rc != 0) return rc;
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) {
      rc = coll_send(x, at(g, vr + mask + root), buf, bytes);
      if (rc != 0) return rc;
    }
  }
  return 0;
}

static int broadcast_chain(coll_ctx *x, const coll_group *g, char *buf, size_t bytes, int root) {
  int n = g->n, vr = mod(g->me - root, n);
  int next = at(g, g->me + 1), prev = at(g, g->me - 1);
  size_t sl = x->comm->slice_bytes, ns = (bytes + sl - 1) / sl;
  if (ns == 0) ns = 1; /* count 0 still exchanges headers */
#define SLICE_LEN(k) ((k)*sl < bytes ? (bytes - (k)*sl < sl ? bytes - (k)*sl : sl) : 0)
  /* Iteration k receives slice k from prev and forwards slice k-1 to next. */
  for (size_t k = 0; k <= ns; k++) {
    int do_recv = vr > 0 && k < ns;
    int do_send = vr == 0 ? k < ns : (vr < n - 1 && k >= 1);
    size_t sk = vr == 0 ? k : k - 1;
    int rc = 0;
    if (do_send && do_recv)
      rc = coll_sendrecv(x, next, buf + sk * sl, SLICE_LEN(sk), prev, buf + k * sl, SLICE_LEN(k));
    else if (do_send)
      rc = coll_send(x, next, buf + sk * sl, SLICE_LEN(sk));
    else if (do_recv)
      rc = coll_recv(x, prev, buf + k * sl, SLICE_LEN(k));
    if (rc != 0) return rc;
  }
#undef SLICE_LEN
  return 0;
}

/* ---- reduce ---- */

static int reduce_tree(coll_ctx *x, const coll_group *g, const char *send, char *recv, size_t count,
                       int root, int fin) {
  int n = g->n, vr = mod(g->me - root, n), rc = 0;
  size_t bytes = count * x->es;
  char *acc = NULL;
  const char *cur = send; /* what this rank sends up: its input until it has reduced */
  if (vr == 0) {
    acc = recv;
    if (send != recv && bytes) memcpy(recv, send, bytes);
    cur = recv;
  }
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      rc = coll_send(x, at(g, vr - mask + root), cur, bytes);
      break;
    }
    if (vr + mask < n) {
      if (acc == NULL) {
        acc = small_tmp(x, bytes);
        if (acc == NULL) return -ENOMEM;
        if (bytes) memcpy(acc, send, bytes);
        cur = acc;
      }
      rc = coll_recv_reduce(x, at(g, vr + mask + root), acc, acc, bytes);
      if (rc != 0) break;
    }
  }
  if (acc != NULL && acc != recv) small_tmp_free(x, acc);
  if (rc == 0 && vr == 0) finish(x, recv, count, fin);
  return rc;
}

static int reduce_chain(coll_ctx *x, const coll_group *g, const char *send, char *recv,
                        size_t count, int root, int fin) {
  cohort_comm *c = x->comm;
  int n = g->n, vr = mod(g->me - root, n);
  /* Data flows from virtual rank n-1 down to 0 (the root). */
  int down = at(g, g->me - 1), up = at(g, g->me + 1);
  size_t es = x->es, bytes = count * es;
  size_t sl = c->slice_bytes / es * es, ns = (bytes + sl - 1) / sl;
  if (ns == 0) ns = 1; /* count 0 still exchanges headers */
  char *tmp[2] = {c->scratch, (char *)c->scratch + c->slice_bytes};
  for (size_t k = 0; k <= ns; k++) {
    size_t ro = k * sl, rlen = ro < bytes ? (bytes - ro < sl ? bytes - ro : sl) : 0;
    size_t so = (k - 1) * sl, slen = 0;
    if (k >= 1) slen = so < bytes ? (bytes - so < sl ? bytes - so : sl) : 0;
    int rc = 0;
    if (vr == n - 1) {
      /* Tail: sends its own slices. */
      if (k < ns) rc = coll_send(x, down, send + ro, rlen);
    } else if (vr == 0) {
      if (k < ns) rc = coll_recv_reduce(x, up, send + ro, recv + ro, rlen);
    } else {
      int do_recv = k < ns, do_send = k >= 1;
      char *dst = tmp[k % 2];
      if (do_recv && do_send)
        rc = coll_sendrecv_reduce(x, down, tmp[(k - 1) % 2], slen, up, send + ro, dst, rlen);
      else if (do_recv)
        rc = coll_recv_reduce(x, up, send + ro, dst, rlen);
      else if (do_send)
        rc = coll_send(x, down, tmp[(k - 1) % 2], slen);
    }
    if (rc != 0) return rc;
  }
  if (vr == 0) finish(x, recv, count, fin);
  return 0;
}

/* ---- hierarchical allreduce ---- */

/*
 * Every host has the same number L of ranks (c->cross is set): reduce-scatter
 * inside the host over shared memory (local member i ends with block i+1 of
 * L), allreduce of that block among the ranks with the same local index on
 * every host (a ring over TCP; L rings run at once and each host sends and
 * receives the message once in all), allgather inside the host. The work and
 * the network traffic are spread evenly over the local ranks.
 */
static int allreduce_hier_rs(coll_ctx *x, const char *send, char *recv, size_t count) {
  cohort_comm *c = x->comm;
  const coll_group *loc = &c->local;
  size_t es = x->es, oo, ol;
  int rc = ring_rs_blocks(x, loc, send, recv, count);
  if (rc != 0) return rc;
  block(count, loc->n, mod(loc->me + 1, loc->n), &oo, &ol);
  char *mine = recv + oo * es;
  if (ol * es >= c->algo_threshold)
    rc = allreduce_ring(x, &c->cross, mine, mine, ol, c->size);
  else
    rc = allreduce_rd(x, &c->cross, mine, mine, ol, c->size);
  if (rc != 0) return rc;
  return ring_ag_blocks(x, loc, recv, count);
}

/*
 * Hosts with different numbers of ranks: reduce to the host leader (local
 * member 0) over shared memory, allreduce among the leaders (ring over TCP:
 * each host sends and receives the message once instead of once per local
 * rank), broadcast inside the host.
 */
static int allreduce_hier(coll_ctx *x, const char *send, char *recv, size_t count) {
  cohort_comm *c = x->comm;
  const coll_group *loc = &c->local, *lead = &c->leaders;
  size_t bytes = count * x->es;
  int rc = 0;
  if (c->cross.ranks != NULL) return allreduce_hier_rs(x, send, recv, count);
  if (loc->n > 1)
    rc = reduce_chain(x, loc, send, recv, count, 0, 0);
  else if (send != recv && bytes)
    memcpy(recv, send, bytes);
  if (rc != 0) return rc;
  if (loc->me == 0) {
    rc = allreduce_ring(x, lead, recv, recv, count, 0);
    if (rc != 0) return rc;
    finish(x, recv, count, c->size);
  }
  if (loc->n > 1) rc = broadcast_chain(x, loc, recv, bytes, 0);
  return rc;
}

int coll_wire_at_edges(cohort_comm *c, const coll_op *op) {
  if (op->dtype != COHORT_F32 || (op->wire != COHORT_BF16 && op->wire != COHORT_F16) ||
      c->size < 2 || c->wire_copy)
    return 0;
  if (op->kind == COLL_ALLGATHER) return 1;
  if (op->op != COHORT_SUM) return 0;
  if (op->kind == COLL_REDUCE_SCATTER) return 1;
  coll_ctx x = {.eng = &c->eng, .comm = c, .op = op, .es = sizeof(float)};
  return op->kind == COLL_ALLREDUCE && op->count * 2 >= c->algo_threshold && !c->hier &&
         !direct_possible(&x);
}

int coll_run_op(coll_ctx *x) {
  cohort_comm *c = x->comm;
  const coll_group *w = &c->world;
  const coll_op *op = x->op;
  size_t es = x->es, bytes = op->count * es;
  const char *send = op->send;
  char *recv = op->recv;
  /* The choice by size counts the bytes that travel (half of them for a 16-bit wire). */
  int small = op->count * cohort_dtype_size(op->wire) < c->algo_threshold, n = c->size;
  if (op->wire != op->dtype) c->wire_edge_ops++;
  if (n == 1) {
    switch (op->kind) {
    case COLL_ALLREDUCE:
    case COLL_REDUCE:
      if (recv != NULL && send != recv && bytes) memcpy(recv, send, bytes);
      return 0;
    case COLL_REDUCE_SCATTER:
    case COLL_ALLGATHER:
      if (send != recv && bytes) memcpy(recv, send, bytes);
      return 0;
    default:
      return 0;
    }
  }
  switch (op->kind) {
  case COLL_ALLREDUCE:
    if (!small && direct_possible(x)) {
      int done = 0, rc = allreduce_direct(x, send, recv, op->count, n, &done);
      if (rc != 0 || done) return rc;
    }
    if (small) return allreduce_rd(x, w, send, recv, op->count, n);
    if (c->hier) return allreduce_hier(x, send, recv, op->count);
    return allreduce_ring(x, w, send, recv, op->count, n);
  case COLL_REDUCE_SCATTER:
    return reduce_scatter_ring(x, w, send, recv, op->count, n);
  case COLL_ALLGATHER:
    return allgather_ring(x, w, send, recv, op->count);
  case COLL_BROADCAST:
    return small ? broadcast_tree(x, w, recv, bytes, op->root)
                 : broadcast_chain(x, w, recv, bytes, op->root);
  case COLL_REDUCE:
    return small ? reduce_tree(x, w, send, recv, op->count, op->root, n)
                 : reduce_chain(x, w, send, recv, op->count, op->root, n);
  case COLL_BARRIER:
    return allreduce_rd(x, w, NULL, NULL, 0, 0);
  case COLL_TRANSFER: /* the chain from the donor through the new ranks; the others wait */
    return c->xfer.me < 0 ? 0 : broadcast_chain(x, &c->xfer, recv, bytes, 0);
  default:
    return -EINVAL;
  }
}

/* ddp_split.c - the split exchange of a 16-bit wire: backward reduce-scatters every bucket, the
 * next forward gathers them in the order it reads the parameters and applies each bucket's
 * update just before it reads it, the token embedding's rows of the lookup first (the row path).
 * See ddp.h for the whole story and internal.h for the state. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2/internal.h"
#include "gpt2/kernels.h"

/* Where a split bucket's gather goes: after the others for the token embedding's (the head reads
 * them last), else in the order of the flat buffer (the order the forward reads it). */
static size_t gather_key(const gpt2_ddp *d, const gpt2_bucket *b) {
  size_t wte_end = (size_t)d->m->cfg.vocab * (size_t)d->m->cfg.channels;
  return b->lo < wte_end ? d->m->nparams + b->lo : b->lo;
}

/* The plain buckets, every one reduce-scattered (the token embedding's in shares of whole rows),
 * one optimiser shard for what no bucket holds (the token embedding with the QA head and no
 * accumulation) and one per bucket in gather order, so each updates on its own. */
static int split_setup(gpt2_ddp *d, const gpt2_ddp_opts *o) {
  (void)o;
  gpt2_ddp_split *s = calloc(1, sizeof *s);
  if (s == NULL) return -ENOMEM;
  d->x = s;
  int rc = gpt2_ddp_plain_buckets(d);
  if (rc != 0) return rc;
  size_t C = (size_t)d->m->cfg.channels, wte_end = (size_t)d->m->cfg.vocab * C;
  size_t W = (size_t)d->world;
  s->order = malloc((size_t)d->nbuckets * sizeof(int));
  if (s->order == NULL) return -ENOMEM;
  s->lo = d->m->nparams;
  for (int i = 0; i < d->nbuckets; i++) {
    gpt2_bucket *b = &d->buckets[i];
    b->per = b->lo < wte_end ? (b->hi - b->lo) / (C * W) * C : (b->hi - b->lo) / W;
    if (b->lo < s->lo) s->lo = b->lo;
    int k = s->norder++;
    for (; k > 0 && gather_key(d, &d->buckets[s->order[k - 1]]) > gather_key(d, b); k--)
      s->order[k] = s->order[k - 1];
    s->order[k] = i;
  }
  rc = gpt2_ddp_add_shard(d, 0, s->lo);
  for (int k = 0; k < s->norder && rc == 0; k++) {
    const gpt2_bucket *b = &d->buckets[s->order[k]];
    rc = gpt2_ddp_add_shard(d, b->lo, b->hi);
  }
  return rc;
}

static void split_destroy(gpt2_ddp *d) {
  gpt2_ddp_split *s = d->x;
  if (s == NULL) return;
  free(s->order);
  free(s->rows);
  free(s->row_grads);
  free(s);
  d->x = NULL;
}

/* The previous step's gathers were waited for in this step's forward: their figures count here. */
static int split_begin(gpt2_ddp *d, int64_t step, int last) {
  gpt2_ddp_split *s = d->x;
  d->exposed_ms = s->carry_exposed_ms;
  d->comm_ms = s->carry_comm_ms;
  d->wire_bytes = s->carry_wire_bytes;
  d->f32_bytes = s->carry_f32_bytes;
  if (last) s->carry_exposed_ms = s->carry_comm_ms = s->carry_wire_bytes = s->carry_f32_bytes = 0.0;
  return gpt2_ddp_plain_begin(d, step, last);
}

/* Starts the allgather of a split bucket's reduced gradients (in place, in the wire type). */
static void launch_gather(gpt2_ddp *d, gpt2_bucket *b) {
  gpt2_ddp_split *s = d->x;
  if (b->per == 0 || d->err) return;
  float *g = d->m->grads;
  int rc = cohort_iallgather_wire(d->comm, g + b->lo + (size_t)d->rank * b->per, g + b->lo, b->per,
                                  COHORT_F32, d->wire, &b->gather);
  if (rc != 0) {
    gpt2_ddp_fail(d, rc, "allgather of gradients");
    return;
  }
  s->gathers_pending++;
}

/* The top quarter of the layers gathers early: during backward, each bucket's gather queued
 * behind the reduce-scatter of the next one down, in the link's spare time while backward
 * computes the lower layers; the next forward then has only the rest to wait for. More of them
 * fill the link past backward's end and delay the last reduce-scatters, which every update waits
 * for (the gradient norm); fewer leave the forward waiting on the link. A quarter measured best
 * at 1 Gbit/s (docs/gpt2.md). Called as bucket `launched` starts, for the upper buckets started
 * before it. */
static void gather_early(gpt2_ddp *d, int launched) {
  for (int i = 0; i < launched; i++) {
    gpt2_bucket *b = &d->buckets[i];
    if (b->event == GPT2_EV_LAYER && 4 * b->layer >= 3 * d->m->cfg.layers && b->gather == NULL)
      launch_gather(d, b);
  }
}

static void split_hook(gpt2_ddp *d, gpt2_grad_event ev, int at) {
  gpt2_ddp_launch_due(d, ev, at, gather_early);
}

/* The norm: the allreduced token embedding here, the rest from each rank's reduced share (and
 * rank 0's remainders), summed over the ranks. */
static int split_norm(gpt2_ddp *d, double *norm) {
  const gpt2_ddp_split *s = d->x;
  const float *g = d->m->grads;
  double own = 0.0;
  for (int k = 0; k < s->norder; k++) {
    const gpt2_bucket *b = &d->buckets[s->order[k]];
    size_t rest = b->lo + b->per * (size_t)d->world;
    own += gpt2_sumsq(g + b->lo + (size_t)d->rank * b->per, b->per);
    if (d->rank == 0) own += gpt2_sumsq(g + rest, b->hi - rest);
  }
  int rc = gpt2_ddp_sum(d, &own, 1);
  if (rc != 0) return rc;
  *norm = sqrt(gpt2_sumsq(g, s->lo) + own);
  return 0;
}

/* The optimiser shard of split bucket order[k] (after the one of what no bucket holds, if any). */
static gpt2_optim *split_shard(gpt2_ddp *d, int k) {
  const gpt2_ddp_split *s = d->x;
  return &d->shards[d->nshards - s->norder + k];
}

/* The pending update of params[lo, hi) from g[0, hi - lo), in shard o. */
static void update(gpt2_ddp *d, gpt2_optim *o, size_t lo, size_t hi, const float *g) {
  const gpt2_ddp_split *s = d->x;
  gpt2_optim_update(o, d->m, d->m->params, g, lo, hi, s->upd_scale, s->upd_lr, s->upd_t);
}

/* The split bucket (its place k in the gather order) holding flat offset `at`, and the rank whose
 * reduce-scatter share holds it (-1 for the allreduced remainder, which every rank holds). */
static int split_bucket_of(const gpt2_ddp *d, size_t at, int *owner) {
  const gpt2_ddp_split *s = d->x;
  for (int k = 0; k < s->norder; k++) {
    const gpt2_bucket *b = &d->buckets[s->order[k]];
    if (at < b->lo || at >= b->hi) continue;
    size_t j = at - b->lo;
    *owner = j < b->per * (size_t)d->world ? (int)(j / b->per) : -1;
    return k;
  }
  *owner = -1;
  return -1;
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* Sorts the n tokens, drops repeats and any outside the vocabulary; returns how many are left. */
static size_t unique_rows(int32_t *tok, size_t n, int32_t vocab) {
  qsort(tok, n, sizeof *tok, cmp_i32);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (tok[i] >= 0 && tok[i] < vocab && (k == 0 || tok[i] != tok[k - 1])) tok[k++] = tok[i];
  return k;
}

static int rows_reserve(gpt2_ddp *d, size_t n) {
  gpt2_ddp_split *s = d->x;
  if (n <= s->rows_cap) return 0;
  size_t C = (size_t)d->m->cfg.channels;
  int32_t *r = realloc(s->rows, n * sizeof *r);
  if (r != NULL) s->rows = r;
  float *g = realloc(s->row_grads, n * C * sizeof *g);
  if (g != NULL) s->row_grads = g;
  if (r == NULL || g == NULL) return -ENOMEM;
  s->rows_cap = n;
  return 0;
}

/* The row path's exchange (see split_launch): every rank's tokens, then the reduced gradient of
 * each of their rows from the rank whose share holds it, the others adding -0 (x + -0 is x, bit
 * for bit), summed in the wire type: the values the row's gather would bring. (A row of a
 * bucket's allreduced remainder is complete everywhere already: all add -0, and rows_apply reads
 * the row itself.) Returns the pending sum, or NULL (nothing to do, or an error in d->err). */
static cohort_request *rows_launch(gpt2_ddp *d, const int32_t *tokens, size_t ntok) {
  gpt2_ddp_split *s = d->x;
  size_t C = (size_t)d->m->cfg.channels, all = ntok * (size_t)d->world;
  int rc = rows_reserve(d, all);
  if (rc == 0) rc = cohort_allgather(d->comm, tokens, s->rows, ntok, COHORT_I32);
  if (rc != 0) {
    gpt2_ddp_fail(d, rc, "allgather of the next tokens");
    return NULL;
  }
  size_t n = unique_rows(s->rows, all, d->m->cfg.vocab);
  for (size_t i = 0; i < n; i++) {
    size_t at = (size_t)s->rows[i] * C;
    float *dst = s->row_grads + i * C;
    int owner = 0;
    split_bucket_of(d, at, &owner);
    if (owner == d->rank) {
      memcpy(dst, d->m->grads + at, C * sizeof(float));
    } else {
      for (size_t j = 0; j < C; j++) dst[j] = -0.0f;
    }
  }
  cohort_request *req = NULL;
  rc = cohort_iallreduce_wire(d->comm, s->row_grads, s->row_grads, n * C, COHORT_F32, d->wire,
                              COHORT_SUM, &req);
  if (rc != 0) {
    gpt2_ddp_fail(d, rc, "allreduce of the token embedding's rows");
    return NULL;
  }
  s->nrows = n;
  s->carry_wire_bytes += (double)ntok * 4 + (double)(n * C) * cohort_dtype_size(d->wire);
  s->carry_f32_bytes += (double)ntok * 4 + (double)(n * C) * sizeof(float);
  return req;
}

/* The row path's updates, once its sum is in. */
static void rows_apply(gpt2_ddp *d, cohort_request *req) {
  gpt2_ddp_split *s = d->x;
  int rc = cohort_request_wait(req);
  if (rc != 0) {
    s->nrows = 0;
    gpt2_ddp_fail(d, rc, "allreduce of the token embedding's rows");
    return;
  }
  size_t C = (size_t)d->m->cfg.channels;
  for (size_t i = 0; i < s->nrows; i++) {
    size_t at = (size_t)s->rows[i] * C;
    int owner = 0, k = split_bucket_of(d, at, &owner);
    const float *g = owner < 0 ? d->m->grads + at : s->row_grads + i * C;
    update(d, split_shard(d, k), at, at + C, g);
  }
}

/* Launches the gathers in the order the forward reads the parameters. Given the next forward's
 * tokens, first the row path: the token embedding's rows those tokens read are exchanged and
 * updated at once, so the lookup need not wait for the token embedding's gathers, which then
 * travel last, while the layers compute, and arrive block by block as the LM head needs them. */
static void split_launch(gpt2_ddp *d, const int32_t *tokens, size_t ntok) {
  gpt2_ddp_split *s = d->x;
  s->gathers_due = 0;
  s->gather_t0_us = gpt2_now_us();
  cohort_request *rows = NULL;
  if (tokens != NULL && s->lo == 0) rows = rows_launch(d, tokens, ntok);
  for (int k = 0; k < s->norder && !d->err; k++) {
    gpt2_bucket *b = &d->buckets[s->order[k]];
    if (b->gather == NULL) launch_gather(d, b);
  }
  if (rows != NULL) {
    rows_apply(d, rows);
    s->carry_exposed_ms += (double)(gpt2_now_us() - s->gather_t0_us) * 1e-3;
  }
}

/* The update decided, its gathers left for the next forward to launch (it brings the tokens the
 * row path needs). Without the token embedding among the buckets (the QA head without
 * accumulation) they leave now, and the token embedding is updated while they run. */
static int split_step(gpt2_ddp *d, float grad_scale, float lr, int64_t t) {
  gpt2_ddp_split *s = d->x;
  s->upd_scale = grad_scale;
  s->upd_lr = lr;
  s->upd_t = t;
  s->gathers_due = 1;
  s->upd_pending = d->atomic;
  if (s->lo > 0) split_launch(d, NULL, 0);
  if (d->nshards > s->norder && !d->atomic)
    gpt2_optim_step(&d->shards[0], d->m, d->m->params, d->m->grads, grad_scale, lr, t);
  return d->err;
}

/* Split bucket order[k]'s update, without the rows the row path has done. */
static void update_bucket(gpt2_ddp *d, int k) {
  const gpt2_ddp_split *s = d->x;
  gpt2_optim *o = split_shard(d, k);
  size_t C = (size_t)d->m->cfg.channels, at = o->lo;
  const float *g = d->m->grads;
  for (size_t i = 0; i < s->nrows; i++) {
    size_t r = (size_t)s->rows[i] * C;
    if (r < o->lo || r >= o->hi) continue;
    if (r > at) update(d, o, at, r, g + at);
    at = r + C;
  }
  if (at < o->hi) update(d, o, at, o->hi, g + at);
}

/* Waits for split bucket order[k]'s gather and applies its update. */
static void settle_one(gpt2_ddp *d, int k) {
  gpt2_ddp_split *s = d->x;
  gpt2_bucket *b = &d->buckets[s->order[k]];
  int64_t t0 = gpt2_now_us();
  int rc = cohort_request_wait(b->gather);
  int64_t t1 = gpt2_now_us();
  b->gather = NULL;
  s->gathers_pending--;
  s->carry_exposed_ms += (double)(t1 - t0) * 1e-3;
  if (s->gathers_pending == 0) s->carry_comm_ms += (double)(t1 - s->gather_t0_us) * 1e-3;
  if (rc != 0) gpt2_ddp_fail(d, rc, "allgather of gradients");
  if (d->err == 0) update_bucket(d, k);
}

static int gather_in(const gpt2_bucket *b) {
  int done = 0;
  return cohort_request_test(b->gather, &done) == 0 && done;
}

/* Waits for the gathers of order[0..kend) and applies their updates, in order. Rather than wait
 * for one still on the link, it first applies the updates of later buckets whose gathers are in
 * (those that left during backward): the forward reads them later, so it loses nothing. */
static int settle_to(gpt2_ddp *d, int kend) {
  gpt2_ddp_split *s = d->x;
  for (int k = 0; k < kend && s->gathers_pending > 0; k++) {
    if (d->buckets[s->order[k]].gather == NULL) continue;
    for (int j = k + 1; j < s->norder && !gather_in(&d->buckets[s->order[k]]); j++)
      if (d->buckets[s->order[j]].gather != NULL && gather_in(&d->buckets[s->order[j]]))
        settle_one(d, j);
    settle_one(d, k);
  }
  if (s->gathers_pending == 0) s->nrows = 0;
  return d->err;
}

static int split_commit(gpt2_ddp *d);

static int split_settle(gpt2_ddp *d) {
  gpt2_ddp_split *s = d->x;
  if (d->atomic) return split_commit(d);
  if (s->gathers_due) split_launch(d, NULL, 0);
  return settle_to(d, s->norder);
}

/* Atomic: every gather in, then every update (what no bucket holds first, as split_step would
 * have), or on a failed gather none. */
static int split_commit(gpt2_ddp *d) {
  gpt2_ddp_split *s = d->x;
  if (!s->upd_pending) return d->err;
  if (s->gathers_due) split_launch(d, NULL, 0);
  for (int k = 0; k < s->norder; k++) {
    gpt2_bucket *b = &d->buckets[s->order[k]];
    if (b->gather == NULL) continue;
    int rc = cohort_request_wait(b->gather);
    b->gather = NULL;
    s->gathers_pending--;
    if (rc != 0) gpt2_ddp_fail(d, rc, "allgather of gradients");
  }
  if (d->err) return d->err;
  s->carry_comm_ms += (double)(gpt2_now_us() - s->gather_t0_us) * 1e-3;
  if (d->nshards > s->norder)
    gpt2_optim_step(&d->shards[0], d->m, d->m->params, d->m->grads, s->upd_scale, s->upd_lr,
                    s->upd_t);
  for (int k = 0; k < s->norder; k++) update_bucket(d, k);
  s->nrows = 0;
  s->upd_pending = 0;
  return 0;
}

static void split_param_wait(gpt2_ddp *d, size_t lo, size_t hi, const int32_t *tokens,
                             size_t ntok) {
  gpt2_ddp_split *s = d->x;
  if (d->atomic) {
    split_commit(d);
    return;
  }
  if (s->gathers_due) split_launch(d, tokens, ntok);
  if (tokens != NULL && s->nrows > 0) return; /* the lookup's rows are up to date */
  int last = -1;
  for (int k = 0; k < s->norder; k++) {
    const gpt2_bucket *b = &d->buckets[s->order[k]];
    if (b->gather != NULL && b->lo < hi && lo < b->hi) last = k;
  }
  settle_to(d, last + 1);
}

const gpt2_ddp_ops gpt2_ddp_split_ops = {
    .name = "split",
    .setup = split_setup,
    .destroy = split_destroy,
    .begin = split_begin,
    .hook = split_hook,
    .finish = gpt2_ddp_plain_finish,
    .grad_norm = split_norm,
    .step = split_step,
    .settle = split_settle,
    .commit = split_commit,
    .param_wait = split_param_wait,
};

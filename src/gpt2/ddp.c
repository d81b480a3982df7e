/* ddp.c - bucketed asynchronous gradient exchange and ZeRO-1 (see ddp.h). */
#include "gpt2/ddp.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2/ckpt.h"
#include "gpt2/kernels.h"

static int fail(gpt2_ddp *d, int rc, const char *what) {
  if (d->err == 0) {
    d->err = rc;
    const char *msg = d->comm ? cohort_comm_error_message(d->comm) : "";
    snprintf(d->errmsg, sizeof(d->errmsg), "%s: %s", what,
             msg && msg[0] ? msg : cohort_strerror(rc));
  }
  return rc;
}

static int add_bucket(gpt2_ddp *d, size_t lo, size_t hi, gpt2_grad_event ev, int layer) {
  gpt2_bucket *nb = realloc(d->buckets, (size_t)(d->nbuckets + 1) * sizeof(gpt2_bucket));
  if (nb == NULL) return -ENOMEM;
  d->buckets = nb;
  size_t per = d->zero ? (hi - lo) / (size_t)d->world : 0;
  d->buckets[d->nbuckets++] = (gpt2_bucket){lo, hi, ev, layer, per, NULL};
  return 0;
}

/* Splits [lo, hi) into buckets of at most `chunk` floats, launched at ev. */
static int add_chunked(gpt2_ddp *d, size_t lo, size_t hi, size_t chunk, gpt2_grad_event ev) {
  for (size_t a = lo; a < hi; a += chunk) {
    int rc = add_bucket(d, a, a + chunk < hi ? a + chunk : hi, ev, -1);
    if (rc != 0) return rc;
  }
  return 0;
}

/* The token embedding's buckets hold whole rows, and whole blocks of the head's rows when they are
 * that large, so each is complete when the head's backward reports a block. */
static size_t wte_chunk(size_t chunk, int channels) {
  size_t C = (size_t)channels, block = (size_t)GPT2_HEAD_ROWS * C;
  if (chunk >= block) return chunk / block * block;
  return chunk >= C ? chunk / C * C : C;
}

static int add_shard(gpt2_ddp *d, size_t lo, size_t hi) {
  if (hi <= lo) return 0;
  gpt2_optim *ns = realloc(d->shards, (size_t)(d->nshards + 1) * sizeof(gpt2_optim));
  if (ns == NULL) return -ENOMEM;
  d->shards = ns;
  int rc = gpt2_optim_init(&d->shards[d->nshards], &d->ocfg, lo, hi);
  if (rc != 0) return rc;
  d->state_floats += d->shards[d->nshards].nstate;
  d->nshards++;
  return 0;
}

/* Moves the gradients into memory the host's ranks share; on failure (on every rank alike) they
 * stay where they are. */
static void share_grads(gpt2_ddp *d) {
  void *buf = NULL;
  d->shared_rc = cohort_mem_alloc(d->comm, d->m->param_bytes, &buf);
  if (d->shared_rc != 0) return;
  gpt2_model_use_grads(d->m, buf);
  d->shared_grads = buf;
}

int gpt2_ddp_init(gpt2_ddp *d, cohort_comm *comm, gpt2_model *m, const gpt2_optim_config *ocfg,
                  size_t bucket_bytes, int zero, int accum) {
  memset(d, 0, sizeof(*d));
  d->comm = comm;
  d->rank = comm ? cohort_comm_rank(comm) : 0;
  d->world = comm ? cohort_comm_size(comm) : 1;
  d->zero = zero && d->world > 1;
  d->accum = accum;
  d->m = m;
  d->ocfg = *ocfg;
  size_t chunk = bucket_bytes / sizeof(float);
  if (chunk < 1024) chunk = 1024;
  int rc = 0;
  size_t wte_end = (size_t)m->cfg.vocab * (size_t)m->cfg.channels;
  if (d->world > 1) {
    share_grads(d);
    /* Layers from the top, merged until a bucket reaches the target size;
     * the tail (ln_f, qa) rides with the last layer. */
    size_t hi = m->nparams;
    for (int l = m->cfg.layers - 1; l >= 0 && rc == 0; l--) {
      size_t lo = m->layer_offset0 + (size_t)l * m->layer_size;
      if ((hi - lo) >= chunk || l == 0) {
        rc = add_bucket(d, lo, hi, GPT2_EV_LAYER, l);
        hi = lo;
      }
    }
    if (rc == 0 && d->zero) {
      /* Embeddings exchanged after backward, embedding share included. */
      rc = add_chunked(d, 0, m->layer_offset0, chunk, GPT2_EV_EMBED);
    } else if (rc == 0) {
      d->gather_embed = 1;
      int wte_needed = m->cfg.head == GPT2_HEAD_LM || accum > 1;
      if (wte_needed)
        rc = add_chunked(d, 0, wte_end, wte_chunk(chunk, m->cfg.channels), GPT2_EV_HEAD);
      if (rc == 0) rc = add_bucket(d, wte_end, m->layer_offset0, GPT2_EV_EMBED, -1);
      size_t BT = (size_t)m->B * (size_t)m->T;
      d->gath_rows = malloc((size_t)d->world * BT * (size_t)m->cfg.channels * sizeof(float));
      d->gath_tok = malloc((size_t)d->world * BT * sizeof(int32_t));
      if (!d->gath_rows || !d->gath_tok) rc = -ENOMEM;
    }
    d->cap_reqs = d->nbuckets * 2 + 8;
    d->reqs = calloc((size_t)d->cap_reqs, sizeof(cohort_request *));
    d->req_done_us = calloc((size_t)d->cap_reqs, sizeof(int64_t));
    if (!d->reqs || !d->req_done_us) rc = -ENOMEM;
  }
  if (rc == 0) {
    if (d->zero) {
      for (int i = 0; i < d->nbuckets && rc == 0; i++) {
        const gpt2_bucket *b = &d->buckets[i];
        size_t own = b->lo + (size_t)d->rank * b->per;
        rc = add_shard(d, own, own + b->per);
        if (rc == 0) rc = add_shard(d, b->lo + b->per * (size_t)d->world, b->hi);
      }
    } else {
      rc = add_shard(d, 0, m->nparams);
    }
  }
  if (rc != 0) {
    /* Not freed collectively here (the other ranks may not be failing): the communicator's
     * destroy unmaps the shared gradients, which the model does not own. */
    d->shared_grads = NULL;
    gpt2_ddp_free(d);
  }
  return rc;
}

void gpt2_ddp_free(gpt2_ddp *d) {
  if (d == NULL) return;
  for (int i = 0; i < d->nreqs; i++) cohort_request_wait(d->reqs[i]);
  for (int i = 0; i < d->nbuckets; i++) cohort_request_wait(d->buckets[i].gather);
  for (int i = 0; i < d->nshards; i++) gpt2_optim_free(&d->shards[i]);
  free(d->shards);
  free(d->buckets);
  free(d->reqs);
  free(d->req_done_us);
  free(d->order);
  free(d->rows);
  free(d->row_grads);
  free(d->gath_rows);
  free(d->gath_tok);
  gpt2_psgd_free(d->psgd);
  free(d->psgd);
  if (d->shared_grads != NULL) {
    cohort_mem_free(d->comm, d->shared_grads);
    d->m->grads = NULL;
  }
  memset(d, 0, sizeof(*d));
}

int gpt2_ddp_set_powersgd(gpt2_ddp *d, int rank, int64_t start, uint64_t seed) {
  if (d->zero) return -EINVAL;
  d->psgd = calloc(1, sizeof *d->psgd);
  if (d->psgd == NULL) return -ENOMEM;
  int rc = gpt2_psgd_init(d->psgd, d->m, rank, seed);
  if (rc != 0) {
    free(d->psgd);
    d->psgd = NULL;
    return rc;
  }
  d->psgd_start = start;
  d->psgd_overlap = 1;
  return 0;
}

int gpt2_ddp_begin_backward(gpt2_ddp *d, int64_t step, int last, const int32_t *tokens) {
  gpt2_ddp_settle(d); /* the forward has, unless it was not given the wait */
  d->psgd_now = d->psgd != NULL && step >= d->psgd_start && d->world > 1;
  d->psgd_live = d->psgd_now && last && d->psgd_overlap;
  if (d->psgd_now && last) gpt2_psgd_begin(d->psgd);
  /* A compressing step communicates after backward: the buckets stay idle. */
  d->active = last && d->world > 1 && !d->psgd_now;
  d->split_now = d->active && gpt2_ddp_split(d);
  d->tokens = tokens;
  d->head_sent = 0;
  d->nreqs = 0;
  d->t_first_us = 0;
  d->t_last_done_us = 0;
  /* The previous split step's gathers were waited for in this step's forward. */
  d->exposed_ms = d->carry_exposed_ms;
  d->comm_ms = d->carry_comm_ms;
  d->wire_bytes = d->carry_wire_bytes;
  d->f32_bytes = d->carry_f32_bytes;
  if (last) d->carry_exposed_ms = d->carry_comm_ms = d->carry_wire_bytes = d->carry_f32_bytes = 0.0;
  /* Outside the communicating micro-step the model does the whole dwte. */
  return !(d->active && d->gather_embed);
}

static void push_req(gpt2_ddp *d, int rc, cohort_request *req, const char *what) {
  if (rc != 0) {
    fail(d, rc, what);
    return;
  }
  if (d->t_first_us == 0) d->t_first_us = gpt2_now_us();
  d->req_done_us[d->nreqs] = 0;
  d->reqs[d->nreqs++] = req;
}

/* Where a split bucket's gather goes: after the others for the token embedding's (the head reads
 * them last), else in the order of the flat buffer (the order the forward reads it). */
static size_t gather_key(const gpt2_ddp *d, const gpt2_bucket *b) {
  size_t wte_end = (size_t)d->m->cfg.vocab * (size_t)d->m->cfg.channels;
  return b->lo < wte_end ? d->m->nparams + b->lo : b->lo;
}

/* The split exchange: every bucket reduce-scattered (the token embedding's in shares of whole
 * rows), one optimiser shard for what no bucket holds (the token embedding with the QA head and
 * no accumulation) and one per bucket in gather order, so each updates on its own. */
static int split_setup(gpt2_ddp *d) {
  size_t C = (size_t)d->m->cfg.channels, wte_end = (size_t)d->m->cfg.vocab * C;
  size_t W = (size_t)d->world;
  d->order = malloc((size_t)d->nbuckets * sizeof(int));
  if (d->order == NULL) return -ENOMEM;
  d->split_lo = d->m->nparams;
  for (int i = 0; i < d->nbuckets; i++) {
    gpt2_bucket *b = &d->buckets[i];
    b->per = b->lo < wte_end ? (b->hi - b->lo) / (C * W) * C : (b->hi - b->lo) / W;
    if (b->lo < d->split_lo) d->split_lo = b->lo;
    int k = d->norder++;
    for (; k > 0 && gather_key(d, &d->buckets[d->order[k - 1]]) > gather_key(d, b); k--)
      d->order[k] = d->order[k - 1];
    d->order[k] = i;
  }
  for (int i = 0; i < d->nshards; i++) gpt2_optim_free(&d->shards[i]);
  d->nshards = 0;
  d->state_floats = 0;
  int rc = add_shard(d, 0, d->split_lo);
  for (int k = 0; k < d->norder && rc == 0; k++) {
    const gpt2_bucket *b = &d->buckets[d->order[k]];
    rc = add_shard(d, b->lo, b->hi);
  }
  return rc;
}

int gpt2_ddp_set_wire(gpt2_ddp *d, cohort_dtype wire) {
  d->wire = wire;
  if (wire == COHORT_F32 || d->zero || d->world < 2 || gpt2_ddp_split(d)) return 0;
  return split_setup(d);
}

/* Counts n floats handed to a collective, travelling as `wire`. */
static void count_bytes(gpt2_ddp *d, size_t n, cohort_dtype wire) {
  d->wire_bytes += (double)n * (double)cohort_dtype_size(wire);
  d->f32_bytes += (double)n * sizeof(float);
}

/* Starts a bucket's reduction (in the wire type; the divisible part reduce-scattered with ZeRO). */
static void launch(gpt2_ddp *d, const gpt2_bucket *b) {
  float *g = d->m->grads;
  cohort_request *req = NULL;
  if (d->err) return;
  size_t all = b->lo;
  if (b->per > 0) {
    int rc = cohort_ireduce_scatter_wire(d->comm, g + b->lo, g + b->lo, b->per, COHORT_F32, d->wire,
                                         COHORT_SUM, &req);
    push_req(d, rc, req, "reduce-scatter of gradients");
    all = b->lo + b->per * (size_t)d->world;
  }
  if (all < b->hi) {
    int rc = cohort_iallreduce_wire(d->comm, g + all, g + all, b->hi - all, COHORT_F32, d->wire,
                                    COHORT_SUM, &req);
    push_req(d, rc, req, "allreduce of gradients");
  }
  count_bytes(d, b->hi - b->lo, d->wire);
}

/* Notes completion times of finished requests (for the hidden fraction). */
static void poll_done(gpt2_ddp *d) {
  for (int i = 0; i < d->nreqs; i++) {
    if (d->req_done_us[i] != 0) continue;
    int done = 0;
    if (cohort_request_test(d->reqs[i], &done) != 0 || !done) break;
    d->req_done_us[i] = gpt2_now_us();
  }
}

/* PowerSGD: launches the group backward has just finished and moves the one before it on. */
static void powersgd_hook(gpt2_ddp *d, gpt2_grad_event ev, int layer) {
  int grp = gpt2_psgd_group_of(d->psgd, ev, layer);
  if (grp < 0) return;
  if (d->t_first_us == 0) d->t_first_us = gpt2_now_us();
  int rc = gpt2_psgd_launch(d->psgd, d->comm, d->m->grads, grp);
  if (rc == 0) rc = gpt2_psgd_advance(d->psgd, d->comm, d->m->grads, 1);
  if (rc != 0) fail(d, rc, "PowerSGD exchange of gradients");
}

/* Starts the allgather of a split bucket's reduced gradients (in place, in the wire type). */
static void launch_gather(gpt2_ddp *d, gpt2_bucket *b) {
  if (b->per == 0 || d->err) return;
  float *g = d->m->grads;
  int rc = cohort_iallgather_wire(d->comm, g + b->lo + (size_t)d->rank * b->per, g + b->lo, b->per,
                                  COHORT_F32, d->wire, &b->gather);
  if (rc != 0) {
    fail(d, rc, "allgather of gradients");
    return;
  }
  d->gathers_pending++;
}

/* The split exchange's top quarter of the layers gathers early: during backward, each bucket's
 * gather queued behind the reduce-scatter of the next one down, in the link's spare time while
 * backward computes the lower layers; the next forward then has only the rest to wait for. More
 * of them fill the link past backward's end and delay the last reduce-scatters, which every
 * update waits for (the gradient norm); fewer leave the forward waiting on the link. A quarter
 * measured best at 1 Gbit/s (docs/gpt2.md). Called as bucket `launched` starts, for the upper
 * buckets started before it. */
static void gather_early(gpt2_ddp *d, int launched) {
  for (int i = 0; i < launched; i++) {
    gpt2_bucket *b = &d->buckets[i];
    if (b->event == GPT2_EV_LAYER && 4 * b->layer >= 3 * d->m->cfg.layers && b->gather == NULL)
      launch_gather(d, b);
  }
}

/* Launches the head's buckets of dwte whose rows are all in (`rows` of them), in order. */
static void launch_head(gpt2_ddp *d, int rows) {
  size_t ready = (size_t)rows * (size_t)d->m->cfg.channels;
  for (int i = 0; i < d->nbuckets; i++) {
    const gpt2_bucket *b = &d->buckets[i];
    if (b->event != GPT2_EV_HEAD || b->lo < d->head_sent || b->hi > ready) continue;
    launch(d, b);
    d->head_sent = b->hi;
  }
}

void gpt2_ddp_hook(void *ctx, gpt2_grad_event ev, int at) {
  gpt2_ddp *d = ctx;
  if (d->psgd_live && !d->err) powersgd_hook(d, ev, at);
  if (!d->active || d->err) return;
  gpt2_model *m = d->m;
  size_t BT = (size_t)m->B * (size_t)m->T;
  if (ev == GPT2_EV_HEAD) launch_head(d, at);
  for (int i = 0; i < d->nbuckets && ev != GPT2_EV_HEAD; i++) {
    const gpt2_bucket *b = &d->buckets[i];
    if (b->event != ev || (ev == GPT2_EV_LAYER && b->layer != at)) continue;
    launch(d, b);
    if (d->split_now) gather_early(d, i);
  }
  if (ev == GPT2_EV_EMBED && d->gather_embed) {
    cohort_request *req = NULL;
    int rc = cohort_iallgather(d->comm, d->tokens, d->gath_tok, BT, COHORT_I32, &req);
    count_bytes(d, BT, COHORT_I32);
    push_req(d, rc, req, "allgather of tokens");
    rc = cohort_iallgather(d->comm, m->dres, d->gath_rows, BT * (size_t)m->cfg.channels, COHORT_F32,
                           &req);
    count_bytes(d, BT * (size_t)m->cfg.channels, COHORT_F32);
    push_req(d, rc, req, "allgather of embedding gradients");
  }
  poll_done(d);
}

static int wait_all(gpt2_ddp *d, double *exposed_ms, int64_t *end_us) {
  int64_t t0 = gpt2_now_us();
  int64_t last_seen = 0;
  int unseen = 0;
  for (int i = 0; i < d->nreqs; i++) {
    if (d->req_done_us[i] == 0) unseen = 1;
    if (d->req_done_us[i] > last_seen) last_seen = d->req_done_us[i];
    int rc = cohort_request_wait(d->reqs[i]);
    if (rc != 0) fail(d, rc, "gradient exchange");
  }
  int64_t t1 = gpt2_now_us();
  d->nreqs = 0;
  *exposed_ms = (double)(t1 - t0) * 1e-3;
  /* Requests that finished before we looked ended at the latest when the
   * wait began; ones that made us wait ended when the wait did. */
  if (*exposed_ms > 0.05) {
    *end_us = t1;
  } else {
    *end_us = unseen ? t0 : last_seen;
  }
  return d->err;
}

/* The rest of a PowerSGD step's exchange (all of it without overlap). Exposed: the waits inside
 * backward's hooks and everything after backward (the last groups' computations included). */
static int finish_powersgd(gpt2_ddp *d) {
  int64_t t0 = gpt2_now_us(), hook_wait_us = d->psgd->wait_us;
  if (d->t_first_us == 0) d->t_first_us = t0;
  int rc = gpt2_psgd_finish(d->psgd, d->comm, d->m->grads);
  if (rc != 0) return fail(d, rc, "PowerSGD exchange of gradients");
  int64_t t1 = gpt2_now_us();
  d->wire_bytes += d->psgd->wire_bytes;
  d->f32_bytes += (double)d->m->nparams * sizeof(float);
  d->comm_ms = (double)(t1 - d->t_first_us) * 1e-3;
  d->exposed_ms = (double)(t1 - t0 + hook_wait_us) * 1e-3;
  d->psgd_live = 0;
  return 0;
}

int gpt2_ddp_finish_backward(gpt2_ddp *d) {
  if (d->psgd_now && !d->err) return finish_powersgd(d);
  if (!d->active) return d->err;
  int64_t end_us = 0;
  double exposed = 0.0;
  wait_all(d, &exposed, &end_us);
  d->exposed_ms += exposed;
  d->comm_ms += d->t_first_us ? (double)(end_us - d->t_first_us) * 1e-3 : 0.0;
  if (d->err) return d->err;
  if (d->gather_embed) {
    gpt2_model *m = d->m;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)m->cfg.channels;
    /* Rank order: every rank adds the same rows in the same order. */
    for (int r = 0; r < d->world; r++)
      gpt2_embedding_scatter_add(m->g.wte, d->gath_rows + (size_t)r * BT * C,
                                 d->gath_tok + (size_t)r * BT, BT, C);
  }
  d->active = 0;
  return 0;
}

static int shard_counted(const gpt2_ddp *d, int i) {
  /* With ZeRO shards alternate owned part / remainder per bucket (empty
   * ones skipped), so look at the range instead: a remainder starts at
   * lo + per*world of its bucket. */
  if (!d->zero) return 1;
  const gpt2_optim *o = &d->shards[i];
  for (int b = 0; b < d->nbuckets; b++) {
    const gpt2_bucket *bk = &d->buckets[b];
    if (o->lo >= bk->lo && o->hi <= bk->hi)
      return o->lo == bk->lo + bk->per * (size_t)d->world ? d->rank == 0 : 1;
  }
  return 1;
}

/* The split step's norm: the allreduced token embedding here, the rest from each rank's reduced
 * share (and rank 0's remainders), summed over the ranks. */
static int split_norm(gpt2_ddp *d, double *norm) {
  const float *g = d->m->grads;
  double own = 0.0;
  for (int k = 0; k < d->norder; k++) {
    const gpt2_bucket *b = &d->buckets[d->order[k]];
    size_t rest = b->lo + b->per * (size_t)d->world;
    own += gpt2_sumsq(g + b->lo + (size_t)d->rank * b->per, b->per);
    if (d->rank == 0) own += gpt2_sumsq(g + rest, b->hi - rest);
  }
  int rc = gpt2_ddp_sum(d, &own, 1);
  if (rc != 0) return rc;
  *norm = sqrt(gpt2_sumsq(g, d->split_lo) + own);
  return 0;
}

int gpt2_ddp_grad_norm(gpt2_ddp *d, double *norm) {
  if (d->split_now) return split_norm(d, norm);
  double s = 0.0;
  for (int i = 0; i < d->nshards; i++) {
    const gpt2_optim *o = &d->shards[i];
    if (shard_counted(d, i)) s += gpt2_sumsq(d->m->grads + o->lo, o->hi - o->lo);
  }
  if (d->zero) {
    int rc = gpt2_ddp_sum(d, &s, 1);
    if (rc != 0) return rc;
  }
  *norm = sqrt(s);
  return 0;
}

/* The optimiser shard of split bucket order[k] (after the one of what no bucket holds, if any). */
static gpt2_optim *split_shard(gpt2_ddp *d, int k) {
  return &d->shards[d->nshards - d->norder + k];
}

/* The pending update of params[lo, hi) from g[0, hi - lo), in shard o. */
static void update(gpt2_ddp *d, gpt2_optim *o, size_t lo, size_t hi, const float *g) {
  gpt2_optim_update(o, d->m, d->m->params, g, lo, hi, d->upd_scale, d->upd_lr, d->upd_t);
}

/* The split bucket (its place k in the gather order) holding flat offset `at`, and the rank whose
 * reduce-scatter share holds it (-1 for the allreduced remainder, which every rank holds). */
static int split_bucket_of(const gpt2_ddp *d, size_t at, int *owner) {
  for (int k = 0; k < d->norder; k++) {
    const gpt2_bucket *b = &d->buckets[d->order[k]];
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
  if (n <= d->rows_cap) return 0;
  size_t C = (size_t)d->m->cfg.channels;
  int32_t *r = realloc(d->rows, n * sizeof *r);
  if (r != NULL) d->rows = r;
  float *g = realloc(d->row_grads, n * C * sizeof *g);
  if (g != NULL) d->row_grads = g;
  if (r == NULL || g == NULL) return -ENOMEM;
  d->rows_cap = n;
  return 0;
}

/* The row path's exchange (see split_launch): every rank's tokens, then the reduced gradient of
 * each of their rows from the rank whose share holds it, the others adding -0 (x + -0 is x, bit
 * for bit), summed in the wire type: the values the row's gather would bring. (A row of a
 * bucket's allreduced remainder is complete everywhere already: all add -0, and rows_apply reads
 * the row itself.) Returns the pending sum, or NULL (nothing to do, or an error in d->err). */
static cohort_request *rows_launch(gpt2_ddp *d, const int32_t *tokens, size_t ntok) {
  size_t C = (size_t)d->m->cfg.channels, all = ntok * (size_t)d->world;
  int rc = rows_reserve(d, all);
  if (rc == 0) rc = cohort_allgather(d->comm, tokens, d->rows, ntok, COHORT_I32);
  if (rc != 0) {
    fail(d, rc, "allgather of the next tokens");
    return NULL;
  }
  size_t n = unique_rows(d->rows, all, d->m->cfg.vocab);
  for (size_t i = 0; i < n; i++) {
    size_t at = (size_t)d->rows[i] * C;
    float *dst = d->row_grads + i * C;
    int owner = 0;
    split_bucket_of(d, at, &owner);
    if (owner == d->rank) {
      memcpy(dst, d->m->grads + at, C * sizeof(float));
    } else {
      for (size_t j = 0; j < C; j++) dst[j] = -0.0f;
    }
  }
  cohort_request *req = NULL;
  rc = cohort_iallreduce_wire(d->comm, d->row_grads, d->row_grads, n * C, COHORT_F32, d->wire,
                              COHORT_SUM, &req);
  if (rc != 0) {
    fail(d, rc, "allreduce of the token embedding's rows");
    return NULL;
  }
  d->nrows = n;
  d->carry_wire_bytes += (double)ntok * 4 + (double)(n * C) * cohort_dtype_size(d->wire);
  d->carry_f32_bytes += (double)ntok * 4 + (double)(n * C) * sizeof(float);
  return req;
}

/* The row path's updates, once its sum is in. */
static void rows_apply(gpt2_ddp *d, cohort_request *req) {
  int rc = cohort_request_wait(req);
  if (rc != 0) {
    d->nrows = 0;
    fail(d, rc, "allreduce of the token embedding's rows");
    return;
  }
  size_t C = (size_t)d->m->cfg.channels;
  for (size_t i = 0; i < d->nrows; i++) {
    size_t at = (size_t)d->rows[i] * C;
    int owner = 0, k = split_bucket_of(d, at, &owner);
    const float *g = owner < 0 ? d->m->grads + at : d->row_grads + i * C;
    update(d, split_shard(d, k), at, at + C, g);
  }
}

/* Launches the split step's gathers in the order the forward reads the parameters. Given the next
 * forward's tokens, first the row path: the token embedding's rows those tokens read are exchanged
 * and updated at once, so the lookup need not wait for the token embedding's gathers, which then
 * travel last, while the layers compute, and arrive block by block as the LM head needs them. */
static void split_launch(gpt2_ddp *d, const int32_t *tokens, size_t ntok) {
  d->gathers_due = 0;
  d->gather_t0_us = gpt2_now_us();
  cohort_request *rows = NULL;
  if (tokens != NULL && d->split_lo == 0) rows = rows_launch(d, tokens, ntok);
  for (int k = 0; k < d->norder && !d->err; k++) {
    gpt2_bucket *b = &d->buckets[d->order[k]];
    if (b->gather == NULL) launch_gather(d, b);
  }
  if (rows != NULL) {
    rows_apply(d, rows);
    d->carry_exposed_ms += (double)(gpt2_now_us() - d->gather_t0_us) * 1e-3;
  }
}

/* The split step: the update decided, its gathers left for the next forward to launch (it brings
 * the tokens the row path needs). Without the token embedding among the buckets (the QA head
 * without accumulation) they leave now, and the token embedding is updated while they run. */
static int split_step(gpt2_ddp *d, float grad_scale, float lr, int64_t t) {
  d->upd_scale = grad_scale;
  d->upd_lr = lr;
  d->upd_t = t;
  d->gathers_due = 1;
  if (d->split_lo > 0) split_launch(d, NULL, 0);
  if (d->nshards > d->norder)
    gpt2_optim_step(&d->shards[0], d->m, d->m->params, d->m->grads, grad_scale, lr, t);
  return d->err;
}

/* Split bucket order[k]'s update, without the rows the row path has done. */
static void update_bucket(gpt2_ddp *d, int k) {
  gpt2_optim *o = split_shard(d, k);
  size_t C = (size_t)d->m->cfg.channels, at = o->lo;
  const float *g = d->m->grads;
  for (size_t i = 0; i < d->nrows; i++) {
    size_t r = (size_t)d->rows[i] * C;
    if (r < o->lo || r >= o->hi) continue;
    if (r > at) update(d, o, at, r, g + at);
    at = r + C;
  }
  if (at < o->hi) update(d, o, at, o->hi, g + at);
}

/* Waits for split bucket order[k]'s gather and applies its update. */
static void settle_one(gpt2_ddp *d, int k) {
  gpt2_bucket *b = &d->buckets[d->order[k]];
  int64_t t0 = gpt2_now_us();
  int rc = cohort_request_wait(b->gather);
  int64_t t1 = gpt2_now_us();
  b->gather = NULL;
  d->gathers_pending--;
  d->carry_exposed_ms += (double)(t1 - t0) * 1e-3;
  if (d->gathers_pending == 0) d->carry_comm_ms += (double)(t1 - d->gather_t0_us) * 1e-3;
  if (rc != 0) fail(d, rc, "allgather of gradients");
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
  for (int k = 0; k < kend && d->gathers_pending > 0; k++) {
    if (d->buckets[d->order[k]].gather == NULL) continue;
    for (int j = k + 1; j < d->norder && !gather_in(&d->buckets[d->order[k]]); j++)
      if (d->buckets[d->order[j]].gather != NULL && gather_in(&d->buckets[d->order[j]]))
        settle_one(d, j);
    settle_one(d, k);
  }
  if (d->gathers_pending == 0) d->nrows = 0;
  return d->err;
}

int gpt2_ddp_settle(gpt2_ddp *d) {
  if (d->gathers_due) split_launch(d, NULL, 0);
  return settle_to(d, d->norder);
}

int gpt2_ddp_zero_grad(gpt2_ddp *d) {
  int rc = gpt2_ddp_settle(d);
  if (rc == 0) gpt2_zero_grad(d->m);
  return rc;
}

void gpt2_ddp_param_wait(void *ctx, size_t lo, size_t hi, const int32_t *tokens, size_t ntok) {
  gpt2_ddp *d = ctx;
  if (d->gathers_due) split_launch(d, tokens, ntok);
  if (tokens != NULL && d->nrows > 0) return; /* the lookup's rows are up to date */
  int last = -1;
  for (int k = 0; k < d->norder; k++) {
    const gpt2_bucket *b = &d->buckets[d->order[k]];
    if (b->gather != NULL && b->lo < hi && lo < b->hi) last = k;
  }
  settle_to(d, last + 1);
}

int gpt2_ddp_step(gpt2_ddp *d, float grad_scale, float lr, int64_t t) {
  if (d->split_now) return split_step(d, grad_scale, lr, t);
  for (int i = 0; i < d->nshards; i++)
    gpt2_optim_step(&d->shards[i], d->m, d->m->params, d->m->grads, grad_scale, lr, t);
  if (!d->zero) return 0;
  int64_t t0 = gpt2_now_us();
  float *p = d->m->params;
  for (int i = 0; i < d->nbuckets && !d->err; i++) {
    const gpt2_bucket *b = &d->buckets[i];
    if (b->per == 0) continue;
    cohort_request *req = NULL;
    int rc = cohort_iallgather(d->comm, p + b->lo + (size_t)d->rank * b->per, p + b->lo, b->per,
                               COHORT_F32, &req);
    count_bytes(d, b->per, COHORT_F32);
    push_req(d, rc, req, "allgather of parameters");
  }
  double exposed = 0.0;
  int64_t end_us = 0;
  wait_all(d, &exposed, &end_us);
  double ms = (double)(gpt2_now_us() - t0) * 1e-3;
  d->comm_ms += ms;
  d->exposed_ms += ms;
  return d->err;
}

int gpt2_ddp_sum(gpt2_ddp *d, double *x, int n) {
  if (d->world == 1) return 0;
  int rc = cohort_allreduce(d->comm, x, x, (size_t)n, COHORT_F64, COHORT_SUM);
  return rc ? fail(d, rc, "allreduce") : 0;
}

int gpt2_ddp_broadcast(gpt2_ddp *d, float *buf, size_t n) {
  if (d->world == 1) return 0;
  const size_t chunk = 16u << 20; /* floats per call: bounded transfers */
  for (size_t a = 0; a < n; a += chunk) {
    int rc = cohort_broadcast(d->comm, buf + a, a + chunk < n ? chunk : n - a, COHORT_F32, 0);
    if (rc != 0) return fail(d, rc, "broadcast");
  }
  return 0;
}

int gpt2_ddp_check_params(gpt2_ddp *d, int *same) {
  *same = 1;
  if (d->world == 1) return 0;
  if (gpt2_ddp_settle(d) != 0) return d->err;
  int64_t h = (int64_t)gpt2_ckpt_hash(0, d->m->params, d->m->nparams * sizeof(float));
  int64_t *all = calloc((size_t)d->world, sizeof(int64_t));
  if (all == NULL) return -ENOMEM;
  int rc = cohort_allgather(d->comm, &h, all, 1, COHORT_I64);
  if (rc != 0) {
    free(all);
    return fail(d, rc, "allgather of parameter checksums");
  }
  for (int r = 0; r < d->world; r++)
    if (all[r] != all[0]) *same = 0;
  free(all);
  return 0;
}

static size_t optim_floats(const gpt2_ddp *d) {
  return (d->ocfg.kind == GPT2_OPT_ADAMW ? 2 : 1) * d->m->nparams;
}

size_t gpt2_ddp_full_state_floats(const gpt2_ddp *d) {
  return optim_floats(d) + (d->psgd ? gpt2_psgd_state_floats(d->psgd, d->world) : 0);
}

float *gpt2_ddp_whole_state(gpt2_ddp *d) {
  return d->zero || d->psgd || gpt2_ddp_split(d) ? NULL : d->shards[0].state;
}

int gpt2_ddp_state_get(gpt2_ddp *d, float *full) {
  if (gpt2_ddp_settle(d) != 0) return d->err;
  size_t n = d->m->nparams;
  int parts = d->ocfg.kind == GPT2_OPT_ADAMW ? 2 : 1;
  for (int i = 0; i < d->nshards; i++) {
    const gpt2_optim *o = &d->shards[i];
    memcpy(full + o->lo, o->m, (o->hi - o->lo) * sizeof(float));
    if (parts == 2) memcpy(full + n + o->lo, o->v, (o->hi - o->lo) * sizeof(float));
  }
  if (d->psgd) {
    int rc = gpt2_psgd_state_get(d->psgd, d->comm, full + optim_floats(d));
    if (rc != 0) return fail(d, rc, "broadcast of PowerSGD state");
  }
  if (!d->zero) return 0;
  for (int part = 0; part < parts; part++) {
    float *base = full + (size_t)part * n;
    for (int i = 0; i < d->nbuckets; i++) {
      const gpt2_bucket *b = &d->buckets[i];
      if (b->per == 0) continue;
      int rc = cohort_allgather(d->comm, base + b->lo + (size_t)d->rank * b->per, base + b->lo,
                                b->per, COHORT_F32);
      if (rc != 0) return fail(d, rc, "allgather of optimiser state");
    }
  }
  return 0;
}

void gpt2_ddp_state_set(gpt2_ddp *d, const float *full) {
  size_t n = d->m->nparams;
  for (int i = 0; i < d->nshards; i++) {
    gpt2_optim *o = &d->shards[i];
    memcpy(o->m, full + o->lo, (o->hi - o->lo) * sizeof(float));
    if (o->v) memcpy(o->v, full + n + o->lo, (o->hi - o->lo) * sizeof(float));
  }
  if (d->psgd) gpt2_psgd_state_set(d->psgd, d->rank, full + optim_floats(d));
}

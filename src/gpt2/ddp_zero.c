/* ddp_zero.c - ZeRO-1: each bucket reduce-scattered, each rank updating its share of the
 * parameters with the optimiser state only it holds, the parameters then allgathered. The few
 * elements of a bucket not divisible by the ranks are allreduced and updated by every rank alike.
 * The embeddings are exchanged after backward, the lookup's share included (see internal.h). */
#include <math.h>

#include "gpt2/internal.h"
#include "gpt2/kernels.h"

static int zero_setup(gpt2_ddp *d, const gpt2_ddp_opts *o) {
  (void)o;
  int rc = gpt2_ddp_layer_buckets(d);
  if (rc == 0) rc = gpt2_ddp_add_chunked(d, 0, d->m->layer_offset0, d->chunk, GPT2_EV_EMBED);
  /* Shards alternate: this rank's part of a bucket, then the bucket's remainder. */
  for (int i = 0; i < d->nbuckets && rc == 0; i++) {
    gpt2_bucket *b = &d->buckets[i];
    b->per = (b->hi - b->lo) / (size_t)d->world;
    size_t own = b->lo + (size_t)d->rank * b->per;
    rc = gpt2_ddp_add_shard(d, own, own + b->per);
    if (rc == 0) rc = gpt2_ddp_add_shard(d, b->lo + b->per * (size_t)d->world, b->hi);
  }
  return rc;
}

static void zero_destroy(gpt2_ddp *d) {
  (void)d;
}

/* Whether shard i counts in this rank's part of the norm: a remainder (it starts at
 * lo + per*world of its bucket; empty shards were skipped) only on rank 0. */
static int shard_counted(const gpt2_ddp *d, int i) {
  const gpt2_optim *o = &d->shards[i];
  for (int b = 0; b < d->nbuckets; b++) {
    const gpt2_bucket *bk = &d->buckets[b];
    if (o->lo >= bk->lo && o->hi <= bk->hi)
      return o->lo == bk->lo + bk->per * (size_t)d->world ? d->rank == 0 : 1;
  }
  return 1;
}

static int zero_grad_norm(gpt2_ddp *d, double *norm) {
  double s = 0.0;
  for (int i = 0; i < d->nshards; i++) {
    const gpt2_optim *o = &d->shards[i];
    if (shard_counted(d, i)) s += gpt2_sumsq(d->m->grads + o->lo, o->hi - o->lo);
  }
  int rc = gpt2_ddp_sum(d, &s, 1);
  if (rc != 0) return rc;
  *norm = sqrt(s);
  return 0;
}

static int zero_step(gpt2_ddp *d, float grad_scale, float lr, int64_t t) {
  gpt2_ddp_step_shards(d, grad_scale, lr, t);
  int64_t t0 = gpt2_now_us();
  float *p = d->m->params;
  for (int i = 0; i < d->nbuckets && !d->err; i++) {
    const gpt2_bucket *b = &d->buckets[i];
    if (b->per == 0) continue;
    cohort_request *req = NULL;
    int rc = cohort_iallgather(d->comm, p + b->lo + (size_t)d->rank * b->per, p + b->lo, b->per,
                               COHORT_F32, &req);
    gpt2_ddp_count_bytes(d, b->per, COHORT_F32);
    gpt2_ddp_push_req(d, rc, req, "allgather of parameters");
  }
  double exposed = 0.0;
  int64_t end_us = 0;
  gpt2_ddp_wait_all(d, &exposed, &end_us);
  double ms = (double)(gpt2_now_us() - t0) * 1e-3;
  d->comm_ms += ms;
  d->exposed_ms += ms;
  return d->err;
}

/* The whole state from the shards: each rank's part of every bucket allgathered. */
static int zero_state_get(gpt2_ddp *d, float *full) {
  int parts = d->ocfg.kind == GPT2_OPT_ADAMW ? 2 : 1;
  for (int part = 0; part < parts; part++) {
    float *base = full + (size_t)part * d->m->nparams;
    for (int i = 0; i < d->nbuckets; i++) {
      const gpt2_bucket *b = &d->buckets[i];
      if (b->per == 0) continue;
      int rc = cohort_allgather(d->comm, base + b->lo + (size_t)d->rank * b->per, base + b->lo,
                                b->per, COHORT_F32);
      if (rc != 0) return gpt2_ddp_fail(d, rc, "allgather of optimiser state");
    }
  }
  return 0;
}

const gpt2_ddp_ops gpt2_ddp_zero_ops = {
    .name = "zero-1",
    .setup = zero_setup,
    .destroy = zero_destroy,
    .begin = gpt2_ddp_plain_begin,
    .hook = gpt2_ddp_plain_hook,
    .finish = gpt2_ddp_plain_finish,
    .grad_norm = zero_grad_norm,
    .step = zero_step,
    .state_get = zero_state_get,
};

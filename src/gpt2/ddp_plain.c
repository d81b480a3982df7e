/* ddp_plain.c - the plain exchange: every bucket allreduced as backward finishes it, the lookup's
 * share of dwte allgathered as rows, the update on the whole optimiser state (see internal.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "gpt2/internal.h"
#include "gpt2/kernels.h"

/* The token embedding's buckets hold whole rows, and whole blocks of the head's rows when they are
 * that large, so each is complete when the head's backward reports a block. */
static size_t wte_chunk(size_t chunk, int channels) {
  size_t C = (size_t)channels, block = (size_t)GPT2_HEAD_ROWS * C;
  if (chunk >= block) return chunk / block * block;
  return chunk >= C ? chunk / C * C : C;
}

int gpt2_ddp_plain_buckets(gpt2_ddp *d) {
  if (d->world < 2) return 0;
  const gpt2_model *m = d->m;
  size_t wte_end = (size_t)m->cfg.vocab * (size_t)m->cfg.channels;
  int rc = gpt2_ddp_layer_buckets(d);
  int wte_needed = m->cfg.head == GPT2_HEAD_LM || d->accum > 1;
  if (rc == 0 && wte_needed)
    rc = gpt2_ddp_add_chunked(d, 0, wte_end, wte_chunk(d->chunk, m->cfg.channels), GPT2_EV_HEAD);
  if (rc == 0) rc = gpt2_ddp_add_bucket(d, wte_end, m->layer_offset0, GPT2_EV_EMBED, -1);
  if (rc != 0) return rc;
  size_t BT = (size_t)m->B * (size_t)m->T;
  d->gath_rows = malloc((size_t)d->world * BT * (size_t)m->cfg.channels * sizeof(float));
  d->gath_tok = malloc((size_t)d->world * BT * sizeof(int32_t));
  return d->gath_rows && d->gath_tok ? 0 : -ENOMEM;
}

static int plain_setup(gpt2_ddp *d, const gpt2_ddp_opts *o) {
  (void)o;
  int rc = gpt2_ddp_plain_buckets(d);
  return rc == 0 ? gpt2_ddp_add_shard(d, 0, d->m->nparams) : rc;
}

static void plain_destroy(gpt2_ddp *d) {
  (void)d;
}

int gpt2_ddp_plain_begin(gpt2_ddp *d, int64_t step, int last) {
  (void)step;
  d->active = last && d->world > 1;
  /* Outside the communicating micro-step the model does the whole dwte. */
  return !(d->active && d->gath_rows != NULL);
}

void gpt2_ddp_plain_hook(gpt2_ddp *d, gpt2_grad_event ev, int at) {
  gpt2_ddp_launch_due(d, ev, at, NULL);
}

int gpt2_ddp_plain_finish(gpt2_ddp *d) {
  if (!d->active) return d->err;
  int64_t end_us = 0;
  double exposed = 0.0;
  gpt2_ddp_wait_all(d, &exposed, &end_us);
  d->exposed_ms += exposed;
  d->comm_ms += d->t_first_us ? (double)(end_us - d->t_first_us) * 1e-3 : 0.0;
  if (d->err) return d->err;
  if (d->gath_rows != NULL) {
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

int gpt2_ddp_plain_grad_norm(gpt2_ddp *d, double *norm) {
  double s = 0.0;
  for (int i = 0; i < d->nshards; i++) {
    const gpt2_optim *o = &d->shards[i];
    s += gpt2_sumsq(d->m->grads + o->lo, o->hi - o->lo);
  }
  *norm = sqrt(s);
  return 0;
}

int gpt2_ddp_plain_step(gpt2_ddp *d, float grad_scale, float lr, int64_t t) {
  gpt2_ddp_step_shards(d, grad_scale, lr, t);
  return 0;
}

const gpt2_ddp_ops gpt2_ddp_plain_ops = {
    .name = "plain",
    .setup = plain_setup,
    .destroy = plain_destroy,
    .begin = gpt2_ddp_plain_begin,
    .hook = gpt2_ddp_plain_hook,
    .finish = gpt2_ddp_plain_finish,
    .grad_norm = gpt2_ddp_plain_grad_norm,
    .step = gpt2_ddp_plain_step,
};

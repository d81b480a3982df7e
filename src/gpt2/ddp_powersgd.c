/* ddp_powersgd.c - PowerSGD (powersgd.h) from its start step on: the last micro-step's gradients
 * summed compressed, group by group as backward finishes them; the plain exchange before the
 * start step (see internal.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "gpt2/internal.h"
#include "gpt2/kernels.h"

static int psgd_setup(gpt2_ddp *d, const gpt2_ddp_opts *o) {
  gpt2_ddp_powersgd *p = calloc(1, sizeof *p);
  if (p == NULL) return -ENOMEM;
  d->x = p;
  p->start = o->powersgd_start;
  p->after_backward = o->powersgd_after_backward;
  int rc = gpt2_psgd_init(&p->s, d->m, o->powersgd_rank, o->seed);
  if (rc != 0) {
    free(p);
    d->x = NULL;
    return rc;
  }
  rc = gpt2_ddp_plain_buckets(d);
  return rc == 0 ? gpt2_ddp_add_shard(d, 0, d->m->nparams) : rc;
}

static void psgd_destroy(gpt2_ddp *d) {
  gpt2_ddp_powersgd *p = d->x;
  if (p == NULL) return;
  gpt2_psgd_free(&p->s);
  free(p);
  d->x = NULL;
}

/* A compressing step communicates after its last micro-step's backward, the buckets idle. */
static int psgd_begin(gpt2_ddp *d, int64_t step, int last) {
  gpt2_ddp_powersgd *p = d->x;
  p->now = gpt2_ddp_powersgd_compresses(d, p, step);
  p->live = p->now && last && !p->after_backward;
  if (!p->now) return gpt2_ddp_plain_begin(d, step, last);
  if (last) gpt2_psgd_begin(&p->s);
  return 1;
}

/* Launches the group backward has just finished and moves the one before it on. */
static void psgd_hook(gpt2_ddp *d, gpt2_grad_event ev, int layer) {
  gpt2_ddp_powersgd *p = d->x;
  if (!p->now) {
    gpt2_ddp_plain_hook(d, ev, layer);
    return;
  }
  if (!p->live || d->err) return;
  int grp = gpt2_psgd_group_of(&p->s, ev, layer);
  if (grp < 0) return;
  if (d->t_first_us == 0) d->t_first_us = gpt2_now_us();
  int rc = gpt2_psgd_launch(&p->s, d->comm, d->m->grads, grp);
  if (rc == 0) rc = gpt2_psgd_advance(&p->s, d->comm, d->m->grads, GPT2_PSGD_LAG);
  if (rc != 0) gpt2_ddp_fail(d, rc, "PowerSGD exchange of gradients");
}

/* The rest of the exchange (all of it after backward). Exposed: the waits inside backward's
 * hooks and everything after backward (the last groups' computations included). */
static int psgd_finish(gpt2_ddp *d) {
  gpt2_ddp_powersgd *p = d->x;
  if (!p->now) return gpt2_ddp_plain_finish(d);
  if (d->err) return d->err;
  int64_t t0 = gpt2_now_us(), hook_wait_us = p->s.wait_us;
  if (d->t_first_us == 0) d->t_first_us = t0;
  int rc = gpt2_psgd_finish(&p->s, d->comm, d->m->grads);
  if (rc != 0) return gpt2_ddp_fail(d, rc, "PowerSGD exchange of gradients");
  int64_t t1 = gpt2_now_us();
  d->wire_bytes += p->s.wire_bytes;
  d->f32_bytes += (double)d->m->nparams * sizeof(float);
  d->comm_ms = (double)(t1 - d->t_first_us) * 1e-3;
  d->exposed_ms = (double)(t1 - t0 + hook_wait_us) * 1e-3;
  d->compress_ms = (double)p->s.cpu_us * 1e-3;
  p->live = 0;
  return 0;
}

/* A compressing step's norm from its factors (gpt2_psgd_sumsq). */
static int psgd_grad_norm(gpt2_ddp *d, double *norm) {
  gpt2_ddp_powersgd *p = d->x;
  if (!p->now) return gpt2_ddp_plain_grad_norm(d, norm);
  *norm = sqrt(gpt2_psgd_sumsq(&p->s, d->m->grads));
  return 0;
}

/* A compressing step's update makes P Q^T as it reads it (gpt2_psgd_update): the matrices' part
 * of g holds this rank's own gradients, not the sum. One shard: the whole buffer. */
static int psgd_step(gpt2_ddp *d, float grad_scale, float lr, int64_t t) {
  gpt2_ddp_powersgd *p = d->x;
  if (!p->now) return gpt2_ddp_plain_step(d, grad_scale, lr, t);
  gpt2_psgd_update(&p->s, &d->shards[0], d->m, d->m->grads, grad_scale, lr, t);
  return 0;
}

static size_t psgd_state_floats(const gpt2_ddp *d) {
  const gpt2_ddp_powersgd *p = d->x;
  return gpt2_psgd_state_floats(&p->s, d->world);
}

static int psgd_state_get(gpt2_ddp *d, float *full) {
  gpt2_ddp_powersgd *p = d->x;
  int rc = gpt2_psgd_state_get(&p->s, d->comm, full + gpt2_ddp_optim_floats(d));
  return rc != 0 ? gpt2_ddp_fail(d, rc, "broadcast of PowerSGD state") : 0;
}

static void psgd_state_set(gpt2_ddp *d, const float *full) {
  gpt2_ddp_powersgd *p = d->x;
  gpt2_psgd_state_set(&p->s, d->rank, full + gpt2_ddp_optim_floats(d));
}

const gpt2_ddp_ops gpt2_ddp_powersgd_ops = {
    .name = "powersgd",
    .setup = psgd_setup,
    .destroy = psgd_destroy,
    .begin = psgd_begin,
    .hook = psgd_hook,
    .finish = psgd_finish,
    .grad_norm = psgd_grad_norm,
    .step = psgd_step,
    .state_floats = psgd_state_floats,
    .state_get = psgd_state_get,
    .state_set = psgd_state_set,
};

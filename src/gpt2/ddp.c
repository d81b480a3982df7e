/* ddp.c - what the data-parallel exchange's modes share, and the calls into the mode (see ddp.h
 * and internal.h). */
#include "gpt2/ddp.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2/ckpt.h"
#include "gpt2/internal.h"
#include "gpt2/kernels.h"

int gpt2_ddp_fail(gpt2_ddp *d, int rc, const char *what) {
  if (d->err == 0) {
    d->err = rc;
    const char *msg = d->comm ? cohort_comm_error_message(d->comm) : "";
    snprintf(d->errmsg, sizeof(d->errmsg), "%s: %s", what,
             msg && msg[0] ? msg : cohort_strerror(rc));
  }
  return rc;
}

int gpt2_ddp_add_bucket(gpt2_ddp *d, size_t lo, size_t hi, gpt2_grad_event ev, int layer) {
  gpt2_bucket *nb = realloc(d->buckets, (size_t)(d->nbuckets + 1) * sizeof(gpt2_bucket));
  if (nb == NULL) return -ENOMEM;
  d->buckets = nb;
  d->buckets[d->nbuckets++] = (gpt2_bucket){lo, hi, ev, layer, 0, NULL};
  return 0;
}

int gpt2_ddp_add_chunked(gpt2_ddp *d, size_t lo, size_t hi, size_t chunk, gpt2_grad_event ev) {
  for (size_t a = lo; a < hi; a += chunk) {
    int rc = gpt2_ddp_add_bucket(d, a, a + chunk < hi ? a + chunk : hi, ev, -1);
    if (rc != 0) return rc;
  }
  return 0;
}

int gpt2_ddp_layer_buckets(gpt2_ddp *d) {
  const gpt2_model *m = d->m;
  size_t hi = m->nparams;
  for (int l = m->cfg.layers - 1; l >= 0; l--) {
    size_t lo = m->layer_offset0 + (size_t)l * m->layer_size;
    if ((hi - lo) >= d->chunk || l == 0) {
      int rc = gpt2_ddp_add_bucket(d, lo, hi, GPT2_EV_LAYER, l);
      if (rc != 0) return rc;
      hi = lo;
    }
  }
  return 0;
}

int gpt2_ddp_add_shard(gpt2_ddp *d, size_t lo, size_t hi) {
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

static const gpt2_ddp_ops *choose_mode(const gpt2_ddp_opts *o, int world) {
  if (o->zero && world > 1) return &gpt2_ddp_zero_ops;
  if (o->powersgd_rank > 0) return &gpt2_ddp_powersgd_ops;
  if (o->wire != COHORT_F32 && world > 1) return &gpt2_ddp_split_ops;
  return &gpt2_ddp_plain_ops;
}

int gpt2_ddp_init(gpt2_ddp *d, cohort_comm *comm, gpt2_model *m, const gpt2_optim_config *ocfg,
                  const gpt2_ddp_opts *o) {
  memset(d, 0, sizeof(*d));
  d->comm = comm;
  d->rank = comm ? cohort_comm_rank(comm) : 0;
  d->world = comm ? cohort_comm_size(comm) : 1;
  if (o->zero && d->world > 1 && o->powersgd_rank > 0) return -EINVAL;
  d->accum = o->accum;
  d->atomic = o->atomic;
  d->m = m;
  d->ocfg = *ocfg;
  d->wire = o->wire;
  d->chunk = o->bucket_bytes / sizeof(float);
  if (d->chunk < 1024) d->chunk = 1024;
  d->ops = choose_mode(o, d->world);
  if (d->world > 1) share_grads(d);
  int rc = d->ops->setup(d, o);
  if (rc == 0 && d->world > 1) {
    d->cap_reqs = d->nbuckets * 2 + 8;
    d->reqs = calloc((size_t)d->cap_reqs, sizeof(cohort_request *));
    d->req_done_us = calloc((size_t)d->cap_reqs, sizeof(int64_t));
    if (!d->reqs || !d->req_done_us) rc = -ENOMEM;
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
  if (d == NULL || d->ops == NULL) return;
  d->ops->destroy(d);
  for (int i = 0; i < d->nreqs; i++) cohort_request_wait(d->reqs[i]);
  for (int i = 0; i < d->nbuckets; i++) cohort_request_wait(d->buckets[i].gather);
  for (int i = 0; i < d->nshards; i++) gpt2_optim_free(&d->shards[i]);
  free(d->shards);
  free(d->buckets);
  free(d->reqs);
  free(d->req_done_us);
  free(d->gath_rows);
  free(d->gath_tok);
  free(d->kept);
  if (d->shared_grads != NULL) {
    if (d->m->grads == d->shared_grads) d->m->grads = NULL;
    cohort_mem_free(d->comm, d->shared_grads);
  }
  memset(d, 0, sizeof(*d));
}

const char *gpt2_ddp_mode(const gpt2_ddp *d) {
  return d->ops->name;
}

/* ---- requests ---- */

void gpt2_ddp_push_req(gpt2_ddp *d, int rc, cohort_request *req, const char *what) {
  if (rc != 0) {
    gpt2_ddp_fail(d, rc, what);
    return;
  }
  if (d->t_first_us == 0) d->t_first_us = gpt2_now_us();
  d->req_done_us[d->nreqs] = 0;
  d->reqs[d->nreqs++] = req;
}

void gpt2_ddp_count_bytes(gpt2_ddp *d, size_t n, cohort_dtype wire) {
  d->wire_bytes += (double)n * (double)cohort_dtype_size(wire);
  d->f32_bytes += (double)n * sizeof(float);
}

/* Starts a bucket's reduction (in the wire type; its divisible part reduce-scattered when it is
 * split between the ranks). */
static void launch(gpt2_ddp *d, const gpt2_bucket *b) {
  float *g = d->m->grads;
  cohort_request *req = NULL;
  if (d->err) return;
  size_t all = b->lo;
  if (b->per > 0) {
    int rc = cohort_ireduce_scatter_wire(d->comm, g + b->lo, g + b->lo, b->per, COHORT_F32, d->wire,
                                         COHORT_SUM, &req);
    gpt2_ddp_push_req(d, rc, req, "reduce-scatter of gradients");
    all = b->lo + b->per * (size_t)d->world;
  }
  if (all < b->hi) {
    int rc = cohort_iallreduce_wire(d->comm, g + all, g + all, b->hi - all, COHORT_F32, d->wire,
                                    COHORT_SUM, &req);
    gpt2_ddp_push_req(d, rc, req, "allreduce of gradients");
  }
  gpt2_ddp_count_bytes(d, b->hi - b->lo, d->wire);
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

/* The embedding lookup's share of dwte: every rank's tokens and rows of d(encoded). */
static void launch_rows(gpt2_ddp *d) {
  const gpt2_model *m = d->m;
  size_t BT = (size_t)m->B * (size_t)m->T;
  cohort_request *req = NULL;
  int rc = cohort_iallgather(d->comm, d->tokens, d->gath_tok, BT, COHORT_I32, &req);
  gpt2_ddp_count_bytes(d, BT, COHORT_I32);
  gpt2_ddp_push_req(d, rc, req, "allgather of tokens");
  rc = cohort_iallgather(d->comm, m->dres, d->gath_rows, BT * (size_t)m->cfg.channels, COHORT_F32,
                         &req);
  gpt2_ddp_count_bytes(d, BT * (size_t)m->cfg.channels, COHORT_F32);
  gpt2_ddp_push_req(d, rc, req, "allgather of embedding gradients");
}

void gpt2_ddp_launch_due(gpt2_ddp *d, gpt2_grad_event ev, int at, void (*after)(gpt2_ddp *, int)) {
  if (!d->active || d->err) return;
  if (ev == GPT2_EV_HEAD) launch_head(d, at);
  for (int i = 0; i < d->nbuckets && ev != GPT2_EV_HEAD; i++) {
    const gpt2_bucket *b = &d->buckets[i];
    if (b->event != ev || (ev == GPT2_EV_LAYER && b->layer != at)) continue;
    launch(d, b);
    if (after != NULL) after(d, i);
  }
  if (ev == GPT2_EV_EMBED && d->gath_rows != NULL) launch_rows(d);
  poll_done(d);
}

int gpt2_ddp_wait_all(gpt2_ddp *d, double *exposed_ms, int64_t *end_us) {
  int64_t t0 = gpt2_now_us();
  int64_t last_seen = 0;
  int unseen = 0;
  for (int i = 0; i < d->nreqs; i++) {
    if (d->req_done_us[i] == 0) unseen = 1;
    if (d->req_done_us[i] > last_seen) last_seen = d->req_done_us[i];
    int rc = cohort_request_wait(d->reqs[i]);
    if (rc != 0) gpt2_ddp_fail(d, rc, "gradient exchange");
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

void gpt2_ddp_step_shards(gpt2_ddp *d, float grad_scale, float lr, int64_t t) {
  for (int i = 0; i < d->nshards; i++)
    gpt2_optim_step(&d->shards[i], d->m, d->m->params, d->m->grads, grad_scale, lr, t);
}

/* ---- the step, through the mode ---- */

int gpt2_ddp_begin_backward(gpt2_ddp *d, int64_t step, int last, const int32_t *tokens) {
  gpt2_ddp_settle(d); /* the forward has, unless it was not given the wait */
  d->active = 0;
  d->tokens = tokens;
  d->head_sent = 0;
  d->nreqs = 0;
  d->t_first_us = 0;
  d->exposed_ms = d->comm_ms = d->wire_bytes = d->f32_bytes = d->compress_ms = 0.0;
  return d->ops->begin(d, step, last);
}

/* Re-forming, a step whose communicator failed is lost: 1 to stop its forward or backward now. */
static int stop_failed(gpt2_ddp *d) {
  int rc = d->atomic && d->err == 0 && d->comm != NULL ? cohort_comm_failed(d->comm) : 0;
  if (rc != 0) gpt2_ddp_fail(d, rc, "gradient exchange");
  return d->atomic && d->err != 0;
}

int gpt2_ddp_hook(void *ctx, gpt2_grad_event ev, int at) {
  gpt2_ddp *d = ctx;
  d->ops->hook(d, ev, at);
  /* After the last event every bucket is launched: whether the exchange completed before the
   * communicator failed is for gpt2_ddp_finish_backward to say. */
  return ev != GPT2_EV_EMBED && stop_failed(d);
}

int gpt2_ddp_finish_backward(gpt2_ddp *d) {
  return d->ops->finish(d);
}

int gpt2_ddp_grad_norm(gpt2_ddp *d, double *norm) {
  return d->ops->grad_norm(d, norm);
}

int gpt2_ddp_step(gpt2_ddp *d, float grad_scale, float lr, int64_t t) {
  return d->ops->step(d, grad_scale, lr, t);
}

int gpt2_ddp_settle(gpt2_ddp *d) {
  return d->ops->settle ? d->ops->settle(d) : d->err;
}

int gpt2_ddp_zero_grad(gpt2_ddp *d) {
  int rc = gpt2_ddp_settle(d);
  if (rc == 0) gpt2_discard_grad(d->m);
  return rc;
}

int gpt2_ddp_param_wait(void *ctx, size_t lo, size_t hi, const int32_t *tokens, size_t ntok) {
  gpt2_ddp *d = ctx;
  if (d->ops->param_wait) d->ops->param_wait(d, lo, hi, tokens, ntok);
  return stop_failed(d);
}

/* ---- blocking helpers ---- */

int gpt2_ddp_sum(gpt2_ddp *d, double *x, int n) {
  if (d->world == 1) return 0;
  int rc = cohort_allreduce(d->comm, x, x, (size_t)n, COHORT_F64, COHORT_SUM);
  return rc ? gpt2_ddp_fail(d, rc, "allreduce") : 0;
}

int gpt2_ddp_broadcast(gpt2_ddp *d, float *buf, size_t n) {
  if (d->world == 1) return 0;
  const size_t chunk = 16u << 20; /* floats per call: bounded transfers */
  for (size_t a = 0; a < n; a += chunk) {
    int rc = cohort_broadcast(d->comm, buf + a, a + chunk < n ? chunk : n - a, COHORT_F32, 0);
    if (rc != 0) return gpt2_ddp_fail(d, rc, "broadcast");
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
    return gpt2_ddp_fail(d, rc, "allgather of parameter checksums");
  }
  for (int r = 0; r < d->world; r++)
    if (all[r] != all[0]) *same = 0;
  free(all);
  return 0;
}

/* ---- the checkpointed state ---- */

size_t gpt2_ddp_optim_floats(const gpt2_ddp *d) {
  return (d->ocfg.kind == GPT2_OPT_ADAMW ? 2 : 1) * d->m->nparams;
}

size_t gpt2_ddp_full_state_floats(const gpt2_ddp *d) {
  return gpt2_ddp_optim_floats(d) + (d->ops->state_floats ? d->ops->state_floats(d) : 0);
}

float *gpt2_ddp_whole_state(gpt2_ddp *d) {
  return d->ops == &gpt2_ddp_plain_ops ? d->shards[0].state : NULL;
}

/* The optimiser state this rank holds into its place in the whole state (m, then v). */
static void shards_get(const gpt2_ddp *d, float *full) {
  size_t n = d->m->nparams;
  for (int i = 0; i < d->nshards; i++) {
    const gpt2_optim *o = &d->shards[i];
    memcpy(full + o->lo, o->m, (o->hi - o->lo) * sizeof(float));
    if (o->v) memcpy(full + n + o->lo, o->v, (o->hi - o->lo) * sizeof(float));
  }
}

static void shards_set(gpt2_ddp *d, const float *full) {
  size_t n = d->m->nparams;
  for (int i = 0; i < d->nshards; i++) {
    gpt2_optim *o = &d->shards[i];
    memcpy(o->m, full + o->lo, (o->hi - o->lo) * sizeof(float));
    if (o->v) memcpy(o->v, full + n + o->lo, (o->hi - o->lo) * sizeof(float));
  }
}

int gpt2_ddp_state_get(gpt2_ddp *d, float *full) {
  if (gpt2_ddp_settle(d) != 0) return d->err;
  shards_get(d, full);
  return d->ops->state_get ? d->ops->state_get(d, full) : 0;
}

void gpt2_ddp_state_set(gpt2_ddp *d, const float *full) {
  shards_set(d, full);
  if (d->ops->state_set) d->ops->state_set(d, full);
}

/* ---- re-form ---- */

int gpt2_ddp_commit(gpt2_ddp *d) {
  return d->ops->commit ? d->ops->commit(d) : d->err;
}

/* PowerSGD's state while it compresses (its step reached, several ranks training), else NULL. */
static gpt2_psgd *psgd_running(const gpt2_ddp *d, int64_t step) {
  gpt2_ddp_powersgd *p = gpt2_ddp_powersgd_of(d);
  return p != NULL && gpt2_ddp_powersgd_compresses(d, p, step) ? &p->s : NULL;
}

int gpt2_ddp_keep(gpt2_ddp *d, int64_t step) {
  gpt2_psgd *s = psgd_running(d, step);
  d->kept_valid = 0;
  if (s == NULL) return 0;
  if (d->kept == NULL) d->kept = malloc((s->nq + s->nerr + 1) * sizeof(float));
  if (d->kept == NULL) return -ENOMEM;
  memcpy(d->kept, s->Q, s->nq * sizeof(float));
  gpt2_psgd_error(s, d->kept + s->nq);
  d->kept_valid = 1;
  return 0;
}

void gpt2_ddp_rollback(gpt2_ddp *d) {
  gpt2_ddp_powersgd *p = gpt2_ddp_powersgd_of(d);
  if (p == NULL || !d->kept_valid) return;
  gpt2_psgd_state_set(&p->s, 0, d->kept);
  d->kept_valid = 0;
}

size_t gpt2_ddp_own_state_floats(const gpt2_ddp *d) {
  const gpt2_ddp_powersgd *p = gpt2_ddp_powersgd_of(d);
  return p != NULL ? p->s.nerr : 0;
}

size_t gpt2_ddp_local_state_floats(const gpt2_ddp *d) {
  const gpt2_ddp_powersgd *p = gpt2_ddp_powersgd_of(d);
  return gpt2_ddp_optim_floats(d) + (p != NULL ? p->s.nq + p->s.nerr : 0);
}

int gpt2_ddp_state_npieces(const gpt2_ddp *d) {
  if (d->ops == &gpt2_ddp_zero_ops) return -EINVAL;
  return d->nshards + (gpt2_ddp_powersgd_of(d) != NULL);
}

int gpt2_ddp_state_pieces(gpt2_ddp *d, cohort_iov *iov, int max) {
  int n = gpt2_ddp_state_npieces(d);
  if (n < 0 || n > max) return n < 0 ? n : -EINVAL;
  for (int i = 0; i < d->nshards; i++) /* m then v: one buffer */
    iov[i] = (cohort_iov){d->shards[i].state, d->shards[i].nstate * sizeof(float)};
  gpt2_ddp_powersgd *p = gpt2_ddp_powersgd_of(d);
  if (p != NULL) iov[d->nshards] = (cohort_iov){p->s.Q, p->s.nq * sizeof(float)};
  return n;
}

void gpt2_ddp_own_state_get(gpt2_ddp *d, float *own) {
  gpt2_ddp_powersgd *p = gpt2_ddp_powersgd_of(d);
  if (p != NULL) gpt2_psgd_error(&p->s, own);
}

void gpt2_ddp_own_state_set(gpt2_ddp *d, const float *own) {
  gpt2_ddp_powersgd *p = gpt2_ddp_powersgd_of(d);
  if (p == NULL) return;
  if (own != NULL)
    memcpy(p->s.err, own, p->s.nerr * sizeof(float));
  else
    memset(p->s.err, 0, p->s.nerr * sizeof(float));
  for (int g = 0; g < p->s.ngroups; g++) p->s.groups[g].share = 0.0f; /* err is the error itself */
}

void gpt2_ddp_set_contrib(gpt2_ddp *d, int contrib, int identity) {
  gpt2_ddp_powersgd *p = gpt2_ddp_powersgd_of(d);
  if (p != NULL) gpt2_psgd_set_contrib(&p->s, contrib, identity);
}

float *gpt2_ddp_exchange_state(gpt2_ddp *d, size_t *n) {
  gpt2_ddp_powersgd *p = gpt2_ddp_powersgd_of(d);
  *n = p != NULL ? p->s.nq : 0;
  return p != NULL ? p->s.Q : NULL;
}

size_t gpt2_ddp_replay_floats(const gpt2_ddp *d, int64_t step) {
  const gpt2_psgd *s = psgd_running(d, step);
  return s != NULL ? gpt2_psgd_result_floats(s) : d->m->nparams;
}

void gpt2_ddp_replay_get(gpt2_ddp *d, int64_t step, float *out) {
  const gpt2_psgd *s = psgd_running(d, step);
  if (s != NULL)
    gpt2_psgd_result_get(s, out);
  else
    memcpy(out, d->m->grads, d->m->nparams * sizeof(float));
}

void gpt2_ddp_replay_set(gpt2_ddp *d, int64_t step, const float *in) {
  gpt2_ddp_powersgd *p = gpt2_ddp_powersgd_of(d);
  gpt2_psgd *s = psgd_running(d, step);
  if (p != NULL) p->now = s != NULL; /* the update gpt2_ddp_step makes: this step's */
  if (s != NULL)
    gpt2_psgd_result_set(s, d->m->grads, in);
  else
    memcpy(d->m->grads, in, d->m->nparams * sizeof(float));
}

/* [lo, hi) of o's m and v from the shards of old that hold it. */
static void copy_overlap(gpt2_optim *o, const gpt2_ddp *old) {
  for (int j = 0; j < old->nshards; j++) {
    const gpt2_optim *s = &old->shards[j];
    size_t lo = s->lo > o->lo ? s->lo : o->lo, hi = s->hi < o->hi ? s->hi : o->hi;
    if (lo >= hi) continue;
    memcpy(o->m + (lo - o->lo), s->m + (lo - s->lo), (hi - lo) * sizeof(float));
    if (o->v && s->v) memcpy(o->v + (lo - o->lo), s->v + (lo - s->lo), (hi - lo) * sizeof(float));
  }
}

void gpt2_ddp_adopt_state(gpt2_ddp *d, gpt2_ddp *old) {
  int same = d->nshards == old->nshards;
  for (int i = 0; same && i < d->nshards; i++)
    same = d->shards[i].lo == old->shards[i].lo && d->shards[i].hi == old->shards[i].hi &&
           d->shards[i].nstate == old->shards[i].nstate;
  for (int i = 0; i < d->nshards; i++) {
    if (!same) {
      copy_overlap(&d->shards[i], old);
      continue;
    }
    gpt2_optim t = d->shards[i]; /* the untouched new buffer goes with old */
    d->shards[i] = old->shards[i];
    old->shards[i] = t;
  }
  gpt2_ddp_powersgd *p = gpt2_ddp_powersgd_of(d), *po = gpt2_ddp_powersgd_of(old);
  if (p != NULL && po != NULL && p->s.nq == po->s.nq && p->s.nerr == po->s.nerr) {
    memcpy(p->s.Q, po->s.Q, p->s.nq * sizeof(float));
    gpt2_psgd_error(&po->s, p->s.err); /* the new one's shares are 0: err is the error */
  }
  gpt2_ddp_free(old);
}

/*
 * internal.h - the data-parallel exchange's modes (src/gpt2/ddp*.c), shared by ddp.c and the
 * files of the modes only (and read by the tests that look inside one).
 *
 * A gpt2_ddp runs one mode for its whole life, chosen by gpt2_ddp_init from its options: an ops
 * table in the style of the collectives' transports (coll_tport_ops). ddp.c owns what every mode
 * shares (the buckets and their requests, the optimiser shards, the figures of a step, the
 * blocking helpers and the checkpointed state) and calls the table; a mode's file fills one:
 *
 *   ddp_plain.c     every bucket allreduced during backward, the update on the whole state;
 *                   the embedding lookup's share of dwte allgathered as rows (one process too)
 *   ddp_zero.c      ZeRO-1: buckets reduce-scattered, each rank updating its share, the
 *                   parameters allgathered
 *   ddp_split.c     16-bit wires: buckets reduce-scattered in backward, gathered in the next
 *                   forward, the update applied bucket by bucket as the forward reads them
 *   ddp_powersgd.c  PowerSGD from its start step on (plain before it)
 */
#ifndef COHORT_GPT2_INTERNAL_H
#define COHORT_GPT2_INTERNAL_H

#include "gpt2/ddp.h"
#include "gpt2/powersgd.h"

struct gpt2_ddp_ops {
  const char *name; /* as the banner prints it */
  /* Lays out the buckets (world > 1), the optimiser shards and the mode's state (d->x). */
  int (*setup)(gpt2_ddp *d, const gpt2_ddp_opts *o);
  /* Finishes what is pending and frees d->x (also after a failed setup). */
  void (*destroy)(gpt2_ddp *d);
  /* A micro-step's backward begins (its figures reset); returns gpt2_backward's scatter_wte. */
  int (*begin)(gpt2_ddp *d, int64_t step, int last);
  void (*hook)(gpt2_ddp *d, gpt2_grad_event ev, int at);
  int (*finish)(gpt2_ddp *d);
  int (*grad_norm)(gpt2_ddp *d, double *norm);
  int (*step)(gpt2_ddp *d, float grad_scale, float lr, int64_t t);
  /* The update still pending after step (NULL: none ever is), and the forward's wait for it. */
  int (*settle)(gpt2_ddp *d);
  /* The pending update applied atomically (NULL: the step leaves nothing pending). */
  int (*commit)(gpt2_ddp *d);
  void (*param_wait)(gpt2_ddp *d, size_t lo, size_t hi, const int32_t *tokens, size_t ntok);
  /* The mode's checkpointed state, after the optimiser's (NULL: none): its floats; state_get
   * completes the whole state `full` once the shards are in (every rank calls), state_set sets
   * this rank's from it. */
  size_t (*state_floats)(const gpt2_ddp *d);
  int (*state_get)(gpt2_ddp *d, float *full);
  void (*state_set)(gpt2_ddp *d, const float *full);
};

extern const gpt2_ddp_ops gpt2_ddp_plain_ops;
extern const gpt2_ddp_ops gpt2_ddp_zero_ops;
extern const gpt2_ddp_ops gpt2_ddp_split_ops;
extern const gpt2_ddp_ops gpt2_ddp_powersgd_ops;

/* ---- shared by the modes (ddp.c) ---- */

/* A bucket of [lo, hi), launched at backward event ev (of layer `layer`). */
int gpt2_ddp_add_bucket(gpt2_ddp *d, size_t lo, size_t hi, gpt2_grad_event ev, int layer);
/* Layers from the top, merged until a bucket reaches d->chunk floats (the tail rides with the
 * last layer), launched as backward finishes them. */
int gpt2_ddp_layer_buckets(gpt2_ddp *d);
/* Splits [lo, hi) into buckets of at most `chunk` floats, launched at ev. */
int gpt2_ddp_add_chunked(gpt2_ddp *d, size_t lo, size_t hi, size_t chunk, gpt2_grad_event ev);
/* An optimiser shard for [lo, hi) (nothing when empty). */
int gpt2_ddp_add_shard(gpt2_ddp *d, size_t lo, size_t hi);
/* Counts n floats handed to a collective, travelling as `wire`. */
void gpt2_ddp_count_bytes(gpt2_ddp *d, size_t n, cohort_dtype wire);
/* Keeps a started request of this step (or records the error rc). */
void gpt2_ddp_push_req(gpt2_ddp *d, int rc, cohort_request *req, const char *what);
/* Starts the buckets backward event (ev, at) completes, calling after(d, i) once bucket i has
 * started (after may be NULL); then the lookup's rows when the mode gathers them. */
void gpt2_ddp_launch_due(gpt2_ddp *d, gpt2_grad_event ev, int at, void (*after)(gpt2_ddp *, int));
/* Waits for the step's requests; *exposed_ms the wait, *end_us when the last one ended. */
int gpt2_ddp_wait_all(gpt2_ddp *d, double *exposed_ms, int64_t *end_us);
/* Floats of the whole optimiser state (the checkpoint's first part). */
size_t gpt2_ddp_optim_floats(const gpt2_ddp *d);
/* The optimiser update of every shard. */
void gpt2_ddp_step_shards(gpt2_ddp *d, float grad_scale, float lr, int64_t t);

/* ---- the plain mode's pieces, which split and PowerSGD build on (ddp_plain.c) ---- */

/* The plain buckets: the layers, the token embedding's (with the LM head or accumulation) and
 * the rest of the embeddings', and room for the lookup's rows. */
int gpt2_ddp_plain_buckets(gpt2_ddp *d);
int gpt2_ddp_plain_begin(gpt2_ddp *d, int64_t step, int last);
void gpt2_ddp_plain_hook(gpt2_ddp *d, gpt2_grad_event ev, int at);
int gpt2_ddp_plain_finish(gpt2_ddp *d);
int gpt2_ddp_plain_grad_norm(gpt2_ddp *d, double *norm);
int gpt2_ddp_plain_step(gpt2_ddp *d, float grad_scale, float lr, int64_t t);

/* ---- the modes' state, for the tests that look inside ---- */

/* The split exchange: every bucket split; `lo` the lowest offset a bucket holds (what lies below
 * has a shard of its own); `order` lists them in gather order (the token embedding's last). The
 * update they wait for is upd_*; the gathers' waits and window go into the next step's figures
 * (carry_*). */
typedef struct gpt2_ddp_split {
  size_t lo;
  int *order, norder;
  float upd_scale, upd_lr;
  int64_t upd_t, gather_t0_us;
  int gathers_due; /* the update is decided, its gathers not yet launched */
  int upd_pending; /* atomic: the update is decided and not applied (gpt2_ddp_commit) */
  int gathers_pending;
  /* The row path: the token embedding's rows of the next forward's tokens (sorted, nrows > 0
   * while their update is done and the rest of their buckets' is not), their gathered
   * gradients; room for rows_cap. */
  int32_t *rows;
  float *row_grads;
  size_t nrows, rows_cap;
  double carry_exposed_ms, carry_comm_ms, carry_wire_bytes, carry_f32_bytes;
} gpt2_ddp_split;

/* PowerSGD from step `start` on: each group launched from the backward hook as soon as backward
 * has finished it and moved on one launch behind, or (after_backward) all of them after backward:
 * the same collectives and the same bits, later. `now`: the current step compresses; `live`:
 * its backward launches the groups. */
typedef struct gpt2_ddp_powersgd {
  gpt2_psgd s;
  int64_t start;
  int after_backward;
  int now, live;
} gpt2_ddp_powersgd;

/* Whether PowerSGD compresses 0-based step `step`: from its start step on, when more than one rank
 * trains (a rank alone, also beside ranks that catch up, sums as the plain exchange does). */
static inline int gpt2_ddp_powersgd_compresses(const gpt2_ddp *d, const gpt2_ddp_powersgd *p,
                                               int64_t step) {
  int trainers = p->s.contrib > 0 ? p->s.contrib : d->world;
  return step >= p->start && trainers > 1;
}

static inline gpt2_ddp_split *gpt2_ddp_split_of(const gpt2_ddp *d) {
  return d->ops == &gpt2_ddp_split_ops ? d->x : NULL;
}
static inline gpt2_ddp_powersgd *gpt2_ddp_powersgd_of(const gpt2_ddp *d) {
  return d->ops == &gpt2_ddp_powersgd_ops ? d->x : NULL;
}

#endif

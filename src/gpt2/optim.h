/*
 * optim.h - optimisers (AdamW, SGD with momentum), learning-rate schedule and
 * gradient-norm helpers over the flat parameter buffer.
 *
 * An optimiser may own only a shard [lo, hi) of the flat buffer (ZeRO stage
 * 1): its state covers just that range and step() updates just that range.
 */
#ifndef COHORT_GPT2_OPTIM_H
#define COHORT_GPT2_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "gpt2/model.h"

typedef enum gpt2_opt_kind { GPT2_OPT_ADAMW = 0, GPT2_OPT_SGD = 1 } gpt2_opt_kind;

typedef struct gpt2_optim_config {
  gpt2_opt_kind kind;
  float beta1, beta2, eps; /* AdamW */
  float momentum;          /* SGD */
  float weight_decay;      /* decoupled for AdamW, L2 for SGD; matrices only */
} gpt2_optim_config;

typedef struct gpt2_optim {
  gpt2_optim_config cfg;
  size_t lo, hi; /* the shard of the flat buffer this optimiser updates */
  float *m, *v;  /* (hi - lo) each; v unused (NULL) for SGD */
  size_t nstate; /* floats of state: (hi-lo) for SGD, 2*(hi-lo) for AdamW */
  float *state;  /* one allocation holding m then v */
} gpt2_optim;

/* Allocates zeroed state for [lo, hi). Returns 0 or -ENOMEM. */
int gpt2_optim_init(gpt2_optim *o, const gpt2_optim_config *cfg, size_t lo, size_t hi);
void gpt2_optim_free(gpt2_optim *o);

/*
 * One update of params[lo, hi) from grad_scale * grads[lo, hi) (the
 * clipping factor, fused to save a pass over the gradients); t is the
 * 1-based number of this update (AdamW bias correction). Weight decay
 * applies to the tensors whose `decay` flag is set.
 */
void gpt2_optim_step(gpt2_optim *o, const gpt2_model *m, float *params, const float *grads,
                     float grad_scale, float lr, int64_t t);
/* The same update of params[lo, hi) alone (inside the shard), its gradients read from
 * grads[0, hi - lo): a shard may be updated piece by piece, each element once, with the same
 * result. */
void gpt2_optim_update(gpt2_optim *o, const gpt2_model *m, float *params, const float *grads,
                       size_t lo, size_t hi, float grad_scale, float lr, int64_t t);

/* Writes the gradients of row `row`, columns [j0, j0 + n), of a matrix into out[0, n): for an
 * update whose gradients are made as it reads them (PowerSGD's P Q^T). Called from several
 * threads at once. */
typedef void (*gpt2_grad_piece_fn)(void *ctx, size_t row, size_t j0, size_t n, float *out);
/* The update of the matrix params[lo, lo + rows x cols) (row-major, inside the shard and one
 * tensor) from grad_scale times the gradients piece() makes, a piece of a row at a time into a
 * buffer in the first-level cache: no pass over a gradient buffer. The bits of gpt2_optim_update
 * over the same gradients; threads take whole rows. */
void gpt2_optim_update_rows(gpt2_optim *o, const gpt2_model *m, float *params, size_t lo,
                            size_t rows, size_t cols, gpt2_grad_piece_fn piece, void *ctx,
                            float grad_scale, float lr, int64_t t);

typedef enum gpt2_lr_schedule { GPT2_LR_CONST = 0, GPT2_LR_COSINE = 1 } gpt2_lr_schedule;

/* Learning rate of 0-based step `step`: linear warm-up over `warmup` steps,
 * then constant or cosine decay to min_ratio*lr at `total` steps. */
float gpt2_lr_at(gpt2_lr_schedule s, float lr, int64_t warmup, int64_t total, float min_ratio,
                 int64_t step);

/* Sum of squares of x[0..n), in double, in a fixed order (deterministic). */
double gpt2_sumsq(const float *x, size_t n);
/* x *= s */
void gpt2_scale(float *x, size_t n, float s);

#endif

/*
 * powersgd.h - PowerSGD gradient compression (Vogels et al., 2019) for the
 * data-parallel trainer, in the form of PyTorch's powerSGD_hook.
 *
 * Every 2-D weight matrix M (rows x cols) whose low-rank factors are at most
 * half its size travels as two thin factors of `rank` columns: P = M Q
 * (rows x rank, summed over ranks, then orthonormalised by Gram-Schmidt) and
 * Q = M^T P (cols x rank, summed over ranks); the summed gradient is then
 * approximated by P Q^T. Everything else (biases, layer-norm gains, matrices
 * too small to gain) is summed uncompressed in the same allreduce as P.
 *
 * Error feedback: what a rank's compressed gradient lost (its M minus its
 * 1/world share of P Q^T) is added to its next gradient, so no part of the
 * gradient is dropped for good. Warm start: Q is kept from step to step as
 * the starting point of the next power iteration. Both are state of the run
 * and travel in checkpoints (Q once, the error of every rank).
 *
 * Gradients are sums over ranks here (the trainer scales the loss by
 * 1/world), so P and Q are summed, not averaged.
 *
 * Memory per rank: the error (the size of the compressed matrices, about the
 * parameter count), P and Q (rank x (rows + cols) floats per matrix) and the
 * packed uncompressed part.
 */
#ifndef COHORT_GPT2_POWERSGD_H
#define COHORT_GPT2_POWERSGD_H

#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"
#include "gpt2/model.h"

typedef struct gpt2_psgd_mat {
  size_t off;     /* in the flat gradient buffer */
  int rows, cols; /* M is rows x cols, row-major */
  size_t p, q, e; /* offsets into P, Q and the error */
} gpt2_psgd_mat;

typedef struct gpt2_psgd {
  int rank; /* columns of P and Q */
  gpt2_psgd_mat *mats;
  int nmats;
  size_t (*plain)[2]; /* [lo, hi) ranges of the flat buffer summed uncompressed */
  int nplain;
  float *packed; /* the plain ranges packed, followed by P: one allreduce */
  float *P, *Q, *err;
  size_t np, nq, nerr, npacked;
} gpt2_psgd;

/* Chooses the matrices among the model's tensors (rows > 1 and rows*cols > 2*rank*(rows+cols):
 * PyTorch's min_compression_rate of 2) and allocates the state; Q starts as orthonormalised
 * N(0, 1) draws from seed (the same on every rank), the error as zero. Returns 0 or -errno. */
int gpt2_psgd_init(gpt2_psgd *s, const gpt2_model *m, int rank, uint64_t seed);
void gpt2_psgd_free(gpt2_psgd *s);

/* Sums the gradients g (the model's flat buffer) over comm's ranks, compressing the matrices;
 * g then holds the approximated sum. Returns 0 or a negative cohort error. The bytes handed to
 * the collectives (all f32) are added to *bytes. */
int gpt2_psgd_allreduce(gpt2_psgd *s, cohort_comm *comm, float *g, double *bytes);

/* The steps of gpt2_psgd_allreduce, for tests (world 1 needs no communication between them):
 * adds the error to each matrix of g and sets P = M Q; */
void gpt2_psgd_compute_p(gpt2_psgd *s, float *g);
/* orthonormalises P and sets Q = M^T P; */
void gpt2_psgd_compute_q(gpt2_psgd *s, const float *g);
/* replaces each matrix of g by P Q^T and keeps error = M - P Q^T / world. */
void gpt2_psgd_decompress(gpt2_psgd *s, float *g, int world);

/* Gram-Schmidt on the `cols` columns of the row-major rows x cols matrix a: orthonormal columns
 * (a column that is numerically zero, or dependent on the earlier ones to within 1e-5 of its
 * length, becomes zero). */
void gpt2_psgd_orthonormalize(float *a, int rows, int cols);

/* Floats of the checkpointed state for `world` ranks: Q, then the error of each rank. */
size_t gpt2_psgd_state_floats(const gpt2_psgd *s, int world);
/* Writes the state of every rank into full (every rank calls; each error is broadcast from its
 * rank; comm may be NULL for one process). Returns 0 or a negative cohort error. */
int gpt2_psgd_state_get(gpt2_psgd *s, cohort_comm *comm, float *full);
/* Sets the state of process rank `rank` from the whole state. */
void gpt2_psgd_state_set(gpt2_psgd *s, int rank, const float *full);

#endif

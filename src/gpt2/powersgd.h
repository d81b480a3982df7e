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
 * and travel in checkpoints (Q once, the error of every rank). The error
 * buffer keeps M itself after a step, with the group's `share`: the error
 * is M - share P Q^T, the P and Q of that step, which stay where they are
 * until the next stage 1 subtracts them as it adds the new gradient (saving
 * the reconstruction a read and a write of the error; gpt2_psgd_error makes
 * it explicit).
 *
 * Groups: the flat buffer is cut where backward finishes ranges (the last
 * layer with ln_f and the QA head, each layer down to layer 0, then the
 * embeddings), and each group goes through three stages of its own:
 *   1. launch: add the error, P = M Q, start the allreduce of the group's
 *      uncompressed floats and P (one packed block);
 *   2. when that is done: unpack, orthonormalise P, Q = M^T P, start the
 *      allreduce of the group's Q;
 *   3. when that is done: the sum is P Q^T (the error: M_before - P Q^T / world), which the
 *      optimiser's update computes as it reads it (gpt2_psgd_update): it is never written out.
 * A group is launched as soon as backward has finished it (the trainer's
 * hook), and the older groups are moved on at each launch, a fixed number of
 * launches behind (gpt2_psgd_advance), so the exchanges overlap the rest of
 * backward. What a group computes depends only on its own floats and on the
 * sums of its own collectives, and every rank starts the same collectives in
 * the same order (the order of launches, never the timing of a completion),
 * so the overlapped exchange and gpt2_psgd_allreduce after backward give the
 * same bits. The kernels split rows (P, P Q^T) or columns (Q) between
 * threads, never a sum, so the result does not depend on the thread count.
 *
 * Gradients are sums over ranks here (the trainer scales the loss by
 * 1/world), so P and Q are summed, not averaged.
 *
 * Memory per rank: the error (the size of the compressed matrices, about the
 * parameter count), P and Q (rank x (rows + cols) floats per matrix) and the
 * packed uncompressed part.
 *
 * Not thread-safe; one step's stages on one thread, between begin and
 * finish. Errors are negative cohort codes; after one, the requests still
 * pending are finished by gpt2_psgd_free.
 */
#ifndef COHORT_GPT2_POWERSGD_H
#define COHORT_GPT2_POWERSGD_H

#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"
#include "gpt2/model.h"
#include "gpt2/optim.h"

typedef struct gpt2_psgd_mat {
  size_t off;     /* in the flat gradient buffer */
  int rows, cols; /* M is rows x cols, row-major */
  size_t p, q, e; /* offsets into packed (P), Q and the error */
} gpt2_psgd_mat;

typedef struct gpt2_psgd_group {
  size_t lo, hi;      /* range of the flat buffer */
  gpt2_grad_event ev; /* the backward event that finishes it */
  int layer;          /* for GPT2_EV_LAYER */
  int m0, m1;         /* its matrices: mats[m0 .. m1) */
  int pl0, pl1;       /* its uncompressed ranges: plain[pl0 .. pl1) */
  size_t pk, npk;     /* its block of packed: the uncompressed floats, then its P */
  size_t q, nq;       /* its block of Q */
  int stage;          /* 0 idle, 1 P summing, 2 Q summing, 3 done */
  float share;        /* the error is err - share P Q^T (0 before a step, after state_set) */
  cohort_request *req;
} gpt2_psgd_group;

typedef struct gpt2_psgd {
  int rank; /* columns of P and Q */
  gpt2_psgd_mat *mats;
  int nmats;
  size_t (*plain)[2]; /* [lo, hi) ranges of the flat buffer summed uncompressed */
  int nplain;
  gpt2_psgd_group *groups; /* in the order backward finishes them */
  int ngroups;
  float *packed; /* per group: its uncompressed floats, then its P */
  float *Q, *err;
  double *mat_sq;               /* per matrix: the sum of squares of its last P Q^T */
  double *gram;                 /* room for two rank x rank Gram matrices */
  float *scratch;               /* one factor in the kernels' layout */
  size_t np, nq, nerr, npacked; /* floats of P, Q, error, uncompressed part */
  /* The current step: groups in the order they were launched. */
  int *order;
  int nlaunched;
  /* Catching up (docs/gpt2.md "Catching up"): the sums hold the gradients of the contrib ranks
   * that train only (0: of every rank of the communicator), whose errors keep 1/contrib of each
   * P Q^T;
   * an identity rank (one of the others) adds -0.0 to every sum (x + -0.0 == x for every x),
   * written as such, never computed (0 x a negative q is +0.0): it computes no factor of its own,
   * orthonormalises the summed P as every rank does, and its error stays zero. */
  int contrib, identity;
  int64_t wait_us;   /* time spent blocked on requests this step */
  int64_t cpu_us;    /* CPU time of this step's compression (its kernels and packing) */
  double wire_bytes; /* bytes handed to the collectives this step */
} gpt2_psgd;

/* Chooses the matrices among the model's tensors (rows > 1 and rows*cols > 2*rank*(rows+cols):
 * PyTorch's min_compression_rate of 2), cuts the groups (one group when the model has no layers)
 * and allocates the state; Q starts as orthonormalised N(0, 1) draws from seed (the same on every
 * rank), the error as zero. Returns 0 or -errno. */
int gpt2_psgd_init(gpt2_psgd *s, const gpt2_model *m, int rank, uint64_t seed);
/* Finishes any pending request, releases everything. NULL is a no-op. */
void gpt2_psgd_free(gpt2_psgd *s);

/* Sums the gradients g (the model's flat buffer) over comm's ranks, compressing the matrices;
 * g then holds the approximated sum: begin, finish, then P Q^T written over each matrix. Returns 0
 * or a negative cohort error. */
int gpt2_psgd_allreduce(gpt2_psgd *s, cohort_comm *comm, float *g);

/* The overlapped form. begin: a new step, nothing launched. */
void gpt2_psgd_begin(gpt2_psgd *s);
/* The group that backward event (ev, layer) finishes, or -1. */
int gpt2_psgd_group_of(const gpt2_psgd *s, gpt2_grad_event ev, int layer);
/* Stage 1 of group `grp` (not launched yet this step). */
int gpt2_psgd_launch(gpt2_psgd *s, cohort_comm *comm, float *g, int grp);
/* Moves every group launched more than `lag` launches ago to stage 2, and more than 2 x lag ago
 * to stage 3, waiting for the exchanges that needs. */
/* The lag of backward's hooks: each launch moves on the group launched two before it, whose P has
 * had a layer's backward to be summed, so a rank waits in a hook only when its peer is more than
 * a layer behind (with 1, any lag of the peer's showed as a wait there). */
#define GPT2_PSGD_LAG 2
int gpt2_psgd_advance(gpt2_psgd *s, cohort_comm *comm, float *g, int lag);
/* Launches the groups not launched yet (in group order) and completes every group. */
int gpt2_psgd_finish(gpt2_psgd *s, cohort_comm *comm, float *g);

/* The compression of one group without communication (world 1), for tests: stage 1's
 * computation (adds the error to each matrix of g, P = M Q), */
void gpt2_psgd_compute_p(gpt2_psgd *s, float *g, int grp);
/* stage 2's (orthonormalises P, Q = M^T P), */
void gpt2_psgd_compute_q(gpt2_psgd *s, const float *g, int grp);
/* stage 3's: the group's sum is P Q^T, kept as its factors (this rank's error = M - P Q^T / world;
 * the sum of squares of P Q^T for gpt2_psgd_sumsq from the factors' Gram matrices); g is not
 * written: the update makes P Q^T as it reads it (gpt2_psgd_update). */
void gpt2_psgd_complete(gpt2_psgd *s, int grp, int world);
/* stage 3's and each matrix of g replaced by P Q^T. */
void gpt2_psgd_decompress(gpt2_psgd *s, float *g, int grp, int world);
/* The sum of squares of the summed gradients after every group's stage 3 (a step's exchange
 * finished): the uncompressed ranges of g by gpt2_sumsq, in memory order, then each matrix's
 * |P Q^T|^2 from its factors, so the clipping norm reads no matrix. The same bits on every rank
 * (every rank holds the same P and Q) and for every thread count; within rounding of the sum of
 * squares of P Q^T written out (the factors' sum is exact in double, the written elements are
 * rounded to float). */
double gpt2_psgd_sumsq(const gpt2_psgd *s, const float *g);
/* The optimiser update after a step's exchange: the uncompressed ranges from g, each matrix from
 * P Q^T made a piece of a row at a time as the update reads it (gpt2_optim_update_rows), so no
 * reconstructed gradient is written or read back. The parameters and optimiser state of
 * decompressing into g and gpt2_optim_update over all of it, bit for bit. o: the optimiser of
 * the whole buffer. */
void gpt2_psgd_update(gpt2_psgd *s, gpt2_optim *o, const gpt2_model *m, const float *g,
                      float grad_scale, float lr, int64_t t);
/* This rank's error (nerr floats, the layout of err) into out. */
void gpt2_psgd_error(gpt2_psgd *s, float *out);

/* Gram-Schmidt on the `cols` columns of the row-major rows x cols matrix a: orthonormal columns
 * (a column that is numerically zero, or dependent on the earlier ones to within 1e-5 of its
 * length, becomes zero). */
void gpt2_psgd_orthonormalize(float *a, int rows, int cols);

/* Catching up: contrib ranks train (0: all); identity: this rank is not one of them. */
void gpt2_psgd_set_contrib(gpt2_psgd *s, int contrib, int identity);
/* A step's result after its exchange, what its update reads besides the optimiser state: the
 * packed block (every group's summed uncompressed floats and orthonormal summed P) and the summed
 * Q, result_floats of them. result_set puts it back (the uncompressed sums into g too), so that
 * gpt2_psgd_update makes the update of that step again, bit for bit (a catching-up rank's replay).
 */
size_t gpt2_psgd_result_floats(const gpt2_psgd *s);
void gpt2_psgd_result_get(const gpt2_psgd *s, float *out);
void gpt2_psgd_result_set(gpt2_psgd *s, float *g, const float *in);

/* Floats of the checkpointed state for `world` ranks: Q, then the error of each rank. */
size_t gpt2_psgd_state_floats(const gpt2_psgd *s, int world);
/* Writes the state of every rank into full (every rank calls; each error is broadcast from its
 * rank; comm may be NULL for one process). Returns 0 or a negative cohort error. */
int gpt2_psgd_state_get(gpt2_psgd *s, cohort_comm *comm, float *full);
/* Sets the state of process rank `rank` from the whole state. */
void gpt2_psgd_state_set(gpt2_psgd *s, int rank, const float *full);

#endif

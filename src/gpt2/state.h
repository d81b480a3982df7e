/*
 * state.h - the training state of a rank as the pieces a newcomer receives
 * when it joins a running job (a re-form, docs/gpt2.md), sent from and
 * received into the model's and the exchange's own buffers (nothing packed).
 *
 * Pieces (host byte order), in this order on every rank:
 *   gpt2_state_head   magic "COHSTAT", the counters, the float counts
 *   float params[nparams]
 *   float shared[nshared]   the optimiser state (each shard's m then v; SGD
 *                           momentum), then PowerSGD's Q: the same on every
 *                           rank
 *   extra                   the caller's piece (cohort-gpt2: the last step's
 *                           report, so that a rank 0 receiving that step
 *                           writes its line)
 * What is not sent is each rank's own part (nown floats, PowerSGD's error
 * feedback): a newcomer's is zero (an error is what this rank's gradients
 * have not yet contributed: another rank's would be applied twice).
 * The RNG state is the seed: batches and initial weights derive from it and
 * the sample or step index alone.
 */
#ifndef COHORT_GPT2_STATE_H
#define COHORT_GPT2_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"
#include "gpt2/ddp.h"
#include "gpt2/model.h"

typedef struct gpt2_state_head {
  char magic[8];     /* "COHSTAT\0" */
  uint64_t step;     /* completed optimiser steps */
  uint64_t data_pos; /* the data position P (data.h) */
  uint64_t rng;      /* the run's RNG state: its seed */
  uint64_t nparams, nshared, nown;
} gpt2_state_head;

/* The pieces of this rank's state, to hand to cohort_comm_state_transferv: *head (filled with
 * these counters and this model's counts), then the model's and d's buffers in place (nothing
 * may be pending in d: after gpt2_ddp_commit or gpt2_ddp_rollback), then extra. Returns a
 * malloc'd array and its length in *n, or NULL (-ENOMEM, or -EINVAL with ZeRO: sharded state)
 * with *n the error. */
cohort_iov *gpt2_state_pieces(gpt2_model *m, gpt2_ddp *d, gpt2_state_head *head, uint64_t step,
                              uint64_t data_pos, uint64_t rng, cohort_iov extra, int *n);

/* A head received into the pieces: 0 when it fits this model and exchange, else -EINVAL. */
int gpt2_state_check(const gpt2_state_head *got, const gpt2_model *m, const gpt2_ddp *d);

#endif

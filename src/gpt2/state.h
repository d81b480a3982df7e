/*
 * state.h - the training state of a rank as one buffer: what a newcomer
 * receives when it joins a running job (a re-form, docs/gpt2.md), and what
 * a survivor keeps across one.
 *
 * Layout (host byte order):
 *   gpt2_state_head   magic "COHSTAT", the counters, the float counts
 *   float params[nparams]
 *   float shared[nshared]   the optimiser state (AdamW m then v; SGD
 *                           momentum), then PowerSGD's Q: the same on every
 *                           rank
 *   float own[nown]         PowerSGD's error feedback: this rank's alone
 * The transfer sends the first gpt2_state_sent_bytes (head, parameters,
 * shared part); a newcomer's own part is zero (an error is what this rank's
 * gradients have not yet contributed: another rank's would be applied twice).
 * The RNG state is the seed: batches and initial weights derive from it and
 * the sample or step index alone.
 */
#ifndef COHORT_GPT2_STATE_H
#define COHORT_GPT2_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "gpt2/ddp.h"
#include "gpt2/model.h"

typedef struct gpt2_state_head {
  char magic[8];     /* "COHSTAT\0" */
  uint64_t step;     /* completed optimiser steps */
  uint64_t data_pos; /* the data position P (data.h) */
  uint64_t rng;      /* the run's RNG state: its seed */
  uint64_t nparams, nshared, nown;
} gpt2_state_head;

/* The buffer of a rank's state (all of it) and the part that travels to newcomers. */
size_t gpt2_state_bytes(const gpt2_model *m, const gpt2_ddp *d);
size_t gpt2_state_sent_bytes(const gpt2_model *m, const gpt2_ddp *d);

/* Writes the state into buf (gpt2_state_bytes): no communication, nothing pending in d (after
 * gpt2_ddp_commit or gpt2_ddp_rollback). Returns 0, or -EINVAL with ZeRO (sharded state). */
int gpt2_state_pack(void *buf, const gpt2_model *m, gpt2_ddp *d, uint64_t step, uint64_t data_pos,
                    uint64_t rng);

/* The own part of a state buffer (after what is sent). */
float *gpt2_state_own(void *buf);

/* Sets the model and d from buf (which must fit them: -EINVAL otherwise, as for a buffer whose
 * magic is wrong), with `own` as this rank's own part (gpt2_state_own(buf), another buffer of
 * head.nown floats, or NULL for zeros). The counters go to *head. */
int gpt2_state_unpack(void *buf, gpt2_model *m, gpt2_ddp *d, const float *own,
                      gpt2_state_head *head);

#endif

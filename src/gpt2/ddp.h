/*
 * ddp.h - data parallelism for cohort-gpt2 over libcohort, and the owner of
 * the optimiser state (whole, or sharded with ZeRO-1).
 *
 * One exchange runs for the whole run, chosen by gpt2_ddp_init from its
 * options: plain, zero-1, split or powersgd, each a file with an ops table
 * (internal.h). What follows describes them.
 *
 * Gradients are exchanged in buckets of about bucket_bytes, in the reverse
 * order of the flat buffer, each started asynchronously (cohort_iallreduce)
 * from the backward hook as soon as backward has finished its layers, so the
 * communication overlaps the rest of backward. Tied embeddings need care:
 * the token embedding's gradient is complete only at the very end of
 * backward, but almost all of it (the LM head's part) is known at the start.
 * So dwte is allreduced right after the head's backward, and the embedding
 * lookup's small share (B*T rows of d(encoded)) is exchanged with an
 * allgather of those rows and their tokens, which every rank adds in rank
 * order. With the QA head and no accumulation dwte is only that share.
 *
 * With ZeRO-1 each bucket is reduce-scattered instead: rank r receives the
 * summed gradient of its 1/N of every bucket, updates just that part of the
 * parameters with the optimiser state it alone holds, and the parameters are
 * then allgathered. (The few elements of a bucket not divisible by N are
 * allreduced and updated by every rank alike.) The token embedding is then
 * exchanged after backward, not overlapped.
 *
 * With a 16-bit wire (bf16, fp16) and no ZeRO every bucket is split in two
 * ("split" exchange): backward reduce-scatters it, and the gradients are
 * allgathered only after the update has been decided, in the order the next
 * forward reads the parameters (position embedding, layer 0, layer 1, ...,
 * then the token embedding, which the LM head reads last, in blocks of its
 * rows). The next forward waits for each bucket's gather and applies its
 * optimiser update just before it reads that bucket's parameters, so the
 * second half of the exchange overlaps the forward instead of delaying it.
 * The embedding lookup at the forward's start reads only the rows of the
 * batch's tokens: the "row path" exchanges just those rows first (every
 * rank's tokens, then each row's reduced gradient from the rank that holds
 * it) and updates them, so the rest of the token embedding travels while the
 * layers and the LM head compute. The result is bit for bit that of settling
 * the whole token embedding first. The gradient norm for clipping comes from
 * each rank's reduced share (gathered values are the same bf16 numbers), so
 * the update is the one the allreduce would give, up to the order of the
 * norm's sum. Parameters and optimiser state are complete again after
 * gpt2_ddp_settle.
 *
 * Gradients are summed, not averaged: the trainer scales the loss by
 * 1/(K*world) so the sum is the mean over the global batch.
 *
 * With several ranks the gradient buffer comes from cohort_mem_alloc, memory
 * the ranks of a host share, so that on one host libcohort's single-copy
 * allreduce reduces the buckets straight between the ranks' buffers. When
 * that allocation fails (a /dev/shm too small: -ENOSPC on every rank alike)
 * the model keeps its private buffer and the buckets take the ordinary
 * algorithms; shared_rc says why.
 *
 * With comm NULL (one process) nothing is communicated and the optimiser
 * state is whole. Errors are negative codes; the communicator's message is
 * in err.
 */
#ifndef COHORT_GPT2_DDP_H
#define COHORT_GPT2_DDP_H

#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"
#include "gpt2/model.h"
#include "gpt2/optim.h"

typedef struct gpt2_bucket {
  size_t lo, hi;          /* range of the flat buffer */
  gpt2_grad_event event;  /* launched when backward reports this event */
  int layer;              /* for GPT2_EV_LAYER */
  size_t per;             /* ZeRO or split: elements per rank of the divisible part */
  cohort_request *gather; /* split: its gradients' allgather, pending until settled */
} gpt2_bucket;

/* The exchange's mode: plain, zero-1, split or powersgd (an ops table, see internal.h). */
typedef struct gpt2_ddp_ops gpt2_ddp_ops;

typedef struct gpt2_ddp_opts {
  size_t bucket_bytes;
  int accum; /* micro-steps per optimiser step */
  int zero;  /* ZeRO-1 (with several ranks) */
  /* The wire type of the gradient reductions: COHORT_F32 (none), or COHORT_BF16 / COHORT_F16
   * (see cohort_allreduce_wire); a 16-bit wire without ZeRO is the split exchange. */
  cohort_dtype wire;
  /* PowerSGD of rank powersgd_rank (0: off; not with ZeRO) from 0-based step powersgd_start
   * on, its first factors drawn from seed; powersgd_after_backward: the groups exchanged after
   * backward rather than during it (the same bits, later: what the tests compare against). */
  int powersgd_rank;
  int64_t powersgd_start;
  uint64_t seed;
  int powersgd_after_backward;
  /* Re-form: a step's update is applied only once every exchange it needs is in (the split
   * exchange's gathers waited for in gpt2_ddp_commit, not in the next forward), so a failed
   * exchange leaves the state of the step before. */
  int atomic;
} gpt2_ddp_opts;

typedef struct gpt2_ddp {
  cohort_comm *comm; /* NULL: one process */
  int rank, world, accum;
  gpt2_model *m;
  gpt2_optim_config ocfg;
  const gpt2_ddp_ops *ops; /* the mode, for the whole run */
  void *x;                 /* its state */
  cohort_dtype wire;
  size_t chunk;       /* floats of a bucket, at most */
  void *shared_grads; /* the model's gradients, from cohort_mem_alloc; NULL: its own */
  int shared_rc;      /* why not shared (cohort_mem_alloc's error), else 0 */
  gpt2_bucket *buckets;
  int nbuckets;
  gpt2_optim *shards; /* optimiser state: one shard, or one per owned range */
  int nshards;
  size_t state_floats; /* total floats of optimiser state held here */
  /* Requests of the current step, in launch order. */
  cohort_request **reqs;
  int64_t *req_done_us; /* completion time seen by polling, 0 if not seen */
  int nreqs, cap_reqs;
  int active; /* the current micro-step's backward launches the buckets */
  const int32_t *tokens;
  size_t head_sent;  /* dwte's head buckets launched this step: up to this float */
  float *gath_rows;  // (world, B*T, C); NULL: the lookup's share travels in the buckets
  int32_t *gath_tok; // (world, B*T)
  int64_t t_first_us;
  /* The last step's figures: the exchange's exposed wait and window, the payload bytes this
   * rank handed to the collectives, as sent and as they would have been in f32 (their ratio is
   * the compression). */
  double exposed_ms, comm_ms, wire_bytes, f32_bytes;
  double compress_ms; /* CPU time of the compression on this thread (PowerSGD's kernels) */
  int atomic;         /* gpt2_ddp_opts.atomic */
  /* Re-form: what a failing step's exchange changes, as it was before the step (gpt2_ddp_keep):
   * PowerSGD's Q and this rank's error; kept_valid when it holds this step's. */
  float *kept;
  int kept_valid;
  int err;
  char errmsg[256];
} gpt2_ddp;

/* Chooses the mode from o and sets it up. Returns 0, -EINVAL (PowerSGD with ZeRO on several
 * ranks) or -ENOMEM. */
int gpt2_ddp_init(gpt2_ddp *d, cohort_comm *comm, gpt2_model *m, const gpt2_optim_config *ocfg,
                  const gpt2_ddp_opts *o);
/* Collective when the gradients are shared (cohort_mem_free): every rank frees, or the
 * communicator has been aborted. The model's gradient pointer is NULL afterwards. */
void gpt2_ddp_free(gpt2_ddp *d);
/* The mode's name: "plain", "zero-1", "split" or "powersgd". */
const char *gpt2_ddp_mode(const gpt2_ddp *d);

/* Call before each micro-step's backward of 0-based optimiser step `step`; last != 0 on the last
 * micro-step of an optimiser step; tokens (B, T) of this micro-step stay valid until finish.
 * Returns whether the backward must scatter the embedding lookup's dwte share itself (the
 * scatter_wte argument of gpt2_backward). */
int gpt2_ddp_begin_backward(gpt2_ddp *d, int64_t step, int last, const int32_t *tokens);
/* The gpt2_grad_hook to pass to gpt2_backward (ctx = d). With `atomic` (re-forming) it stops
 * backward once the communicator has failed (d->err then says why): buckets not yet launched
 * cannot be exchanged, so the step is lost anyway. */
int gpt2_ddp_hook(void *ctx, gpt2_grad_event ev, int at);
/* After the last backward: waits for every exchange and completes dwte. */
int gpt2_ddp_finish_backward(gpt2_ddp *d);

/* Global gradient norm (of the reduced gradients). */
int gpt2_ddp_grad_norm(gpt2_ddp *d, double *norm);
/* Optimiser update from grad_scale times the reduced gradients (clipping)
 * with learning rate lr, update number t (1-based); with ZeRO also
 * allgathers the parameters. After a split step only what no bucket holds is
 * updated here; the rest waits for the next forward or gpt2_ddp_settle. A
 * PowerSGD step's reduced matrices are their factors P and Q, never in the
 * gradient buffer (which keeps this rank's own there): the update makes
 * P Q^T as it reads it. */
int gpt2_ddp_step(gpt2_ddp *d, float grad_scale, float lr, int64_t t);
/* Launches the split step's gathers if the forward has not, waits for them and applies their
 * updates. Returns 0 or the exchange's error. */
int gpt2_ddp_settle(gpt2_ddp *d);
/* Zeroes the gradients for a new step, once the split update's gathers (which write them) have
 * landed: gpt2_ddp_settle, then gpt2_discard_grad (the next backward stores them, no pass over
 * them here). Returns 0 or the exchange's error (the gradients then untouched). */
int gpt2_ddp_zero_grad(gpt2_ddp *d);
/* gpt2_param_wait for gpt2_forward_wait (ctx = d): launches the split step's gathers (with the
 * row path when given the lookup's tokens) and settles the buckets the forward is about to read;
 * an error stays in d->err. With `atomic` (re-forming) it stops the forward once the
 * communicator has failed, as gpt2_ddp_hook does backward. */
int gpt2_ddp_param_wait(void *ctx, size_t lo, size_t hi, const int32_t *tokens, size_t ntok);

/* Records the first error (rc, what failed, the communicator's message) in err and errmsg, and
 * returns rc: also for the caller's own collectives. */
int gpt2_ddp_fail(gpt2_ddp *d, int rc, const char *what);

/* Sum of x over ranks (doubles, blocking). */
int gpt2_ddp_sum(gpt2_ddp *d, double *x, int n);
/* Broadcasts n floats from rank 0. */
int gpt2_ddp_broadcast(gpt2_ddp *d, float *buf, size_t n);
/* Checks that every rank holds the same parameters (hash compared). */
int gpt2_ddp_check_params(gpt2_ddp *d, int *same);

/* Floats of the whole optimiser state (the checkpoint layout: AdamW m then
 * v over all parameters, SGD momentum over all parameters; then PowerSGD's
 * state, see gpt2_psgd_state_floats). */
size_t gpt2_ddp_full_state_floats(const gpt2_ddp *d);
/* Copies the whole state into full (gathering shards; every rank calls). */
int gpt2_ddp_state_get(gpt2_ddp *d, float *full);
/* Sets this rank's state from the whole state. */
void gpt2_ddp_state_set(gpt2_ddp *d, const float *full);
/* The single whole-state shard when the state is not sharded and is all there is, else NULL. */
float *gpt2_ddp_whole_state(gpt2_ddp *d);

/* ---- re-form (see docs/gpt2.md "Re-form") ---- */

/* Applies what the last gpt2_ddp_step left pending (the split exchange's gathers); with `atomic`
 * every gather is in before any of its updates is applied. Returns 0 or the exchange's error. */
int gpt2_ddp_commit(gpt2_ddp *d);
/* Before 0-based step `step`: keeps what its exchange will change in place (PowerSGD's Q and
 * error, once PowerSGD runs; nothing otherwise). Returns 0 or -ENOMEM. */
int gpt2_ddp_keep(gpt2_ddp *d, int64_t step);
/* After a failed step: puts back what gpt2_ddp_keep kept; the state is the step before's. */
void gpt2_ddp_rollback(gpt2_ddp *d);
/* This rank's state in the layout of one rank's checkpoint: the whole optimiser state, PowerSGD's
 * Q, then what is this rank's own (PowerSGD's error: gpt2_ddp_own_state_floats of them, at the
 * end). Not with ZeRO (the state is sharded). */
size_t gpt2_ddp_local_state_floats(const gpt2_ddp *d);
size_t gpt2_ddp_own_state_floats(const gpt2_ddp *d);
/* The shared part of it (all but the own part) as pieces in place, to send or receive: each
 * shard's optimiser state, then PowerSGD's Q. Writes at most max; returns how many there are
 * (gpt2_ddp_state_npieces), -EINVAL with ZeRO. Nothing may be pending (after gpt2_ddp_commit or a
 * failed step). */
int gpt2_ddp_state_npieces(const gpt2_ddp *d);
int gpt2_ddp_state_pieces(gpt2_ddp *d, cohort_iov *iov, int max);
/* The own part alone (gpt2_ddp_own_state_floats), as it is now. */
void gpt2_ddp_own_state_get(gpt2_ddp *d, float *own);
/* Sets the own part from own (NULL: zero, a newcomer's). */
void gpt2_ddp_own_state_set(gpt2_ddp *d, const float *own);
/* Catching up (docs/gpt2.md "Catching up"): contrib ranks train, the others (identity: this rank
 * is one of them) take part in every sum with -0.0 (PowerSGD: their factors too, and the errors of
 * the ranks that train keep 1/contrib of each step's approximation). A new exchange has
 * contrib = world. */
void gpt2_ddp_set_contrib(gpt2_ddp *d, int contrib, int identity);
/* The part of the shared state that a step's exchange writes before the step's update (PowerSGD's
 * Q), *n floats of it; NULL when none. */
float *gpt2_ddp_exchange_state(gpt2_ddp *d, size_t *n);
/* What a catching-up rank keeps of 0-based step `step` after its exchange, to replay the step's
 * update once its state is in (gpt2_ddp_step after replay_set: the bits of the others' update):
 * the summed gradients, or a compressing PowerSGD step's factors and uncompressed sums. Not with
 * the split exchange or ZeRO. */
size_t gpt2_ddp_replay_floats(const gpt2_ddp *d, int64_t step);
void gpt2_ddp_replay_get(gpt2_ddp *d, int64_t step, float *out);
void gpt2_ddp_replay_set(gpt2_ddp *d, int64_t step, const float *in);
/* A re-form: d, just set up for the new membership, takes over old's optimiser and PowerSGD state
 * (the same model's exchange over the membership that ended, nothing pending): the buffers
 * themselves where the shards are the same, else copied. Then free old. */
void gpt2_ddp_adopt_state(gpt2_ddp *d, gpt2_ddp *old);

#endif

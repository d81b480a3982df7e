/* run.h - one run of cohort-gpt2 as its two files share it: train.c (set-up, the steps, their
 * reports, the loop) and reform.c (a run through re-forms: the join of a membership, the state
 * handed over at once or caught up in the background). Private to src/gpt2; the API is train.h. */
#ifndef COHORT_GPT2_RUN_H
#define COHORT_GPT2_RUN_H

#include <stdint.h>
#include <stdio.h>

#include "cohort/cohort.h"
#include "gpt2/ckpt.h"
#include "gpt2/data.h"
#include "gpt2/ddp.h"
#include "gpt2/kernels.h"
#include "gpt2/state.h"
#include "gpt2/tb_writer.h"
#include "gpt2/train.h"

/* What the phases of a run return: 0 to go on, else the reason to stop (the run's exit status is
 * 1 for RUN_FAIL and RUN_COMM, 2 for RUN_USAGE; RUN_COMM also prints the communicator's error). */
enum { RUN_OK = 0, RUN_FAIL = 1, RUN_USAGE = 2, RUN_COMM = 3 };

/* One optimiser step's figures, for the step report. */
typedef struct step_stats {
  uint64_t step; /* 1-based */
  int world;     /* the ranks that trained it */
  int late;      /* reported by a rank 0 that received the step with the state (a re-form) */
  double loss, gnorm, step_s, tok_s, gflops, comm_ms, hidden;
  double wire_mb, ratio; /* MB this rank handed to the collectives; f32 bytes / wire bytes */
  /* The main thread's CPU time over the step (cpu_ms), split into forward, backward and the
   * rest (compute_ms), the compression (compress_ms) and the norm and update (update_ms); the
   * wall time it waited for the exchange (exposed_ms). */
  double cpu_ms, compute_ms, compress_ms, update_ms, exposed_ms;
  float lr;
} step_stats;

/* Everything one run holds; zero-initialised, and train_free() is safe at any point of set-up. */
typedef struct train_run {
  const gpt2_train_opts *o;
  FILE *out, *errf;
  int rank, world, threads;
  cohort_comm *comm;
  /* Re-form (docs/gpt2.md): reform when the job's agent re-forms it (COHORT_CONTROL_FD), newcomer
   * when started into a running job (COHORT_NEWCOMER=1: the state comes from a survivor). */
  int reform, newcomer;
  int ahead;           /* started ahead of its membership (COHORT_AWAIT_FORM=1) */
  gpt2_ddp_opts dopts; /* the exchange's options, to set it up again for a new world */
  gpt2_model model;
  gpt2_data data;
  gpt2_batch_buf bb;
  gpt2_ddp ddp;
  /* The checkpoint's optimiser state is the whole state; with ZeRO it is assembled in full_state
   * (nfull floats), else state points into the optimiser. */
  float *state, *full_state;
  size_t nfull;
  gpt2_ckpt_header want; /* what a checkpoint of this run must match */
  uint64_t start_step;
  uint64_t done; /* completed steps */
  uint64_t pos;  /* the data position P: samples the completed steps consumed (data.h) */
  int in_step;   /* the exchange failed inside a step (not between two) */
  int exchanged; /* the current step's gradient exchange has completed */
  /* After a step whose exchange completed but which failed after it: this rank's own state
   * (PowerSGD's error) as that step left it, which is right when another rank completed the
   * step (every rank's part was in its sums). */
  float *own_after;
  int own_after_valid;
  int stateful; /* this process holds the run's state (a newcomer: once it has received it) */
  /* Catching up (docs/gpt2.md "Re-form"): the ranks that joined without state (any ranks: their
   * list in catch_who) take part in every reduction with -0.0 while the state streams to them from
   * the donors (a snapshot of step catch_step), keep each step's averaged gradients, and replay
   * them once it is in. contrib: the ranks that train a step (world when nobody catches up); slot:
   * this rank's place among them, which gives its data (its rank when all train); writer: the
   * rank that writes checkpoints, 0 or, while rank 0 catches up, the lowest rank that trains. */
  int contrib, slot, writer;
  char catch_who[96];
  int catching; /* this rank catches up */
  int ready;    /* every catching-up rank has the state (the step's agreed flag) */
  int grow;     /* a node joins: every rank re-forms after this step (the step's agreed flag) */
  /* A node joining breaks a step that has barely begun (docs/gpt2.md "Re-form", item 3): one that
   * comes while less than this share of a step has run (COHORT_GROW_BREAK; 0: every grow deferred;
   * -1, unset: node_ranks / (contrib + node_ranks), one node of LOCAL_WORLD_SIZE ranks joining). */
  double grow_break;
  int node_ranks;
  cohort_stream *stream;
  /* A donor (every rank not new) streams from the stream's copy of its share only
   * (COHORT_STREAM_COPY), taken in the background: its next update waits for it (snap_copied,
   * snap_held bytes; snap_wait_s: how long that update waited). */
  int snap_copied;
  size_t snap_held;
  double snap_wait_s;
  size_t snap_bytes; /* the state's bytes, every piece */
  /* Where the last re-form's time went: the membership formed, the exchange set up, the ranks
   * agreed on the step (gpt2_now_s). */
  double t_formed, t_exchange, t_agreed;
  gpt2_state_head snap_head;
  step_stats snap_last;
  /* The piece that a step's exchange writes before its update (PowerSGD's Q): streamed from a copy
   * a donor takes at the join, and received into one (the catching-up rank's exchange writes its
   * own), which the replay starts from. */
  float *snap_q;
  struct replay_step *replay;
  size_t nreplay;
  int32_t *zero_tok; /* a catching-up rank's tokens: row 0, each adding -0.0 */
  uint64_t catch_step;
  double catch_t0;
  /* Tests only (COHORT_GPT2_TEST_HOLD=N): a catching-up rank contributes no sooner than N steps
   * after the join, however soon its state is in (0: as soon as it is). */
  uint64_t catch_hold;
  /* The last completed step's report (every rank keeps it; it travels with the state, so that
   * a rank 0 that receives a step writes its line), and the last step this process reported as
   * rank 0, or its metrics file had when it opened it. */
  step_stats last;
  uint64_t reported;
  /* Tests only (COHORT_GPT2_TEST_FAIL=K:PATH): step K, once completed here and once PATH exists,
   * fails as if its last collective had (0: none). */
  uint64_t test_fail_step;
  const char *test_fail_path;
  int test_step_ms; /* tests only (COHORT_GPT2_TEST_STEP_MS): each step first sleeps so long */
  /* When this process began, had its model and data set up, and joined its first membership. */
  double t_start, t_setup, t_member;
  int outputs_open;
  FILE *metrics;
  gpt2_tb_writer *tb;
  uint64_t global_batch; /* sequences per optimiser step over all ranks */
  double tokens_per_step, flops_micro;
  double *step_times; /* [steps + 1] */
  size_t ntimes;
  double last_loss, comm_total, exposed_total;
  double wire_total, f32_total; /* bytes handed to the collectives over the steps run */
  char err[512];
} train_run;

/* A step a catching-up rank took part in: what its update reads (gpt2_ddp_replay_get: n floats)
 * and the update's figures. */
typedef struct replay_step {
  float *rec;
  size_t n;
  float gscale, lr;
  int64_t t;
} replay_step;

static inline double gpt2_now_s(void) {
  return (double)gpt2_now_us() * 1e-6;
}

/* ---- train.c ---- */

/* The ranks that train a step (contrib of them; world when nobody catches up), this rank's place
 * among them (its data) and the rank that writes checkpoints. */
void gpt2_run_set_contrib(train_run *r, int contrib, int slot, int writer);
/* Rank 0's metrics file, TensorBoard events and banner, once. */
int gpt2_run_open_outputs(train_run *r);
/* The state from the checkpoint (or the start). */
int gpt2_run_resume(train_run *r);
/* The exchange for the current world, taking over old's buffers (NULL: a first set-up). */
int gpt2_run_setup_exchange(train_run *r, gpt2_ddp *old);
/* A step's line, metrics and TensorBoard scalars (rank 0). */
int gpt2_run_report_step(train_run *r, const step_stats *st);

/* ---- reform.c ---- */

/* Joins the current membership: agree on the step, hand the state over (at once, or caught up in
 * the background), check the parameters. */
int gpt2_run_join(train_run *r, int old_world, double t0);
/* The membership ended (COHORT_ERESHAPED): re-form, set the exchange up again, join. */
int gpt2_run_reform(train_run *r);
/* A step failed after its exchange: keeps this rank's own state as the exchange left it. */
void gpt2_run_keep_own_after(train_run *r);
/* Tests only (COHORT_GPT2_TEST_FAIL): the completed step made to fail. */
int gpt2_run_test_fail(train_run *r);
/* A catching-up rank's part of step's exchange (-0.0 everywhere). */
int gpt2_catch_up_steps(train_run *r, uint64_t step);
/* A catching-up rank keeps the step's averaged gradients and the update's figures. */
int gpt2_catch_up_keep(train_run *r, float gscale, float lr, int64_t t);
/* Every rank, at the step boundary where the catching-up ranks have their state. */
int gpt2_catch_up_finish(train_run *r);
/* The last step is done while ranks catch up: wait for the state together, then finish. */
int gpt2_catch_up_drain(train_run *r);
/* Whether this rank's state is not in yet at the step in flight (0 when it does not catch up):
 * polled, its stream's poll, not 1 (or, tests only, the hold not over). */
int gpt2_catch_up_pending(const train_run *r, int polled);
/* Ends the stream, frees the snapshot and the steps kept. */
void gpt2_catch_up_drop(train_run *r);
/* A donor, before it changes its state (the update): waits until the stream has its share's copy.
 */
int gpt2_catch_up_release(train_run *r);

#endif

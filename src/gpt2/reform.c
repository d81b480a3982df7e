/* reform.c - a run of cohort-gpt2 through re-forms (docs/gpt2.md "Re-form"): the join of a
 * membership agrees on the step, and the ranks without the state receive it at once or catch up
 * while the others train. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt2/run.h"

/* A catching-up rank's part of the step's exchange: every bucket launched in backward's order
 * (the head's rows, the tail, the layers from the top, the embeddings), its gradients and its rows
 * of the embedding lookup -0.0 on token 0. x + -0.0 == x for every x (-0.0 and +0.0 included),
 * so every sum is the one of the ranks that train. */
int gpt2_catch_up_steps(train_run *r, uint64_t step) {
  gpt2_model *m = &r->model;
  const int K = r->o->grad_accum;
  size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)m->cfg.channels;
  if (r->zero_tok == NULL) r->zero_tok = calloc(BT, sizeof(int32_t));
  if (r->zero_tok == NULL) return RUN_FAIL;
  for (int k = 0; k < K && r->ddp.err == 0; k++) {
    if (k == 0 && gpt2_ddp_zero_grad(&r->ddp) != 0) return RUN_COMM;
    gpt2_ddp_begin_backward(&r->ddp, (int64_t)step, k == K - 1, r->zero_tok);
    for (size_t i = 0; k == 0 && i < m->nparams; i++) m->grads[i] = -0.0f;
    for (size_t i = 0; i < BT * C; i++) m->dres[i] = -0.0f;
    gpt2_ddp_hook(&r->ddp, GPT2_EV_HEAD, m->cfg.vocab);
    gpt2_ddp_hook(&r->ddp, GPT2_EV_TAIL, -1);
    for (int l = m->cfg.layers - 1; l >= 0; l--) gpt2_ddp_hook(&r->ddp, GPT2_EV_LAYER, l);
    gpt2_ddp_hook(&r->ddp, GPT2_EV_EMBED, -1);
  }
  return RUN_OK;
}

/* A catching-up rank keeps what the step's update reads (the averaged gradients, or a compressing
 * PowerSGD step's factors and uncompressed sums) and the update's figures, to replay them once its
 * state is in. */
int gpt2_catch_up_keep(train_run *r, float gscale, float lr, int64_t t) {
  replay_step *n = realloc(r->replay, (r->nreplay + 1) * sizeof *n);
  if (n != NULL) r->replay = n;
  size_t nf = gpt2_ddp_replay_floats(&r->ddp, t - 1);
  float *rec = n != NULL ? gpt2_big_alloc(nf * sizeof(float)) : NULL;
  if (rec == NULL) {
    fprintf(r->errf, "cohort-gpt2: rank %d: out of memory keeping a step to replay\n", r->rank);
    return RUN_FAIL;
  }
  gpt2_ddp_replay_get(&r->ddp, t - 1, rec);
  r->replay[r->nreplay++] = (replay_step){.rec = rec, .n = nf, .gscale = gscale, .lr = lr, .t = t};
  return RUN_OK;
}

/* ---- re-form (docs/gpt2.md "Re-form") ---- */

/* What the ranks of a new membership agree on when they (re)join: each rank's completed steps (-1:
 * no state) and whether the exchange failed inside a step. */
typedef struct join_view {
  int64_t max;         /* the highest completed step: where the run goes on */
  int old_world;       /* the world of the membership that ended (0: none, a first start) */
  int behind, dropped; /* survivors behind it (they receive the state); a step in flight lost */
  int nnew;            /* ranks that receive the state */
  /* The ranks without state catch up while the others train (start_catch_up): every rank may and
   * none is behind; they may be any ranks, rank 0 included. */
  int catch_up;
  int slot;     /* this rank's place among the ranks at the highest step (-1: not one) */
  int first;    /* the lowest rank at the highest step */
  char who[96]; /* the ranks behind it, as ranges ("0-0", "1-2,4-4"; "..." when longer) */
} join_view;

/* Whether this rank may catch up a newcomer in the background: the plain exchange or PowerSGD
 * (the split exchange's update is not bit for bit that of the ranks that train: docs/gpt2.md),
 * unless COHORT_GPT2_CATCH_UP=0 (the state transfer that blocks every rank). */
static int may_catch_up(const train_run *r) {
  const char *e = getenv("COHORT_GPT2_CATCH_UP"), *mode = gpt2_ddp_mode(&r->ddp);
  return (strcmp(mode, "plain") == 0 || strcmp(mode, "powersgd") == 0) &&
         (e == NULL || strcmp(e, "0") != 0);
}

/* Appends the range lo-hi of the ranks behind to v->who (cut with "..." where it is long). */
static void add_range(join_view *v, int lo, int hi) {
  size_t at = strlen(v->who); /* a range takes 24 characters at most */
  if (at >= sizeof v->who - 32 && v->who[at - 1] != '.') strcat(v->who, ",...");
  if (at >= sizeof v->who - 32) return;
  snprintf(v->who + at, sizeof v->who - at, "%s%d-%d", at > 0 ? "," : "", lo, hi);
}

static void view_of(const int64_t *all, int world, int rank, join_view *v) {
  *v = (join_view){.max = -1, .catch_up = 1, .slot = -1, .first = -1};
  for (int i = 0; i < world; i++) {
    if (all[4 * i] > v->max) v->max = all[4 * i];
    if (all[4 * i + 2] > v->old_world) v->old_world = (int)all[4 * i + 2];
    v->catch_up &= all[4 * i + 3] != 0;
  }
  int run = -1; /* the first rank of the current range of ranks behind */
  for (int i = 0; i <= world; i++) {
    int behind = i < world && all[4 * i] < v->max;
    if (behind && run < 0) run = i;
    if (!behind && run >= 0) add_range(v, run, i - 1);
    if (!behind) run = -1;
    if (i == world) break;
    v->behind += all[4 * i] >= 0 && all[4 * i] < v->max;
    v->nnew += behind;
    v->dropped |= all[4 * i] == v->max && all[4 * i + 1] != 0;
    if (!behind && v->first < 0) v->first = i;
    if (!behind && i == rank) v->slot = i - v->nnew;
  }
  v->catch_up &= v->max >= 0 && v->behind == 0 && v->nnew > 0 && v->nnew < world;
}

static int agree(train_run *r, int64_t mine, int old_world, join_view *v) {
  int64_t me[4] = {mine, r->in_step, old_world, may_catch_up(r)};
  int64_t *all = calloc((size_t)r->world * 4, sizeof(int64_t));
  if (all == NULL) return RUN_FAIL;
  int rc = r->world > 1 ? cohort_allgather(r->comm, me, all, 4, COHORT_I64) : 0;
  if (r->world == 1) memcpy(all, me, sizeof me);
  if (rc != 0) {
    free(all);
    gpt2_ddp_fail(&r->ddp, rc, "allgather of the completed steps");
    return RUN_COMM;
  }
  view_of(all, r->world, r->rank, v);
  free(all);
  return RUN_OK;
}

/* ---- catching up: the state streams while the ranks with it train (docs/gpt2.md "Re-form") ----
 */

/* Ends the stream (if it runs), frees the snapshot and the steps kept: a re-form, or the end. */
void gpt2_catch_up_drop(train_run *r) {
  if (r->stream != NULL) cohort_comm_state_stream_end(r->comm, r->stream);
  r->stream = NULL;
  r->snap_copied = 0;
  for (size_t i = 0; i < r->nreplay; i++)
    gpt2_big_free(r->replay[i].rec, r->replay[i].n * sizeof(float));
  free(r->replay);
  r->replay = NULL;
  r->nreplay = 0;
  free(r->snap_q);
  r->snap_q = NULL;
  r->catching = r->ready = 0;
  free(r->zero_tok);
  r->zero_tok = NULL;
}

/* A donor, before it changes its state (the update): waits until the stream has copied its
 * share (its thread does, in the background), once per stream. */
int gpt2_catch_up_release(train_run *r) {
  if (r->stream == NULL || r->catching || r->snap_copied) return RUN_OK;
  double t = gpt2_now_s();
  int rc = cohort_comm_state_stream_wait_copy(r->stream, &r->snap_held);
  if (rc != 0) {
    fprintf(r->errf, "cohort-gpt2: rank %d: the copy of the state streamed: %s\n", r->rank,
            cohort_strerror(rc));
    return RUN_FAIL;
  }
  r->snap_copied = 1;
  r->snap_wait_s = gpt2_now_s() - t;
  return RUN_OK;
}

/* A rank 0 that receives the step the job goes on from (it was behind, or is new) writes that
 * step's line from the report that came with it, unless its metrics have it (a lost rank 0 wrote
 * it): every step has its line once. */
static int report_received(train_run *r, int64_t max) {
  if (r->rank != 0 || max <= 0 || r->last.step != (uint64_t)max || r->reported >= r->last.step)
    return RUN_OK;
  step_stats late = r->last;
  late.late = 1;
  return gpt2_run_report_step(r, &late);
}

/* The ranks without state (nnew of them, any ranks) catch up: every rank with state (a donor)
 * streams its share of it to them in the background, from a copy of that share the stream takes
 * (COHORT_STREAM_COPY) before this rank's next update; they take part in every step's reductions
 * from here on without training (train_step). A rank 0 among them has the last step's report at
 * once, from the lowest donor, for its line. */
static int start_catch_up(train_run *r, int64_t mine, const join_view *v, double t0) {
  r->catching = mine < 0;
  gpt2_run_set_contrib(r, r->world - v->nnew, v->slot, v->first);
  gpt2_ddp_set_contrib(&r->ddp, r->world - v->nnew, r->catching);
  snprintf(r->catch_who, sizeof r->catch_who, "%s", v->who);
  int rc =
      v->first > 0 ? cohort_broadcast(r->comm, &r->last, sizeof r->last, COHORT_U8, v->first) : 0;
  if (rc != 0) {
    gpt2_ddp_fail(&r->ddp, rc, "broadcast of the last step's report");
    return RUN_COMM;
  }
  if (!r->catching) r->snap_last = r->last;
  cohort_iov last = {&r->snap_last, sizeof r->snap_last};
  int n;
  cohort_iov *iov = gpt2_state_pieces(&r->model, &r->ddp, &r->snap_head, (uint64_t)v->max, r->pos,
                                      r->o->seed, last, &n);
  if (iov == NULL) {
    fprintf(r->errf, "cohort-gpt2: rank %d: the state: %s\n", r->rank, strerror(-n));
    return RUN_FAIL;
  }
  size_t nq = 0;
  float *q = gpt2_ddp_exchange_state(&r->ddp, &nq);
  r->snap_q = nq > 0 ? malloc(nq * sizeof(float)) : NULL;
  if (nq > 0 && r->snap_q == NULL) {
    free(iov);
    fprintf(r->errf, "cohort-gpt2: rank %d: out of memory\n", r->rank);
    return RUN_FAIL;
  }
  if (nq > 0 && !r->catching) memcpy(r->snap_q, q, nq * sizeof(float)); /* the step's own Q */
  for (int i = 0; i < n && nq > 0; i++)
    if (iov[i].base == q) iov[i].base = r->snap_q;
  r->snap_bytes = 0;
  for (int i = 0; i < n; i++) r->snap_bytes += iov[i].len;
  r->snap_copied = 0;
  r->snap_held = 0;
  rc = cohort_comm_state_stream_begin_flags(r->comm, iov, n, COHORT_STREAM_COPY, &r->stream);
  free(iov);
  if (rc != 0) {
    gpt2_ddp_fail(&r->ddp, rc, "state stream");
    return RUN_COMM;
  }
  r->catch_step = (uint64_t)v->max;
  r->catch_t0 = gpt2_now_s();
  const char *hold = getenv("COHORT_GPT2_TEST_HOLD");
  r->catch_hold = hold != NULL ? strtoull(hold, NULL, 10) : 0;
  if (r->catching) r->done = r->catch_step;
  r->start_step = r->done;
  r->in_step = 0;
  if (r->rank == 0) {
    fprintf(r->out,
            "cohort-gpt2: re-formed (epoch %d): world %d -> %d at step %lld (step in flight %s), "
            "%d rank(s) catching up: %zu bytes of state streaming from %d rank(s) while they "
            "train, %.3f s in all (membership %.3f s, exchange set up %.3f s, agreed %.3f s, "
            "stream begun %.3f s)\n",
            cohort_comm_epoch(r->comm), v->old_world, r->world, (long long)v->max,
            v->dropped ? "dropped" : "none", v->nnew, r->snap_bytes, r->contrib, gpt2_now_s() - t0,
            r->t_formed - t0, r->t_exchange - r->t_formed, r->t_agreed - r->t_exchange,
            r->catch_t0 - r->t_agreed);
    fflush(r->out);
  }
  rc = gpt2_run_open_outputs(r);
  return rc == RUN_OK ? report_received(r, v->max) : rc;
}

int gpt2_catch_up_pending(const train_run *r, int polled) {
  return r->catching && (polled != 1 || r->done + 1 < r->catch_step + r->catch_hold);
}

/* A catching-up rank whose state is in: replays the steps it kept through the optimiser's own
 * code (the bits of the others' updates), from the snapshot's data position. */
static int replay(train_run *r) {
  if (gpt2_state_check(&r->snap_head, &r->model, &r->ddp) != 0 ||
      r->snap_head.step + r->nreplay != r->done) {
    fprintf(r->errf, "cohort-gpt2: rank %d: the state streamed does not fit this model\n", r->rank);
    return RUN_FAIL;
  }
  uint64_t pos = r->snap_head.data_pos;
  size_t nq = 0;
  float *q = gpt2_ddp_exchange_state(&r->ddp, &nq);
  /* The snapshot's Q; a compressing step's replay sets that step's. */
  if (nq > 0) memcpy(q, r->snap_q, nq * sizeof(float));
  for (size_t i = 0; i < r->nreplay; i++) {
    const replay_step *k = &r->replay[i];
    gpt2_ddp_replay_set(&r->ddp, k->t - 1, k->rec);
    if (gpt2_ddp_step(&r->ddp, k->gscale, k->lr, k->t) != 0 || gpt2_ddp_commit(&r->ddp) != 0)
      return RUN_COMM;
    pos = gpt2_data_advance(pos, r->contrib, r->o->grad_accum, r->o->B);
  }
  gpt2_ddp_own_state_set(&r->ddp, NULL); /* a newcomer's error feedback: zero */
  r->pos = pos;
  r->stateful = 1;
  cohort_comm_set_step(r->comm, (int64_t)r->done);
  fprintf(r->out,
          "cohort-gpt2: rank %d (newcomer%s): caught up: snapshot of step %llu (%zu bytes) in, "
          "replayed %zu step(s), %.3f s after it began\n",
          r->rank, r->ahead ? ", started ahead" : "", (unsigned long long)r->catch_step,
          r->snap_bytes, r->nreplay, gpt2_now_s() - r->catch_t0);
  fflush(r->out);
  return RUN_OK;
}

/* Every rank, at the step boundary where all agreed that the catching-up ranks have their state:
 * they replay, and every rank trains from the next step on; the parameters are checked. */
int gpt2_catch_up_finish(train_run *r) {
  /* A donor's thread has the receivers' answers a moment after they said so. */
  if (gpt2_catch_up_release(r) != RUN_OK) return RUN_FAIL; /* a run that ends before an update */
  for (int i = 0; i < 60000 && cohort_comm_state_stream_poll(r->stream, NULL) == 0; i++)
    usleep(1000);
  double stream_s = gpt2_now_s() - r->catch_t0;
  int rc = cohort_comm_state_stream_end(r->comm, r->stream);
  r->stream = NULL;
  if (rc != 0) {
    fprintf(r->errf, "cohort-gpt2: rank %d: the state stream: %s\n", r->rank, cohort_strerror(rc));
    return RUN_FAIL;
  }
  int st = r->catching ? replay(r) : RUN_OK;
  size_t replayed = (size_t)(r->done - r->catch_step), held = r->snap_held;
  double wait_s = r->snap_wait_s;
  int donors = r->contrib, donor0 = !r->catching;
  gpt2_catch_up_drop(r);
  gpt2_run_set_contrib(r, r->world, r->rank, 0);
  gpt2_ddp_set_contrib(&r->ddp, r->world, 0);
  int same = 0;
  if (st == RUN_OK && gpt2_ddp_check_params(&r->ddp, &same) != 0) st = RUN_COMM;
  if (st == RUN_OK && !same) {
    fprintf(r->errf, "cohort-gpt2: rank %d: parameters differ between ranks after catching up\n",
            r->rank);
    st = RUN_FAIL;
  }
  if (st == RUN_OK && r->rank == 0) {
    /* What rank 0 held as a donor (none when it caught up itself). */
    char copy[160] = "";
    if (donor0)
      snprintf(copy, sizeof copy,
               "; each donor a copy of its share only: %zu bytes on rank 0, its update waited "
               "%.3f s for it",
               held, wait_s);
    fprintf(r->out,
            "cohort-gpt2: rank(s) %s caught up: received %zu bytes of state in the background "
            "from %d rank(s) (the snapshot of step %llu, in at most %.3f s%s), replayed %zu "
            "step(s), contribute from step %llu\n",
            r->catch_who, r->snap_bytes, donors, (unsigned long long)r->catch_step, stream_s, copy,
            replayed, (unsigned long long)r->done + 1);
    fflush(r->out);
  }
  return st;
}

/* The run's last step is done while ranks still catch up: the ranks wait together for the state
 * (an agreed flag every 10 ms, 600 s at most), then finish it. */
int gpt2_catch_up_drain(train_run *r) {
  for (int i = 0; i < 60000; i++) {
    double x = r->catching && cohort_comm_state_stream_poll(r->stream, NULL) != 1;
    if (gpt2_ddp_sum(&r->ddp, &x, 1) != 0) return RUN_COMM;
    if (x == 0.0) return gpt2_catch_up_finish(r);
    int polled = r->catching ? cohort_comm_state_stream_poll(r->stream, NULL) : 0;
    if (polled < 0) {
      fprintf(r->errf, "cohort-gpt2: rank %d: the state stream from the donors failed: %s\n",
              r->rank, cohort_strerror(polled));
      return RUN_FAIL;
    }
    usleep(10000);
  }
  fprintf(r->errf, "cohort-gpt2: rank %d: the state stream did not end within 600 s\n", r->rank);
  return RUN_FAIL;
}

/* The state from the lowest rank at the agreed step to every rank without it (newcomers, survivors
 * behind), sent from and received into the model's and the exchange's own buffers. *moved: the
 * bytes each of them received (every piece, the step's report included). */
static int receive_state(train_run *r, int64_t mine, const join_view *v, double *xfer_s,
                         size_t *moved) {
  int receiver = mine < v->max;
  if (receiver) cohort_comm_mark_new(r->comm); /* also one whose stream ended before it caught up */
  gpt2_state_head head;
  int n;
  cohort_iov last = {&r->last, sizeof r->last}; /* step_stats: plain numbers */
  cohort_iov *iov =
      gpt2_state_pieces(&r->model, &r->ddp, &head, r->done, r->pos, r->o->seed, last, &n);
  if (iov == NULL) {
    fprintf(r->errf, "cohort-gpt2: rank %d: the state: %s\n", r->rank, strerror(-n));
    return RUN_FAIL;
  }
  *moved = 0;
  for (int i = 0; i < n; i++) *moved += iov[i].len;
  double t0 = gpt2_now_s();
  int rc = r->world > 1 ? cohort_comm_state_transferv(r->comm, iov, n) : 0;
  *xfer_s = gpt2_now_s() - t0;
  free(iov);
  if (rc != 0) {
    gpt2_ddp_fail(&r->ddp, rc, "state transfer");
    return RUN_COMM;
  }
  if (receiver) {
    if (gpt2_state_check(&head, &r->model, &r->ddp) != 0) {
      fprintf(r->errf, "cohort-gpt2: rank %d: the state received does not fit this model\n",
              r->rank);
      return RUN_FAIL;
    }
    /* This rank's own part: as the failed step left it when another rank completed that step,
     * else none. */
    gpt2_ddp_own_state_set(
        &r->ddp, mine >= 0 && mine + 1 == v->max && r->own_after_valid ? r->own_after : NULL);
    r->done = head.step;
    r->pos = head.data_pos;
  }
  r->start_step = r->done;
  r->stateful = 1;
  r->own_after_valid = 0;
  return RUN_OK;
}

/* Joins the current membership: agree on the step, hand the state to the ranks without it, check
 * that every rank holds the same parameters. With no state anywhere: the checkpoint. */
int gpt2_run_join(train_run *r, int old_world, double t0) {
  int64_t mine = r->stateful && !cohort_comm_is_new(r->comm, r->rank) ? (int64_t)r->done : -1;
  join_view v;
  int st = agree(r, mine, old_world, &v);
  r->t_agreed = gpt2_now_s();
  if (st != RUN_OK) return st;
  if (v.max < 0) {
    if (r->rank == 0)
      fprintf(r->out, "cohort-gpt2: no rank of the job has its state: resuming from %s\n",
              r->o->ckpt_dir ? r->o->ckpt_dir : "the start (no --ckpt-dir)");
    st = gpt2_run_resume(r);
    r->stateful = st == RUN_OK;
    return st;
  }
  if (v.catch_up) return start_catch_up(r, mine, &v, t0);
  double xfer_s = 0.0, t1 = gpt2_now_s();
  size_t bytes = 0;
  int first = r->newcomer && !r->stateful; /* a newcomer receiving its first state */
  st = receive_state(r, mine, &v, &xfer_s, &bytes);
  double t2 = gpt2_now_s();
  int same = 0;
  if (st == RUN_OK && gpt2_ddp_check_params(&r->ddp, &same) != 0) st = RUN_COMM;
  if (st == RUN_OK && !same) {
    fprintf(r->errf,
            "cohort-gpt2: rank %d: parameters differ between ranks after the state "
            "transfer\n",
            r->rank);
    st = RUN_FAIL;
  }
  if (st != RUN_OK) return st;
  if (first) { /* where a newcomer's time went (docs/gpt2.md "Re-form") */
    fprintf(r->out,
            "cohort-gpt2: rank %d (newcomer%s): set up %.3f s, joined the membership %.3f s "
            "later, exchange set up %.3f s, state %zu bytes in %.3f s (%.2f GB/s), checked "
            "%.3f s: %.3f s in all\n",
            r->rank, r->ahead ? ", started ahead" : "", r->t_setup - r->t_start,
            r->t_member - r->t_setup, t1 - r->t_member, bytes, xfer_s,
            xfer_s > 0 ? (double)bytes / xfer_s * 1e-9 : 0.0, gpt2_now_s() - t2,
            gpt2_now_s() - r->t_start);
    fflush(r->out);
  }
  /* Rank 0 may be a newcomer (a replacement takes its predecessor's place): the line comes from
   * what the ranks agreed on. */
  if (r->rank == 0 && v.old_world > 0) {
    fprintf(r->out,
            "cohort-gpt2: re-formed (epoch %d): world %d -> %d at step %lld (step in flight %s), "
            "%d rank(s) received %zu bytes of state in %.3f s, %.3f s in all\n",
            cohort_comm_epoch(r->comm), v.old_world, r->world, (long long)v.max,
            v.dropped  ? "dropped"
            : v.behind ? "kept"
                       : "none",
            v.nnew, v.nnew ? bytes : 0, xfer_s, gpt2_now_s() - t0);
    fflush(r->out);
  }
  r->in_step = 0;
  st = gpt2_run_open_outputs(r);
  return st == RUN_OK ? report_received(r, v.max) : st;
}

/* The membership ended (COHORT_ERESHAPED): keep the state of the last completed step, re-form the
 * communicator, set the exchange up for the new world and join it. Bounded: the agent stops a job
 * that keeps losing ranks (cohort_comm_reform then fails). */
int gpt2_run_reform(train_run *r) {
  double t0 = gpt2_now_s();
  int old_world = r->world;
  gpt2_catch_up_drop(r); /* a rank still catching up receives the state of the new membership */
  for (int round = 0; round < 64; round++) {
    int rc = cohort_comm_reform(r->comm);
    if (rc == COHORT_ERESHAPED) continue; /* it ended again while connecting: the next one */
    if (rc != 0) {
      fprintf(r->errf, "cohort-gpt2: rank %d: re-form failed: %s\n", r->rank,
              cohort_comm_error_message(r->comm)[0] ? cohort_comm_error_message(r->comm)
                                                    : cohort_strerror(rc));
      return RUN_FAIL;
    }
    if (gpt2_model_own_grads(&r->model) != 0) return RUN_FAIL;
    /* The state stays where it is: the new exchange takes over the old one's buffers. */
    r->t_formed = gpt2_now_s();
    gpt2_ddp old = r->ddp;
    memset(&r->ddp, 0, sizeof r->ddp);
    r->rank = cohort_comm_rank(r->comm);
    r->world = cohort_comm_size(r->comm);
    int st = gpt2_run_setup_exchange(r, &old);
    r->t_exchange = gpt2_now_s();
    if (st == RUN_OK) st = gpt2_run_join(r, old_world, t0);
    if (st != RUN_COMM || r->ddp.err != COHORT_ERESHAPED) return st;
  }
  fprintf(r->errf, "cohort-gpt2: rank %d: 64 re-forms in a row without a step: giving up\n",
          r->rank);
  return RUN_FAIL;
}

/* A step failed after its exchange: keeps this rank's own state as the exchange left it. */
void gpt2_run_keep_own_after(train_run *r) {
  size_t n = gpt2_ddp_own_state_floats(&r->ddp);
  if (!r->exchanged || n == 0 || !r->ddp.kept_valid) return;
  if (r->own_after == NULL) r->own_after = malloc(n * sizeof(float));
  if (r->own_after == NULL) return; /* then it starts from zero, as a newcomer's */
  gpt2_ddp_own_state_get(&r->ddp, r->own_after);
  r->own_after_valid = 1;
}

/* Tests (COHORT_GPT2_TEST_FAIL=K:PATH): this rank's step K completed all its collectives; once
 * PATH exists (the test made it when the other ranks completed K too: 60 s at most) it fails
 * as if the last had not, once. So this survivor is behind the others at the re-form it starts
 * (docs/gpt2.md "Re-form"): it must receive step K's state, and compute nothing again. */
int gpt2_run_test_fail(train_run *r) {
  r->test_fail_step = 0;
  for (int i = 0; i < 60000 && access(r->test_fail_path, F_OK) != 0; i++) usleep(1000);
  gpt2_ddp_fail(&r->ddp, COHORT_ERESHAPED, "test: a completed step made to fail");
  return RUN_COMM;
}

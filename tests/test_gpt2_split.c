/*
 * test_gpt2_split.c - the split exchange of a 16-bit wire (src/gpt2/ddp.c) between forked ranks of
 * a real communicator, 2 and 3 of them: the row path (the lookup's rows of the token embedding
 * exchanged and updated before the rest of it arrives) gives the bits of settling the whole token
 * embedding before the forward, step after step, with accumulation, token-embedding buckets of
 * whole rows and, with 3 ranks, rows left over for the allreduce; the upper layers' gathers leave
 * during backward; and the ranks' parameters agree.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt2/ddp.h"
#include "gpt2/internal.h"
#include "gpt2/rng.h"
#include "tests/check.h"
#include "tests/store_fork.h"

enum { TB = 2, TT = 16, ACCUM = 2, STEPS = 4, LAYERS = 4 };

typedef struct trainer {
  gpt2_model m;
  gpt2_ddp d;
  int rows_seen; /* forwards whose lookup found its rows updated by the row path */
} trainer;

static int trainer_init(trainer *t, cohort_comm *comm) {
  gpt2_config cfg;
  gpt2_config_preset("tiny", &cfg);
  cfg.layers = LAYERS;
  cfg.head = GPT2_HEAD_LM;
  gpt2_optim_config oc = {
      .kind = GPT2_OPT_ADAMW, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  memset(t, 0, sizeof *t);
  int rc = gpt2_model_init(&t->m, &cfg, TB, TT);
  /* Buckets of 4096 floats: the token embedding in 8 buckets of 64 rows. */
  gpt2_ddp_opts o = {.bucket_bytes = 4096 * sizeof(float), .accum = ACCUM, .wire = COHORT_BF16};
  if (rc == 0) rc = gpt2_ddp_init(&t->d, comm, &t->m, &oc, &o);
  if (rc == 0) gpt2_model_init_weights(&t->m, 3);
  return rc;
}

static void trainer_free(trainer *t) {
  gpt2_ddp_free(&t->d);
  gpt2_model_free(&t->m);
}

/* The row path, and a record of whether it had the lookup's rows ready. */
static int wait_rows(void *ctx, size_t lo, size_t hi, const int32_t *tokens, size_t ntok) {
  trainer *t = ctx;
  int stop = gpt2_ddp_param_wait(&t->d, lo, hi, tokens, ntok);
  if (tokens != NULL && gpt2_ddp_split_of(&t->d)->nrows > 0) t->rows_seen++;
  return stop;
}

/* The same waits without the tokens: the lookup waits for the whole token embedding. */
static int wait_whole(void *ctx, size_t lo, size_t hi, const int32_t *tokens, size_t ntok) {
  (void)tokens;
  (void)ntok;
  trainer *t = ctx;
  return gpt2_ddp_param_wait(&t->d, lo, hi, NULL, 0);
}

/* One optimiser step as cohort-gpt2 takes it; the mean loss of its micro-steps. */
static double train_step(trainer *t, gpt2_param_wait wait, int rank, int step, int world) {
  int32_t tok[TB * TT + 1];
  double loss = 0.0;
  for (int k = 0; k < ACCUM; k++) {
    uint64_t st = gpt2_rng_derive(91, (uint64_t)rank, (uint64_t)step, (uint64_t)k);
    for (int i = 0; i <= TB * TT; i++) tok[i] = (int32_t)(gpt2_rng_next(&st) % 512);
    gpt2_batch b = {.tokens = tok, .targets = tok + 1};
    loss += gpt2_forward_wait(&t->m, &b, wait, t);
    if (k == 0) CHECK_EQ_INT(gpt2_ddp_zero_grad(&t->d), 0); /* as cohort-gpt2 does */
    int scatter = gpt2_ddp_begin_backward(&t->d, step, k == ACCUM - 1, tok);
    gpt2_backward(&t->m, &b, 1.0f / (float)(ACCUM * world), gpt2_ddp_hook, &t->d, scatter);
  }
  double norm = 0.0;
  CHECK_EQ_INT(gpt2_ddp_finish_backward(&t->d), 0);
  /* The top quarter of the layers' buckets (layer 3 of 4) gathered during backward, the rest
   * not yet. */
  for (int i = 0; i < t->d.nbuckets; i++) {
    const gpt2_bucket *bk = &t->d.buckets[i];
    int early = bk->event == GPT2_EV_LAYER && bk->layer == LAYERS - 1;
    CHECK((bk->gather != NULL) == early);
  }
  CHECK_EQ_INT(gpt2_ddp_grad_norm(&t->d, &norm), 0);
  float scale = norm > 1.0 ? (float)(1.0 / norm) : 1.0f;
  CHECK_EQ_INT(gpt2_ddp_step(&t->d, scale, 1e-3f, step + 1), 0);
  return loss;
}

static int split_rank(int rank, int world, int port) {
  cohort_comm *comm = store_fork_comm(rank, world, port, "split");
  if (comm == NULL) return 1;
  trainer a, b;
  CHECK_EQ_INT(trainer_init(&a, comm), 0);
  CHECK_EQ_INT(trainer_init(&b, comm), 0);
  CHECK(strcmp(gpt2_ddp_mode(&a.d), "split") == 0);
  CHECK(gpt2_ddp_split_of(&a.d)->lo == 0);
  for (int step = 0; step < STEPS && check_failed_count == 0; step++) {
    double la = train_step(&a, wait_rows, rank, step, world);
    double lb = train_step(&b, wait_whole, rank, step, world);
    CHECK(la == lb);
  }
  /* Every step after the first found the lookup's rows updated ahead of their buckets. */
  CHECK_EQ_INT(a.rows_seen, STEPS - 1);
  CHECK_EQ_INT(gpt2_ddp_settle(&a.d), 0);
  CHECK_EQ_INT(gpt2_ddp_settle(&b.d), 0);
  CHECK(memcmp(a.m.params, b.m.params, a.m.nparams * sizeof(float)) == 0);
  CHECK(memcmp(a.d.shards[0].state, b.d.shards[0].state, a.d.shards[0].nstate * sizeof(float)) ==
        0);
  int same = 0;
  CHECK_EQ_INT(gpt2_ddp_check_params(&a.d, &same), 0);
  CHECK(same);
  trainer_free(&b);
  trainer_free(&a);
  cohort_comm_destroy(comm);
  return check_failed_count != 0;
}

int main(void) {
  CHECK_EQ_INT(store_fork_ranks(2, split_rank), 0);
  CHECK_EQ_INT(store_fork_ranks(3, split_rank), 0);
  return check_report();
}

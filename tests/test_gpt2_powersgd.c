/*
 * test_gpt2_powersgd.c - unit tests of PowerSGD (src/gpt2/powersgd.c) on one process: the
 * orthonormalisation, which tensors are compressed, a low-rank gradient passing exactly, error
 * feedback carrying the residual M - P Q^T into the next step, the state round trip, the groups
 * of a real model; and, between forked ranks of a real communicator, the exchange overlapped with
 * backward giving the same bits as the exchange after it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt2/ddp.h"
#include "gpt2/internal.h"
#include "gpt2/powersgd.h"
#include "gpt2/rng.h"
#include "tests/check.h"
#include "tests/store_fork.h"

static uint64_t rng_state = 7;

static void fill_randn(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = gpt2_rng_normal(&rng_state);
}

/* Largest |(A^T A)_jk - I_jk| of the row-major rows x cols matrix a. */
static double ortho_error(const float *a, int rows, int cols) {
  double worst = 0.0;
  for (int j = 0; j < cols; j++)
    for (int k = 0; k < cols; k++) {
      double d = 0.0;
      for (int i = 0; i < rows; i++) d += (double)a[i * cols + j] * a[i * cols + k];
      double e = fabs(d - (j == k ? 1.0 : 0.0));
      if (e > worst) worst = e;
    }
  return worst;
}

static void test_orthonormalize(void) {
  enum { R = 57, C = 5 };
  float a[R * C];
  fill_randn(a, R * C);
  gpt2_psgd_orthonormalize(a, R, C);
  CHECK(ortho_error(a, R, C) < 1e-5);
  /* A column that is a combination of earlier ones ends as zero, not as amplified rounding. */
  float b[R * 2];
  for (int i = 0; i < R; i++) b[i * 2] = b[i * 2 + 1] = (float)(i % 7) - 3.0f;
  gpt2_psgd_orthonormalize(b, R, 2);
  double n1 = 0.0;
  for (int i = 0; i < R; i++) n1 += (double)b[i * 2 + 1] * b[i * 2 + 1];
  CHECK(n1 < 1e-6);
}

/* A model of three tensors: a vector, a 40x30 matrix, a 3x100 matrix too thin to gain at rank 2,
 * and a vector: only the 40x30 matrix is compressed. */
enum { N0 = 6, ROWS = 40, COLS = 30, NPARAMS = N0 + ROWS * COLS + 300 + 5 };

static void fake_model(gpt2_model *m, gpt2_tensor t[4]) {
  memset(m, 0, sizeof *m);
  t[0] = (gpt2_tensor){"v0", 0, N0, 1, N0, 0};
  t[1] = (gpt2_tensor){"w", N0, ROWS * COLS, ROWS, COLS, 1};
  t[2] = (gpt2_tensor){"thin", N0 + ROWS * COLS, 300, 3, 100, 1};
  t[3] = (gpt2_tensor){"v1", N0 + ROWS * COLS + 300, 5, 1, 5, 0};
  m->tensors = t;
  m->ntensors = 4;
  m->nparams = NPARAMS;
}

/* State of rank `rank` for the fake model (t holds its tensors). */
static void setup(gpt2_psgd *s, gpt2_tensor t[4], int rank, uint64_t seed) {
  gpt2_model m;
  fake_model(&m, t);
  CHECK_EQ_INT(gpt2_psgd_init(s, &m, rank, seed), 0);
}

static void one_round(gpt2_psgd *s, float *g) {
  gpt2_psgd_compute_p(s, g, 0);
  gpt2_psgd_compute_q(s, g, 0);
  gpt2_psgd_decompress(s, g, 0, 1);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
  double w = 0.0;
  for (size_t i = 0; i < n; i++)
    if (fabs((double)a[i] - b[i]) > w) w = fabs((double)a[i] - b[i]);
  return w;
}

/* The sum of squares of g, in double, element by element. */
static double sumsq_of(const float *g, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
  return s;
}

/* gpt2_psgd_sumsq, from the factors, is the sum of squares of what is in g (to within the
 * rounding of the elements written in float). */
static void check_sumsq(const gpt2_psgd *s, const float *g) {
  double want = sumsq_of(g, NPARAMS), got = gpt2_psgd_sumsq(s, g);
  CHECK(want > 0.0 && fabs(got - want) <= 1e-6 * want);
}

static void test_layout(void) {
  gpt2_tensor t[4];
  gpt2_psgd s;
  setup(&s, t, 2, 1);
  CHECK_EQ_INT(s.nmats, 1);
  CHECK(s.mats[0].off == N0 && s.mats[0].rows == ROWS && s.mats[0].cols == COLS);
  CHECK(s.npacked == NPARAMS - ROWS * COLS);
  CHECK(s.np == ROWS * 2 && s.nq == COLS * 2 && s.nerr == ROWS * COLS);
  CHECK(ortho_error(s.Q, COLS, 2) < 1e-5); /* warm start from an orthonormal Q */
  gpt2_psgd_free(&s);
}

/* A rank-1 gradient is reproduced (P spans its columns), so nothing is left as error. */
static void test_low_rank_exact(void) {
  gpt2_tensor t[4];
  gpt2_psgd s;
  setup(&s, t, 2, 3);
  float u[ROWS], v[COLS], g[NPARAMS], want[NPARAMS];
  fill_randn(u, ROWS);
  fill_randn(v, COLS);
  fill_randn(g, NPARAMS);
  for (int i = 0; i < ROWS; i++)
    for (int j = 0; j < COLS; j++) g[N0 + i * COLS + j] = u[i] * v[j];
  memcpy(want, g, sizeof g);
  one_round(&s, g);
  CHECK(max_abs_diff(g, want, NPARAMS) < 1e-4);
  float zero[ROWS * COLS] = {0};
  static float err[ROWS * COLS];
  gpt2_psgd_error(&s, err);
  CHECK(max_abs_diff(err, zero, ROWS * COLS) < 1e-4);
  /* P's first column is u's direction, the second (dependent) one zero. */
  const float *P = s.packed + s.mats[0].p;
  double n0 = 0.0, n1 = 0.0;
  for (int i = 0; i < ROWS; i++) {
    n0 += (double)P[i * 2] * P[i * 2];
    n1 += (double)P[i * 2 + 1] * P[i * 2 + 1];
  }
  CHECK(fabs(n0 - 1.0) < 1e-5 && n1 == 0.0);
  gpt2_psgd_free(&s);
}

/* A full-rank gradient: P orthonormal, g's matrix replaced by P Q^T, the error exactly the residual
 * M - P Q^T, the plain tensors untouched; the next round starts from gradient + error. */
static void test_error_feedback(void) {
  gpt2_tensor t[4];
  gpt2_psgd s;
  setup(&s, t, 2, 5);
  static float g[NPARAMS], g0[NPARAMS], approx[ROWS * COLS];
  fill_randn(g, NPARAMS);
  memcpy(g0, g, sizeof g);
  one_round(&s, g);
  const float *P = s.packed + s.mats[0].p;
  CHECK(ortho_error(P, ROWS, 2) < 1e-5);
  for (int i = 0; i < ROWS; i++)
    for (int j = 0; j < COLS; j++) {
      double d = 0.0;
      for (int k = 0; k < 2; k++) d += (double)P[i * 2 + k] * s.Q[j * 2 + k];
      approx[i * COLS + j] = (float)d;
    }
  CHECK(max_abs_diff(g + N0, approx, ROWS * COLS) < 1e-4);
  check_sumsq(&s, g);
  static float resid[ROWS * COLS], err[ROWS * COLS];
  for (int i = 0; i < ROWS * COLS; i++) resid[i] = g0[N0 + i] - g[N0 + i];
  gpt2_psgd_error(&s, err);
  CHECK(max_abs_diff(err, resid, ROWS * COLS) < 1e-5);
  double rn = 0.0;
  for (int i = 0; i < ROWS * COLS; i++) rn += (double)resid[i] * resid[i];
  CHECK(rn > 1.0); /* rank 2 of a random 40x30 matrix loses most of it */
  CHECK(memcmp(g, g0, N0 * sizeof(float)) == 0);
  CHECK(memcmp(g + N0 + ROWS * COLS, g0 + N0 + ROWS * COLS, 305 * sizeof(float)) == 0);
  /* The next step: the matrix it compresses (in the error buffer until decompression) is the new
   * gradient plus the residual, and P is that matrix times Q. */
  static float g1[NPARAMS], m1[ROWS * COLS];
  fill_randn(g1, NPARAMS);
  for (int i = 0; i < ROWS * COLS; i++) m1[i] = g1[N0 + i] + resid[i];
  gpt2_psgd_compute_p(&s, g1, 0);
  CHECK(max_abs_diff(s.err, m1, ROWS * COLS) < 1e-6);
  double pq = 0.0;
  for (int j = 0; j < COLS; j++) pq += (double)m1[j] * s.Q[j * 2];
  CHECK(fabs(pq - P[0]) < 1e-4);
  gpt2_psgd_free(&s);
}

/* With two ranks each keeps M minus half the approximation: the errors sum to the residual of the
 * sum. (The sum is formed by hand here; the trainer's tests cover real ranks.) */
static void test_error_share(void) {
  gpt2_tensor t[4];
  gpt2_psgd s;
  setup(&s, t, 1, 9);
  static float g[NPARAMS], g0[NPARAMS];
  fill_randn(g, NPARAMS);
  memcpy(g0, g, sizeof g);
  gpt2_psgd_compute_p(&s, g, 0);
  gpt2_psgd_compute_q(&s, g, 0);
  gpt2_psgd_decompress(&s, g, 0, 2);
  check_sumsq(&s, g);
  float *err = malloc(s.nerr * sizeof(float)); /* rank 1 compresses the thin matrix too */
  gpt2_psgd_error(&s, err);
  int ok = 1;
  for (int i = 0; i < ROWS * COLS; i++)
    ok &= fabsf(err[i] - (g0[N0 + i] - 0.5f * g[N0 + i])) < 1e-5f;
  CHECK(ok);
  free(err);
  gpt2_psgd_free(&s);
}

/* The update that makes P Q^T as it reads it gives the parameters and optimiser state of writing
 * P Q^T into the gradients and updating from them, bit for bit (AdamW over two steps, and SGD),
 * and leaves the gradients as they were: a vector, a 5 x 4100 matrix (rows wider than the
 * update's 2048-float pieces, a tail off the vector width) and a vector. */
enum { WR = 5, WC = 4100, WN = 6 + WR * WC + 7 };

static void fused_case(gpt2_opt_kind kind) {
  gpt2_tensor t[3] = {
      {"v0", 0, 6, 1, 6, 0}, {"w", 6, WR * WC, WR, WC, 1}, {"v1", 6 + WR * WC, 7, 1, 7, 0}};
  gpt2_model ma = {.nparams = WN, .tensors = t, .ntensors = 3}, mb = ma;
  gpt2_optim_config oc = {.kind = kind,
                          .beta1 = 0.9f,
                          .beta2 = 0.95f,
                          .eps = 1e-8f,
                          .momentum = 0.5f,
                          .weight_decay = 0.1f};
  gpt2_psgd a, b;
  gpt2_optim oa, ob;
  CHECK_EQ_INT(gpt2_psgd_init(&a, &ma, 2, 21), 0);
  CHECK_EQ_INT(gpt2_psgd_init(&b, &mb, 2, 21), 0);
  CHECK_EQ_INT(a.nmats, 1);
  CHECK_EQ_INT(gpt2_optim_init(&oa, &oc, 0, WN), 0);
  CHECK_EQ_INT(gpt2_optim_init(&ob, &oc, 0, WN), 0);
  float *buf = malloc(4 * WN * sizeof(float));
  ma.params = buf, ma.grads = buf + WN, mb.params = buf + 2 * WN, mb.grads = buf + 3 * WN;
  fill_randn(ma.params, WN);
  memcpy(mb.params, ma.params, WN * sizeof(float));
  for (int step = 1; step <= 2; step++) {
    fill_randn(ma.grads, WN);
    memcpy(mb.grads, ma.grads, WN * sizeof(float));
    gpt2_psgd_compute_p(&a, ma.grads, 0);
    gpt2_psgd_compute_q(&a, ma.grads, 0);
    gpt2_psgd_decompress(&a, ma.grads, 0, 2);
    gpt2_optim_step(&oa, &ma, ma.params, ma.grads, 0.7f, 1e-2f, step);
    gpt2_psgd_compute_p(&b, mb.grads, 0);
    gpt2_psgd_compute_q(&b, mb.grads, 0);
    gpt2_psgd_complete(&b, 0, 2);
    float *g0 = malloc(WN * sizeof(float));
    memcpy(g0, mb.grads, WN * sizeof(float));
    gpt2_psgd_update(&b, &ob, &mb, mb.grads, 0.7f, 1e-2f, step);
    CHECK(memcmp(g0, mb.grads, WN * sizeof(float)) == 0);
    CHECK(gpt2_psgd_sumsq(&a, ma.grads) == gpt2_psgd_sumsq(&b, mb.grads));
    free(g0);
  }
  CHECK(memcmp(ma.params, mb.params, WN * sizeof(float)) == 0);
  CHECK(memcmp(oa.state, ob.state, oa.nstate * sizeof(float)) == 0);
  CHECK(memcmp(a.err, b.err, a.nerr * sizeof(float)) == 0);
  free(buf);
  gpt2_optim_free(&oa);
  gpt2_optim_free(&ob);
  gpt2_psgd_free(&a);
  gpt2_psgd_free(&b);
}

static void test_fused_update(void) {
  fused_case(GPT2_OPT_ADAMW);
  fused_case(GPT2_OPT_SGD);
}

static void test_state_round_trip(void) {
  gpt2_tensor t[4];
  gpt2_psgd a, b;
  setup(&a, t, 2, 11);
  setup(&b, t, 2, 12);
  static float g[NPARAMS];
  fill_randn(g, NPARAMS);
  one_round(&a, g);
  CHECK(gpt2_psgd_state_floats(&a, 3) == a.nq + 3 * a.nerr);
  size_t n = gpt2_psgd_state_floats(&a, 1);
  float *full = malloc(n * sizeof(float));
  CHECK_EQ_INT(gpt2_psgd_state_get(&a, NULL, full), 0);
  gpt2_psgd_state_set(&b, 0, full);
  CHECK(memcmp(a.Q, b.Q, a.nq * sizeof(float)) == 0);
  /* a keeps its last M and factors, b the error they stand for: the same error, and the same
   * next step, bit for bit. */
  float *ea = malloc(a.nerr * sizeof(float)), *eb = malloc(a.nerr * sizeof(float));
  gpt2_psgd_error(&a, ea);
  gpt2_psgd_error(&b, eb);
  CHECK(memcmp(ea, eb, a.nerr * sizeof(float)) == 0);
  CHECK(memcmp(ea, full + a.nq, a.nerr * sizeof(float)) == 0);
  static float ga[NPARAMS], gb[NPARAMS];
  fill_randn(ga, NPARAMS);
  memcpy(gb, ga, sizeof ga);
  one_round(&a, ga);
  one_round(&b, gb);
  CHECK(memcmp(ga, gb, sizeof ga) == 0);
  CHECK(memcmp(a.err, b.err, a.nerr * sizeof(float)) == 0);
  free(ea);
  free(eb);
  free(full);
  gpt2_psgd_free(&a);
  gpt2_psgd_free(&b);
}

/* The tiny model's groups: the last layer with ln_f, each layer, the embeddings; each group's
 * matrices and uncompressed ranges inside it, the packed blocks and Q blocks back to back. */
static void test_groups(void) {
  gpt2_config cfg;
  CHECK_EQ_INT(gpt2_config_preset("tiny", &cfg), 0);
  cfg.layers = 3;
  cfg.head = GPT2_HEAD_LM;
  gpt2_model m;
  CHECK_EQ_INT(gpt2_model_init(&m, &cfg, 2, 8), 0);
  gpt2_psgd s;
  CHECK_EQ_INT(gpt2_psgd_init(&s, &m, 2, 1), 0);
  CHECK_EQ_INT(s.ngroups, 4);
  CHECK(s.groups[0].hi == m.nparams && s.groups[3].lo == 0);
  CHECK_EQ_INT(gpt2_psgd_group_of(&s, GPT2_EV_LAYER, 2), 0);
  CHECK_EQ_INT(gpt2_psgd_group_of(&s, GPT2_EV_LAYER, 0), 2);
  CHECK_EQ_INT(gpt2_psgd_group_of(&s, GPT2_EV_EMBED, -1), 3);
  CHECK_EQ_INT(gpt2_psgd_group_of(&s, GPT2_EV_TAIL, -1), -1);
  size_t pk = 0, covered = 0, q = s.nq;
  int ok = 1;
  for (int g = 0; g < s.ngroups; g++) {
    const gpt2_psgd_group *gr = &s.groups[g];
    ok &= g == 0 || gr->hi == s.groups[g - 1].lo;
    ok &= gr->pk == pk && gr->m1 > gr->m0; /* every group has matrices (wte and wpe, weights) */
    for (int i = gr->m0; i < gr->m1; i++) {
      const gpt2_psgd_mat *x = &s.mats[i];
      ok &= x->off >= gr->lo && x->off + (size_t)x->rows * (size_t)x->cols <= gr->hi;
      ok &= x->p >= gr->pk && x->p + (size_t)x->rows * 2 <= gr->pk + gr->npk;
      covered += (size_t)x->rows * (size_t)x->cols;
    }
    for (int i = gr->pl0; i < gr->pl1; i++) {
      ok &= s.plain[i][0] >= gr->lo && s.plain[i][1] <= gr->hi;
      covered += s.plain[i][1] - s.plain[i][0];
    }
    ok &= gr->q + gr->nq == q; /* Q in memory order: the groups from the top down */
    q = gr->q;
    pk += gr->npk;
  }
  CHECK(ok);
  CHECK(q == 0 && pk == s.npacked + s.np && covered == m.nparams);
  gpt2_psgd_free(&s);
  gpt2_model_free(&m);
}

/* ---- the overlapped exchange between real ranks ---- */

enum { WORLD = 3, STEPS = 4, ACCUM = 2, TB = 2, TT = 16 };

/* One rank's trainer: a tiny model, its data parallelism with PowerSGD of rank 2 from the second
 * step on, and what the hook saw when backward ended. */
typedef struct trainer {
  gpt2_model m;
  gpt2_ddp d;
  int launched_at_end, first_stage_at_end;
} trainer;

static int trainer_init(trainer *t, cohort_comm *comm, int overlap) {
  gpt2_config cfg;
  gpt2_config_preset("tiny", &cfg);
  cfg.layers = 3;
  cfg.head = GPT2_HEAD_LM;
  gpt2_optim_config oc = {
      .kind = GPT2_OPT_ADAMW, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  int rc = gpt2_model_init(&t->m, &cfg, TB, TT);
  gpt2_ddp_opts o = {.bucket_bytes = 4096 * sizeof(float),
                     .accum = ACCUM,
                     .powersgd_rank = 2,
                     .powersgd_start = 1,
                     .seed = 5,
                     .powersgd_after_backward = !overlap};
  if (rc == 0) rc = gpt2_ddp_init(&t->d, comm, &t->m, &oc, &o);
  if (rc != 0) return rc;
  gpt2_model_init_weights(&t->m, 3);
  return 0;
}

static int probe_hook(void *ctx, gpt2_grad_event ev, int layer) {
  trainer *t = ctx;
  int stop = gpt2_ddp_hook(&t->d, ev, layer);
  const gpt2_ddp_powersgd *p = gpt2_ddp_powersgd_of(&t->d);
  if (ev == GPT2_EV_EMBED && p->now) {
    t->launched_at_end = p->s.nlaunched;
    t->first_stage_at_end = p->s.groups[0].stage;
  }
  return stop;
}

/* Forward and backward of one step's micro-steps on this rank's tokens, the exchange. */
static int trainer_backward(trainer *t, int rank, int step) {
  int32_t tok[TB * TT + 1];
  gpt2_zero_grad(&t->m);
  t->launched_at_end = t->first_stage_at_end = -1;
  for (int k = 0; k < ACCUM; k++) {
    uint64_t st = gpt2_rng_derive(77, (uint64_t)rank, (uint64_t)step, (uint64_t)k);
    for (int i = 0; i <= TB * TT; i++) tok[i] = (int32_t)(gpt2_rng_next(&st) % 512);
    gpt2_batch b = {.tokens = tok, .targets = tok + 1};
    gpt2_forward(&t->m, &b);
    int scatter = gpt2_ddp_begin_backward(&t->d, step, k == ACCUM - 1, tok);
    gpt2_backward(&t->m, &b, 1.0f / (ACCUM * WORLD), probe_hook, t, scatter);
  }
  return gpt2_ddp_finish_backward(&t->d);
}

/* A rank: two trainers on one communicator, one overlapping the exchange with backward, one
 * exchanging after it; their gradients, then parameters and PowerSGD state, agree bit for bit. */
static int overlap_rank(int rank, int world, int port) {
  cohort_comm *comm = store_fork_comm(rank, world, port, "psgd-overlap");
  if (comm == NULL) return 1;
  trainer a, b;
  CHECK_EQ_INT(trainer_init(&a, comm, 1), 0);
  CHECK_EQ_INT(trainer_init(&b, comm, 0), 0);
  for (int step = 0; step < STEPS && check_failed_count == 0; step++) {
    CHECK_EQ_INT(trainer_backward(&a, rank, step), 0);
    CHECK_EQ_INT(trainer_backward(&b, rank, step), 0);
    CHECK(memcmp(a.m.grads, b.m.grads, a.m.nparams * sizeof(float)) == 0);
    if (step >= 1) {
      /* Overlapped: all launched inside backward, the first group moved on by the launches
       * after it (done when more than 2 x GPT2_PSGD_LAG followed); else none launched. */
      int ngroups = gpt2_ddp_powersgd_of(&a.d)->s.ngroups;
      CHECK_EQ_INT(a.launched_at_end, ngroups);
      CHECK_EQ_INT(a.first_stage_at_end, ngroups > 2 * GPT2_PSGD_LAG ? 3 : 2);
      CHECK_EQ_INT(b.launched_at_end, 0);
      CHECK(a.d.wire_bytes == b.d.wire_bytes && a.d.wire_bytes < 0.5 * a.d.f32_bytes);
    }
    CHECK_EQ_INT(gpt2_ddp_step(&a.d, 1.0f, 1e-3f, step + 1), 0);
    CHECK_EQ_INT(gpt2_ddp_step(&b.d, 1.0f, 1e-3f, step + 1), 0);
  }
  CHECK(memcmp(a.m.params, b.m.params, a.m.nparams * sizeof(float)) == 0);
  const gpt2_psgd *pa = &gpt2_ddp_powersgd_of(&a.d)->s, *pb = &gpt2_ddp_powersgd_of(&b.d)->s;
  CHECK(memcmp(pa->err, pb->err, pa->nerr * sizeof(float)) == 0);
  CHECK(memcmp(pa->Q, pb->Q, pa->nq * sizeof(float)) == 0);
  gpt2_ddp_free(&b.d);
  gpt2_ddp_free(&a.d);
  gpt2_model_free(&b.m);
  gpt2_model_free(&a.m);
  cohort_comm_destroy(comm);
  return check_failed_count != 0;
}

int main(void) {
  CHECK_EQ_INT(store_fork_ranks(WORLD, overlap_rank), 0);
  test_orthonormalize();
  test_layout();
  test_low_rank_exact();
  test_error_feedback();
  test_error_share();
  test_fused_update();
  test_state_round_trip();
  test_groups();
  return check_report();
}

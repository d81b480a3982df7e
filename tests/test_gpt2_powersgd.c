/*
 * test_gpt2_powersgd.c - unit tests of PowerSGD (src/gpt2/powersgd.c) on one process: the
 * orthonormalisation, which tensors are compressed, a low-rank gradient passing exactly, error
 * feedback carrying the residual M - P Q^T into the next step, and the state round trip.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2/powersgd.h"
#include "gpt2/rng.h"
#include "tests/check.h"

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
  gpt2_psgd_compute_p(s, g);
  gpt2_psgd_compute_q(s, g);
  gpt2_psgd_decompress(s, g, 1);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
  double w = 0.0;
  for (size_t i = 0; i < n; i++)
    if (fabs((double)a[i] - b[i]) > w) w = fabs((double)a[i] - b[i]);
  return w;
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
  CHECK(max_abs_diff(s.err, zero, ROWS * COLS) < 1e-4);
  /* P's first column is u's direction, the second (dependent) one zero. */
  double n0 = 0.0, n1 = 0.0;
  for (int i = 0; i < ROWS; i++)
    n0 += (double)s.P[i * 2] * s.P[i * 2], n1 += (double)s.P[i * 2 + 1] * s.P[i * 2 + 1];
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
  CHECK(ortho_error(s.P, ROWS, 2) < 1e-5);
  for (int i = 0; i < ROWS; i++)
    for (int j = 0; j < COLS; j++) {
      double d = 0.0;
      for (int k = 0; k < 2; k++) d += (double)s.P[i * 2 + k] * s.Q[j * 2 + k];
      approx[i * COLS + j] = (float)d;
    }
  CHECK(max_abs_diff(g + N0, approx, ROWS * COLS) < 1e-4);
  static float resid[ROWS * COLS];
  for (int i = 0; i < ROWS * COLS; i++) resid[i] = g0[N0 + i] - g[N0 + i];
  CHECK(max_abs_diff(s.err, resid, ROWS * COLS) < 1e-5);
  double rn = 0.0;
  for (int i = 0; i < ROWS * COLS; i++) rn += (double)resid[i] * resid[i];
  CHECK(rn > 1.0); /* rank 2 of a random 40x30 matrix loses most of it */
  CHECK(memcmp(g, g0, N0 * sizeof(float)) == 0);
  CHECK(memcmp(g + N0 + ROWS * COLS, g0 + N0 + ROWS * COLS, 305 * sizeof(float)) == 0);
  /* The next step: the matrix it compresses is the new gradient plus the residual. */
  static float g1[NPARAMS], m1[ROWS * COLS];
  fill_randn(g1, NPARAMS);
  for (int i = 0; i < ROWS * COLS; i++) m1[i] = g1[N0 + i] + resid[i];
  gpt2_psgd_compute_p(&s, g1);
  CHECK(max_abs_diff(g1 + N0, m1, ROWS * COLS) < 1e-6);
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
  gpt2_psgd_compute_p(&s, g);
  gpt2_psgd_compute_q(&s, g);
  gpt2_psgd_decompress(&s, g, 2);
  int ok = 1;
  for (int i = 0; i < ROWS * COLS; i++)
    ok &= fabsf(s.err[i] - (g0[N0 + i] - 0.5f * g[N0 + i])) < 1e-5f;
  CHECK(ok);
  gpt2_psgd_free(&s);
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
  CHECK(memcmp(a.err, b.err, a.nerr * sizeof(float)) == 0);
  free(full);
  gpt2_psgd_free(&a);
  gpt2_psgd_free(&b);
}

int main(void) {
  test_orthonormalize();
  test_layout();
  test_low_rank_exact();
  test_error_feedback();
  test_error_share();
  test_state_round_trip();
  return check_report();
}

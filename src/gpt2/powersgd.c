/* powersgd.c - PowerSGD gradient compression with error feedback (see powersgd.h). */
#include "gpt2/powersgd.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2/rng.h"

static double col_norm2(const float *a, int rows, int cols, int j) {
  double n2 = 0.0;
  for (int i = 0; i < rows; i++) n2 += (double)a[(size_t)i * cols + j] * a[(size_t)i * cols + j];
  return n2;
}

void gpt2_psgd_orthonormalize(float *a, int rows, int cols) {
  for (int j = 0; j < cols; j++) {
    double before = col_norm2(a, rows, cols, j);
    /* Modified Gram-Schmidt: remove the earlier (already unit) columns one by one. */
    for (int k = 0; k < j; k++) {
      double d = 0.0;
      for (int i = 0; i < rows; i++) d += (double)a[(size_t)i * cols + j] * a[(size_t)i * cols + k];
      for (int i = 0; i < rows; i++) a[(size_t)i * cols + j] -= (float)d * a[(size_t)i * cols + k];
    }
    double n2 = col_norm2(a, rows, cols, j);
    /* What is left of a column that depended on the earlier ones (or was zero) is rounding error
     * with no direction worth keeping: normalising it would make a column neither orthogonal nor
     * meaningful, so it becomes zero. */
    float inv = n2 > 1e-10 * before && n2 > 1e-30 ? (float)(1.0 / sqrt(n2)) : 0.0f;
    for (int i = 0; i < rows; i++) a[(size_t)i * cols + j] *= inv;
  }
}

static int worth_compressing(const gpt2_tensor *t, int rank) {
  double rows = t->rows, cols = t->cols;
  return t->rows > 1 && rows * cols > 2.0 * rank * (rows + cols);
}

/* The plain ranges: the complement of the matrices in [0, nparams), in order. */
static int add_plain(gpt2_psgd *s, size_t lo, size_t hi) {
  if (hi <= lo) return 0;
  size_t(*np)[2] = realloc(s->plain, (size_t)(s->nplain + 1) * sizeof(*np));
  if (np == NULL) return -ENOMEM;
  s->plain = np;
  s->plain[s->nplain][0] = lo;
  s->plain[s->nplain][1] = hi;
  s->nplain++;
  s->npacked += hi - lo;
  return 0;
}

static int choose_matrices(gpt2_psgd *s, const gpt2_model *m) {
  s->mats = calloc((size_t)m->ntensors, sizeof(gpt2_psgd_mat));
  if (s->mats == NULL) return -ENOMEM;
  size_t next = 0; /* first element not yet classified; tensors are in memory order */
  for (int i = 0; i < m->ntensors; i++) {
    const gpt2_tensor *t = &m->tensors[i];
    if (!worth_compressing(t, s->rank)) continue;
    int rc = add_plain(s, next, t->offset);
    if (rc != 0) return rc;
    s->mats[s->nmats++] = (gpt2_psgd_mat){t->offset, t->rows, t->cols, s->np, s->nq, s->nerr};
    s->np += (size_t)t->rows * (size_t)s->rank;
    s->nq += (size_t)t->cols * (size_t)s->rank;
    s->nerr += t->size;
    next = t->offset + t->size;
  }
  return add_plain(s, next, m->nparams);
}

int gpt2_psgd_init(gpt2_psgd *s, const gpt2_model *m, int rank, uint64_t seed) {
  memset(s, 0, sizeof *s);
  s->rank = rank;
  int rc = choose_matrices(s, m);
  if (rc == 0) {
    /* The packed plain part and P are summed in one allreduce, so they are one buffer. */
    s->packed = malloc((s->npacked + s->np + 1) * sizeof(float));
    s->Q = malloc((s->nq + 1) * sizeof(float));
    s->err = calloc(s->nerr + 1, sizeof(float));
    if (!s->packed || !s->Q || !s->err) rc = -ENOMEM;
  }
  if (rc != 0) {
    gpt2_psgd_free(s);
    return rc;
  }
  s->P = s->packed + s->npacked;
  uint64_t st = gpt2_rng_derive(seed, 0x9057u, (uint64_t)rank, 0);
  for (size_t i = 0; i < s->nq; i++) s->Q[i] = gpt2_rng_normal(&st);
  for (int i = 0; i < s->nmats; i++)
    gpt2_psgd_orthonormalize(s->Q + s->mats[i].q, s->mats[i].cols, rank);
  return 0;
}

void gpt2_psgd_free(gpt2_psgd *s) {
  if (s == NULL) return;
  free(s->mats);
  free(s->plain);
  free(s->packed);
  free(s->Q);
  free(s->err);
  memset(s, 0, sizeof *s);
}

void gpt2_psgd_compute_p(gpt2_psgd *s, float *g) {
  const int r = s->rank;
#pragma omp parallel for schedule(dynamic)
  for (int i = 0; i < s->nmats; i++) {
    const gpt2_psgd_mat *x = &s->mats[i];
    float *M = g + x->off;
    const float *e = s->err + x->e;
    size_t n = (size_t)x->rows * (size_t)x->cols;
    for (size_t k = 0; k < n; k++) M[k] += e[k];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, x->rows, r, x->cols, 1.0f, M, x->cols,
                s->Q + x->q, r, 0.0f, s->P + x->p, r);
  }
}

void gpt2_psgd_compute_q(gpt2_psgd *s, const float *g) {
  const int r = s->rank;
#pragma omp parallel for schedule(dynamic)
  for (int i = 0; i < s->nmats; i++) {
    const gpt2_psgd_mat *x = &s->mats[i];
    gpt2_psgd_orthonormalize(s->P + x->p, x->rows, r);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, x->cols, r, x->rows, 1.0f, g + x->off,
                x->cols, s->P + x->p, r, 0.0f, s->Q + x->q, r);
  }
}

void gpt2_psgd_decompress(gpt2_psgd *s, float *g, int world) {
  const int r = s->rank;
  const float share = 1.0f / (float)world;
#pragma omp parallel for schedule(dynamic)
  for (int i = 0; i < s->nmats; i++) {
    const gpt2_psgd_mat *x = &s->mats[i];
    float *M = g + x->off, *e = s->err + x->e;
    size_t n = (size_t)x->rows * (size_t)x->cols;
    memcpy(e, M, n * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, x->rows, x->cols, r, 1.0f, s->P + x->p, r,
                s->Q + x->q, r, 0.0f, M, x->cols);
    /* This rank's share of the sum is 1/world of the approximation; the rest of its M is kept. */
    for (size_t k = 0; k < n; k++) e[k] -= share * M[k];
  }
}

/* Moves the plain ranges of g into the packed buffer (out != 0) or back. */
static void pack(gpt2_psgd *s, float *g, int out) {
  float *p = s->packed;
  for (int i = 0; i < s->nplain; i++) {
    size_t lo = s->plain[i][0], n = s->plain[i][1] - lo;
    if (out)
      memcpy(p, g + lo, n * sizeof(float));
    else
      memcpy(g + lo, p, n * sizeof(float));
    p += n;
  }
}

int gpt2_psgd_allreduce(gpt2_psgd *s, cohort_comm *comm, float *g, double *bytes) {
  int world = cohort_comm_size(comm);
  pack(s, g, 1);
  gpt2_psgd_compute_p(s, g);
  int rc = cohort_allreduce(comm, s->packed, s->packed, s->npacked + s->np, COHORT_F32, COHORT_SUM);
  if (rc != 0) return rc;
  pack(s, g, 0);
  gpt2_psgd_compute_q(s, g);
  rc = cohort_allreduce(comm, s->Q, s->Q, s->nq, COHORT_F32, COHORT_SUM);
  if (rc != 0) return rc;
  gpt2_psgd_decompress(s, g, world);
  *bytes += (double)(s->npacked + s->np + s->nq) * sizeof(float);
  return 0;
}

size_t gpt2_psgd_state_floats(const gpt2_psgd *s, int world) {
  return s->nq + (size_t)world * s->nerr;
}

int gpt2_psgd_state_get(gpt2_psgd *s, cohort_comm *comm, float *full) {
  memcpy(full, s->Q, s->nq * sizeof(float));
  int world = comm ? cohort_comm_size(comm) : 1, me = comm ? cohort_comm_rank(comm) : 0;
  const size_t chunk = 16u << 20; /* floats per call: bounded transfers */
  for (int r = 0; r < world; r++) {
    float *e = full + s->nq + (size_t)r * s->nerr;
    if (r == me) memcpy(e, s->err, s->nerr * sizeof(float));
    for (size_t a = 0; a < s->nerr && world > 1; a += chunk) {
      size_t n = a + chunk < s->nerr ? chunk : s->nerr - a;
      int rc = cohort_broadcast(comm, e + a, n, COHORT_F32, r);
      if (rc != 0) return rc;
    }
  }
  return 0;
}

void gpt2_psgd_state_set(gpt2_psgd *s, int rank, const float *full) {
  memcpy(s->Q, full, s->nq * sizeof(float));
  memcpy(s->err, full + s->nq + (size_t)rank * s->nerr, s->nerr * sizeof(float));
}

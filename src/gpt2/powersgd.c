/* powersgd.c - PowerSGD gradient compression with error feedback, in groups that can overlap
 * backward (see powersgd.h). */
#include "gpt2/powersgd.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2/kernels.h"
#include "gpt2/optim.h"
#include "gpt2/rng.h"

/* The kernels stream each matrix once per stage, row by row, and call no matrix product for these
 * thin factors: a rank-r product does 2r flops an element, so it is a pass over memory, and BLAS's
 * packing (and its zeroing of an output it then overwrites) adds passes of its own. Every sum has
 * a fixed order whatever the vector width or the thread count: a row's dot products in LANES
 * partial sums added in lane order, a column's sum over the rows in row order. Threads take whole
 * rows (stage 1, the reconstruction) or whole columns (stage 2): ROW_TILE rows a task in stage 1;
 * the factors' columns KB at a time (zeros beyond the rank); stage 2's sums in COL_FLOATS floats,
 * in the first-level cache. */
enum { LANES = 8, KB = 4, ROW_TILE = 64, COL_FLOATS = 4096 };

/* The row kernels are built for AVX2 and for the baseline (GPT2_CLONES): the same bits, since the
 * order of every sum is fixed. */
#define ROW_KERNEL GPT2_CLONES

static int kblocks(int r) {
  return (r + KB - 1) / KB;
}

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

/* The group boundaries, from the top of the buffer down: the last layer (with ln_f and the QA
 * head), each layer, the embeddings; one group without layers. */
static int cut_groups(gpt2_psgd *s, const gpt2_model *m) {
  int L = m->cfg.layers;
  s->groups = calloc((size_t)L + 1, sizeof *s->groups);
  if (s->groups == NULL) return -ENOMEM;
  size_t hi = m->nparams;
  for (int l = L - 1; l >= 0; l--) {
    size_t lo = m->layer_offset0 + (size_t)l * m->layer_size;
    s->groups[s->ngroups++] =
        (gpt2_psgd_group){.lo = lo, .hi = hi, .ev = GPT2_EV_LAYER, .layer = l};
    hi = lo;
  }
  s->groups[s->ngroups++] = (gpt2_psgd_group){.lo = 0, .hi = hi, .ev = GPT2_EV_EMBED, .layer = -1};
  return 0;
}

/* Whether a group boundary lies strictly inside (lo, hi); *at is the lowest. */
static int boundary_in(const gpt2_psgd *s, size_t lo, size_t hi, size_t *at) {
  int found = 0;
  for (int g = 0; g < s->ngroups; g++) {
    size_t b = s->groups[g].lo;
    if (b > lo && b < hi && (!found || b < *at)) *at = b, found = 1;
  }
  return found;
}

/* Adds [lo, hi) to the uncompressed ranges (in memory order), cut at group boundaries. */
static int add_plain(gpt2_psgd *s, size_t lo, size_t hi) {
  while (lo < hi) {
    size_t end = hi;
    boundary_in(s, lo, hi, &end);
    size_t(*np)[2] = realloc(s->plain, (size_t)(s->nplain + 1) * sizeof(*np));
    if (np == NULL) return -ENOMEM;
    s->plain = np;
    s->plain[s->nplain][0] = lo;
    s->plain[s->nplain][1] = end;
    s->nplain++;
    s->npacked += end - lo;
    lo = end;
  }
  return 0;
}

/* The matrices (Q and error offsets in memory order) and the uncompressed ranges. */
static int choose_matrices(gpt2_psgd *s, const gpt2_model *m) {
  s->mats = calloc((size_t)m->ntensors + 1, sizeof(gpt2_psgd_mat));
  if (s->mats == NULL) return -ENOMEM;
  size_t next = 0; /* first element not yet classified; tensors are in memory order */
  for (int i = 0; i < m->ntensors; i++) {
    const gpt2_tensor *t = &m->tensors[i];
    if (!worth_compressing(t, s->rank)) continue;
    int rc = add_plain(s, next, t->offset);
    if (rc != 0) return rc;
    s->mats[s->nmats++] = (gpt2_psgd_mat){t->offset, t->rows, t->cols, 0, s->nq, s->nerr};
    s->np += (size_t)t->rows * (size_t)s->rank;
    s->nq += (size_t)t->cols * (size_t)s->rank;
    s->nerr += t->size;
    next = t->offset + t->size;
  }
  return add_plain(s, next, m->nparams);
}

/* Each group's matrices and ranges, its packed block (in group order) and its block of Q. */
static void lay_out_groups(gpt2_psgd *s) {
  size_t pk = 0;
  for (int g = 0; g < s->ngroups; g++) {
    gpt2_psgd_group *gr = &s->groups[g];
    gr->m0 = gr->m1 = gr->pl0 = gr->pl1 = 0;
    for (int i = 0; i < s->nmats; i++) {
      if (s->mats[i].off < gr->lo || s->mats[i].off >= gr->hi) continue;
      if (gr->m1 == gr->m0) gr->m0 = i;
      gr->m1 = i + 1;
    }
    size_t plain = 0;
    for (int i = 0; i < s->nplain; i++) {
      if (s->plain[i][0] < gr->lo || s->plain[i][0] >= gr->hi) continue;
      if (gr->pl1 == gr->pl0) gr->pl0 = i;
      gr->pl1 = i + 1;
      plain += s->plain[i][1] - s->plain[i][0];
    }
    gr->pk = pk;
    size_t p = pk + plain;
    for (int i = gr->m0; i < gr->m1; i++) {
      s->mats[i].p = p;
      p += (size_t)s->mats[i].rows * (size_t)s->rank;
    }
    gr->npk = p - pk;
    gr->q = gr->m1 > gr->m0 ? s->mats[gr->m0].q : 0;
    gr->nq = 0;
    for (int i = gr->m0; i < gr->m1; i++) gr->nq += (size_t)s->mats[i].cols * (size_t)s->rank;
    pk = p;
  }
}

/* Room for one factor of any matrix in blocks (to_blocks). */
static size_t scratch_floats(const gpt2_psgd *s) {
  size_t n = 0;
  for (int i = 0; i < s->nmats; i++) {
    size_t big =
        s->mats[i].rows > s->mats[i].cols ? (size_t)s->mats[i].rows : (size_t)s->mats[i].cols;
    if (big > n) n = big;
  }
  return n * (size_t)kblocks(s->rank) * KB;
}

int gpt2_psgd_init(gpt2_psgd *s, const gpt2_model *m, int rank, uint64_t seed) {
  memset(s, 0, sizeof *s);
  s->rank = rank;
  int rc = cut_groups(s, m);
  if (rc == 0) rc = choose_matrices(s, m);
  if (rc == 0) {
    lay_out_groups(s);
    s->packed = malloc((s->npacked + s->np + 1) * sizeof(float));
    s->Q = malloc((s->nq + 1) * sizeof(float));
    s->err = calloc(s->nerr + 1, sizeof(float));
    s->mat_sq = calloc((size_t)s->nmats + 1, sizeof(double));
    s->gram = malloc(2 * (size_t)rank * (size_t)rank * sizeof(double));
    s->scratch = malloc((scratch_floats(s) + 1) * sizeof(float));
    s->order = calloc((size_t)s->ngroups, sizeof(int));
    if (!s->packed || !s->Q || !s->err || !s->mat_sq || !s->gram || !s->scratch || !s->order)
      rc = -ENOMEM;
  }
  if (rc != 0) {
    gpt2_psgd_free(s);
    return rc;
  }
  uint64_t st = gpt2_rng_derive(seed, 0x9057u, (uint64_t)rank, 0);
  for (size_t i = 0; i < s->nq; i++) s->Q[i] = gpt2_rng_normal(&st);
  for (int i = 0; i < s->nmats; i++)
    gpt2_psgd_orthonormalize(s->Q + s->mats[i].q, s->mats[i].cols, rank);
  return 0;
}

void gpt2_psgd_free(gpt2_psgd *s) {
  if (s == NULL) return;
  for (int g = 0; g < s->ngroups; g++) cohort_request_wait(s->groups[g].req);
  free(s->mats);
  free(s->plain);
  free(s->groups);
  free(s->packed);
  free(s->Q);
  free(s->err);
  free(s->mat_sq);
  free(s->gram);
  free(s->scratch);
  free(s->order);
  memset(s, 0, sizeof *s);
}

/* ---- kernels (one matrix M, rows x cols, row-major; the factors' columns in blocks of KB) ---- */

/* The factor F (n, r) as blocks of its transpose: Ft[c][j] = F[j][c] for c < kblocks(r) * KB, zero
 * for c >= r (row c of F^T, n floats each, back to back). */
static void to_blocks(const float *F, float *Ft, size_t n, int r) {
  for (int c = 0; c < kblocks(r) * KB; c++) {
    float *dst = Ft + (size_t)c * n;
    for (size_t j = 0; j < n; j++) dst[j] = c < r ? F[j * (size_t)r + (size_t)c] : 0.0f;
  }
}

/* LANES floats: GCC's vector extension, AVX2 registers in the AVX2 clones and two SSE2 registers
 * in the others. Element-wise IEEE operations with no fused multiply-add (ISO C, and no FMA in the
 * clones' targets), so a vector lane computes the bits of the scalar code of the tails. Loads and
 * stores are unaligned and may alias the floats. */
typedef float vfloat __attribute__((vector_size(LANES * sizeof(float))));
typedef float vfloat_at __attribute__((vector_size(LANES * sizeof(float)), aligned(4), may_alias));
#define VLOAD(p) (*(const vfloat_at *)(p))
#define VSTORE(p, v) (*(vfloat_at *)(p) = (v))
/* The helpers of the row kernels are inlined into each clone (compiled for its target). */
#define ROW_INLINE static inline __attribute__((always_inline))

/* (p Q^T)[j] of a row: the sum over k, in order, of p[k] * Qt[k][j]. */
ROW_INLINE float expand_at(const float *p, const float *Qt, size_t cols, int r, size_t j) {
  float x = p[0] * Qt[j];
  for (int k = 1; k < r; k++) x += p[k] * Qt[(size_t)k * cols + j];
  return x;
}

/* out[k] = the LANES partial sums of part[k] added in lane order. */
ROW_INLINE void lane_sums(float part[KB][LANES], float out[KB]) {
  for (int k = 0; k < KB; k++) {
    float sum = 0.0f;
    for (int l = 0; l < LANES; l++) sum += part[k][l];
    out[k] = sum;
  }
}

/* out[k] = e . qt[k] for the KB rows of one block: LANES partial sums each (element j in lane
 * j mod LANES), added in lane order. */
ROW_INLINE void row_dots(const float *e, const float *qt, size_t cols, float out[KB]) {
  vfloat acc[KB] = {0};
  size_t j = 0;
  for (; j + LANES <= cols; j += LANES) {
    vfloat x = VLOAD(e + j);
    for (int k = 0; k < KB; k++) acc[k] += x * VLOAD(qt + (size_t)k * cols + j);
  }
  float part[KB][LANES];
  memcpy(part, acc, sizeof part);
  for (size_t l = 0; j + l < cols; l++)
    for (int k = 0; k < KB; k++) part[k][l] += e[j + l] * qt[(size_t)k * cols + j + l];
  lane_sums(part, out);
}

/* Stage 1 of one row, in one sweep over it: e becomes e - share p Q^T + g (the last step's share
 * settled when settle, share != 0; pold holds the last P's row), and the first block of p = e Q is
 * summed from the new e as it is stored. The other blocks (rank > KB) read the row again from the
 * cache. The order of each sum is row_dots's. Inlined with r and settle constant (r == KB, the
 * default rank): the loops over k unroll, and pold (a copy in registers) and each vector of Qt are
 * loaded once, not again after every store to e, which may alias them. */
ROW_INLINE void project_row_at(const float *g, float *e, float *p, const float *pold,
                               const float *Qt, float share, size_t cols, int r, int settle) {
  vfloat acc[KB] = {0};
  size_t j = 0;
  for (; j + LANES <= cols; j += LANES) {
    GPT2_PREFETCH(e + j + GPT2_AHEAD); /* kernels.h */
    GPT2_PREFETCH(g + j + GPT2_AHEAD);
    vfloat q[KB];
    for (int k = 0; k < KB; k++) q[k] = VLOAD(Qt + (size_t)k * cols + j);
    vfloat x = VLOAD(e + j);
    if (settle) {
      vfloat pq = pold[0] * q[0];
      for (int k = 1; k < r; k++) {
        vfloat qk = q[k & (KB - 1)];
        if (k >= KB) qk = VLOAD(Qt + (size_t)k * cols + j);
        pq += pold[k] * qk;
      }
      x -= share * pq;
    }
    x += VLOAD(g + j);
    VSTORE(e + j, x);
    for (int k = 0; k < KB; k++) acc[k] += x * q[k];
  }
  float part[KB][LANES], out[KB];
  memcpy(part, acc, sizeof part);
  for (size_t l = 0; j + l < cols; l++) {
    float x = e[j + l];
    if (settle) x -= share * expand_at(pold, Qt, cols, r, j + l);
    x += g[j + l];
    e[j + l] = x;
    for (int k = 0; k < KB; k++) part[k][l] += x * Qt[(size_t)k * cols + j + l];
  }
  lane_sums(part, out);
  for (int b = 0; b < kblocks(r); b++) {
    if (b > 0) row_dots(e, Qt + (size_t)b * KB * cols, cols, out);
    for (int k = 0; k < KB && b * KB + k < r; k++) p[b * KB + k] = out[k];
  }
}

/* project_row_at with r and settle constant where r == KB; p's last row copied first (the new one
 * is stored over it at the end). */
ROW_KERNEL static void project_row(const float *g, float *e, float *p, const float *Qt, float share,
                                   size_t cols, int r) {
  if (r == KB) {
    float pold[KB];
    memcpy(pold, p, sizeof pold);
    if (share != 0.0f)
      project_row_at(g, e, p, pold, Qt, share, cols, KB, 1);
    else
      project_row_at(g, e, p, pold, Qt, share, cols, KB, 0);
  } else if (share != 0.0f) {
    project_row_at(g, e, p, p, Qt, share, cols, r, 1);
  } else {
    project_row_at(g, e, p, p, Qt, share, cols, r, 0);
  }
}

/* Stage 1, error feedback fused with the first product, a row at a time while it is in the cache:
 * E holds the last M, of which share P Q^T (the last P, in P, and this Q) was sent: E becomes
 * E - share P Q^T + G, then P = E Q. Qt: Q in blocks (to_blocks); P (rows, r). */
static void add_and_project(const float *G, float *E, const float *Qt, float *P, float share,
                            size_t rows, size_t cols, int r) {
  size_t ntiles = (rows + ROW_TILE - 1) / ROW_TILE;
#pragma omp parallel for schedule(static)
  for (size_t t = 0; t < ntiles; t++) {
    size_t end = (t + 1) * ROW_TILE < rows ? (t + 1) * ROW_TILE : rows;
    for (size_t i = t * ROW_TILE; i < end; i++)
      project_row(G + i * cols, E + i * cols, P + i * (size_t)r, Qt, share, cols, r);
  }
}

/* acc[k][j] (KB x n) += the sum over the rows i, in order, of pt[k][i] * E[i][j0 + j]: four rows
 * a step (each read once for the KB sums), added one after another (the order of one row a
 * step). pt: one block of P in blocks. */
ROW_KERNEL static void column_sums(const float *E, const float *pt, float *acc, size_t rows,
                                   size_t cols, size_t j0, size_t n) {
  size_t i = 0;
  for (; i + 4 <= rows; i += 4) {
    const float *e0 = E + i * cols + j0, *e1 = e0 + cols, *e2 = e1 + cols, *e3 = e2 + cols;
    float p[KB][4];
    for (int k = 0; k < KB; k++)
      for (int u = 0; u < 4; u++) p[k][u] = pt[(size_t)k * rows + i + u];
    size_t j = 0;
    for (; j + LANES <= n; j += LANES) {
      if (i + 8 <= rows) /* the next four rows' same columns (a tile of them, or whole rows) */
        for (int u = 0; u < 4; u++) GPT2_PREFETCH(e0 + (size_t)(4 + u) * cols + j);
      vfloat x0 = VLOAD(e0 + j), x1 = VLOAD(e1 + j), x2 = VLOAD(e2 + j), x3 = VLOAD(e3 + j);
      for (int k = 0; k < KB; k++) {
        vfloat a = VLOAD(acc + (size_t)k * n + j);
        a += p[k][0] * x0;
        a += p[k][1] * x1;
        a += p[k][2] * x2;
        a += p[k][3] * x3;
        VSTORE(acc + (size_t)k * n + j, a);
      }
    }
    for (; j < n; j++)
      for (int k = 0; k < KB; k++) {
        float a = acc[(size_t)k * n + j];
        a += p[k][0] * e0[j];
        a += p[k][1] * e1[j];
        a += p[k][2] * e2[j];
        a += p[k][3] * e3[j];
        acc[(size_t)k * n + j] = a;
      }
  }
  for (; i < rows; i++) {
    const float *e = E + i * cols + j0;
    for (int k = 0; k < KB; k++) {
      float pk = pt[(size_t)k * rows + i], *a = acc + (size_t)k * n;
      for (size_t j = 0; j < n; j++) a[j] += pk * e[j];
    }
  }
}

/* Stage 2's product Q = E^T P, E streamed once per block of P's columns: all its rows for a tile
 * of columns whose sums stay in the first-level cache. Pt: P in blocks; Q (cols, r). */
static void project_back(const float *E, const float *Pt, float *Q, size_t rows, size_t cols,
                         int r) {
  const size_t tile = COL_FLOATS / KB;
  size_t ntiles = (cols + tile - 1) / tile, nb = (size_t)kblocks(r);
#pragma omp parallel for schedule(static)
  for (size_t t = 0; t < ntiles * nb; t++) {
    size_t j0 = t / nb * tile, n = cols - j0 < tile ? cols - j0 : tile, b = t % nb;
    float acc[COL_FLOATS];
    memset(acc, 0, KB * n * sizeof(float));
    column_sums(E, Pt + b * KB * rows, acc, rows, cols, j0, n);
    for (size_t k = 0; k < KB && b * KB + k < (size_t)r; k++)
      for (size_t j = 0; j < n; j++) Q[(j0 + j) * (size_t)r + b * KB + k] = acc[k * n + j];
  }
}

/* out[0, n) = columns [j0, j0 + n) of a row of P Q^T (p: the row of P), each element's sum in
 * expand_at's order whatever j0 and the vector width. Inlined with r constant where r == KB, p
 * copied into registers (a store to out may alias it). */
ROW_INLINE void expand_piece_at(const float *p, const float *Qt, size_t cols, int r, size_t j0,
                                size_t n, float *out) {
  size_t j = 0;
  for (; j + LANES <= n; j += LANES) {
    vfloat x = p[0] * VLOAD(Qt + j0 + j);
    for (int k = 1; k < r; k++) x += p[k] * VLOAD(Qt + (size_t)k * cols + j0 + j);
    VSTORE(out + j, x);
  }
  for (; j < n; j++) out[j] = expand_at(p, Qt, cols, r, j0 + j);
}

ROW_KERNEL static void expand_piece(const float *p, const float *Qt, size_t cols, int r, size_t j0,
                                    size_t n, float *out) {
  if (r == KB) {
    float pc[KB];
    memcpy(pc, p, sizeof pc);
    expand_piece_at(pc, Qt, cols, KB, j0, n, out);
  } else {
    expand_piece_at(p, Qt, cols, r, j0, n, out);
  }
}

/* A matrix's P Q^T as gpt2_optim_update_rows asks for it. Qt: Q in blocks. */
typedef struct expand_ctx {
  const float *P, *Qt;
  size_t cols;
  int r;
} expand_ctx;

static void expand_rows_piece(void *ctx, size_t row, size_t j0, size_t n, float *out) {
  const expand_ctx *c = ctx;
  expand_piece(c->P + row * (size_t)c->r, c->Qt, c->cols, c->r, j0, n, out);
}

/* G = P Q^T, each row computed once and written over G (not zeroed first). Qt: Q in blocks. */
static void expand(const float *P, const float *Qt, float *G, size_t rows, size_t cols, int r) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < rows; i++)
    expand_piece(P + i * (size_t)r, Qt, cols, r, 0, cols, G + i * cols);
}

/* The sum of squares of P Q^T (P rows x r, Q cols x r) from the two r x r Gram matrices:
 * |P Q^T|^2 = trace(Q P^T P Q^T) = the sum over k, l of (P^T P)[k][l] (Q^T Q)[k][l], in double,
 * in a fixed order, in (rows + cols) r^2 operations instead of a pass over rows x cols floats.
 * gram: room for 2 r^2 doubles. */
static double lowrank_sumsq(const float *P, const float *Q, size_t rows, size_t cols, int r,
                            double *gram) {
  double *gp = gram, *gq = gram + (size_t)r * r, sum = 0.0;
  memset(gram, 0, 2 * (size_t)r * r * sizeof(double));
  for (size_t i = 0; i < rows; i++)
    for (int k = 0; k < r; k++)
      for (int l = 0; l < r; l++) gp[k * r + l] += (double)P[i * r + k] * P[i * r + l];
  for (size_t j = 0; j < cols; j++)
    for (int k = 0; k < r; k++)
      for (int l = 0; l < r; l++) gq[k * r + l] += (double)Q[j * r + k] * Q[j * r + l];
  for (int k = 0; k < r * r; k++) sum += gp[k] * gq[k];
  return sum;
}

/* The error of matrix x into out: E - share P Q^T (one thread, rows in order; stage 1's bits). */
static void settle_into(gpt2_psgd *s, const gpt2_psgd_mat *x, float share, float *out) {
  size_t cols = (size_t)x->cols;
  memcpy(out, s->err + x->e, (size_t)x->rows * cols * sizeof(float));
  if (share == 0.0f) return;
  to_blocks(s->Q + x->q, s->scratch, cols, s->rank);
  for (size_t i = 0; i < (size_t)x->rows; i++) {
    const float *p = s->packed + x->p + i * (size_t)s->rank;
    for (size_t j = 0; j < cols; j++)
      out[i * cols + j] -= share * expand_at(p, s->scratch, cols, s->rank, j);
  }
}

/* ---- one group's computations ---- */

void gpt2_psgd_compute_p(gpt2_psgd *s, float *g, int grp) {
  const gpt2_psgd_group *gr = &s->groups[grp];
  for (int i = gr->m0; i < gr->m1; i++) {
    const gpt2_psgd_mat *x = &s->mats[i];
    /* The error becomes the matrix to compress: what this step adds plus what was left over. */
    to_blocks(s->Q + x->q, s->scratch, (size_t)x->cols, s->rank);
    add_and_project(g + x->off, s->err + x->e, s->scratch, s->packed + x->p, gr->share,
                    (size_t)x->rows, (size_t)x->cols, s->rank);
  }
}

void gpt2_psgd_compute_q(gpt2_psgd *s, const float *g, int grp) {
  (void)g; /* the matrices are in the error buffer since compute_p */
  const gpt2_psgd_group *gr = &s->groups[grp];
  for (int i = gr->m0; i < gr->m1; i++) {
    const gpt2_psgd_mat *x = &s->mats[i];
    gpt2_psgd_orthonormalize(s->packed + x->p, x->rows, s->rank);
    to_blocks(s->packed + x->p, s->scratch, (size_t)x->rows, s->rank);
    project_back(s->err + x->e, s->scratch, s->Q + x->q, (size_t)x->rows, (size_t)x->cols, s->rank);
  }
}

void gpt2_psgd_complete(gpt2_psgd *s, int grp, int world) {
  gpt2_psgd_group *gr = &s->groups[grp];
  for (int i = gr->m0; i < gr->m1; i++) {
    const gpt2_psgd_mat *x = &s->mats[i];
    s->mat_sq[i] = lowrank_sumsq(s->packed + x->p, s->Q + x->q, (size_t)x->rows, (size_t)x->cols,
                                 s->rank, s->gram);
  }
  /* This rank's share of the sum is 1/world of the approximation; the rest of its M is kept. An
   * identity rank sent nothing: its error stays zero. */
  gr->share = s->identity ? 0.0f : 1.0f / (float)world;
}

/* Each matrix of group grp in g replaced by its P Q^T. */
static void expand_group(gpt2_psgd *s, float *g, int grp) {
  const gpt2_psgd_group *gr = &s->groups[grp];
  for (int i = gr->m0; i < gr->m1; i++) {
    const gpt2_psgd_mat *x = &s->mats[i];
    to_blocks(s->Q + x->q, s->scratch, (size_t)x->cols, s->rank);
    expand(s->packed + x->p, s->scratch, g + x->off, (size_t)x->rows, (size_t)x->cols, s->rank);
  }
}

void gpt2_psgd_decompress(gpt2_psgd *s, float *g, int grp, int world) {
  gpt2_psgd_complete(s, grp, world);
  expand_group(s, g, grp);
}

double gpt2_psgd_sumsq(const gpt2_psgd *s, const float *g) {
  double sum = 0.0;
  for (int i = 0; i < s->nplain; i++)
    sum += gpt2_sumsq(g + s->plain[i][0], s->plain[i][1] - s->plain[i][0]);
  for (int i = 0; i < s->nmats; i++) sum += s->mat_sq[i];
  return sum;
}

void gpt2_psgd_update(gpt2_psgd *s, gpt2_optim *o, const gpt2_model *m, const float *g,
                      float grad_scale, float lr, int64_t t) {
  for (int i = 0; i < s->nplain; i++)
    gpt2_optim_update(o, m, m->params, g + s->plain[i][0], s->plain[i][0], s->plain[i][1],
                      grad_scale, lr, t);
  for (int i = 0; i < s->nmats; i++) {
    const gpt2_psgd_mat *x = &s->mats[i];
    to_blocks(s->Q + x->q, s->scratch, (size_t)x->cols, s->rank);
    expand_ctx c = {s->packed + x->p, s->scratch, (size_t)x->cols, s->rank};
    gpt2_optim_update_rows(o, m, m->params, x->off, (size_t)x->rows, (size_t)x->cols,
                           expand_rows_piece, &c, grad_scale, lr, t);
  }
}

void gpt2_psgd_error(gpt2_psgd *s, float *out) {
  for (int g = 0; g < s->ngroups; g++)
    for (int i = s->groups[g].m0; i < s->groups[g].m1; i++)
      settle_into(s, &s->mats[i], s->groups[g].share, out + s->mats[i].e);
}

/* Moves a group's uncompressed ranges of g into its packed block (out != 0) or back. */
static void pack(gpt2_psgd *s, float *g, int grp, int out) {
  const gpt2_psgd_group *gr = &s->groups[grp];
  float *p = s->packed + gr->pk;
  for (int i = gr->pl0; i < gr->pl1; i++) {
    size_t lo = s->plain[i][0], n = s->plain[i][1] - lo;
    if (out)
      memcpy(p, g + lo, n * sizeof(float));
    else
      memcpy(g + lo, p, n * sizeof(float));
    p += n;
  }
}

/* ---- the stages ---- */

/* An identity rank's factors of group grp, -0.0 each: P (which, from stage 1), or Q. */
static void identity_factors(gpt2_psgd *s, int grp, int which_p) {
  const gpt2_psgd_group *gr = &s->groups[grp];
  for (int i = gr->m0; i < gr->m1; i++) {
    const gpt2_psgd_mat *x = &s->mats[i];
    float *f = which_p ? s->packed + x->p : s->Q + x->q;
    size_t n = (size_t)(which_p ? x->rows : x->cols) * (size_t)s->rank;
    for (size_t j = 0; j < n; j++) f[j] = -0.0f;
  }
}

/* An identity rank's stage 2: the summed P orthonormalised (the result every rank uses), its Q
 * -0.0. */
static void identity_q(gpt2_psgd *s, int grp) {
  const gpt2_psgd_group *gr = &s->groups[grp];
  for (int i = gr->m0; i < gr->m1; i++)
    gpt2_psgd_orthonormalize(s->packed + s->mats[i].p, s->mats[i].rows, s->rank);
  identity_factors(s, grp, 0);
}

static int wait_group(gpt2_psgd *s, gpt2_psgd_group *gr) {
  int64_t t0 = gpt2_now_us();
  int rc = cohort_request_wait(gr->req);
  gr->req = NULL;
  s->wait_us += gpt2_now_us() - t0;
  return rc;
}

static int sum_async(gpt2_psgd *s, cohort_comm *comm, float *buf, size_t n, cohort_request **req) {
  s->wire_bytes += (double)n * sizeof(float);
  return cohort_iallreduce(comm, buf, buf, n, COHORT_F32, COHORT_SUM, req);
}

int gpt2_psgd_launch(gpt2_psgd *s, cohort_comm *comm, float *g, int grp) {
  gpt2_psgd_group *gr = &s->groups[grp];
  if (gr->stage != 0) return -EINVAL;
  s->order[s->nlaunched++] = grp;
  int64_t c0 = gpt2_cpu_us();
  pack(s, g, grp, 1); /* an identity rank's gradients are -0.0 */
  if (s->identity)
    identity_factors(s, grp, 1);
  else
    gpt2_psgd_compute_p(s, g, grp);
  s->cpu_us += gpt2_cpu_us() - c0;
  gr->stage = 1;
  return sum_async(s, comm, s->packed + gr->pk, gr->npk, &gr->req);
}

/* Stage 2: P summed; Q = M^T P summed next. */
static int to_stage2(gpt2_psgd *s, cohort_comm *comm, float *g, int grp) {
  gpt2_psgd_group *gr = &s->groups[grp];
  int rc = wait_group(s, gr);
  if (rc != 0) return rc;
  int64_t c0 = gpt2_cpu_us();
  pack(s, g, grp, 0);
  if (s->identity)
    identity_q(s, grp);
  else
    gpt2_psgd_compute_q(s, g, grp);
  s->cpu_us += gpt2_cpu_us() - c0;
  gr->stage = 2;
  return gr->nq > 0 ? sum_async(s, comm, s->Q + gr->q, gr->nq, &gr->req) : 0;
}

/* Stage 3: Q summed; the matrices' sum is P Q^T, left as its factors for the update
 * (gpt2_psgd_update) or gpt2_psgd_expand. */
static int to_stage3(gpt2_psgd *s, cohort_comm *comm, int grp) {
  gpt2_psgd_group *gr = &s->groups[grp];
  int rc = wait_group(s, gr);
  if (rc != 0) return rc;
  int64_t c0 = gpt2_cpu_us();
  gpt2_psgd_complete(s, grp, s->contrib > 0 ? s->contrib : cohort_comm_size(comm));
  s->cpu_us += gpt2_cpu_us() - c0;
  gr->stage = 3;
  return 0;
}

int gpt2_psgd_advance(gpt2_psgd *s, cohort_comm *comm, float *g, int lag) {
  for (int i = 0; i + lag < s->nlaunched; i++) {
    if (s->groups[s->order[i]].stage != 1) continue;
    int rc = to_stage2(s, comm, g, s->order[i]);
    if (rc != 0) return rc;
  }
  for (int i = 0; i + 2 * lag < s->nlaunched; i++) {
    if (s->groups[s->order[i]].stage != 2) continue;
    int rc = to_stage3(s, comm, s->order[i]);
    if (rc != 0) return rc;
  }
  return 0;
}

void gpt2_psgd_begin(gpt2_psgd *s) {
  for (int g = 0; g < s->ngroups; g++) s->groups[g].stage = 0;
  s->nlaunched = 0;
  s->wait_us = 0;
  s->cpu_us = 0;
  s->wire_bytes = 0.0;
}

int gpt2_psgd_group_of(const gpt2_psgd *s, gpt2_grad_event ev, int layer) {
  for (int g = 0; g < s->ngroups; g++) {
    const gpt2_psgd_group *gr = &s->groups[g];
    if (gr->ev == ev && (ev != GPT2_EV_LAYER || gr->layer == layer)) return g;
  }
  return -1;
}

int gpt2_psgd_finish(gpt2_psgd *s, cohort_comm *comm, float *g) {
  for (int grp = 0; grp < s->ngroups; grp++) {
    if (s->groups[grp].stage != 0) continue;
    int rc = gpt2_psgd_launch(s, comm, g, grp);
    if (rc != 0) return rc;
  }
  return gpt2_psgd_advance(s, comm, g, 0);
}

int gpt2_psgd_allreduce(gpt2_psgd *s, cohort_comm *comm, float *g) {
  gpt2_psgd_begin(s);
  int rc = gpt2_psgd_finish(s, comm, g);
  for (int grp = 0; grp < s->ngroups && rc == 0; grp++) expand_group(s, g, grp);
  return rc;
}

/* ---- catching up ---- */

void gpt2_psgd_set_contrib(gpt2_psgd *s, int contrib, int identity) {
  s->contrib = contrib;
  s->identity = identity;
}

size_t gpt2_psgd_result_floats(const gpt2_psgd *s) {
  return s->npacked + s->np + s->nq;
}

void gpt2_psgd_result_get(const gpt2_psgd *s, float *out) {
  memcpy(out, s->packed, (s->npacked + s->np) * sizeof(float));
  memcpy(out + s->npacked + s->np, s->Q, s->nq * sizeof(float));
}

void gpt2_psgd_result_set(gpt2_psgd *s, float *g, const float *in) {
  memcpy(s->packed, in, (s->npacked + s->np) * sizeof(float));
  memcpy(s->Q, in + s->npacked + s->np, s->nq * sizeof(float));
  for (int grp = 0; grp < s->ngroups; grp++) pack(s, g, grp, 0);
}

/* ---- state ---- */

size_t gpt2_psgd_state_floats(const gpt2_psgd *s, int world) {
  return s->nq + (size_t)world * s->nerr;
}

int gpt2_psgd_state_get(gpt2_psgd *s, cohort_comm *comm, float *full) {
  memcpy(full, s->Q, s->nq * sizeof(float));
  int world = comm ? cohort_comm_size(comm) : 1, me = comm ? cohort_comm_rank(comm) : 0;
  const size_t chunk = 16u << 20; /* floats per call: bounded transfers */
  for (int r = 0; r < world; r++) {
    float *e = full + s->nq + (size_t)r * s->nerr;
    if (r == me) gpt2_psgd_error(s, e);
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
  for (int g = 0; g < s->ngroups; g++) s->groups[g].share = 0.0f; /* err is the error itself */
}

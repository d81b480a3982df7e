/* optim.c - AdamW, SGD with momentum, schedules and norms (see optim.h). */
#include "gpt2/optim.h"

#include "gpt2/kernels.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int gpt2_optim_init(gpt2_optim *o, const gpt2_optim_config *cfg, size_t lo, size_t hi) {
  memset(o, 0, sizeof(*o));
  o->cfg = *cfg;
  o->lo = lo;
  o->hi = hi;
  size_t n = hi - lo;
  o->nstate = cfg->kind == GPT2_OPT_ADAMW ? 2 * n : n;
  o->state = gpt2_big_alloc(o->nstate * sizeof(float));
  if (o->state == NULL) return -ENOMEM;
  o->m = o->state;
  o->v = cfg->kind == GPT2_OPT_ADAMW ? o->state + n : NULL;
  return 0;
}

void gpt2_optim_free(gpt2_optim *o) {
  if (o == NULL) return;
  gpt2_big_free(o->state, o->nstate * sizeof(float));
  memset(o, 0, sizeof(*o));
}

/* One update's constants: AdamW's bias corrections, the learning rate, the tensor's weight
 * decay and the clipping factor. */
typedef struct upd_coef {
  float b1, b2, eps, c1, c2, mom, lr, wd, gs;
} upd_coef;

static upd_coef coef_of(const gpt2_optim *o, float lr, float wd, int64_t t, float gs) {
  upd_coef u = {.b1 = o->cfg.beta1,
                .b2 = o->cfg.beta2,
                .eps = o->cfg.eps,
                .mom = o->cfg.momentum,
                .lr = lr,
                .wd = wd,
                .gs = gs};
  if (o->cfg.kind == GPT2_OPT_ADAMW) {
    u.c1 = 1.0f / (1.0f - powf(u.b1, (float)t));
    u.c2 = 1.0f / (1.0f - powf(u.b2, (float)t));
  }
  return u;
}

/* The elementwise updates are built for AVX2 and for the baseline (GPT2_CLONES): IEEE operations
 * element by element (no fused multiply-add in either target; the division and the square root
 * are correctly rounded), so the same bits, in twice the lanes where the CPU has AVX2. */

/* p[0, n) from g[0, n) (m and v: its state): AdamW with decoupled weight decay. */
/* Floats of each stream between two prefetches (GPT2_PREFETCH): a cache line. */
enum { BLOCK = 16 };

static inline __attribute__((always_inline)) void adamw_at(const upd_coef *u, float *p, float *m,
                                                           float *v, const float *g, size_t i) {
  float gi = g[i] * u->gs;
  float mi = u->b1 * m[i] + (1.0f - u->b1) * gi;
  float vi = u->b2 * v[i] + (1.0f - u->b2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  float pi = p[i] * (1.0f - u->lr * u->wd);
  p[i] = pi - u->lr * (mi * u->c1) / (sqrtf(vi * u->c2) + u->eps);
}

GPT2_CLONES static void adamw_span(const upd_coef *u, float *p, float *m, float *v, const float *g,
                                   size_t n) {
  size_t i = 0;
  for (; i + BLOCK <= n; i += BLOCK) {
    GPT2_PREFETCH(p + i + GPT2_AHEAD);
    GPT2_PREFETCH(m + i + GPT2_AHEAD);
    GPT2_PREFETCH(v + i + GPT2_AHEAD);
    GPT2_PREFETCH(g + i + GPT2_AHEAD);
    for (size_t k = i; k < i + BLOCK; k++) adamw_at(u, p, m, v, g, k);
  }
  for (; i < n; i++) adamw_at(u, p, m, v, g, i);
}

/* p[0, n) from g[0, n) (buf: its momentum): SGD with momentum and L2 weight decay. */
GPT2_CLONES static void sgd_span(const upd_coef *u, float *p, float *buf, const float *g,
                                 size_t n) {
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * u->gs + u->wd * p[i];
    float bi = u->mom * buf[i] + gi;
    buf[i] = bi;
    p[i] -= u->lr * bi;
  }
}

/* params[lo, lo + n) from g[0, n), on this thread: the optimiser's elementwise update. */
static inline void update_span(const gpt2_optim *o, const upd_coef *u, float *params,
                               const float *g, size_t lo, size_t n) {
  float *p = params + lo, *m = o->m + (lo - o->lo);
  if (o->cfg.kind == GPT2_OPT_ADAMW)
    adamw_span(u, p, m, o->v + (lo - o->lo), g, n);
  else
    sgd_span(u, p, m, g, n);
}

enum { SPAN = 2048 }; /* floats a task: whole spans of the same elements whatever the threads */

/* params[lo, hi) from g[0, hi - lo), the threads taking SPAN floats at a time. */
static void update_range(gpt2_optim *o, float *params, const float *g, size_t lo, size_t hi,
                         const upd_coef *u) {
  size_t n = hi - lo, nspans = (n + SPAN - 1) / SPAN;
#pragma omp parallel for schedule(static)
  for (size_t k = 0; k < nspans; k++) {
    size_t a = k * SPAN, len = n - a < SPAN ? n - a : SPAN;
    update_span(o, u, params, g + a, lo + a, len);
  }
}

/* The weight decay of the tensor holding flat offset `at` (0 outside every tensor). */
static float decay_at(const gpt2_optim *o, const gpt2_model *m, size_t at) {
  for (int ti = 0; ti < m->ntensors; ti++) {
    const gpt2_tensor *tn = &m->tensors[ti];
    if (at >= tn->offset && at < tn->offset + tn->size) return tn->decay ? o->cfg.weight_decay : 0;
  }
  return 0.0f;
}

void gpt2_optim_update(gpt2_optim *o, const gpt2_model *m, float *params, const float *grads,
                       size_t lo, size_t hi, float grad_scale, float lr, int64_t t) {
  for (int ti = 0; ti < m->ntensors; ti++) {
    const gpt2_tensor *tn = &m->tensors[ti];
    size_t a = tn->offset > lo ? tn->offset : lo;
    size_t b = tn->offset + tn->size < hi ? tn->offset + tn->size : hi;
    if (a >= b) continue;
    upd_coef u = coef_of(o, lr, tn->decay ? o->cfg.weight_decay : 0.0f, t, grad_scale);
    update_range(o, params, grads + (a - lo), a, b, &u);
  }
}

void gpt2_optim_update_rows(gpt2_optim *o, const gpt2_model *m, float *params, size_t lo,
                            size_t rows, size_t cols, gpt2_grad_piece_fn piece, void *ctx,
                            float grad_scale, float lr, int64_t t) {
  upd_coef u = coef_of(o, lr, decay_at(o, m, lo), t, grad_scale);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < rows; i++) {
    float g[SPAN];
    for (size_t j = 0; j < cols; j += SPAN) {
      size_t n = cols - j < SPAN ? cols - j : SPAN;
      piece(ctx, i, j, n, g);
      update_span(o, &u, params, g, lo + i * cols + j, n);
    }
  }
}

void gpt2_optim_step(gpt2_optim *o, const gpt2_model *m, float *params, const float *grads,
                     float grad_scale, float lr, int64_t t) {
  gpt2_optim_update(o, m, params, grads + o->lo, o->lo, o->hi, grad_scale, lr, t);
}

float gpt2_lr_at(gpt2_lr_schedule s, float lr, int64_t warmup, int64_t total, float min_ratio,
                 int64_t step) {
  if (warmup > 0 && step < warmup) return lr * (float)(step + 1) / (float)warmup;
  if (s == GPT2_LR_CONST || total <= warmup) return lr;
  double frac = (double)(step - warmup) / (double)(total - warmup);
  if (frac > 1.0) frac = 1.0;
  double coeff = 0.5 * (1.0 + cos(M_PI * frac));
  return (float)(lr * (min_ratio + (1.0 - min_ratio) * coeff));
}

/* A chunk's sum of squares in SUMSQ_LANES partial sums (element i in lane i mod SUMSQ_LANES), added
 * in lane order: independent additions the compiler can keep in several registers, where one
 * running sum waits for each addition (the pass was bound by that latency, not by memory), and
 * the same bits whatever the vector width. */
enum { SUMSQ_LANES = 16 };

GPT2_CLONES static double sumsq_chunk(const float *x, size_t n) {
  double acc[SUMSQ_LANES] = {0};
  size_t i = 0;
  for (; i + SUMSQ_LANES <= n; i += SUMSQ_LANES) {
    GPT2_PREFETCH(x + i + GPT2_AHEAD);
    for (int l = 0; l < SUMSQ_LANES; l++) acc[l] += (double)x[i + l] * x[i + l];
  }
  for (int l = 0; i + (size_t)l < n; l++) acc[l] += (double)x[i + l] * x[i + l];
  double s = 0.0;
  for (int l = 0; l < SUMSQ_LANES; l++) s += acc[l];
  return s;
}

double gpt2_sumsq(const float *x, size_t n) {
  /* Fixed-size chunks summed in index order: the same result for any number
   * of threads. */
  const size_t chunk = 1 << 14;
  size_t nchunks = (n + chunk - 1) / chunk;
  double *part = malloc((nchunks ? nchunks : 1) * sizeof(double));
  if (part == NULL) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
  }
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < nchunks; c++)
    part[c] = sumsq_chunk(x + c * chunk, c + 1 < nchunks ? chunk : n - c * chunk);
  double total = 0.0;
  for (size_t c = 0; c < nchunks; c++) total += part[c];
  free(part);
  return total;
}

void gpt2_scale(float *x, size_t n, float s) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) x[i] *= s;
}

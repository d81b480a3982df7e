/* kernels.c - GPT-2 forward and backward kernels (see kernels.h). */
#include "gpt2/kernels.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/mman.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/*
 * exp(x) for the hot element-wise loops (GELU's tanh, the vocabulary
 * softmax): Cephes-style range reduction x = n*ln2 + r and a degree-6
 * polynomial, about 2 ulp, written without calls or branches so that the
 * compiler vectorises the loops that use it (libm's expf and tanhf are
 * scalar calls). Inputs are clamped to [-87, 88]: below, the result is
 * ~1e-38 instead of 0, which no sum in this file can notice.
 */
static inline float exp_fast(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  /* Round x*log2(e) to the nearest integer by adding 1.5*2^23. */
  float t = x * 1.44269504088896341f + 12582912.0f;
  float n = t - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t e = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &e, sizeof(scale));
  return y * scale;
}

/* tanh(u) = 1 - 2 / (exp(2u) + 1): exact limits +-1, absolute error ~1e-7. */
static inline float tanh_fast(float u) {
  return 1.0f - 2.0f / (exp_fast(2.0f * u) + 1.0f);
}

/* Channel blocks for reductions over rows: each thread owns whole channels,
 * so every sum runs over rows in the same order whatever the thread count. */
#define GPT2_CBLOCK 64

void gpt2_encoder_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                          size_t B, size_t T, size_t C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (size_t b = 0; b < B; b++) {
    for (size_t t = 0; t < T; t++) {
      float *o = out + (b * T + t) * C;
      const float *we = wte + (size_t)tokens[b * T + t] * C;
      const float *pe = wpe + t * C;
      for (size_t c = 0; c < C; c++) o[c] = we[c] + pe[c];
    }
  }
}

void gpt2_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                           size_t B, size_t T, size_t C) {
  size_t nblk = (C + GPT2_CBLOCK - 1) / GPT2_CBLOCK;
#pragma omp parallel for schedule(static)
  for (size_t blk = 0; blk < nblk; blk++) {
    size_t c0 = blk * GPT2_CBLOCK, c1 = c0 + GPT2_CBLOCK < C ? c0 + GPT2_CBLOCK : C;
    for (size_t b = 0; b < B; b++) {
      for (size_t t = 0; t < T; t++) {
        const float *d = dout + (b * T + t) * C;
        float *dp = dwpe + t * C;
        for (size_t c = c0; c < c1; c++) dp[c] += d[c];
        if (dwte != NULL) {
          float *dw = dwte + (size_t)tokens[b * T + t] * C;
          for (size_t c = c0; c < c1; c++) dw[c] += d[c];
        }
      }
    }
  }
}

void gpt2_embedding_scatter_add(float *dwte, const float *rows, const int32_t *tokens, size_t n,
                                size_t C) {
  size_t nblk = (C + GPT2_CBLOCK - 1) / GPT2_CBLOCK;
#pragma omp parallel for schedule(static)
  for (size_t blk = 0; blk < nblk; blk++) {
    size_t c0 = blk * GPT2_CBLOCK, c1 = c0 + GPT2_CBLOCK < C ? c0 + GPT2_CBLOCK : C;
    for (size_t i = 0; i < n; i++) {
      const float *r = rows + i * C;
      float *dw = dwte + (size_t)tokens[i] * C;
      for (size_t c = c0; c < c1; c++) dw[c] += r[c];
    }
  }
}

void gpt2_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                            const float *b, size_t N, size_t C) {
  const float eps = 1e-5f;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < N; i++) {
    const float *x = inp + i * C;
    float m = 0.0f;
    for (size_t c = 0; c < C; c++) m += x[c];
    m /= (float)C;
    /* Two passes (mean, then squared deviations) rather than E[x^2]-E[x]^2,
     * which cancels badly when the mean is large. */
    float v = 0.0f;
    for (size_t c = 0; c < C; c++) {
      float d = x[c] - m;
      v += d * d;
    }
    v /= (float)C;
    float s = 1.0f / sqrtf(v + eps);
    float *o = out + i * C;
    for (size_t c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

void gpt2_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, size_t N,
                             size_t C, int store_dw) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < N; i++) {
    const float *x = inp + i * C, *d = dout + i * C;
    float m = mean[i], s = rstd[i];
    float dmean = 0.0f, dnormmean = 0.0f;
    for (size_t c = 0; c < C; c++) {
      float norm = (x[c] - m) * s;
      float dn = w[c] * d[c];
      dmean += dn;
      dnormmean += dn * norm;
    }
    dmean /= (float)C;
    dnormmean /= (float)C;
    float *di = dinp + i * C;
    for (size_t c = 0; c < C; c++) {
      float norm = (x[c] - m) * s;
      float dn = w[c] * d[c];
      di[c] += (dn - dmean - norm * dnormmean) * s;
    }
  }
  size_t nblk = (C + GPT2_CBLOCK - 1) / GPT2_CBLOCK;
#pragma omp parallel for schedule(static)
  for (size_t blk = 0; blk < nblk; blk++) {
    size_t c0 = blk * GPT2_CBLOCK, c1 = c0 + GPT2_CBLOCK < C ? c0 + GPT2_CBLOCK : C;
    float accw[GPT2_CBLOCK], accb[GPT2_CBLOCK];
    for (size_t c = c0; c < c1; c++) accw[c - c0] = accb[c - c0] = 0.0f;
    for (size_t i = 0; i < N; i++) {
      const float *x = inp + i * C, *d = dout + i * C;
      float m = mean[i], s = rstd[i];
      for (size_t c = c0; c < c1; c++) {
        accw[c - c0] += d[c] * (x[c] - m) * s;
        accb[c - c0] += d[c];
      }
    }
    for (size_t c = c0; c < c1; c++) {
      dw[c] = (store_dw ? 0.0f : dw[c]) + accw[c - c0]; /* adding into zero: its bits */
      db[c] = (store_dw ? 0.0f : db[c]) + accb[c - c0];
    }
  }
}

/* The matrix products split their output into one column (or row) slice per
 * OpenMP thread and call single-threaded sgemm on each slice. One thread
 * pool then serves every kernel: OpenBLAS's own pool would spin against
 * OpenMP's on a small machine. Each output element is computed by one sgemm
 * call over the full inner dimension: no partial sums are added up afterwards
 * (a differently shaped call may still round differently). */
static void slice_of(size_t n, int parts, int i, size_t *lo, size_t *hi) {
  size_t per = (n + (size_t)parts - 1) / (size_t)parts;
  per = (per + 15) / 16 * 16;
  *lo = per * (size_t)i < n ? per * (size_t)i : n;
  *hi = *lo + per < n ? *lo + per : n;
}

static int nthreads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

static int thread_id(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/* out[:, j0:j1] (= or +=) inp @ w[j0:j1]^T (+ bias[j0:j1]), the columns split over the threads. */
static void matmul_cols(float *out, const float *inp, const float *w, const float *bias, size_t N,
                        size_t C, size_t OC, size_t j0, size_t j1, int accumulate) {
  int parts = nthreads();
#pragma omp parallel num_threads(parts)
  {
    size_t a, b;
    slice_of(j1 - j0, parts, thread_id(), &a, &b);
    a += j0;
    b += j0;
    if (b > a) {
      float beta = accumulate ? 1.0f : 0.0f;
      if (bias != NULL) {
        for (size_t i = 0; i < N; i++) {
          float *o = out + i * OC;
          if (accumulate) {
            for (size_t j = a; j < b; j++) o[j] += bias[j];
          } else {
            for (size_t j = a; j < b; j++) o[j] = bias[j];
          }
        }
        beta = 1.0f;
      }
      // out[:, a:b] (N, OC') = inp (N, C) @ w[a:b]^T (C, OC')
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)(b - a), (int)C, 1.0f, inp,
                  (int)C, w + a * C, (int)C, beta, out + a, (int)OC);
    }
  }
}

void gpt2_matmul_forward(float *out, const float *inp, const float *w, const float *bias, size_t N,
                         size_t C, size_t OC, int accumulate) {
  matmul_cols(out, inp, w, bias, N, C, OC, 0, OC, accumulate);
}

void gpt2_matmul_forward_rows(float *out, const float *inp, const float *w, size_t N, size_t C,
                              size_t OC, size_t j0, size_t j1) {
  matmul_cols(out, inp, w, NULL, N, C, OC, j0, j1, 0);
}

void gpt2_matmul_backward_rows(float *dw, float *dbias, const float *dout, const float *inp,
                               size_t N, size_t C, size_t OC, size_t j0, size_t j1, int store_dw) {
  int parts = nthreads();
#pragma omp parallel num_threads(parts)
  {
    size_t a, b;
    slice_of(j1 - j0, parts, thread_id(), &a, &b);
    a += j0;
    b += j0;
    if (b > a) {
      // dw[a:b] (OC', C) += dout[:, a:b]^T (OC', N) @ inp (N, C)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(b - a), (int)C, (int)N, 1.0f,
                  dout + a, (int)OC, inp, (int)C, store_dw ? 0.0f : 1.0f, dw + a * C, (int)C);
      if (dbias != NULL) {
        for (size_t j = a; j < b; j++) {
          float acc = 0.0f;
          for (size_t i = 0; i < N; i++) acc += dout[i * OC + j];
          dbias[j] = (store_dw ? 0.0f : dbias[j]) + acc;
        }
      }
    }
  }
}

void gpt2_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                          const float *w, size_t N, size_t C, size_t OC, int accumulate_dinp,
                          int store_dw) {
  int parts = nthreads();
  if (dinp != NULL) {
#pragma omp parallel num_threads(parts)
    {
      size_t c0, c1;
      slice_of(C, parts, thread_id(), &c0, &c1);
      // dinp[:, c0:c1] (N, C') = dout (N, OC) @ w[:, c0:c1] (OC, C')
      if (c1 > c0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)(c1 - c0), (int)OC,
                    1.0f, dout, (int)OC, w + c0, (int)C, accumulate_dinp ? 1.0f : 0.0f, dinp + c0,
                    (int)C);
    }
  }
  if (dw != NULL) gpt2_matmul_backward_rows(dw, dbias, dout, inp, N, C, OC, 0, OC, store_dw);
}

void gpt2_attention_forward(float *out, float *att, const float *qkv, const int32_t *mask, size_t B,
                            size_t T, size_t C, size_t NH) {
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(3) schedule(static)
  for (size_t b = 0; b < B; b++) {
    for (size_t h = 0; h < NH; h++) {
      for (size_t t = 0; t < T; t++) {
        const float *q = qkv + (b * T + t) * 3 * C + h * hs;
        float *a = att + ((b * NH + h) * T + t) * T; // (T)
        /* The mask adds GPT2_MASK_SCORE to hidden keys. Applied literally in
         * float, -10000 + score keeps only ~1e-3 of the score's precision;
         * evaluated exactly, a hidden key's weight is exp(-10000) = 0 when
         * the query sees any unhidden key, and when it sees none the constant
         * cancels in the softmax. So: drop hidden keys unless all are hidden. */
        int drop = 0;
        if (mask != NULL) {
          for (size_t t2 = 0; t2 <= t; t2++) drop |= mask[b * T + t2] != 0;
        }
        float maxv = -INFINITY;
        for (size_t t2 = 0; t2 <= t; t2++) {
          if (drop && mask[b * T + t2] == 0) {
            a[t2] = -INFINITY;
            continue;
          }
          const float *k = qkv + (b * T + t2) * 3 * C + C + h * hs;
          float s = 0.0f;
          for (size_t i = 0; i < hs; i++) s += q[i] * k[i];
          s *= scale;
          a[t2] = s;
          if (s > maxv) maxv = s;
        }
        float sum = 0.0f;
        for (size_t t2 = 0; t2 <= t; t2++) {
          float e = expf(a[t2] - maxv);
          a[t2] = e;
          sum += e;
        }
        float inv = 1.0f / sum;
        for (size_t t2 = 0; t2 <= t; t2++) a[t2] *= inv;
        for (size_t t2 = t + 1; t2 < T; t2++) a[t2] = 0.0f;
        float *o = out + (b * T + t) * C + h * hs;
        for (size_t i = 0; i < hs; i++) o[i] = 0.0f;
        for (size_t t2 = 0; t2 <= t; t2++) {
          const float *v = qkv + (b * T + t2) * 3 * C + 2 * C + h * hs;
          float p = a[t2];
          for (size_t i = 0; i < hs; i++) o[i] += p * v[i];
        }
      }
    }
  }
}

void gpt2_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                             const float *att, size_t B, size_t T, size_t C, size_t NH) {
  size_t hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  /* One task per (b, h): dk and dv of a head collect contributions from
   * every later query, so splitting a head across threads would race. */
#pragma omp parallel for collapse(2) schedule(static)
  for (size_t b = 0; b < B; b++) {
    for (size_t h = 0; h < NH; h++) {
      float *datt = scratch + (b * NH + h) * T; // (T)
      for (size_t t = 0; t < T; t++) {
        float *row = dqkv + (b * T + t) * 3 * C;
        memset(row + h * hs, 0, hs * sizeof(float));
        memset(row + C + h * hs, 0, hs * sizeof(float));
        memset(row + 2 * C + h * hs, 0, hs * sizeof(float));
      }
      for (size_t t = 0; t < T; t++) {
        const float *a = att + ((b * NH + h) * T + t) * T;
        const float *d = dout + (b * T + t) * C + h * hs;
        const float *q = qkv + (b * T + t) * 3 * C + h * hs;
        float *dq = dqkv + (b * T + t) * 3 * C + h * hs;
        float dot = 0.0f;
        for (size_t t2 = 0; t2 <= t; t2++) {
          const float *v = qkv + (b * T + t2) * 3 * C + 2 * C + h * hs;
          float *dv = dqkv + (b * T + t2) * 3 * C + 2 * C + h * hs;
          float s = 0.0f;
          for (size_t i = 0; i < hs; i++) {
            s += d[i] * v[i];
            dv[i] += a[t2] * d[i];
          }
          datt[t2] = s;
          dot += a[t2] * s;
        }
        for (size_t t2 = 0; t2 <= t; t2++) {
          float dpre = a[t2] * (datt[t2] - dot) * scale;
          const float *k = qkv + (b * T + t2) * 3 * C + C + h * hs;
          float *dk = dqkv + (b * T + t2) * 3 * C + C + h * hs;
          for (size_t i = 0; i < hs; i++) {
            dq[i] += dpre * k[i];
            dk[i] += dpre * q[i];
          }
        }
      }
    }
  }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* `omp simd`: the clamps in exp_fast are selects, which the vectoriser
 * accepts only when told the loop is safe to vectorise. */
void gpt2_gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanh_fast(u));
  }
}

void gpt2_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    float th = tanh_fast(u);
    float sech2 = 1.0f - th * th;
    float g =
        0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = g * dout[i];
  }
}

double gpt2_crossentropy_forward(float *lse, float *losses, const float *logits,
                                 const int32_t *targets, size_t N, size_t V) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < N; i++) {
    const float *l = logits + i * V;
    float maxv = -INFINITY;
    for (size_t j = 0; j < V; j++) maxv = l[j] > maxv ? l[j] : maxv;
    /* Double accumulation: tens of thousands of terms. */
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (size_t j = 0; j < V; j++) sum += (double)exp_fast(l[j] - maxv);
    lse[i] = maxv + (float)log(sum);
    losses[i] = lse[i] - l[targets[i]];
  }
  double total = 0.0;
  for (size_t i = 0; i < N; i++) total += losses[i];
  return total / (double)N;
}

void gpt2_crossentropy_backward(float *logits, const float *lse, const int32_t *targets,
                                float dloss, size_t N, size_t V) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < N; i++) {
    float *l = logits + i * V;
    float m = lse[i];
#pragma omp simd
    for (size_t j = 0; j < V; j++) l[j] = exp_fast(l[j] - m) * dloss;
    l[targets[i]] -= dloss;
  }
}

double gpt2_qa_loss_forward(float *lse, float *losses, const float *logits, const int32_t *start,
                            const int32_t *end, size_t B, size_t T) {
  double total = 0.0;
  for (size_t b = 0; b < B; b++) {
    float loss = 0.0f;
    for (size_t j = 0; j < 2; j++) {
      float maxv = -INFINITY;
      for (size_t t = 0; t < T; t++) {
        float v = logits[(b * T + t) * 2 + j];
        maxv = v > maxv ? v : maxv;
      }
      float sum = 0.0f;
      for (size_t t = 0; t < T; t++) sum += expf(logits[(b * T + t) * 2 + j] - maxv);
      float l = maxv + logf(sum);
      lse[b * 2 + j] = l;
      size_t pos = (size_t)(j == 0 ? start[b] : end[b]);
      loss += l - logits[(b * T + pos) * 2 + j];
    }
    losses[b] = 0.5f * loss;
    total += losses[b];
  }
  return total / (double)B;
}

void gpt2_qa_loss_backward(float *dlogits, const float *logits, const float *lse,
                           const int32_t *start, const int32_t *end, float dloss, size_t B,
                           size_t T) {
  for (size_t b = 0; b < B; b++) {
    for (size_t j = 0; j < 2; j++) {
      size_t pos = (size_t)(j == 0 ? start[b] : end[b]);
      for (size_t t = 0; t < T; t++) {
        size_t i = (b * T + t) * 2 + j;
        float p = expf(logits[i] - lse[b * 2 + j]);
        dlogits[i] = 0.5f * dloss * (p - (t == pos ? 1.0f : 0.0f));
      }
    }
  }
}

void gpt2_add_inplace(float *dst, const float *src, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

void *gpt2_big_alloc(size_t bytes) {
  if (bytes == 0) bytes = 1;
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  /* Advisory only: without huge pages everything still works. */
  (void)madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

void gpt2_big_free(void *p, size_t bytes) {
  if (p != NULL) munmap(p, bytes ? bytes : 1);
}

int64_t gpt2_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t gpt2_cpu_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

const char *gpt2_blas_core(void) {
  const char *core = openblas_get_corename();
  return core != NULL ? core : "unknown";
}

const char *gpt2_blas_better_core(void) {
  if (getenv("OPENBLAS_CORETYPE") != NULL || strcasecmp(gpt2_blas_core(), "prescott") != 0)
    return NULL;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return NULL;
}

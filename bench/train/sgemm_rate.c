/*
 * sgemm_rate.c - OpenBLAS sgemm throughput on the matrix shapes of one
 * cohort-gpt2 training step (forward and backward of every linear layer and
 * of the LM head), the yardstick for the trainer's model FLOP rate.
 *
 * usage: gpt2-sgemm-rate MODEL HEAD B T THREADS REPS
 * Prints one JSON object: {"openblas_gflops": median over REPS of the whole
 * step's products run with OpenBLAS's own THREADS threads,
 * "sliced_gflops": the same products through cohort-gpt2's matmul kernels
 * (OpenMP slices over single-threaded sgemm), "openblas_core": the OpenBLAS
 * kernels in use}.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "gpt2/kernels.h"
#include "gpt2/model.h"

typedef struct shape {
  size_t oc, c; /* a linear layer (OC, C) applied to N rows */
} shape;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* OpenBLAS chose its fallback kernels on a CPU it does not know: start again
 * with the ones the CPU allows (gpt2_blas_better_core; its JSON names the
 * kernels in use). When the exec fails, go on as we are. */
static void blas_reexec(char **argv) {
  const char *core = gpt2_blas_better_core();
  if (core == NULL || setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");
}

int main(int argc, char **argv) {
  blas_reexec(argv);
  if (argc != 7) {
    fprintf(stderr, "usage: gpt2-sgemm-rate MODEL HEAD B T THREADS REPS\n");
    return 2;
  }
  gpt2_config cfg = {.head = strcmp(argv[2], "qa") == 0 ? GPT2_HEAD_QA : GPT2_HEAD_LM};
  if (gpt2_config_preset(argv[1], &cfg) != 0) {
    fprintf(stderr, "gpt2-sgemm-rate: unknown model %s\n", argv[1]);
    return 2;
  }
  size_t B = (size_t)atoi(argv[3]), T = (size_t)atoi(argv[4]);
  int threads = atoi(argv[5]), reps = atoi(argv[6]);
  if (B < 1 || T < 1 || threads < 1 || reps < 1) {
    fprintf(stderr, "gpt2-sgemm-rate: bad numbers\n");
    return 2;
  }
  size_t N = B * T, C = (size_t)cfg.channels;
  shape sh[5] = {{3 * C, C}, {C, C}, {4 * C, C}, {C, 4 * C}, {(size_t)cfg.vocab, C}};
  int nsh = cfg.head == GPT2_HEAD_LM ? 5 : 4;
  size_t maxw = 0, maxio = 0;
  for (int i = 0; i < nsh; i++) {
    if (sh[i].oc * sh[i].c > maxw) maxw = sh[i].oc * sh[i].c;
    size_t io = N * (sh[i].oc > sh[i].c ? sh[i].oc : sh[i].c);
    if (io > maxio) maxio = io;
  }
  float *w = malloc(maxw * sizeof(float)), *dw = malloc(maxw * sizeof(float));
  float *x = malloc(maxio * sizeof(float)), *y = malloc(maxio * sizeof(float));
  float *dx = malloc(maxio * sizeof(float));
  for (size_t i = 0; i < maxw; i++) w[i] = dw[i] = (float)(i % 7) * 0.01f;
  for (size_t i = 0; i < maxio; i++) x[i] = y[i] = dx[i] = (float)(i % 5) * 0.01f;
  double flops = 0.0;
  for (int i = 0; i < nsh; i++) {
    int count = i < 4 ? cfg.layers : 1;
    flops += 3.0 * 2.0 * (double)N * (double)sh[i].oc * (double)sh[i].c * count;
  }
  double *t_blas = calloc((size_t)reps, sizeof(double)),
         *t_sliced = calloc((size_t)reps, sizeof(double));
  for (int r = 0; r < reps + 1; r++) {
    /* OpenBLAS with its own threads. */
    openblas_set_num_threads(threads);
    double t0 = now_s();
    for (int i = 0; i < nsh; i++) {
      int count = i < 4 ? cfg.layers : 1;
      int oc = (int)sh[i].oc, c = (int)sh[i].c, n = (int)N;
      for (int k = 0; k < count; k++) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, oc, c, 1.0f, x, c, w, c, 0.0f, y,
                    oc);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, c, oc, 1.0f, y, oc, w, c, 0.0f,
                    dx, c);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, oc, c, n, 1.0f, y, oc, x, c, 1.0f, dw,
                    c);
      }
    }
    double t1 = now_s();
    /* The trainer's kernels: OpenMP slices over single-threaded sgemm. */
    openblas_set_num_threads(1);
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    for (int i = 0; i < nsh; i++) {
      int count = i < 4 ? cfg.layers : 1;
      for (int k = 0; k < count; k++) {
        gpt2_matmul_forward(y, x, w, NULL, N, sh[i].c, sh[i].oc, 0);
        gpt2_matmul_backward(dx, dw, NULL, y, x, w, N, sh[i].c, sh[i].oc, 0, 0);
      }
    }
    double t2 = now_s();
    if (r > 0) { /* the first round warms up caches and thread pools */
      t_blas[r - 1] = t1 - t0;
      t_sliced[r - 1] = t2 - t1;
    }
  }
  qsort(t_blas, (size_t)reps, sizeof(double), cmp);
  qsort(t_sliced, (size_t)reps, sizeof(double), cmp);
  printf("{\"openblas_gflops\": %.2f, \"sliced_gflops\": %.2f, \"step_gflop\": %.3f, "
         "\"threads\": %d, \"openblas_core\": \"%s\"}\n",
         flops / t_blas[reps / 2] * 1e-9, flops / t_sliced[reps / 2] * 1e-9, flops * 1e-9, threads,
         gpt2_blas_core());
  free(w), free(dw), free(x), free(y), free(dx), free(t_blas), free(t_sliced);
  return 0;
}

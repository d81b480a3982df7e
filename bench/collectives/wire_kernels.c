/*
 * wire_kernels.c - the bf16 wire kernels of reduce.c timed as the engine runs them on one core:
 * a 2-rank exchange's share of a gradient (N floats, default 62 M: half of GPT-2 124M's) in
 * pieces of 8192 elements, the f32 side in memory, the 16-bit side in a small cache-resident
 * buffer (the engine's stage, the TCP transport's staging). Prints each kernel's time and its
 * rate in GB/s of f32 bytes, beside a read, a write and a copy of the same buffers.
 *
 * build: cc -O2 -Iinclude -Ibuild/generated/include -Isrc bench/collectives/wire_kernels.c \
 *          build/libcohort.a -lpthread -lm -o wire_kernels
 * usage: wire_kernels [N_FLOATS] [REPS]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll/convert.h"

#define PIECE 8192

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static volatile float sink;

enum { K_READ, K_WRITE, K_COPY, K_TO, K_TO_CHANGES, K_SUM, K_FROM, K_COUNT };
static const char *names[] = {"read (or of the bits)", "write (memset)",       "copy (memcpy)",
                              "coll_to_wire",          "coll_to_wire_changes", "coll_sum_from_wire",
                              "coll_from_wire"};

static void run_kernel(int k, float *a, float *b, uint16_t *w, size_t n) {
  float acc = 0.0f;
  uint32_t bits = 0;
  for (size_t lo = 0; lo < n; lo += PIECE) {
    size_t m = n - lo < PIECE ? n - lo : PIECE;
    switch (k) {
    case K_READ:
      for (size_t i = 0; i < m; i++) {
        uint32_t x;
        memcpy(&x, &a[lo + i], sizeof x);
        bits |= x;
      }
      break;
    case K_WRITE:
      memset(b + lo, 0, m * sizeof(float));
      break;
    case K_COPY:
      memcpy(b + lo, a + lo, m * sizeof(float));
      break;
    case K_TO:
      coll_to_wire(COHORT_BF16, w, a + lo, m);
      break;
    case K_TO_CHANGES:
      acc += (float)coll_to_wire_changes(COHORT_BF16, w, a + lo, m);
      break;
    case K_SUM:
      coll_sum_from_wire(COHORT_BF16, b + lo, b + lo, w, m);
      break;
    case K_FROM:
      coll_from_wire(COHORT_BF16, b + lo, w, m);
      break;
    }
  }
  sink = acc + (float)(bits & 1u);
}

int main(int argc, char **argv) {
  size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 62u << 20;
  int reps = argc > 2 ? atoi(argv[2]) : 5;
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  uint16_t *w = malloc(PIECE * sizeof *w);
  if (a == NULL || b == NULL || w == NULL) return 1;
  for (size_t i = 0; i < n; i++) a[i] = b[i] = (float)(i % 1000) * 1e-3f - 0.5f;
  for (size_t i = 0; i < PIECE; i++) w[i] = (uint16_t)(0x3f80 + (i & 0x7f));
  printf("%zu floats (%.0f MB of f32) in pieces of %d, best of %d\n", n, n * 4e-6, PIECE, reps);
  printf("| kernel | ms | GB/s of f32 |\n|---|---|---|\n");
  for (int k = 0; k < K_COUNT; k++) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
      double t0 = now_s();
      run_kernel(k, a, b, w, n);
      double t = now_s() - t0;
      if (t < best) best = t;
    }
    printf("| %s | %.1f | %.1f |\n", names[k], best * 1e3, n * 4e-9 / best);
  }
  free(a);
  free(b);
  free(w);
  return 0;
}

/*
 * mem_bound.c - the memory-bandwidth bound of a 2-rank float32 allreduce on
 * one host: two buffers (the two ranks' data) and two threads, each reducing
 * its half of both in place (a[i] = b[i] = a[i] + b[i]), so every input is
 * read once and every output written once, which no allreduce can beat.
 *
 * usage: mem_bound ITERS WARMUP BYTES   prints "BYTES MEAN_US" (the same line
 * as the other runners of bench/collectives/run.sh), or nothing and exit 1
 * when the sums are wrong.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static size_t g_n;
static float *g_a, *g_b;
static int g_iters;
static double g_mean_us;
/* A spinning barrier of the two threads (one per core): a futex wake-up would add its ~100 us to
 * every round and loosen the bound. */
static atomic_uint g_arrived, g_generation;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void barrier2(unsigned *gen) {
  unsigned next = ++*gen;
  if (atomic_fetch_add(&g_arrived, 1) == 1) {
    atomic_store(&g_arrived, 0);
    atomic_store(&g_generation, next);
  } else {
    while (atomic_load(&g_generation) != next) {
    }
  }
}

static void *worker(void *arg) {
  size_t t = (size_t)arg, lo = t * g_n / 2, hi = (t + 1) * g_n / 2;
  float *a = g_a, *b = g_b;
  unsigned gen = atomic_load(&g_generation);
  barrier2(&gen);
  double t0 = now_us();
  for (int it = 0; it < g_iters; it++) {
    for (size_t i = lo; i < hi; i++) {
      float s = a[i] + b[i];
      a[i] = s;
      b[i] = s;
    }
    barrier2(&gen);
  }
  if (t == 0) g_mean_us = (now_us() - t0) / g_iters;
  return NULL;
}

/* Runs `iters` timed rounds; returns the mean microseconds per round. */
static double run(int iters) {
  pthread_t th[2];
  g_iters = iters;
  for (size_t t = 0; t < 2; t++) pthread_create(&th[t], NULL, worker, (void *)t);
  for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
  return g_mean_us;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: mem_bound ITERS WARMUP BYTES\n");
    return 2;
  }
  int iters = atoi(argv[1]), warm = atoi(argv[2]);
  size_t bytes = strtoull(argv[3], NULL, 10);
  g_n = bytes / sizeof(float);
  g_a = malloc(g_n * sizeof(float));
  g_b = malloc(g_n * sizeof(float));
  if (iters < 1 || warm < 0 || g_n < 2 || g_a == NULL || g_b == NULL) return 2;
  /* Small integers: exact sums. */
  for (size_t i = 0; i < g_n; i++) {
    g_a[i] = (float)(i % 7);
    g_b[i] = 1.0f;
  }
  run(1);
  for (size_t i = 0; i < g_n; i++)
    if (g_a[i] != (float)(i % 7) + 1.0f || g_b[i] != g_a[i]) {
      fprintf(stderr, "mem_bound: wrong sum at %zu\n", i);
      return 1;
    }
  for (size_t i = 0; i < g_n; i++) g_a[i] = g_b[i] = 0.0f; /* stays 0: no overflow, no denormals */
  if (warm > 0) run(warm);
  printf("%zu %.3f\n", bytes, run(iters));
  return 0;
}

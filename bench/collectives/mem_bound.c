/*
 * mem_bound.c - the memory-bandwidth bound of an N-rank float32 allreduce on
 * one host (N = 2 unless given): N buffers (the ranks' data) and N threads,
 * or one per core when there are fewer cores, each reducing its slice of all
 * N in place (every buffer's slice becomes the sum of the N slices), so every
 * input is read once and every output written once, which no allreduce can
 * beat.
 *
 * usage: mem_bound ITERS WARMUP BYTES [RANKS]   prints "BYTES MEAN_US" (the
 * same line as the other runners of bench/collectives/run.sh), or nothing and
 * exit 1 when the sums are wrong.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 64

static size_t g_n;
static int g_ranks, g_threads; /* g_threads <= the cores: the barrier spins */
static float *g_buf[MAX_RANKS];
static int g_iters;
static double g_mean_us;
/* A spinning barrier of the threads (one per core): a futex wake-up would add its ~100 us to
 * every round and loosen the bound. */
static atomic_uint g_arrived, g_generation;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void barrier(unsigned *gen) {
  unsigned next = ++*gen;
  if (atomic_fetch_add(&g_arrived, 1) == (unsigned)g_threads - 1) {
    atomic_store(&g_arrived, 0);
    atomic_store(&g_generation, next);
  } else {
    while (atomic_load(&g_generation) != next) {
    }
  }
}

/* Slice [lo, hi) of every buffer becomes the sum over the buffers: a chunk at a time, summed in an
 * L1-sized scratch array, so that every buffer is read once and written once with loops the
 * compiler vectorises. */
#define CHUNK 1024
static void reduce_slice(size_t lo, size_t hi) {
  if (g_ranks == 2) { /* run.sh's bound: one pass, no scratch */
    float *a = g_buf[0], *b = g_buf[1];
    for (size_t i = lo; i < hi; i++) {
      float s = a[i] + b[i];
      a[i] = s;
      b[i] = s;
    }
    return;
  }
  float acc[CHUNK];
  for (size_t c = lo; c < hi; c += CHUNK) {
    size_t n = hi - c < CHUNK ? hi - c : CHUNK;
    const float *b0 = g_buf[0] + c;
    for (size_t i = 0; i < n; i++) acc[i] = b0[i];
    for (int r = 1; r < g_ranks; r++) {
      const float *b = g_buf[r] + c;
      for (size_t i = 0; i < n; i++) acc[i] += b[i];
    }
    for (int r = 0; r < g_ranks; r++) {
      float *b = g_buf[r] + c;
      for (size_t i = 0; i < n; i++) b[i] = acc[i];
    }
  }
}

static void *worker(void *arg) {
  size_t t = (size_t)arg, nt = (size_t)g_threads, lo = t * g_n / nt, hi = (t + 1) * g_n / nt;
  unsigned gen = atomic_load(&g_generation);
  barrier(&gen);
  double t0 = now_us();
  for (int it = 0; it < g_iters; it++) {
    reduce_slice(lo, hi);
    barrier(&gen);
  }
  if (t == 0) g_mean_us = (now_us() - t0) / g_iters;
  return NULL;
}

/* Runs `iters` timed rounds; returns the mean microseconds per round. */
static double run(int iters) {
  pthread_t th[MAX_RANKS];
  g_iters = iters;
  for (size_t t = 0; t < (size_t)g_threads; t++) pthread_create(&th[t], NULL, worker, (void *)t);
  for (int t = 0; t < g_threads; t++) pthread_join(th[t], NULL);
  return g_mean_us;
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: mem_bound ITERS WARMUP BYTES [RANKS]\n");
    return 2;
  }
  int iters = atoi(argv[1]), warm = atoi(argv[2]);
  size_t bytes = strtoull(argv[3], NULL, 10);
  g_ranks = argc == 5 ? atoi(argv[4]) : 2;
  g_n = bytes / sizeof(float);
  if (iters < 1 || warm < 0 || g_ranks < 2 || g_ranks > MAX_RANKS || g_n < (size_t)g_ranks)
    return 2;
  /* A spinning thread that shares a core waits out whole time slices of the others: with more
   * ranks than cores, the cores there are do the same traffic. */
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  g_threads = cores > 0 && cores < g_ranks ? (int)cores : g_ranks;
  for (int r = 0; r < g_ranks; r++)
    if ((g_buf[r] = malloc(g_n * sizeof(float))) == NULL) return 2;
  /* Small integers: exact sums. */
  for (size_t i = 0; i < g_n; i++)
    for (int r = 0; r < g_ranks; r++) g_buf[r][i] = r == 0 ? (float)(i % 7) : (float)r;
  float extra = (float)(g_ranks * (g_ranks - 1) / 2); /* 1 + 2 + ... + (N - 1) */
  run(1);
  for (size_t i = 0; i < g_n; i++)
    for (int r = 0; r < g_ranks; r++)
      if (g_buf[r][i] != (float)(i % 7) + extra) {
        fprintf(stderr, "mem_bound: wrong sum at %zu\n", i);
        return 1;
      }
  /* stays 0: no overflow, no denormals */
  for (int r = 0; r < g_ranks; r++)
    for (size_t i = 0; i < g_n; i++) g_buf[r][i] = 0.0f;
  if (warm > 0) run(warm);
  printf("%zu %.3f\n", bytes, run(iters));
  return 0;
}

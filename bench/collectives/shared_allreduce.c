/*
 * shared_allreduce.c - a float32 allreduce timed on buffers from
 * cohort_mem_alloc (libcohort's single-copy path when all ranks share a
 * host; with COHORT_SINGLE_COPY=0 the ordinary algorithms on the same
 * buffers). One rank of a job started with the environment `cohort run`
 * gives (RANK, WORLD_SIZE, COHORT_STORE, COHORT_JOB_ID).
 *
 * usage: shared_allreduce ITERS WARMUP BYTES   rank 0 prints "BYTES MEAN_US"
 * (the slowest rank's mean), as the other runners of run.sh; nothing and
 * exit 1 when a sum is wrong.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cohort/cohort.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int fail(cohort_comm *c, const char *what, int rc) {
  fprintf(stderr, "shared_allreduce: %s: %s %s\n", what, cohort_strerror(rc),
          c ? cohort_comm_error_message(c) : "");
  cohort_comm_destroy(c);
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: shared_allreduce ITERS WARMUP BYTES\n");
    return 2;
  }
  int iters = atoi(argv[1]), warm = atoi(argv[2]);
  size_t n = strtoull(argv[3], NULL, 10) / sizeof(float);
  if (iters < 1 || warm < 0 || n < 1) return 2;
  cohort_comm *c = NULL;
  int rc = cohort_comm_create_from_env(&c);
  if (rc != 0) return fail(NULL, "create", rc);
  int r = cohort_comm_rank(c), size = cohort_comm_size(c);
  float *buf = NULL;
  rc = cohort_mem_alloc(c, n * sizeof(float), (void **)&buf);
  if (rc != 0) return fail(c, "cohort_mem_alloc", rc);
  /* Ones: after k in-place sums every element is size^k, exact while it fits (checked once). */
  for (size_t i = 0; i < n; i++) buf[i] = 1.0f;
  rc = cohort_allreduce(c, buf, buf, n, COHORT_F32, COHORT_SUM);
  for (size_t i = 0; rc == 0 && i < n; i++)
    if (buf[i] != (float)size) rc = -1;
  if (rc != 0) return fail(c, "wrong sum", rc);
  for (int i = 0; i < warm && rc == 0; i++)
    rc = cohort_allreduce(c, buf, buf, n, COHORT_F32, COHORT_AVG);
  if (rc == 0) rc = cohort_barrier(c);
  double t0 = now_us();
  for (int i = 0; i < iters && rc == 0; i++)
    rc = cohort_allreduce(c, buf, buf, n, COHORT_F32, COHORT_AVG);
  double mean = (now_us() - t0) / iters;
  if (rc == 0) rc = cohort_allreduce(c, &mean, &mean, 1, COHORT_F64, COHORT_MAX);
  if (rc != 0) return fail(c, "allreduce", rc);
  if (r == 0) printf("%zu %.3f\n", n * sizeof(float), mean);
  cohort_mem_free(c, buf);
  cohort_comm_destroy(c);
  return 0;
}

/*
 * reform_coll_worker.c - a libcohort worker that re-forms, for
 * test_reform_coll_agent.sh under the real `cohort run --on-failure reform`.
 *
 * Every step is an allreduce (sum of ones: the world size, checked) and an
 * allreduce (max) of "the file $REFORM_DONE exists", so all ranks leave at
 * the same step (exit 0). On COHORT_ERESHAPED it re-forms, then hands its
 * state (STATE_MIB MiB: a pattern of the step it reached, which every
 * survivor agrees on through an allreduce max) to the newcomers. Prints:
 *   start pid=P rank=R world=W newcomer=N epoch=E at=S
 *   reshape pid=P rank=R ms=T at=S  (T: from its last good step to ERESHAPED)
 *   formed pid=P rank=R world=W epoch=E ms=T at=S   (T: the reform's duration)
 *   state pid=P rank=R ok=1 new=N bytes=B ms=T at=S (the state transfer)
 * (S: wall-clock seconds, which the test compares with the kill's.)
 * Exits 1 on a wrong result or a failed call (with the reason on stderr).
 */
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cohort/cohort.h"

#define STATE_MIB 16

/* Wall-clock seconds, for the test's figures across processes. */
static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static unsigned char pattern(size_t i, int64_t step) {
  return (unsigned char)((i * 131u + (uint64_t)step * 7u) % 251u + 1u);
}

/* The state: a pattern derived from the step, so the newcomer can check what it received. */
static int hand_over(cohort_comm *c, unsigned char *st, size_t bytes, int64_t *step) {
  int r = cohort_comm_rank(c);
  int64_t s = cohort_comm_is_new(c, r) ? -1 : *step;
  int rc = cohort_allreduce(c, &s, &s, 1, COHORT_I64, COHORT_MAX); /* the survivors' step */
  if (rc != 0) return rc;
  int is_new = cohort_comm_is_new(c, r);
  if (!is_new)
    for (size_t i = 0; i < bytes; i++) st[i] = pattern(i, s);
  int64_t t0 = base_now_ms();
  rc = cohort_comm_state_transfer(c, st, bytes);
  if (rc != 0) return rc;
  size_t bad = 0;
  for (size_t i = 0; i < bytes; i++) bad += st[i] != pattern(i, s);
  printf("state pid=%d rank=%d ok=%d new=%d bytes=%zu ms=%lld at=%.3f\n", (int)getpid(), r,
         bad == 0, is_new, bytes, (long long)(base_now_ms() - t0), wall());
  fflush(stdout);
  *step = s;
  return bad == 0 ? 0 : -1;
}

static int reform(cohort_comm *c, unsigned char *st, size_t bytes, int64_t *step) {
  int rc;
  do {
    int64_t t0 = base_now_ms();
    rc = cohort_comm_reform(c);
    if (rc == 0)
      printf("formed pid=%d rank=%d world=%d epoch=%d ms=%lld at=%.3f\n", (int)getpid(),
             cohort_comm_rank(c), cohort_comm_size(c), cohort_comm_epoch(c),
             (long long)(base_now_ms() - t0), wall());
    fflush(stdout);
    if (rc == 0) rc = hand_over(c, st, bytes, step);
  } while (rc == COHORT_ERESHAPED);
  return rc;
}

int main(void) {
  cohort_comm *c = NULL;
  int rc = cohort_comm_create_from_env(&c);
  if (rc != 0) {
    fprintf(stderr, "worker: create: %s\n", cohort_strerror(rc));
    return 1;
  }
  const char *done = getenv("REFORM_DONE");
  size_t bytes = (size_t)STATE_MIB << 20, count = 1u << 16;
  unsigned char *st = calloc(bytes, 1);
  float *v = malloc(count * sizeof *v);
  int64_t step = 0, last_ok = base_now_ms();
  printf("start pid=%d rank=%d world=%d newcomer=%d epoch=%d at=%.3f\n", (int)getpid(),
         cohort_comm_rank(c), cohort_comm_size(c), cohort_comm_is_new(c, cohort_comm_rank(c)),
         cohort_comm_epoch(c), wall());
  fflush(stdout);
  if (cohort_comm_is_new(c, cohort_comm_rank(c))) rc = hand_over(c, st, bytes, &step);
  if (rc == COHORT_ERESHAPED) rc = reform(c, st, bytes, &step);
  if (rc != 0) {
    fprintf(stderr, "worker: %s (%s)\n", cohort_strerror(rc), cohort_comm_error_message(c));
    return 1;
  }
  for (int32_t leave = 0; !leave;) {
    for (size_t i = 0; i < count; i++) v[i] = 1.0f;
    rc = cohort_allreduce(c, v, v, count, COHORT_F32, COHORT_SUM);
    if (rc == 0 && (v[0] != (float)cohort_comm_size(c) || v[count - 1] != v[0])) {
      fprintf(stderr, "worker: wrong sum %g in a world of %d\n", v[0], cohort_comm_size(c));
      return 1;
    }
    leave = done != NULL && access(done, F_OK) == 0;
    if (rc == 0) rc = cohort_allreduce(c, &leave, &leave, 1, COHORT_I32, COHORT_MAX);
    if (rc == COHORT_ERESHAPED) {
      printf("reshape pid=%d rank=%d ms=%lld at=%.3f\n", (int)getpid(), cohort_comm_rank(c),
             (long long)(base_now_ms() - last_ok), wall());
      rc = reform(c, st, bytes, &step);
      leave = 0;
    }
    if (rc != 0) {
      fprintf(stderr, "worker: %s (%s)\n", cohort_strerror(rc), cohort_comm_error_message(c));
      return 1;
    }
    cohort_comm_set_step(c, ++step);
    last_ok = base_now_ms();
    usleep(20000);
  }
  cohort_comm_destroy(c);
  free(st);
  free(v);
  return 0;
}

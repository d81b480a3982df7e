/*
 * reform_steps_worker.c STEPS - a libcohort program that outlives lost peers
 * (docs/reform.md), for the agent's end-to-end test.
 *
 * Each step is one allreduce of 1.0 (its result must be the world size) and
 * 50 ms of sleep. On COHORT_ERESHAPED it calls cohort_comm_reform() and hands
 * its step count to new ranks (cohort_comm_state_transfer), so every rank
 * ends at step STEPS together. Lines: "start pid=P rank=R size=N new=B",
 * "reformed pid=P rank=R size=N epoch=E step=S", "done pid=P rank=R size=N
 * step=S"; exit 1 on any other error or a wrong sum.
 *
 * A replacement still starting: with REFORM_HELLO_AFTER=FILE a newcomer
 * (COHORT_NEWCOMER=1) prints "wait pid=P" and creates its communicator (whose
 * hello that is) only once FILE exists (at most 120 s).
 *
 * A rank that ends without a goodbye: with REFORM_NO_DESTROY=R, rank R exits
 * at once after its last step (or, with REFORM_EXIT_AT=K, exits with status
 * REFORM_EXIT_CODE, default 0, after step K), without cohort_comm_destroy.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cohort/cohort.h"

static void nap(void) {
  struct timespec ts = {0, 50 * 1000 * 1000};
  nanosleep(&ts, NULL);
}

static int fail(cohort_comm *comm, const char *what, int rc) {
  fprintf(stderr, "reform_steps_worker: %s: %s (%s)\n", what, cohort_strerror(rc),
          comm != NULL ? cohort_comm_error_message(comm) : "");
  return 1;
}

/* A re-form and the step handed to new ranks; 0 or an error. */
static int reform(cohort_comm *comm, int64_t *step) {
  for (;;) {
    int rc = cohort_comm_reform(comm);
    if (rc == 0) rc = cohort_comm_state_transfer(comm, step, sizeof *step);
    if (rc != COHORT_ERESHAPED) return rc;
  }
}

/* REFORM_HELLO_AFTER (a newcomer only): until its file exists, bounded. */
static void hold_hello(void) {
  const char *gate = getenv("REFORM_HELLO_AFTER"), *nc = getenv("COHORT_NEWCOMER");
  if (gate == NULL || nc == NULL || strcmp(nc, "1") != 0) return;
  printf("wait pid=%d\n", (int)getpid());
  fflush(stdout);
  for (int i = 0; i < 2400 && access(gate, F_OK) != 0; i++) nap();
}

/* REFORM_NO_DESTROY=R: whether this rank leaves now, without a goodbye (its last step, or
 * REFORM_EXIT_AT's). */
static int no_goodbye(cohort_comm *comm, int64_t step, int64_t steps) {
  const char *r = getenv("REFORM_NO_DESTROY"), *at = getenv("REFORM_EXIT_AT");
  if (r == NULL || atoi(r) != cohort_comm_rank(comm)) return 0;
  return step == (at != NULL && at[0] != '\0' ? atoll(at) : steps);
}

int main(int argc, char **argv) {
  int64_t steps = argc > 1 ? atoll(argv[1]) : 60, step = 0;
  cohort_comm *comm = NULL;
  hold_hello();
  int rc = cohort_comm_create_from_env(&comm);
  if (rc != 0) return fail(comm, "create", rc);
  int me = cohort_comm_rank(comm);
  printf("start pid=%d rank=%d size=%d new=%d\n", (int)getpid(), me, cohort_comm_size(comm),
         cohort_comm_is_new(comm, me));
  fflush(stdout);
  /* A newcomer receives the step; at the first start nobody is new and this returns at once. */
  rc = cohort_comm_state_transfer(comm, &step, sizeof step);
  if (rc == COHORT_ERESHAPED) rc = reform(comm, &step);
  if (rc != 0) return fail(comm, "state", rc);
  while (step < steps) {
    float one = 1.0f, sum = 0.0f;
    rc = cohort_allreduce(comm, &one, &sum, 1, COHORT_F32, COHORT_SUM);
    if (rc == COHORT_ERESHAPED) {
      if ((rc = reform(comm, &step)) != 0) return fail(comm, "reform", rc);
      printf("reformed pid=%d rank=%d size=%d epoch=%d step=%lld\n", (int)getpid(),
             cohort_comm_rank(comm), cohort_comm_size(comm), cohort_comm_epoch(comm),
             (long long)step);
      fflush(stdout);
      continue;
    }
    if (rc != 0) return fail(comm, "allreduce", rc);
    if (sum != (float)cohort_comm_size(comm)) return fail(comm, "wrong sum", -1);
    step++;
    cohort_comm_set_step(comm, step);
    if (no_goodbye(comm, step, steps)) {
      printf("leaves pid=%d rank=%d step=%lld\n", (int)getpid(), cohort_comm_rank(comm),
             (long long)step);
      fflush(stdout);
      const char *code = getenv("REFORM_EXIT_CODE");
      _exit(code != NULL ? atoi(code) : 0);
    }
    nap();
  }
  printf("done pid=%d rank=%d size=%d step=%lld\n", (int)getpid(), cohort_comm_rank(comm),
         cohort_comm_size(comm), (long long)step);
  cohort_comm_destroy(comm);
  return 0;
}

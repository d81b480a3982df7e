/*
 * test_hang_worker.c - a libcohort worker that hangs the job: it allreduces
 * in a loop, and rank HANG_RANK skips the allreduce of step 5 and sleeps
 * instead, so the others wait in cohort_allreduce. Prints its pid first
 * ("pid N") and "hanging" from the stuck rank. STEPS (default 1000000)
 * ends the loop, STEP_MS sleeps that long in every step (silently: only
 * libcohort's own progress reports say it is alive), then it prints "done".
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cohort/cohort.h>

int main(void) {
  printf("pid %d\n", (int)getpid());
  fflush(stdout);
  cohort_comm *comm = NULL;
  if (cohort_comm_create_from_env(&comm) != 0) return 1;
  int rank = cohort_comm_rank(comm);
  const char *hr = getenv("HANG_RANK");
  int hang_rank = hr ? atoi(hr) : -1;
  const char *steps_env = getenv("STEPS"), *ms_env = getenv("STEP_MS");
  int steps = steps_env ? atoi(steps_env) : 1000000, step_ms = ms_env ? atoi(ms_env) : 0;
  float grad[256] = {0}; /* (256,) */
  for (int step = 0; step < steps; step++) {
    if (rank == hang_rank && step == 5) {
      printf("hanging\n");
      fflush(stdout);
      sleep(3600); /* WORKER-SLEEP */
    }
    int rc = cohort_allreduce(comm, grad, grad, 256, COHORT_F32, COHORT_SUM); /* WORKER-ALLREDUCE */
    if (rc != 0) break;
    if (step_ms > 0) usleep((useconds_t)step_ms * 1000);
  }
  printf("done\n");
  cohort_comm_destroy(comm);
  return 0;
}

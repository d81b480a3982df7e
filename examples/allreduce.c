/*
 * allreduce.c - the smallest libcohort program: every rank contributes
 * (rank + 1) * (i + 1) to element i and prints the sums.
 *
 * Run it on one node with two workers:
 *   cohort run --nproc-per-node 2 ./allreduce
 * Every rank prints the same sums, here for 2 ranks: 3 6 9 12.
 */
#include <stdio.h>

#include <cohort/cohort.h>

int main(void) {
  cohort_comm *comm = NULL;
  int rc = cohort_comm_create_from_env(&comm);
  if (rc != 0) {
    fprintf(stderr, "allreduce: cannot create the communicator: %s\n", cohort_strerror(rc));
    return 1;
  }
  int rank = cohort_comm_rank(comm), size = cohort_comm_size(comm);

  float buf[4]; /* (4,) */
  for (int i = 0; i < 4; i++) buf[i] = (float)((rank + 1) * (i + 1));
  rc = cohort_allreduce(comm, buf, buf, 4, COHORT_F32, COHORT_SUM);
  if (rc != 0) {
    fprintf(stderr, "allreduce: rank %d: %s (%s)\n", rank, cohort_strerror(rc),
            cohort_comm_error_message(comm));
    cohort_comm_destroy(comm);
    return 1;
  }
  printf("rank %d of %d: %g %g %g %g\n", rank, size, buf[0], buf[1], buf[2], buf[3]);
  cohort_comm_destroy(comm);
  return 0;
}

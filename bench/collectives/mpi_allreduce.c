/*
 * mpi_allreduce.c - the Open MPI peer of bench/collectives/run.sh.
 * Usage: mpi_allreduce ITERS WARMUP SIZE... ; for each size (bytes of
 * float32) rank 0 prints "SIZE TIME_US" where TIME_US is the slowest rank's
 * mean time of one MPI_Allreduce(MPI_SUM) over ITERS after WARMUP untimed.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc < 4) {
    if (rank == 0) fprintf(stderr, "usage: mpi_allreduce ITERS WARMUP SIZE...\n");
    MPI_Finalize();
    return 2;
  }
  int iters = atoi(argv[1]), warmup = atoi(argv[2]);
  for (int a = 3; a < argc; a++) {
    size_t bytes = strtoull(argv[a], NULL, 10), count = bytes / sizeof(float);
    float *in = malloc(count * sizeof(float) + 4), *out = malloc(count * sizeof(float) + 4);
    for (size_t i = 0; i < count; i++) in[i] = (float)((i + (size_t)rank) % 7);
    memset(out, 0, count * sizeof(float));
    for (int i = 0; i < warmup; i++)
      MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
      MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double us = (MPI_Wtime() - t0) / iters * 1e6, worst = 0;
    MPI_Reduce(&us, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("%zu %.3f\n", bytes, worst);
    fflush(stdout);
    free(in);
    free(out);
  }
  MPI_Finalize();
  return 0;
}

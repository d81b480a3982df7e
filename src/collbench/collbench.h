/*
 * collbench.h - the collective benchmark behind `cohort bench`: nccl-tests
 * style timings of libcohort's collectives, each result checked against the
 * serial reference (reference.h).
 *
 * Runs collectives through the public API (cohort/cohort.h) only; the local
 * ranks meet at the internal store server. Prints nothing: rows go to the
 * caller's function, which formats them.
 */
#ifndef COHORT_COLLBENCH_COLLBENCH_H
#define COHORT_COLLBENCH_COLLBENCH_H

#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"

typedef enum collbench_op {
  COLLBENCH_ALLREDUCE,
  COLLBENCH_REDUCE_SCATTER,
  COLLBENCH_ALLGATHER,
  COLLBENCH_BROADCAST,
  COLLBENCH_REDUCE,
  COLLBENCH_NOPS
} collbench_op;

/* "allreduce", "reduce_scatter", ... as nccl-tests names them. */
const char *collbench_op_name(collbench_op op);

/* Where the buffers live: ordinary memory as a program's own (4 KiB pages unless the system backs
 * all memory with huge ones, or the one-host allreduce collapses them: COHORT_SHM_COLLAPSE), the
 * same advised for transparent huge pages (MADV_HUGEPAGE, as allocators that ask for them give),
 * or cohort_mem_alloc's shared memory. */
typedef enum collbench_mem {
  COLLBENCH_MEM_PRIVATE,
  COLLBENCH_MEM_SHARED,
  COLLBENCH_MEM_HUGE,
} collbench_mem;

typedef struct collbench_opts {
  uint64_t minb, maxb; /* total bytes of the first and last row */
  uint64_t factor;     /* size multiplier between rows, >= 2 */
  cohort_dtype dtype;
  cohort_redop redop;
  int iters, warmup; /* timed and untimed iterations per size */
  int root;          /* of broadcast and reduce */
  int check;         /* 1: a separate run per size is compared with the reference */
  int mem;           /* collbench_mem: where send and recv live */
} collbench_opts;

/* One size of one collective: out of place [0] and in place [1]. */
typedef struct collbench_row {
  collbench_op op;
  size_t bytes, count;       /* as nccl-tests: total bytes and elements */
  int reduces, rooted;       /* whether redop and root apply */
  int has[2];                /* broadcast has no out-of-place form */
  double us[2];              /* the slowest rank's mean time per iteration */
  double algbw[2], busbw[2]; /* GB/s */
  int64_t wrong[2];          /* elements that differ from the reference, over all ranks */
} collbench_row;

/* Called on every rank with the same row (times and counts are agreed over ranks). */
typedef void (*collbench_row_fn)(const collbench_row *row, void *ctx);

typedef struct collbench collbench;

/* Buffers for o on communicator c (a collective call when they are shared). Returns 0 or -ENOMEM,
 * -EINVAL (root beyond the ranks), madvise's error (huge) or cohort_mem_alloc's (shared). */
int collbench_create(cohort_comm *c, const collbench_opts *o, collbench **out);
void collbench_destroy(
    collbench *b); /* NULL: no-op; a collective call when the buffers are shared */

/*
 * Runs op for every size of the options on every rank (a collective call)
 * and passes each row to fn. Returns 0, or the failed collective's error
 * (then *failed_bytes is its size and cohort_comm_error_message() says more).
 */
int collbench_op_run(collbench *b, collbench_op op, collbench_row_fn fn, void *ctx,
                     size_t *failed_bytes);

/*
 * Runs rank_main(arg) in n forked processes on this machine, as ranks of
 * one job around a store server on loopback: each child finds RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, COHORT_STORE and COHORT_JOB_ID
 * in its environment, and COHORT_TRANSPORT = transport unless NULL.
 * Returns the highest exit status of the ranks, or -errno when the store or
 * a fork failed (the ranks started are still waited for).
 */
int collbench_fork_ranks(int n, const char *transport, int (*rank_main)(void *arg), void *arg);

#endif

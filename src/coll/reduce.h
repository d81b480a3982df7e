/*
 * reduce.h - the reduction kernels (reduce.c): what the engine applies to
 * bytes as they arrive and the algorithms to whole buffers.
 */
#ifndef COHORT_COLL_REDUCE_H
#define COHORT_COLL_REDUCE_H

#include <stddef.h>

#include "cohort/cohort.h"

/* dst[i] = a[i] op b[i] for n elements; dst may be a (exactly). AVG is SUM. */
void coll_reduce(cohort_dtype dt, cohort_redop op, void *dst, const void *a, const void *b,
                 size_t n);
/* Finishes AVG in place: buf[i] /= size (integer division for integer types). */
void coll_reduce_finish(cohort_dtype dt, cohort_redop op, void *buf, size_t n, int size);
/* The two-rank step of a float sum or average in one pass, each input read and each output
 * written once: d0[i] = d1[i] = a[i] + b[i], finished for an average over `fin` ranks when
 * fin > 0. d0 may be a and d1 may be b (exactly). Returns 0 (and touches nothing) for another
 * type or operation, or a divisor that is not a power of two: the caller takes the general path. */
int coll_reduce_pair(cohort_dtype dt, cohort_redop op, void *d0, void *d1, const void *a,
                     const void *b, size_t n, int fin);
const char *coll_dtype_name(cohort_dtype dt);
const char *coll_redop_name(cohort_redop op);

#endif

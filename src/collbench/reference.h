/*
 * reference.h - deterministic inputs for the collectives and the serial
 * reference of their reduction, so that a result can be checked exactly:
 * `cohort bench` checks with them, and so does tests/test_coll.c.
 *
 * The inputs are small integers, so every reduction is exact in every type
 * (f16 and bf16 included) whatever the order the algorithm adds them in.
 * Pure functions; thread-safe.
 */
#ifndef COHORT_COLLBENCH_REFERENCE_H
#define COHORT_COLLBENCH_REFERENCE_H

#include <stddef.h>

#include "cohort/cohort.h"

/* v rounded to dt's precision, to nearest with ties to even as IEEE 754 (and libcohort) round,
 * beyond dt's range infinity: f32, f16 and bf16 (through f32 first, as f32 buffers are sent
 * in 16 bits); any other type's v unchanged. Computed without libcohort's converters. */
double collbench_round(cohort_dtype dt, double v);

/* Stores v as element i of buf, of type dt (rounded as collbench_round rounds). */
void collbench_put(cohort_dtype dt, void *buf, size_t i, double v);

/* The input of rank r at element i for operator op. */
double collbench_input(cohort_redop op, cohort_dtype dt, int r, size_t i);

/* Element j of out = the reduction over n ranks of collbench_input(op, dt, r, i),
 * finished as the library finishes COHORT_AVG (a division in dt). */
void collbench_reference(cohort_redop op, cohort_dtype dt, int n, size_t i, void *out, size_t j);

#endif

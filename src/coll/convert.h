/*
 * convert.h - f32 <-> the 16-bit float types (f16, bf16), rounding to
 * nearest even (defined in reduce.c), beneath every layer of the
 * collectives.
 */
#ifndef COHORT_COLL_CONVERT_H
#define COHORT_COLL_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"

float coll_f16_to_f32(uint16_t h);
uint16_t coll_f32_to_f16(float f);
float coll_bf16_to_f32(uint16_t h);
uint16_t coll_f32_to_bf16(float f);
/* f32 <-> a 16-bit wire type (COHORT_BF16 or COHORT_F16), rounding to nearest even. */
void coll_to_wire(cohort_dtype wire, uint16_t *dst, const float *src, size_t n);
void coll_from_wire(cohort_dtype wire, float *dst, const uint16_t *src, size_t n);
/* coll_to_wire, returning 1 when some src[i] is not its rounded value widened back (bit for bit),
 * 0 when src already holds wire values. */
int coll_to_wire_changes(cohort_dtype wire, uint16_t *dst, const float *src, size_t n);
/* The receiving end of a sum whose bytes travel in the wire type (engine.c): dst[i] = local[i]
 * rounded to the wire type plus in[i], the sum rounded to the wire type and widened back; the
 * bits of rounding local into a wire buffer, summing there and widening the result, in one pass.
 * dst may be local (exactly). */
void coll_sum_from_wire(cohort_dtype wire, float *dst, const float *local, const uint16_t *in,
                        size_t n);

#endif

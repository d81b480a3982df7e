/*
 * reference.c - inputs and the serial reference (see reference.h).
 *
 * f16 and bf16 values are rounded here by arithmetic on doubles (the
 * quantum of the value's binade, rint to nearest even) and only then laid
 * out in bits, deliberately not with libcohort's converters, whose bit
 * tricks are what the checks are there to catch: a rounding bug in the
 * library makes its results differ from this reference.
 */
#include "collbench/reference.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The 16-bit formats: significant bits, and the exponent of the smallest normal. */
typedef struct half_format {
  int digits;
  int emin;
  double max; /* the largest finite value */
} half_format;

static const half_format f16_format = {11, -14, 0x1.ffcp15};  /* 65504 */
static const half_format bf16_format = {8, -126, 0x1.fep127}; /* 255 x 2^120 */

/* x rounded to nearest, ties to even, to the format's precision; beyond max: infinity.
 * The rounding mode is the default (FE_TONEAREST) that rint follows. */
static double round_to(const half_format *f, double x) {
  if (isnan(x) || isinf(x) || x == 0.0) return x;
  int e;
  (void)frexp(x, &e); /* |x| = m 2^e, 0.5 <= m < 1: the unit of the last place is 2^(e - digits) */
  int ulp = e - f->digits;
  if (ulp < f->emin + 1 - f->digits) ulp = f->emin + 1 - f->digits; /* subnormals: fixed step */
  double r = ldexp(rint(ldexp(x, -ulp)), ulp);
  if (fabs(r) > f->max) return copysign(INFINITY, x);
  return r;
}

double collbench_round(cohort_dtype dt, double v) {
  switch (dt) {
  case COHORT_F32:
    return (float)v;
  case COHORT_F16:
    return round_to(&f16_format, (float)v);
  case COHORT_BF16:
    return round_to(&bf16_format, (float)v);
  default:
    return v;
  }
}

/* The IEEE 754 binary16 bits of v, a value of that format (round_to's result). */
static uint16_t f16_bits(double v) {
  uint16_t sign = signbit(v) ? 0x8000u : 0;
  double a = fabs(v);
  if (isnan(v)) return sign | 0x7e00u;
  if (isinf(v)) return sign | 0x7c00u;
  if (a < ldexp(1.0, f16_format.emin)) return (uint16_t)(sign | (uint16_t)ldexp(a, 24));
  int e;
  double m = frexp(a, &e); /* a = m 2^e, m in [0.5, 1): biased exponent e - 1 + 15 */
  return (uint16_t)(sign | (uint16_t)((e + 14) << 10) | (uint16_t)ldexp(2.0 * m - 1.0, 10));
}

/* bfloat16 is the upper half of binary32: v, a bf16 value, is exact as a float. */
static uint16_t bf16_bits(double v) {
  float f = (float)v;
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return (uint16_t)(x >> 16);
}

void collbench_put(cohort_dtype dt, void *buf, size_t i, double v) {
  switch (dt) {
  case COHORT_F32:
    ((float *)buf)[i] = (float)v;
    break;
  case COHORT_F64:
    ((double *)buf)[i] = v;
    break;
  case COHORT_F16:
    ((uint16_t *)buf)[i] = f16_bits(collbench_round(dt, v));
    break;
  case COHORT_BF16:
    ((uint16_t *)buf)[i] = bf16_bits(collbench_round(dt, v));
    break;
  case COHORT_I32:
    ((int32_t *)buf)[i] = (int32_t)v;
    break;
  case COHORT_I64:
    ((int64_t *)buf)[i] = (int64_t)v;
    break;
  case COHORT_U8:
    ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v;
    break;
  default:
    break;
  }
}

double collbench_input(cohort_redop op, cohort_dtype dt, int r, size_t i) {
  size_t h = (size_t)r * 7919u + i * 104729u + (size_t)op * 13u;
  switch (op) {
  case COHORT_PROD: {
    /* Factors of 2 only from the first 8 ranks: a product stays within 2^8,
     * exact in every type, however many ranks take part. */
    int k = (int)(h % 5);
    return k == 0 && r < 8 ? 2 : (k == 1 && dt != COHORT_U8 ? -1 : 1);
  }
  case COHORT_MIN:
  case COHORT_MAX:
    return dt == COHORT_U8 ? (double)(h % 101) : (double)(h % 101) - 50;
  default:
    return dt == COHORT_U8 ? (double)(h % 7) : (double)(h % 7) - 3;
  }
}

/* The average finished in dt, as the library does: a division of the sum. */
static void put_average(cohort_dtype dt, void *out, size_t j, double sum, int n) {
  switch (dt) {
  case COHORT_F32:
    ((float *)out)[j] = (float)sum / (float)n;
    break;
  case COHORT_F64:
    ((double *)out)[j] = sum / (double)n;
    break;
  case COHORT_F16:
  case COHORT_BF16:
    collbench_put(dt, out, j, (float)sum / (float)n);
    break;
  case COHORT_I32:
    ((int32_t *)out)[j] = (int32_t)sum / n;
    break;
  case COHORT_I64:
    ((int64_t *)out)[j] = (int64_t)sum / n;
    break;
  case COHORT_U8:
    ((uint8_t *)out)[j] = (uint8_t)((uint8_t)sum / n);
    break;
  default:
    break;
  }
}

void collbench_reference(cohort_redop op, cohort_dtype dt, int n, size_t i, void *out, size_t j) {
  double acc = collbench_input(op, dt, 0, i);
  for (int r = 1; r < n; r++) {
    double v = collbench_input(op, dt, r, i);
    if (op == COHORT_PROD)
      acc *= v;
    else if (op == COHORT_MIN)
      acc = v < acc ? v : acc;
    else if (op == COHORT_MAX)
      acc = v > acc ? v : acc;
    else
      acc += v;
  }
  if (dt == COHORT_U8) acc = (double)((uint64_t)(int64_t)acc & 0xffu);
  if (op == COHORT_AVG)
    put_average(dt, out, j, acc, n);
  else
    collbench_put(dt, out, j, acc);
}

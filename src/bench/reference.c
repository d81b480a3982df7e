/*
 * reference.c - inputs and the serial reference (see reference.h).
 *
 * f16 and bf16 values are made with libcohort's own converters (coll/convert.h):
 * the reference must round exactly as the library does, so it uses them
 * rather than a copy.
 */
#include "bench/reference.h"

#include <stdint.h>

#include "coll/convert.h"

void bench_put(cohort_dtype dt, void *buf, size_t i, double v) {
  switch (dt) {
  case COHORT_F32:
    ((float *)buf)[i] = (float)v;
    break;
  case COHORT_F64:
    ((double *)buf)[i] = v;
    break;
  case COHORT_F16:
    ((uint16_t *)buf)[i] = coll_f32_to_f16((float)v);
    break;
  case COHORT_BF16:
    ((uint16_t *)buf)[i] = coll_f32_to_bf16((float)v);
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

double bench_input(cohort_redop op, cohort_dtype dt, int r, size_t i) {
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
    ((uint16_t *)out)[j] = coll_f32_to_f16((float)sum / (float)n);
    break;
  case COHORT_BF16:
    ((uint16_t *)out)[j] = coll_f32_to_bf16((float)sum / (float)n);
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

void bench_reference(cohort_redop op, cohort_dtype dt, int n, size_t i, void *out, size_t j) {
  double acc = bench_input(op, dt, 0, i);
  for (int r = 1; r < n; r++) {
    double v = bench_input(op, dt, r, i);
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
    bench_put(dt, out, j, acc);
}

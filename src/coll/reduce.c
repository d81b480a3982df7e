/*
 * reduce.c - element-wise reduction kernels and half-precision conversions.
 *
 * f16 and bf16 are widened to f32, combined in f32 and rounded back to
 * nearest-even once per combination, so a sum of small integers is exact.
 * Built with -O3 (module.cmake) so the plain loops vectorise.
 */
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "coll/convert.h"
#include "coll/reduce.h"

/* The 16-bit wire kernels are built three times on x86-64 by gcc, for AVX-512 (x86-64-v4), for
 * AVX2 and for the baseline, and the loader picks the one the CPU runs (an ifunc): wider lanes
 * and the packing of 32-bit lanes into 16-bit ones cut the cost of rounding and summing bf16
 * (AVX2 halved it; on the 2-vCPU Xeon of docs/gpt2.md AVX-512 takes the receiving sum over 252
 * MB from 88 to 40 ms and the rounding from 46 to 33). Same results bit for bit: integer
 * operations and single additions, in the same order (test_coll's sweep compares the version the
 * CPU runs with a scalar reference). (clang 14 names the clones of an external function so that
 * other files cannot call it: its builds keep the one version.) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define WIRE_KERNEL __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
#endif
#ifndef WIRE_KERNEL
#define WIRE_KERNEL
#endif

float coll_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {
      /* Subnormal half: normalise into a float. */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t coll_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t man = x & 0x7fffffu;
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0)); /* inf / nan */
  int e = (int)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u); /* overflow to inf */
  if (e <= 0) {
    if (e < -10) return sign; /* underflows to zero */
    /* Subnormal half: shift the mantissa with its implicit bit, round to nearest even. */
    man |= 0x800000u;
    int shift = 14 - e;
    uint32_t half = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = ((uint32_t)e << 10) | (man >> 13);
  uint32_t rem = man & 0x1fffu;
  /* Rounding may carry into the exponent, which is still correct (up to inf). */
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++;
  return (uint16_t)(sign | half);
}

/* Branch-free, so the loops over arrays vectorise: a NaN keeps its top bits (made quiet), anything
 * else rounds to nearest even (a carry into the exponent is right, up to infinity). */
static inline uint16_t bf16_round(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  uint32_t quiet = (x >> 16) | 0x40u;
  return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

static inline float bf16_widen(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t coll_f32_to_bf16(float f) {
  return bf16_round(f);
}

float coll_bf16_to_f32(uint16_t h) {
  return bf16_widen(h);
}

/* One loop per (type, op). dst may alias a; no restrict, the compiler adds the overlap check. */
#define COLL_LOOP(T, EXPR)                                                                         \
  do {                                                                                             \
    T *d_ = (T *)dst;                                                                              \
    const T *a_ = (const T *)a, *b_ = (const T *)b;                                                \
    for (size_t i = 0; i < n; i++) {                                                               \
      T x = a_[i], y = b_[i];                                                                      \
      d_[i] = (T)(EXPR);                                                                           \
    }                                                                                              \
  } while (0)

#define COLL_OPS(T)                                                                                \
  switch (op) {                                                                                    \
  case COHORT_SUM:                                                                                 \
  case COHORT_AVG:                                                                                 \
    COLL_LOOP(T, x + y);                                                                           \
    break;                                                                                         \
  case COHORT_PROD:                                                                                \
    COLL_LOOP(T, x *y);                                                                            \
    break;                                                                                         \
  case COHORT_MIN:                                                                                 \
    COLL_LOOP(T, x < y ? x : y);                                                                   \
    break;                                                                                         \
  case COHORT_MAX:                                                                                 \
    COLL_LOOP(T, x > y ? x : y);                                                                   \
    break;                                                                                         \
  default:                                                                                         \
    break;                                                                                         \
  }

/* bf16 sums, the collectives' common case, in one loop the compiler vectorises. */
WIRE_KERNEL static void bf16_sum(uint16_t *dst, const uint16_t *a, const uint16_t *b, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = bf16_round(bf16_widen(a[i]) + bf16_widen(b[i]));
}

/* Half types: widen a block to f32, combine, narrow. */
#define COLL_HALF_BLOCK 256
static void reduce_half(int bf, cohort_redop op, uint16_t *dst, const uint16_t *a,
                        const uint16_t *b, size_t n) {
  float fa[COLL_HALF_BLOCK], fb[COLL_HALF_BLOCK];
  for (size_t base = 0; base < n; base += COLL_HALF_BLOCK) {
    size_t m = n - base < COLL_HALF_BLOCK ? n - base : COLL_HALF_BLOCK;
    for (size_t i = 0; i < m; i++) {
      fa[i] = bf ? coll_bf16_to_f32(a[base + i]) : coll_f16_to_f32(a[base + i]);
      fb[i] = bf ? coll_bf16_to_f32(b[base + i]) : coll_f16_to_f32(b[base + i]);
    }
    for (size_t i = 0; i < m; i++) {
      float x = fa[i], y = fb[i], r;
      switch (op) {
      case COHORT_PROD:
        r = x * y;
        break;
      case COHORT_MIN:
        r = x < y ? x : y;
        break;
      case COHORT_MAX:
        r = x > y ? x : y;
        break;
      default:
        r = x + y;
        break;
      }
      fa[i] = r;
    }
    for (size_t i = 0; i < m; i++)
      dst[base + i] = bf ? coll_f32_to_bf16(fa[i]) : coll_f32_to_f16(fa[i]);
  }
}

void coll_reduce(cohort_dtype dt, cohort_redop op, void *dst, const void *a, const void *b,
                 size_t n) {
  switch (dt) {
  case COHORT_F32:
    COLL_OPS(float);
    break;
  case COHORT_F64:
    COLL_OPS(double);
    break;
  case COHORT_I32:
    COLL_OPS(int32_t);
    break;
  case COHORT_I64:
    COLL_OPS(int64_t);
    break;
  case COHORT_U8:
    COLL_OPS(uint8_t);
    break;
  case COHORT_F16:
    reduce_half(0, op, dst, a, b, n);
    break;
  case COHORT_BF16:
    if (op == COHORT_SUM || op == COHORT_AVG)
      bf16_sum(dst, a, b, n);
    else
      reduce_half(1, op, dst, a, b, n);
    break;
  default:
    break;
  }
}

/* A power of two: its reciprocal is exact, so x * (1 / n) is the same correctly rounded number
 * as x / n (bit for bit; the tests compare with a division) at a fraction of a division's cost. */
static int is_pow2(int n) {
  return n > 0 && (n & (n - 1)) == 0;
}

/* d0[i] = d1[i] = (a[i] + b[i]) * scale, with scale 1 or an exact reciprocal. */
#define COLL_PAIR_LOOP(T, scale)                                                                   \
  do {                                                                                             \
    T *d0_ = (T *)d0, *d1_ = (T *)d1;                                                              \
    const T *a_ = (const T *)a, *b_ = (const T *)b;                                                \
    for (size_t i = 0; i < n; i++) {                                                               \
      T s_ = (a_[i] + b_[i]) * (T)(scale);                                                         \
      d0_[i] = s_;                                                                                 \
      d1_[i] = s_;                                                                                 \
    }                                                                                              \
  } while (0)

int coll_reduce_pair(cohort_dtype dt, cohort_redop op, void *d0, void *d1, const void *a,
                     const void *b, size_t n, int fin) {
  int avg = op == COHORT_AVG && fin > 1;
  if ((op != COHORT_SUM && op != COHORT_AVG) || (avg && !is_pow2(fin))) return 0;
  double scale = avg ? 1.0 / fin : 1.0;
  if (dt == COHORT_F32)
    COLL_PAIR_LOOP(float, scale);
  else if (dt == COHORT_F64)
    COLL_PAIR_LOOP(double, scale);
  else
    return 0;
  return 1;
}

/* x / size for a floating-point average, as x * (1 / size) when size is a power of two. */
#define COLL_AVG_LOOP(T, p, n, size)                                                               \
  do {                                                                                             \
    if (is_pow2(size)) {                                                                           \
      T r_ = (T)1 / (T)(size);                                                                     \
      for (size_t i = 0; i < (n); i++) (p)[i] = (p)[i] * r_;                                       \
    } else {                                                                                       \
      for (size_t i = 0; i < (n); i++) (p)[i] = (p)[i] / (T)(size);                                \
    }                                                                                              \
  } while (0)

void coll_reduce_finish(cohort_dtype dt, cohort_redop op, void *buf, size_t n, int size) {
  if (op != COHORT_AVG || size <= 1) return;
  switch (dt) {
  case COHORT_F32: {
    float *p = buf;
    COLL_AVG_LOOP(float, p, n, size);
    break;
  }
  case COHORT_F64: {
    double *p = buf;
    COLL_AVG_LOOP(double, p, n, size);
    break;
  }
  case COHORT_I32: {
    int32_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = p[i] / size;
    break;
  }
  case COHORT_I64: {
    int64_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = p[i] / size;
    break;
  }
  case COHORT_U8: {
    uint8_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(p[i] / size);
    break;
  }
  case COHORT_F16: {
    uint16_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = coll_f32_to_f16(coll_f16_to_f32(p[i]) / (float)size);
    break;
  }
  case COHORT_BF16: {
    uint16_t *p = buf;
    for (size_t i = 0; i < n; i++) p[i] = coll_f32_to_bf16(coll_bf16_to_f32(p[i]) / (float)size);
    break;
  }
  default:
    break;
  }
}

COHORT_API size_t cohort_dtype_size(cohort_dtype dtype) {
  switch (dtype) {
  case COHORT_F32:
    return 4;
  case COHORT_F64:
    return 8;
  case COHORT_F16:
    return 2;
  case COHORT_BF16:
    return 2;
  case COHORT_I32:
    return 4;
  case COHORT_I64:
    return 8;
  case COHORT_U8:
    return 1;
  default:
    return 0;
  }
}

const char *coll_dtype_name(cohort_dtype dt) {
  static const char *names[] = {"float", "double", "half", "bfloat16", "int32", "int64", "uint8"};
  return (unsigned)dt < COHORT_DTYPE_COUNT ? names[dt] : "?";
}

const char *coll_redop_name(cohort_redop op) {
  static const char *names[] = {"sum", "prod", "min", "max", "avg"};
  return (unsigned)op < COHORT_REDOP_COUNT ? names[op] : "?";
}

WIRE_KERNEL void coll_to_wire(cohort_dtype wire, uint16_t *dst, const float *src, size_t n) {
  if (wire == COHORT_BF16)
    for (size_t i = 0; i < n; i++) dst[i] = bf16_round(src[i]);
  else
    for (size_t i = 0; i < n; i++) dst[i] = coll_f32_to_f16(src[i]);
}

/* coll_to_wire for bf16 that also tells whether any element changed (its bits compared with the
 * rounded value widened back, so a NaN made quiet counts). */
WIRE_KERNEL static int bf16_round_changes(uint16_t *dst, const float *src, size_t n) {
  uint32_t diff = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t x;
    memcpy(&x, &src[i], sizeof x);
    uint16_t h = bf16_round(src[i]);
    dst[i] = h;
    diff |= x ^ ((uint32_t)h << 16);
  }
  return diff != 0;
}

int coll_to_wire_changes(cohort_dtype wire, uint16_t *dst, const float *src, size_t n) {
  if (wire == COHORT_BF16) return bf16_round_changes(dst, src, n);
  coll_to_wire(wire, dst, src, n);
  for (size_t i = 0; i < n; i++) {
    float w = coll_f16_to_f32(dst[i]);
    if (memcmp(&w, &src[i], sizeof w) != 0) return 1;
  }
  return 0;
}

/* Widening bf16 into a large f32 destination with streaming (non-temporal) stores where the CPU
 * has AVX-512: the destination's lines are written without being read first, which halves the
 * memory traffic of the allgather's receiving end (the whole other half of the gradient, every
 * step): 36 against 12 ms for 252 MB on the 2-vCPU Xeon of docs/gpt2.md. The bits are those of
 * the plain loop (a shift); the fence orders the stores before whatever tells another thread
 * that they are done. */
#if defined(__x86_64__) && defined(__GNUC__)
#define WIDEN_STREAM_MIN 4096
#define STREAM_TARGET __attribute__((target("avx512f,avx512bw")))
STREAM_TARGET static void bf16_widen_stream(float *dst, const uint16_t *src, size_t n) {
  size_t i = 0;
  for (; i < n && ((uintptr_t)(dst + i) & 63u) != 0; i++) dst[i] = bf16_widen(src[i]);
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
    _mm512_stream_si512((__m512i *)(dst + i), _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  for (; i < n; i++) dst[i] = bf16_widen(src[i]);
  _mm_sfence();
}

static int widen_streams(size_t n) {
  return n >= WIDEN_STREAM_MIN && __builtin_cpu_supports("avx512bw");
}
#else
#define bf16_widen_stream(dst, src, n) ((void)0)
#define widen_streams(n) 0
#endif

WIRE_KERNEL void coll_from_wire(cohort_dtype wire, float *dst, const uint16_t *src, size_t n) {
  if (wire == COHORT_BF16 && widen_streams(n))
    bf16_widen_stream(dst, src, n);
  else if (wire == COHORT_BF16)
    for (size_t i = 0; i < n; i++) dst[i] = bf16_widen(src[i]);
  else
    for (size_t i = 0; i < n; i++) dst[i] = coll_f16_to_f32(src[i]);
}

WIRE_KERNEL void coll_sum_from_wire(cohort_dtype wire, float *dst, const float *local,
                                    const uint16_t *in, size_t n) {
  if (wire == COHORT_BF16)
    for (size_t i = 0; i < n; i++)
      dst[i] = bf16_widen(bf16_round(bf16_widen(bf16_round(local[i])) + bf16_widen(in[i])));
  else
    for (size_t i = 0; i < n; i++)
      dst[i] = coll_f16_to_f32(
          coll_f32_to_f16(coll_f16_to_f32(coll_f32_to_f16(local[i])) + coll_f16_to_f32(in[i])));
}

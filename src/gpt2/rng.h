/*
 * rng.h - a small deterministic random number generator (splitmix64). Its
 * whole state is one uint64_t, so it is trivially saved in checkpoints and
 * derived per rank, step or chunk by hashing indices into a seed.
 */
#ifndef COHORT_GPT2_RNG_H
#define COHORT_GPT2_RNG_H

#include <math.h>
#include <stdint.h>

static inline uint64_t gpt2_rng_next(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A seed derived from a base seed and up to three indices. */
static inline uint64_t gpt2_rng_derive(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t s = seed;
  uint64_t x = gpt2_rng_next(&s) ^ a;
  x = gpt2_rng_next(&x) ^ b;
  x = gpt2_rng_next(&x) ^ c;
  return gpt2_rng_next(&x);
}

/* Uniform integer in [0, n) (n > 0); the modulo bias is negligible for n << 2^64. */
static inline uint32_t gpt2_rng_below(uint64_t *state, uint32_t n) {
  return (uint32_t)(gpt2_rng_next(state) % n);
}

/* Uniform float in (0, 1]. */
static inline float gpt2_rng_unit(uint64_t *state) {
  return (float)((gpt2_rng_next(state) >> 40) + 1) * (1.0f / 16777216.0f);
}

/* Standard normal (Box-Muller, one of the pair). */
static inline float gpt2_rng_normal(uint64_t *state) {
  float u1 = gpt2_rng_unit(state), u2 = gpt2_rng_unit(state);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}

#endif

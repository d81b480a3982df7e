/*
 * sha256.h - SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), used by the
 * store's challenge-response authentication.
 *
 * Thread safety: no shared state; a context is used by one thread at a time.
 */
#ifndef COHORT_BASE_SHA256_H
#define COHORT_BASE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define BASE_SHA256_LEN 32
#define BASE_SHA256_BLOCK 64

typedef struct base_sha256_ctx {
  uint32_t h[8];
  uint64_t total; /* bytes hashed so far */
  uint8_t block[BASE_SHA256_BLOCK];
  size_t fill; /* bytes waiting in block */
} base_sha256_ctx;

void base_sha256_init(base_sha256_ctx *ctx);
void base_sha256_update(base_sha256_ctx *ctx, const void *data, size_t len);
void base_sha256_final(base_sha256_ctx *ctx, uint8_t out[BASE_SHA256_LEN]);
/* One-shot digest. */
void base_sha256(const void *data, size_t len, uint8_t out[BASE_SHA256_LEN]);

typedef struct base_hmac_sha256_ctx {
  base_sha256_ctx inner, outer;
} base_hmac_sha256_ctx;

/* HMAC-SHA256 with a key of any length (longer than a block is hashed first). */
void base_hmac_sha256_init(base_hmac_sha256_ctx *ctx, const void *key, size_t keylen);
void base_hmac_sha256_update(base_hmac_sha256_ctx *ctx, const void *data, size_t len);
void base_hmac_sha256_final(base_hmac_sha256_ctx *ctx, uint8_t out[BASE_SHA256_LEN]);
void base_hmac_sha256(const void *key, size_t keylen, const void *data, size_t len,
                      uint8_t out[BASE_SHA256_LEN]);

/*
 * Compares n bytes in time independent of where they differ (so a MAC check
 * leaks nothing through timing). Returns 1 when equal.
 */
int base_memeq_ct(const void *a, const void *b, size_t n);

#endif

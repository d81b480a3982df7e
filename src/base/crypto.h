/*
 * crypto.h - the few cryptographic functions cohort needs, from OpenSSL's
 * libcrypto: SHA-256, HMAC-SHA256 and its constant-time check. (Random bytes
 * are base_random_bytes() in base.h, also from libcrypto.) Nothing here is
 * written by hand.
 *
 * Errors: libcrypto fails only when it cannot allocate; every function then
 * returns -ENOMEM and leaves no result a caller could mistake for a digest.
 * Thread safety: no shared state of ours; libcrypto 3 is thread-safe.
 */
#ifndef COHORT_BASE_CRYPTO_H
#define COHORT_BASE_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#define BASE_SHA256_LEN 32

/* SHA-256 (FIPS 180-4) of len bytes. Returns 0 or -ENOMEM. */
int base_sha256(const void *data, size_t len, uint8_t out[BASE_SHA256_LEN]);

/*
 * HMAC-SHA256 (RFC 2104) with a key of any length up to INT_MAX bytes.
 * Returns 0, -EINVAL (a longer key) or -ENOMEM.
 */
int base_hmac_sha256(const void *key, size_t keylen, const void *data, size_t len,
                     uint8_t out[BASE_SHA256_LEN]);

/*
 * Returns 1 when mac is the HMAC-SHA256 of data under key, compared in time
 * independent of where the bytes differ (so a check leaks nothing through
 * timing); 0 when it is not or when the MAC could not be computed.
 */
int base_hmac_sha256_ok(const void *key, size_t keylen, const void *data, size_t len,
                        const uint8_t mac[BASE_SHA256_LEN]);

#endif

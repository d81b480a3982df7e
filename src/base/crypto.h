/*
 * crypto.h - the few cryptographic functions cohort needs, from Nettle
 * (libnettle, Debian's nettle-dev): SHA-256, HMAC-SHA256 and its
 * constant-time check, and base64. (Random bytes are base_random_bytes() in
 * base.h, from the kernel.) Nothing here is written by hand.
 *
 * Nettle rather than OpenSSL's libcrypto: libcrypto cost every process
 * about 2.5 M instructions of relocations to load and 5.5 M more to set up
 * its providers at the first HMAC, about two thirds of what an agent of a
 * `true` job did; Nettle has neither (callgrind: 8.8 M -> 0.48 M for one
 * HMAC in a process of its own).
 *
 * Errors: Nettle's functions cannot fail; only a key longer than INT_MAX
 * bytes (refused, as before) and bad base64 are errors.
 * Thread safety: no shared state.
 */
#ifndef COHORT_BASE_CRYPTO_H
#define COHORT_BASE_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#define BASE_SHA256_LEN 32

/* SHA-256 (FIPS 180-4) of len bytes. Returns 0. */
int base_sha256(const void *data, size_t len, uint8_t out[BASE_SHA256_LEN]);

/*
 * HMAC-SHA256 (RFC 2104) with a key of any length up to INT_MAX bytes.
 * Returns 0 or -EINVAL (a longer key).
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

/* The length of len bytes in base64 (RFC 4648, padded), without the NUL. */
#define BASE_B64_LEN(len) ((((len) + 2) / 3) * 4)
/* The most bytes len characters of base64 decode to. */
#define BASE_B64_DECODED_MAX(len) ((((len) + 1) * 6) / 8)

/* Writes len bytes as padded base64 and a NUL: BASE_B64_LEN(len) + 1 bytes of out. */
void base_b64_encode(const void *data, size_t len, char *out);

/*
 * Decodes len characters of padded base64 into out (BASE_B64_DECODED_MAX(len)
 * bytes), the count in *outlen. Returns 0, or -EINVAL for text that is not
 * base64 (a bad character, bad padding, a cut-off group).
 */
int base_b64_decode(const char *text, size_t len, void *out, size_t *outlen);

#endif

/* crypto.c - SHA-256, HMAC-SHA256 and base64 through Nettle (libnettle). */
#include "base/crypto.h"

#include <errno.h>
#include <limits.h>
#include <nettle/base64.h>
#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <nettle/sha2.h>

int base_sha256(const void *data, size_t len, uint8_t out[BASE_SHA256_LEN]) {
  struct sha256_ctx c;
  sha256_init(&c);
  sha256_update(&c, len, data);
  sha256_digest(&c, BASE_SHA256_LEN, out);
  return 0;
}

int base_hmac_sha256(const void *key, size_t keylen, const void *data, size_t len,
                     uint8_t out[BASE_SHA256_LEN]) {
  if (keylen > (size_t)INT_MAX) return -EINVAL;
  struct hmac_sha256_ctx c;
  hmac_sha256_set_key(&c, keylen, key);
  hmac_sha256_update(&c, len, data);
  hmac_sha256_digest(&c, BASE_SHA256_LEN, out);
  return 0;
}

int base_hmac_sha256_ok(const void *key, size_t keylen, const void *data, size_t len,
                        const uint8_t mac[BASE_SHA256_LEN]) {
  uint8_t want[BASE_SHA256_LEN];
  if (base_hmac_sha256(key, keylen, data, len, want) != 0) return 0;
  return memeql_sec(want, mac, BASE_SHA256_LEN) != 0;
}

void base_b64_encode(const void *data, size_t len, char *out) {
  base64_encode_raw(out, len, data);
  out[BASE_B64_LEN(len)] = '\0';
}

int base_b64_decode(const char *text, size_t len, void *out, size_t *outlen) {
  struct base64_decode_ctx c;
  base64_decode_init(&c);
  size_t n = 0;
  if (!base64_decode_update(&c, &n, out, len, text) || !base64_decode_final(&c)) return -EINVAL;
  *outlen = n;
  return 0;
}

/* crypto.c - SHA-256 and HMAC-SHA256 through OpenSSL's libcrypto. */
#include "base/crypto.h"

#include <errno.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

int base_sha256(const void *data, size_t len, uint8_t out[BASE_SHA256_LEN]) {
  unsigned int n = 0;
  if (EVP_Digest(data, len, out, &n, EVP_sha256(), NULL) != 1 || n != BASE_SHA256_LEN)
    return -ENOMEM;
  return 0;
}

int base_hmac_sha256(const void *key, size_t keylen, const void *data, size_t len,
                     uint8_t out[BASE_SHA256_LEN]) {
  /* HMAC() takes the key length as an int. */
  if (keylen > (size_t)INT_MAX) return -EINVAL;
  unsigned int n = 0;
  if (HMAC(EVP_sha256(), key, (int)keylen, data, len, out, &n) == NULL || n != BASE_SHA256_LEN)
    return -ENOMEM;
  return 0;
}

int base_hmac_sha256_ok(const void *key, size_t keylen, const void *data, size_t len,
                        const uint8_t mac[BASE_SHA256_LEN]) {
  uint8_t want[BASE_SHA256_LEN];
  if (base_hmac_sha256(key, keylen, data, len, want) != 0) return 0;
  return CRYPTO_memcmp(want, mac, BASE_SHA256_LEN) == 0;
}

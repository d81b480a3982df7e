/* auth.c - MAC computation shared by the store's client and server. */
#include "store/auth.h"

#include <string.h>

#include "base/sha256.h"

void store_auth_mac(const char *token, size_t token_len, const char *label,
                    const uint8_t cnonce[STORE_NONCE_LEN], const uint8_t snonce[STORE_NONCE_LEN],
                    uint8_t out[STORE_MAC_LEN]) {
  base_hmac_sha256_ctx h;
  base_hmac_sha256_init(&h, token, token_len);
  /* The label's terminating NUL separates it from the nonces. */
  base_hmac_sha256_update(&h, label, strlen(label) + 1);
  base_hmac_sha256_update(&h, cnonce, STORE_NONCE_LEN);
  base_hmac_sha256_update(&h, snonce, STORE_NONCE_LEN);
  base_hmac_sha256_final(&h, out);
}

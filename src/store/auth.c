/* auth.c - MAC computation shared by the store's client and server. */
#include "store/auth.h"

#include <errno.h>
#include <string.h>

#include "base/crypto.h"

_Static_assert(STORE_MAC_LEN == BASE_SHA256_LEN, "a store MAC is one HMAC-SHA256");

/* Both labels are short constants; the message is label, NUL, two nonces. */
#define AUTH_LABEL_MAX 64
#define AUTH_MSG_MAX (AUTH_LABEL_MAX + 1 + 2 * STORE_NONCE_LEN)

static int auth_message(const char *label, const uint8_t cnonce[STORE_NONCE_LEN],
                        const uint8_t snonce[STORE_NONCE_LEN], uint8_t msg[AUTH_MSG_MAX],
                        size_t *len) {
  size_t l = strlen(label) + 1; /* the NUL separates the label from the nonces */
  if (l > AUTH_LABEL_MAX + 1) return -EINVAL;
  memcpy(msg, label, l);
  memcpy(msg + l, cnonce, STORE_NONCE_LEN);
  memcpy(msg + l + STORE_NONCE_LEN, snonce, STORE_NONCE_LEN);
  *len = l + 2 * STORE_NONCE_LEN;
  return 0;
}

int store_auth_mac(const char *token, size_t token_len, const char *label,
                   const uint8_t cnonce[STORE_NONCE_LEN], const uint8_t snonce[STORE_NONCE_LEN],
                   uint8_t out[STORE_MAC_LEN]) {
  uint8_t msg[AUTH_MSG_MAX];
  size_t len;
  int rc = auth_message(label, cnonce, snonce, msg, &len);
  return rc != 0 ? rc : base_hmac_sha256(token, token_len, msg, len, out);
}

int store_auth_ok(const char *token, size_t token_len, const char *label,
                  const uint8_t cnonce[STORE_NONCE_LEN], const uint8_t snonce[STORE_NONCE_LEN],
                  const uint8_t mac[STORE_MAC_LEN]) {
  uint8_t msg[AUTH_MSG_MAX];
  size_t len;
  if (auth_message(label, cnonce, snonce, msg, &len) != 0) return 0;
  return base_hmac_sha256_ok(token, token_len, msg, len, mac);
}

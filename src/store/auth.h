/*
 * auth.h - the MACs of the store's challenge-response authentication.
 *
 * Both sides send a fresh random nonce; the client proves it knows the
 * token with HMAC-SHA256(token, client label || client nonce || server
 * nonce), the server answers with the same under the server label. The
 * labels differ so that one side's proof can never be reflected as the
 * other's; the server's fresh nonce makes a recorded proof useless on a new
 * connection. The token itself never crosses the wire.
 */
#ifndef COHORT_STORE_STORE_AUTH_H
#define COHORT_STORE_STORE_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "store/proto.h"

#define STORE_AUTH_CLIENT_LABEL "cohort-store v1 client proof"
#define STORE_AUTH_SERVER_LABEL "cohort-store v1 server proof"

/*
 * The MAC of one side: HMAC-SHA256(token, label || NUL || client nonce ||
 * server nonce). Returns 0 or a negative errno (see base/crypto.h).
 */
int store_auth_mac(const char *token, size_t token_len, const char *label,
                   const uint8_t cnonce[STORE_NONCE_LEN], const uint8_t snonce[STORE_NONCE_LEN],
                   uint8_t out[STORE_MAC_LEN]);

/*
 * Returns 1 when mac is that MAC (compared in constant time), 0 when it is
 * not or could not be computed: a failure never lets a peer in.
 */
int store_auth_ok(const char *token, size_t token_len, const char *label,
                  const uint8_t cnonce[STORE_NONCE_LEN], const uint8_t snonce[STORE_NONCE_LEN],
                  const uint8_t mac[STORE_MAC_LEN]);

#endif

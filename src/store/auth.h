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

/*
 * The id that names a job's keys in the store, the same on every node: "j"
 * and 16 hex digits of a digest of basis (what the nodes share: the store's
 * address, the scheduler's job and step). With a token (non-NULL, non-empty)
 * the digest is HMAC-SHA256 keyed by it, so a client without the token
 * cannot compute the job's key names from the address; without one it is
 * FNV-1a. Returns 0 or a negative errno (see base/crypto.h).
 */
#define STORE_JOB_ID_LEN 17
int store_job_id(const char *basis, const char *token, char out[STORE_JOB_ID_LEN + 1]);

/* A fresh job token: STORE_TOKEN_NEW_BYTES random bytes in lower-case hex. */
#define STORE_TOKEN_NEW_BYTES 16
#define STORE_TOKEN_NEW_LEN (2 * STORE_TOKEN_NEW_BYTES)

/* Writes a fresh token (STORE_TOKEN_NEW_LEN characters and a NUL). Returns 0 or -EIO. */
int store_token_new(char out[STORE_TOKEN_NEW_LEN + 1]);

/*
 * Reads a token file into buf (buflen >= 2): its first line without the line
 * break. The file must be a regular file that neither its group nor other
 * users may read or write, since anyone who reads the token can join or stop
 * the job. Returns 0; -errno when it cannot be opened or read; -EPERM for
 * its mode (or not a regular file); -ENODATA when the first line is empty;
 * -E2BIG when it does not fit buf.
 */
int store_token_read_file(const char *path, char *buf, size_t buflen);

#endif

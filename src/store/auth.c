/* auth.c - MAC computation shared by the store's client and server. */
#include "store/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
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

int store_job_id(const char *basis, const char *token, char out[STORE_JOB_ID_LEN + 1]) {
  uint8_t d[BASE_SHA256_LEN];
  if (token != NULL && token[0] != '\0') {
    int rc = base_hmac_sha256(token, strlen(token), basis, strlen(basis), d);
    if (rc != 0) return rc;
  } else {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *c = basis; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    for (int i = 0; i < 8; i++) d[i] = (uint8_t)(h >> (56 - 8 * i));
  }
  out[0] = 'j';
  base_hex(d, 8, out + 1);
  return 0;
}

int store_token_new(char out[STORE_TOKEN_NEW_LEN + 1]) {
  unsigned char raw[STORE_TOKEN_NEW_BYTES];
  int rc = base_random_bytes(raw, sizeof raw);
  if (rc != 0) return rc;
  base_hex(raw, sizeof raw, out);
  return 0;
}

int store_token_read_file(const char *path, char *buf, size_t buflen) {
  /* O_NONBLOCK: a FIFO must not block the open; it is refused below. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return -errno;
  struct stat st;
  ssize_t n = 0;
  char more;
  int rc = 0;
  if (fstat(fd, &st) != 0)
    rc = -errno;
  else if (!S_ISREG(st.st_mode) || (st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
    rc = -EPERM;
  else if ((n = read(fd, buf, buflen - 1)) < 0)
    rc = -errno;
  buf[rc == 0 ? n : 0] = '\0';
  size_t line = strcspn(buf, "\r\n");
  /* A full buffer without a line break: the token fits only if the file ends there. */
  if (rc == 0 && line == buflen - 1 && read(fd, &more, 1) != 0) rc = -E2BIG;
  close(fd);
  if (rc != 0) return rc;
  buf[line] = '\0';
  return line == 0 ? -ENODATA : 0;
}

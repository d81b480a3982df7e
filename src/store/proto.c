/* proto.c - framing and message encoding of the store protocol. */
#include "store/proto.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cohort/cohort.h"

static int fail(char *why, size_t whylen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *why, size_t whylen, const char *fmt, ...) {
  if (why != NULL && whylen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
  }
  return COHORT_EPROTO;
}

uint32_t store_load_u32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint64_t load_u64(const uint8_t *p) {
  return (uint64_t)store_load_u32(p) << 32 | store_load_u32(p + 4);
}

int store_proto_frame(const uint8_t *buf, size_t len, uint32_t max_body, uint32_t *body_len,
                      char *why, size_t whylen) {
  *body_len = 0;
  if (len < STORE_HEADER_LEN) return 0;
  uint32_t n = store_load_u32(buf);
  if (n == 0) return fail(why, whylen, "empty frame");
  if (n > max_body)
    return fail(why, whylen, "frame of %u bytes exceeds the limit of %u", (unsigned)n,
                (unsigned)max_body);
  *body_len = n;
  return len - STORE_HEADER_LEN >= n ? 1 : 0;
}

int store_proto_key_ok(const uint8_t *p, size_t len) {
  return len >= 1 && len <= STORE_KEY_MAX && memchr(p, '\0', len) == NULL;
}

/* A cursor over a message body; every getter checks the remaining length. */
typedef struct reader {
  const uint8_t *p;
  size_t left;
  char *why;
  size_t whylen;
  int err;
} reader;

static int rd_fail(reader *r, const char *what) {
  if (r->err == 0) r->err = fail(r->why, r->whylen, "%s", what);
  return r->err;
}

static int rd_u8(reader *r, uint8_t *v) {
  if (r->err) return r->err;
  if (r->left < 1) return rd_fail(r, "truncated message");
  *v = r->p[0];
  r->p++;
  r->left--;
  return 0;
}

static int rd_u32(reader *r, uint32_t *v) {
  if (r->err) return r->err;
  if (r->left < 4) return rd_fail(r, "truncated message");
  *v = store_load_u32(r->p);
  r->p += 4;
  r->left -= 4;
  return 0;
}

static int rd_u64(reader *r, uint64_t *v) {
  if (r->err) return r->err;
  if (r->left < 8) return rd_fail(r, "truncated message");
  *v = load_u64(r->p);
  r->p += 8;
  r->left -= 8;
  return 0;
}

static int rd_raw(reader *r, size_t n, store_bytes *out) {
  if (r->err) return r->err;
  if (r->left < n) return rd_fail(r, "truncated message");
  out->p = r->p;
  out->len = n;
  r->p += n;
  r->left -= n;
  return 0;
}

static int rd_key(reader *r, store_bytes *out) {
  if (r->err) return r->err;
  if (r->left < 2) return rd_fail(r, "truncated message");
  size_t n = (size_t)r->p[0] << 8 | r->p[1];
  r->p += 2;
  r->left -= 2;
  if (n == 0) return rd_fail(r, "empty key");
  if (n > STORE_KEY_MAX) {
    r->err = fail(r->why, r->whylen, "key of %zu bytes exceeds the limit of %d", n, STORE_KEY_MAX);
    return r->err;
  }
  if (rd_raw(r, n, out) != 0) return r->err;
  if (memchr(out->p, '\0', n) != NULL) return rd_fail(r, "key contains a NUL byte");
  return 0;
}

static int rd_value(reader *r, store_bytes *out) {
  uint32_t n = 0;
  if (rd_u32(r, &n) != 0) return r->err;
  if (n > STORE_VALUE_MAX) {
    r->err = fail(r->why, r->whylen, "value of %u bytes exceeds the limit of %u", (unsigned)n,
                  (unsigned)STORE_VALUE_MAX);
    return r->err;
  }
  return rd_raw(r, n, out);
}

static int rd_end(reader *r) {
  if (r->err) return r->err;
  if (r->left != 0) return rd_fail(r, "trailing bytes after the message");
  return 0;
}

int store_proto_parse_request(const uint8_t *body, size_t len, store_request *req, char *why,
                              size_t whylen) {
  memset(req, 0, sizeof *req);
  reader r = {.p = body, .left = len, .why = why, .whylen = whylen};
  if (rd_u8(&r, &req->op) != 0) return r.err;
  switch (req->op) {
  case STORE_OP_HELLO:
    rd_u8(&r, &req->version);
    rd_raw(&r, STORE_NONCE_LEN, &req->nonce);
    break;
  case STORE_OP_AUTH: {
    uint8_t n = 0;
    if (rd_u8(&r, &n) != 0) break;
    if (n != 0 && n != STORE_MAC_LEN) return rd_fail(&r, "bad authentication length");
    rd_raw(&r, n, &req->mac);
    break;
  }
  case STORE_OP_PING:
    break;
  case STORE_OP_SET:
  case STORE_OP_WILL:
    rd_key(&r, &req->key);
    rd_value(&r, &req->value);
    break;
  case STORE_OP_GET:
  case STORE_OP_DELETE:
    rd_key(&r, &req->key);
    break;
  case STORE_OP_ADD: {
    uint64_t d = 0;
    rd_key(&r, &req->key);
    rd_u64(&r, &d);
    req->delta = (int64_t)d;
    break;
  }
  case STORE_OP_CAS: {
    uint8_t has = 0;
    rd_key(&r, &req->key);
    rd_u8(&r, &has);
    if (r.err) break;
    if (has > 1) return rd_fail(&r, "bad CAS flag");
    req->has_expected = has;
    if (has) rd_value(&r, &req->expected);
    rd_value(&r, &req->value);
    break;
  }
  case STORE_OP_WAIT: {
    uint32_t n = 0;
    rd_u32(&r, &req->timeout_ms);
    rd_u32(&r, &n);
    if (r.err) break;
    if (n == 0) return rd_fail(&r, "WAIT without keys");
    if (n > STORE_WAIT_KEYS_MAX) return rd_fail(&r, "WAIT with too many keys");
    req->nkeys = n;
    const uint8_t *start = r.p;
    for (uint32_t i = 0; i < n && !r.err; i++) {
      store_bytes k;
      rd_key(&r, &k);
    }
    if (r.err) break;
    req->keys.p = start;
    req->keys.len = (size_t)(r.p - start);
    break;
  }
  default:
    return fail(why, whylen, "unknown request type 0x%02x", req->op);
  }
  return rd_end(&r);
}

int store_proto_next_key(const store_request *req, size_t *pos, store_bytes *key) {
  /* The keys were validated by the parser, so only the bounds are rechecked. */
  if (*pos + 2 > req->keys.len) return 0;
  const uint8_t *p = req->keys.p + *pos;
  size_t n = (size_t)p[0] << 8 | p[1];
  if (*pos + 2 + n > req->keys.len) return 0;
  key->p = p + 2;
  key->len = n;
  *pos += 2 + n;
  return 1;
}

int store_proto_parse_response(uint8_t op, const uint8_t *body, size_t len, store_response *resp,
                               char *why, size_t whylen) {
  memset(resp, 0, sizeof *resp);
  reader r = {.p = body, .left = len, .why = why, .whylen = whylen};
  if (rd_u8(&r, &resp->status) != 0) return r.err;
  if (resp->status >= STORE_ST_COUNT)
    return fail(why, whylen, "unknown response status %u", resp->status);
  /* Errors carry no payload; a CAS answers with the current value either way. */
  if (resp->status != STORE_ST_OK) return rd_end(&r);
  switch (op) {
  case STORE_OP_HELLO: {
    uint8_t a = 0;
    rd_u8(&r, &resp->version);
    rd_u8(&r, &a);
    if (r.err) break;
    if (a > 1) return rd_fail(&r, "bad authentication flag");
    resp->auth_required = a;
    rd_raw(&r, STORE_NONCE_LEN, &resp->nonce);
    break;
  }
  case STORE_OP_AUTH:
    rd_raw(&r, STORE_MAC_LEN, &resp->mac);
    break;
  case STORE_OP_GET:
    rd_value(&r, &resp->value);
    break;
  case STORE_OP_ADD: {
    uint64_t v = 0;
    rd_u64(&r, &v);
    resp->number = (int64_t)v;
    break;
  }
  case STORE_OP_CAS: {
    uint8_t has = 0;
    rd_u8(&r, &has);
    if (r.err) break;
    if (has > 1) return rd_fail(&r, "bad CAS flag");
    resp->has_value = has;
    if (has) rd_value(&r, &resp->value);
    break;
  }
  case STORE_OP_PING:
  case STORE_OP_SET:
  case STORE_OP_DELETE:
  case STORE_OP_WAIT:
  case STORE_OP_WILL:
    break;
  default:
    return fail(why, whylen, "response to unknown request type 0x%02x", op);
  }
  return rd_end(&r);
}

int store_proto_status_err(uint8_t status) {
  switch (status) {
  case STORE_ST_OK:
    return 0;
  case STORE_ST_NOTFOUND:
    return -ENOENT;
  case STORE_ST_TIMEOUT:
    return -ETIMEDOUT;
  case STORE_ST_AUTH:
    return COHORT_EAUTH;
  case STORE_ST_LIMIT:
    return COHORT_ELIMIT;
  case STORE_ST_INVALID:
    return -EINVAL;
  case STORE_ST_RANGE:
    return -ERANGE;
  default:
    return COHORT_EPROTO;
  }
}

void store_buf_free(store_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

void store_buf_put(store_buf *b, const void *p, size_t n) {
  if (b->oom) return;
  if (n > b->cap - b->len) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < n) {
      if (cap > SIZE_MAX / 2) {
        b->oom = 1;
        return;
      }
      cap *= 2;
    }
    uint8_t *np = realloc(b->p, cap);
    if (np == NULL) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
  if (n > 0) memcpy(b->p + b->len, p, n);
  b->len += n;
}

void store_buf_u8(store_buf *b, uint8_t v) {
  store_buf_put(b, &v, 1);
}

void store_buf_u16(store_buf *b, uint16_t v) {
  uint8_t x[2] = {(uint8_t)(v >> 8), (uint8_t)v};
  store_buf_put(b, x, 2);
}

void store_buf_u32(store_buf *b, uint32_t v) {
  uint8_t x[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
  store_buf_put(b, x, 4);
}

void store_buf_u64(store_buf *b, uint64_t v) {
  store_buf_u32(b, (uint32_t)(v >> 32));
  store_buf_u32(b, (uint32_t)v);
}

void store_buf_key(store_buf *b, const void *p, size_t n) {
  store_buf_u16(b, (uint16_t)n);
  store_buf_put(b, p, n);
}

void store_buf_value(store_buf *b, const void *p, size_t n) {
  store_buf_u32(b, (uint32_t)n);
  store_buf_put(b, p, n);
}

size_t store_buf_begin_frame(store_buf *b) {
  size_t start = b->len;
  store_buf_u32(b, 0);
  return start;
}

void store_buf_end_frame(store_buf *b, size_t start) {
  if (b->oom) return;
  uint32_t n = (uint32_t)(b->len - start - STORE_HEADER_LEN);
  b->p[start] = (uint8_t)(n >> 24);
  b->p[start + 1] = (uint8_t)(n >> 16);
  b->p[start + 2] = (uint8_t)(n >> 8);
  b->p[start + 3] = (uint8_t)n;
}

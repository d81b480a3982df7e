/*
 * proto.h - the store's wire format: framing, request and response
 * encoding and parsing (docs/store-protocol.md).
 *
 * Parsing is pure: bytes in, a parsed message (pointing into the caller's
 * bytes) or an error with a reason out. Nothing here does I/O, allocates
 * (except the growable encode buffer) or logs, so the parsers can be fuzzed
 * on their own (fuzz/fuzz_store_proto.c).
 *
 * Thread safety: no shared state.
 */
#ifndef COHORT_STORE_STORE_PROTO_H
#define COHORT_STORE_STORE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

#define STORE_PROTO_VERSION 1
#define STORE_NONCE_LEN 32
#define STORE_MAC_LEN 32
/* Most keys in one WAIT request. */
#define STORE_WAIT_KEYS_MAX 4096
/* Largest frame body: a CAS with two maximal values is the biggest request. */
#define STORE_FRAME_MAX (2u * STORE_VALUE_MAX + STORE_KEY_MAX + 64u)
#define STORE_HEADER_LEN 4

/* Request types (first byte of a request body). */
enum {
  STORE_OP_HELLO = 0x01,
  STORE_OP_AUTH = 0x02,
  STORE_OP_PING = 0x10,
  STORE_OP_SET = 0x11,
  STORE_OP_GET = 0x12,
  STORE_OP_ADD = 0x13,
  STORE_OP_CAS = 0x14,
  STORE_OP_DELETE = 0x15,
  STORE_OP_WAIT = 0x16,
  STORE_OP_WILL = 0x17,
};

/* Response status (first byte of a response body). */
enum {
  STORE_ST_OK = 0,
  STORE_ST_NOTFOUND = 1, /* -ENOENT */
  STORE_ST_TIMEOUT = 2,  /* -ETIMEDOUT */
  STORE_ST_AUTH = 3,     /* COHORT_EAUTH; the server closes after sending it */
  STORE_ST_LIMIT = 4,    /* COHORT_ELIMIT: memory or connection limit */
  STORE_ST_INVALID = 5,  /* -EINVAL: ADD on a value that is not an integer */
  STORE_ST_RANGE = 6,    /* -ERANGE: ADD overflowed int64 */
  STORE_ST_PROTO = 7,    /* COHORT_EPROTO; the server closes after sending it */
  STORE_ST_COUNT
};

/* A byte string inside a parsed message. */
typedef struct store_bytes {
  const uint8_t *p;
  size_t len;
} store_bytes;

typedef struct store_request {
  uint8_t op;
  store_bytes key;      /* SET GET ADD CAS DELETE */
  store_bytes value;    /* SET; CAS: the desired value */
  int has_expected;     /* CAS: 0 means "key must be absent" */
  store_bytes expected; /* CAS */
  int64_t delta;        /* ADD */
  uint32_t timeout_ms;  /* WAIT: relative to the server's receipt */
  uint32_t nkeys;       /* WAIT */
  store_bytes keys;     /* WAIT: nkeys validated key fields, see store_proto_next_key() */
  uint8_t version;      /* HELLO */
  store_bytes nonce;    /* HELLO: client nonce (STORE_NONCE_LEN) */
  store_bytes mac;      /* AUTH: 0 (client has no token) or STORE_MAC_LEN bytes */
} store_request;

typedef struct store_response {
  uint8_t status;
  store_bytes value; /* GET OK; CAS: current value when has_value */
  int has_value;     /* CAS */
  int64_t number;    /* ADD OK */
  uint8_t version;   /* HELLO OK */
  int auth_required; /* HELLO OK */
  store_bytes nonce; /* HELLO OK: server nonce */
  store_bytes mac;   /* AUTH OK: server proof */
} store_response;

/*
 * Looks at the start of a byte stream. Returns 1 and sets *body_len when a
 * whole frame (header + body) is present, 0 when more bytes are needed (and
 * *body_len is set once the header is complete, else 0), or COHORT_EPROTO
 * when the header declares a body of 0 bytes or more than max_body bytes
 * (why receives the reason).
 */
int store_proto_frame(const uint8_t *buf, size_t len, uint32_t max_body, uint32_t *body_len,
                      char *why, size_t whylen);

/* Parses a request body. Returns 0 or COHORT_EPROTO with a reason in why. */
int store_proto_parse_request(const uint8_t *body, size_t len, store_request *req, char *why,
                              size_t whylen);

/*
 * Parses the body of the response to a request of type op. Returns 0 or
 * COHORT_EPROTO with a reason in why.
 */
int store_proto_parse_response(uint8_t op, const uint8_t *body, size_t len, store_response *resp,
                               char *why, size_t whylen);

/*
 * Iterates over the keys of a parsed WAIT request: *pos starts at 0.
 * Returns 1 with the next key in *key, or 0 when done.
 */
int store_proto_next_key(const store_request *req, size_t *pos, store_bytes *key);

/* Checks a key as the protocol requires (1..STORE_KEY_MAX bytes, no NUL). */
int store_proto_key_ok(const uint8_t *p, size_t len);

/* The negative error code a response status stands for (0 for OK). */
int store_proto_status_err(uint8_t status);

/* A growable byte buffer for encoding frames. */
typedef struct store_buf {
  uint8_t *p;
  size_t len, cap;
  int oom; /* set when a growth failed; later appends are ignored */
} store_buf;

void store_buf_free(store_buf *b);
void store_buf_put(store_buf *b, const void *p, size_t n);
void store_buf_u8(store_buf *b, uint8_t v);
void store_buf_u16(store_buf *b, uint16_t v);
void store_buf_u32(store_buf *b, uint32_t v);
void store_buf_u64(store_buf *b, uint64_t v);
/* A key field (u16 length + bytes) and a value field (u32 length + bytes). */
void store_buf_key(store_buf *b, const void *p, size_t n);
void store_buf_value(store_buf *b, const void *p, size_t n);
/* Starts a frame: reserves the length header; store_buf_end_frame fills it. */
size_t store_buf_begin_frame(store_buf *b);
void store_buf_end_frame(store_buf *b, size_t start);

/* Big-endian loads. */
uint32_t store_load_u32(const uint8_t *p);

#endif

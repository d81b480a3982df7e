/*
 * fuzz_store_proto.c - libFuzzer target for the store's wire parser.
 *
 * The first input byte picks what the rest is fed to:
 *   even: a byte stream from a client, split into frames and parsed as
 *         requests, the way the server's read loop does (WAIT keys iterated);
 *   odd:  the body of a response to request type data[1], as the client
 *         parses it.
 * Anything may be returned as an error; nothing may read out of bounds,
 * overflow, or produce a parsed field outside the input.
 *
 * Build (clang only): cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCOHORT_FUZZ=ON
 * Run: build-fuzz/fuzz_store_proto -max_total_time=60
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "store/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int inside(const uint8_t *base, size_t len, store_bytes b) {
  if (b.len == 0) return 1;
  return b.p >= base && b.len <= len && (size_t)(b.p - base) <= len - b.len;
}

static void check(int ok) {
  if (!ok) abort();
}

static void fuzz_requests(const uint8_t *p, size_t n) {
  /* A small frame limit as well, so the size check is exercised both ways. */
  uint32_t max = n > 0 && (p[0] & 1) ? 64 : STORE_FRAME_MAX;
  while (n > 0) {
    uint32_t blen = 0;
    char why[128];
    int rc = store_proto_frame(p, n, max, &blen, why, sizeof why);
    if (rc <= 0) return;
    const uint8_t *body = p + STORE_HEADER_LEN;
    check(blen >= 1 && blen <= max && STORE_HEADER_LEN + (size_t)blen <= n);
    store_request r;
    if (store_proto_parse_request(body, blen, &r, why, sizeof why) == 0) {
      check(inside(body, blen, r.key) && inside(body, blen, r.value) &&
            inside(body, blen, r.expected) && inside(body, blen, r.keys) &&
            inside(body, blen, r.nonce) && inside(body, blen, r.mac));
      if (r.key.len) check(store_proto_key_ok(r.key.p, r.key.len));
      if (r.op == STORE_OP_WAIT) {
        size_t pos = 0, count = 0;
        store_bytes k;
        while (store_proto_next_key(&r, &pos, &k)) {
          check(inside(body, blen, k) && store_proto_key_ok(k.p, k.len));
          count++;
        }
        check(count == r.nkeys && pos == r.keys.len);
      }
    }
    p += STORE_HEADER_LEN + blen;
    n -= STORE_HEADER_LEN + blen;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  if ((data[0] & 1) == 0) {
    fuzz_requests(data + 1, size - 1);
    return 0;
  }
  if (size < 2) return 0;
  const uint8_t *body = data + 2;
  size_t n = size - 2;
  store_response r;
  char why[128];
  if (store_proto_parse_response(data[1], body, n, &r, why, sizeof why) == 0) {
    check(r.status < STORE_ST_COUNT);
    check(inside(body, n, r.value) && inside(body, n, r.nonce) && inside(body, n, r.mac));
    (void)store_proto_status_err(r.status);
  }
  return 0;
}

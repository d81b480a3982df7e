/*
 * fuzz_mcast_dgram.c - libFuzzer target for the multicast rendezvous
 * datagram parser (rdzv_dgram_parse, src/rdzv/mcast.c).
 *
 * byte 0: bit 0 parse with a token; bit 1 (with a token) the harness appends
 * the correct HMAC to the rest, so the fuzzer also explores datagrams that
 * pass authentication. The rest is the datagram as received.
 *
 * Checks: any bytes give 0, COHORT_EPROTO or COHORT_EAUTH; an accepted
 * datagram has fields within their documented ranges, is authenticated
 * exactly when a token was given, and encodes back to the very same bytes
 * (the format has one encoding per value).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/crypto.h"
#include "cohort/cohort.h"
#include "rdzv/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define TOKEN "mcast-fuzz-token"

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_mcast_dgram: check failed: %s\n", what);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 4096) return 0;
  int with_token = data[0] & 1, sign = (data[0] & 2) && with_token;
  const char *token = with_token ? TOKEN : NULL;
  size_t len = size - 1;
  uint8_t *buf = malloc(len + RDZV_MAC_LEN + 1);
  check(buf != NULL, "out of memory");
  memcpy(buf, data + 1, len);
  if (sign) {
    check(base_hmac_sha256(TOKEN, strlen(TOKEN), buf, len, buf + len) == 0, "hmac");
    len += RDZV_MAC_LEN;
  }
  rdzv_dgram d;
  int rc = rdzv_dgram_parse(buf, len, token, &d);
  check(rc == 0 || rc == COHORT_EPROTO || rc == COHORT_EAUTH, "unexpected error code");
  if (rc == 0) {
    check(d.kind == RDZV_ANNOUNCE || d.kind == RDZV_CANDIDATE, "kind");
    check(d.claimed_rank >= -1, "rank");
    check(d.port >= 0 && d.port <= 65535, "port");
    check(d.kind == RDZV_CANDIDATE ? d.port == 0 && d.host[0] == '\0' : d.port > 0,
          "fields that do not fit the kind");
    check(strlen(d.job_id) >= 1 && strlen(d.job_id) <= RDZV_JOB_ID_MAX, "job id length");
    check(d.authenticated == with_token, "authenticated flag");
    uint8_t again[RDZV_DGRAM_MAX + RDZV_MAC_LEN];
    int n = rdzv_dgram_encode(&d, token, again, sizeof again);
    check(n > 0 && (size_t)n == len && memcmp(again, buf, len) == 0,
          "an accepted datagram does not encode back to itself");
  }
  free(buf);
  return 0;
}

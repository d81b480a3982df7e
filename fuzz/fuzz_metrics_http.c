/*
 * fuzz_metrics_http.c - libFuzzer target for the request parser of
 * `cohort run --metrics-port` (agent_metrics_parse_request, src/agent/metrics.c).
 *
 * The input is the bytes a client sent so far. Checks: the result is one of
 * the parser's answers; without a line end, a request shorter than the
 * buffer is incomplete; GET and HEAD answers come only for requests that
 * name that method and /metrics and end their headers with an empty line;
 * every prefix of the input parses too (the server parses after each read).
 *
 * Build (clang only): cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCOHORT_FUZZ=ON
 * Run: build-fuzz/fuzz_metrics_http -max_total_time=60
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/metrics.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_metrics_http: check failed: %s\n", what);
    abort();
  }
}

static int has_blank_line(const char *s, size_t n) {
  for (size_t i = 0; i + 1 < n; i++)
    if (s[i] == '\n' && (s[i + 1] == '\n' || (i + 2 < n && s[i + 1] == '\r' && s[i + 2] == '\n')))
      return 1;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > METRICS_REQ_MAX) size = METRICS_REQ_MAX; /* the server reads no more */
  /* A copy of exactly size bytes, so that ASan sees any read past the end. */
  char *buf = malloc(size ? size : 1);
  if (buf == NULL) return 0;
  memcpy(buf, data, size);
  for (size_t n = 0; n <= size; n += n < 64 ? 1 : 61) {
    metrics_req r = agent_metrics_parse_request(buf, n);
    check(r >= METRICS_REQ_PARTIAL && r <= METRICS_REQ_BAD, "unknown answer");
    if (memchr(buf, '\n', n) == NULL && memchr(buf, '\0', n) == NULL && n < METRICS_REQ_MAX)
      check(r == METRICS_REQ_PARTIAL || r == METRICS_REQ_BAD, "complete without a line end");
    if (r == METRICS_REQ_GET)
      check(n >= 13 && memcmp(buf, "GET /metrics", 12) == 0 && has_blank_line(buf, n),
            "GET of a request that is not one");
    if (r == METRICS_REQ_HEAD)
      check(n >= 14 && memcmp(buf, "HEAD /metrics", 13) == 0 && has_blank_line(buf, n),
            "HEAD of a request that is not one");
  }
  free(buf);
  return 0;
}

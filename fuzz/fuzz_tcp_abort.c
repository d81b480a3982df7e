/*
 * fuzz_tcp_abort.c - libFuzzer target for the parser of the TCP transport's
 * abort record (coll_tcp_parse_abort, src/coll/tcp.c): the last bytes a peer
 * that aborted the communicator leaves on its connection, read by the rank
 * that finds the connection ended.
 *
 * The input is the end of a stream. Checks: the result is 0 or 1; a record
 * found has a rank >= 0 and a terminated reason that fits the record and the
 * caller's buffer; a buffer of one byte gets an empty reason.
 *
 * Build (clang only): cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCOHORT_FUZZ=ON
 * Run: build-fuzz/fuzz_tcp_abort -max_total_time=60
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/tport.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_tcp_abort: check failed: %s\n", what);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* A copy of exactly the input, so that ASan sees any read past its end. */
  char *s = malloc(size > 0 ? size : 1);
  if (s == NULL) return 0;
  if (size > 0) memcpy(s, data, size);
  int rank = -7;
  char msg[400];
  memset(msg, 'X', sizeof msg);
  int rc = coll_tcp_parse_abort(s, size, &rank, msg, sizeof msg);
  check(rc == 0 || rc == 1, "unexpected result");
  if (rc == 1) {
    check(size >= COLL_ABORT_LEN, "a record shorter than its length");
    check(rank >= 0, "negative rank");
    size_t n = strnlen(msg, sizeof msg);
    check(n < sizeof msg && n < COLL_ABORT_LEN, "reason not terminated or too long");
    char one = 'X';
    check(coll_tcp_parse_abort(s, size, &rank, &one, 1) == 1 && one == '\0', "cut reason");
  } else {
    check(rank == -7, "rank written without a record");
  }
  free(s);
  return 0;
}

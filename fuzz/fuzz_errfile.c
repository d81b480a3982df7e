/*
 * fuzz_errfile.c - libFuzzer target for the parser of PyTorch's error files
 * (agent_error_json_message, src/agent/errfile.c).
 *
 * The input is the content of a TORCHELASTIC_ERROR_FILE. Checks: the result
 * is 0 or -EPROTO; the message fits the buffer, is one line without control
 * characters, and is valid UTF-8 even when cut short (jansson's string
 * constructor, which refuses invalid UTF-8, is the judge).
 *
 * Build (clang only): cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCOHORT_FUZZ=ON
 * Run: build-fuzz/fuzz_errfile -max_total_time=60
 */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/errfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_errfile: check failed: %s\n", what);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* A small buffer as well as the agent's, so that cutting is exercised. */
  static const size_t lens[] = {1, 7, 900};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    char out[900];
    memset(out, 'X', sizeof out);
    int rc = agent_error_json_message((const char *)data, size, out, lens[i]);
    check(rc == 0 || rc == -EPROTO, "unexpected result");
    size_t n = strnlen(out, lens[i]);
    check(n < lens[i], "message not terminated inside the buffer");
    check(rc == 0 || n == 0, "a failure left a message");
    for (size_t k = 0; k < n; k++)
      check((unsigned char)out[k] >= 0x20 && out[k] != 0x7f, "control character in the message");
    json_t *s = json_string(out);
    check(s != NULL, "message is not valid UTF-8");
    json_decref(s);
  }
  return 0;
}

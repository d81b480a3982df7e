/*
 * fuzz_control.c - libFuzzer target for the re-form control channel's
 * message parser (agent_control_parse, src/agent/control.c).
 *
 * The input is one datagram a worker sent. Checks: the result is 0 or
 * -EPROTO; an accepted message's verb name is NUL-terminated and made of
 * [a-z_]; fields it did not carry stay -1.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/control.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_control: check failed: %s\n", what);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  control_msg m;
  int rc = agent_control_parse((const char *)data, size, &m);
  check(rc == 0 || rc == -EPROTO, "unexpected result");
  if (rc != 0) return 0;
  size_t n = strnlen(m.name, sizeof m.name);
  check(n > 0 && n < sizeof m.name, "verb name not terminated");
  for (size_t i = 0; i < n; i++)
    check((m.name[i] >= 'a' && m.name[i] <= 'z') || m.name[i] == '_', "verb name bytes");
  check(m.verb != CONTROL_HELLO || strcmp(m.name, "hello") == 0, "hello's name");
  if (memmem(data, size, "pid=", 4) == NULL) check(m.pid == -1, "pid without pid=");
  return 0;
}

/*
 * fuzz_coll_control.c - libFuzzer target for the parser of the agent's control
 * messages (coll_ctl_parse, src/coll/control.c): what a re-formable worker
 * reads from COHORT_CONTROL_FD.
 *
 * The input is one datagram. Checks: the result is 0 or COHORT_EPROTO; an
 * error comes with a terminated one-line reason; a parsed message has its
 * strings terminated, why= free of control characters, and a form has every
 * field its bootstrap needs, with rank below size.
 *
 * Build (clang only): cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCOHORT_FUZZ=ON
 * Run: build-fuzz/fuzz_coll_control -max_total_time=60
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cohort/cohort.h"
#include "coll/control.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_coll_control: check failed: %s\n", what);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  coll_ctl_msg m;
  char err[128];
  memset(err, 'X', sizeof err);
  int rc = coll_ctl_parse((const char *)data, size, &m, err, sizeof err);
  check(rc == 0 || rc == COHORT_EPROTO, "unexpected result");
  if (rc != 0) {
    size_t n = strnlen(err, sizeof err);
    check(n > 0 && n < sizeof err, "reason empty or not terminated");
    check(strchr(err, '\n') == NULL, "reason spans lines");
    return 0;
  }
  check(strnlen(m.store, sizeof m.store) < sizeof m.store, "store not terminated");
  check(strnlen(m.job, sizeof m.job) < sizeof m.job, "job not terminated");
  check(strnlen(m.master_addr, sizeof m.master_addr) < sizeof m.master_addr, "addr unterminated");
  size_t wl = strnlen(m.why, sizeof m.why);
  check(wl < sizeof m.why, "why not terminated");
  for (size_t i = 0; i < wl; i++) check(m.why[i] >= 0x20 && m.why[i] <= 0x7e, "control in why");
  check(m.verb >= COLL_CTL_UNKNOWN && m.verb <= COLL_CTL_STOP, "verb out of range");
  if (m.verb == COLL_CTL_FORM) {
    check(m.epoch >= 0 && m.size >= 1 && m.rank >= 0 && m.rank < m.size, "form's numbers");
    check(m.store[0] != '\0' && m.job[0] != '\0', "form without store or job");
  }
  return 0;
}

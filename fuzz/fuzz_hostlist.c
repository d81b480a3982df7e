/*
 * fuzz_hostlist.c - libFuzzer target for Slurm hostlist expansion
 * (rdzv_hostlist_expand, src/rdzv/hostlist.c).
 *
 * byte 0: the host limit (1..256, so COHORT_ELIMIT is reached often); the
 * rest: the expression (NUL-terminated by the harness; an embedded NUL ends
 * it early, as in the environment).
 *
 * Checks: the result is 0, -EINVAL, -ENOMEM or COHORT_ELIMIT; on success the
 * count is 1..limit, every name is non-empty, has no ',', '[' or ']' and is
 * made of the expression's literal characters and digits; a name list with
 * one name expands to itself.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cohort/cohort.h"
#include "rdzv/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_hostlist: check failed: %s\n", what);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 4096) return 0;
  size_t limit = (size_t)data[0] + 1;
  char *expr = malloc(size);
  check(expr != NULL, "out of memory");
  memcpy(expr, data + 1, size - 1);
  expr[size - 1] = '\0';
  char **hosts = NULL;
  size_t n = 0;
  int rc = rdzv_hostlist_expand(expr, limit, &hosts, &n);
  check(rc == 0 || rc == -EINVAL || rc == -ENOMEM || rc == COHORT_ELIMIT, "unexpected error");
  if (rc == 0) {
    check(n >= 1 && n <= limit && hosts != NULL, "count");
    for (size_t i = 0; i < n; i++) {
      size_t l = strlen(hosts[i]);
      check(l >= 1, "empty name");
      check(strpbrk(hosts[i], ",[]") == NULL, "a name with list syntax");
      for (size_t k = 0; k < l; k++)
        check(strchr(expr, hosts[i][k]) != NULL || (hosts[i][k] >= '0' && hosts[i][k] <= '9'),
              "a character that is not in the expression");
    }
    if (strpbrk(expr, ",[") == NULL) check(n == 1 && strcmp(hosts[0], expr) == 0, "a plain name");
  } else {
    check(hosts == NULL && n == 0, "output set on failure");
  }
  rdzv_hostlist_free(hosts, n);
  free(expr);
  return 0;
}

/*
 * fuzz_util.h - what several libFuzzer harnesses share: a scratch directory
 * for the files a harness writes for every input.
 */
#ifndef COHORT_FUZZ_UTIL_H
#define COHORT_FUZZ_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * Makes "<root>/fuzz-cohort-<tag>.XXXXXX" in out (at least 64 bytes), root
 * being $COHORT_FUZZ_SCRATCH when it fits (run-target.sh's), else /dev/shm
 * when writable (tmpfs: the files are rewritten for every input), else
 * $TMPDIR or /tmp. Aborts when it cannot.
 */
static inline void fuzz_scratch_dir(char *out, size_t len, const char *tag) {
  /* run-target.sh names a directory it removes however the run ends (a
   * crash or a signal skips the harness's atexit clean-up). */
  const char *root = "/tmp", *t = getenv("TMPDIR"), *own = getenv("COHORT_FUZZ_SCRATCH");
  if (own != NULL && own[0] != '\0' && strlen(own) + strlen(tag) + 21 < len)
    root = own;
  else if (access("/dev/shm", W_OK) == 0)
    root = "/dev/shm";
  else if (t != NULL && t[0] != '\0' && strlen(t) < 24)
    root = t;
  snprintf(out, len, "%s/fuzz-cohort-%s.XXXXXX", root, tag);
  if (mkdtemp(out) == NULL) {
    fprintf(stderr, "fuzz: cannot make a scratch directory like %s\n", out);
    abort();
  }
}

#endif

/*
 * fuzz_hostfile.c - libFuzzer target for `cohort launch`'s host lists
 * (src/launch/hostfile.c): hostfiles, --hosts lists, --include/--exclude.
 *
 * byte 0: bit 0 picks the parser (0 hostfile, 1 --hosts list); bits 1-2
 * the filter (none, include, exclude, both). The rest: the text; for a
 * --hosts list and the filter, split at the first '|' (list|filter) and
 * NUL-terminated by the harness.
 *
 * Checks: the result is 0, -EINVAL or -E2BIG (-ENOMEM aborts: there is no
 * reason for it here); on failure the list is empty and err is a non-empty
 * line; on success 1..LAUNCH_MAX_HOSTS hosts, each name valid for ssh
 * (non-empty, not starting with '-', only name characters and at most one
 * '@'), no two alike, slots 0..LAUNCH_MAX_SLOTS; a filter keeps a non-empty
 * subset in the same order.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/launch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_hostfile: check failed: %s\n", what);
    abort();
  }
}

static void check_list(const launch_hosts *h) {
  check(h->n >= 1 && h->n <= LAUNCH_MAX_HOSTS && h->v != NULL, "count");
  for (size_t i = 0; i < h->n; i++) {
    const char *s = h->v[i].name;
    size_t len = strlen(s);
    check(len >= 1 && s[0] != '-', "empty name or option");
    check(strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_@") == len,
          "a character ssh or a shell would interpret");
    const char *at = strchr(s, '@');
    check(at == NULL || (strchr(at + 1, '@') == NULL && at[1] != '\0' && at[1] != '-'),
          "user@host form");
    check(h->v[i].slots >= 0 && h->v[i].slots <= LAUNCH_MAX_SLOTS, "slots");
    for (size_t k = 0; k < i; k++) check(strcmp(h->v[k].name, s) != 0, "a host twice");
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 65536) return 0;
  int mode = data[0];
  char *text = malloc(size);
  check(text != NULL, "out of memory");
  memcpy(text, data + 1, size - 1);
  text[size - 1] = '\0';
  launch_hosts h = {NULL, 0};
  char err[LAUNCH_ERR_MAX] = "";
  char *filter = NULL;
  int rc;
  if ((mode & 1) == 0) {
    rc = launch_hostfile_parse(text, size - 1, &h, err, sizeof err);
  } else {
    char *bar = strchr(text, '|');
    if (bar != NULL) {
      *bar = '\0';
      filter = bar + 1;
    }
    rc = launch_hosts_parse_list(text, &h, err, sizeof err);
  }
  check(rc == 0 || rc == -EINVAL || rc == -E2BIG, "unexpected error");
  if (rc != 0) {
    check(h.v == NULL && h.n == 0, "output set on failure");
    check(err[0] != '\0' && strchr(err, '\n') == NULL, "error is one line");
    free(text);
    return 0;
  }
  check_list(&h);
  int which = (mode >> 1) & 3;
  if (filter != NULL && which != 0) {
    const char *inc = which & 1 ? filter : NULL, *exc = which & 2 ? filter : NULL;
    size_t before = h.n;
    launch_host first = h.v[0];
    err[0] = '\0';
    int frc = launch_hosts_filter(&h, inc, exc, err, sizeof err);
    check(frc == 0 || frc == -EINVAL, "unexpected filter error");
    if (frc == 0) {
      check(h.n >= 1 && h.n <= before, "filter count");
      check_list(&h);
    } else {
      check(h.n == before && strcmp(h.v[0].name, first.name) == 0, "list changed on failure");
      check(err[0] != '\0', "filter error text");
    }
  }
  launch_hosts_free(&h);
  free(text);
  return 0;
}

/*
 * fixture_tree.h - writing a fixture tree (sysfs, procfs, /dev stand-ins)
 * under a test's own directory, one file at a time.
 */
#ifndef COHORT_TESTS_FIXTURE_TREE_H
#define COHORT_TESTS_FIXTURE_TREE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Writes root/rel with text, making its directories (root's too); a test that cannot
 * write its fixture stops (exit 2) rather than check a tree it did not make. */
static inline void fixture_put(const char *root, const char *rel, const char *text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  for (char *p = path + 1; *p; p++) { /* mkdir -p of the parent, root included */
    if (*p != '/') continue;
    *p = '\0';
    mkdir(path, 0755);
    *p = '/';
  }
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    perror(path);
    exit(2);
  }
  fputs(text, f);
  fclose(f);
}

#endif

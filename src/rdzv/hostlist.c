/*
 * hostlist.c - Slurm hostlist expressions ("node[01-04,07]", "a[1-2]b[3-4]",
 * "gpu1,gpu[3-5]") expanded into host names.
 *
 * An expression is a comma-separated list of entries (commas inside
 * brackets separate ranges, not entries). An entry is literal text and
 * bracket groups; it names the cartesian product of its groups, the last
 * group varying fastest, as Slurm orders them. Everything is counted before
 * anything is allocated, so "node[0-99999999]" is refused, not expanded.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "rdzv/internal.h"

#define HL_MAX_GROUPS 8  /* bracket groups in one entry */
#define HL_MAX_DIGITS 18 /* fits in uint64_t with room to add */

static int hl_literal_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_';
}

/* Reads a decimal number of 1..HL_MAX_DIGITS digits at *p; width = digit count. */
static int hl_number(const char **p, const char *end, uint64_t *v, int *width) {
  const char *s = *p;
  uint64_t x = 0;
  int n = 0;
  while (s < end && *s >= '0' && *s <= '9') {
    if (++n > HL_MAX_DIGITS) return -EINVAL;
    x = x * 10 + (uint64_t)(*s - '0');
    s++;
  }
  if (n == 0) return -EINVAL;
  *p = s;
  *v = x;
  *width = n;
  return 0;
}

/*
 * Parses the bracket group starting after '[' at *p. With want == NULL it
 * only counts (into *count, saturating above cap); otherwise it finds the
 * idx-th value and its width. Leaves *p after ']'.
 */
static int hl_group(const char **p, const char *end, uint64_t cap, uint64_t *count, uint64_t idx,
                    uint64_t *want, int *want_width) {
  const char *s = *p;
  uint64_t total = 0;
  for (;;) {
    uint64_t lo, hi;
    int wlo, whi;
    if (hl_number(&s, end, &lo, &wlo) != 0) return -EINVAL;
    hi = lo;
    if (s < end && *s == '-') {
      s++;
      if (hl_number(&s, end, &hi, &whi) != 0 || hi < lo) return -EINVAL;
    }
    uint64_t n = hi - lo + 1;
    if (want != NULL && idx >= total && idx - total < n) {
      *want = lo + (idx - total);
      *want_width = wlo;
    }
    total = (n > cap || total + n > cap) ? cap + 1 : total + n;
    if (s >= end) return -EINVAL;
    if (*s == ',') {
      s++;
      continue;
    }
    if (*s == ']') {
      s++;
      break;
    }
    return -EINVAL;
  }
  *p = s;
  *count = total;
  return 0;
}

/* Validates one entry [s, end) and counts its names (saturating above cap). */
static int hl_entry_count(const char *s, const char *end, uint64_t cap, uint64_t *count,
                          uint64_t *group_counts, int *ngroups) {
  if (s == end) return -EINVAL;
  uint64_t total = 1;
  int g = 0;
  while (s < end) {
    if (*s == '[') {
      if (g == HL_MAX_GROUPS) return -EINVAL;
      s++;
      uint64_t n;
      int rc = hl_group(&s, end, cap, &n, 0, NULL, NULL);
      if (rc != 0) return rc;
      group_counts[g++] = n;
      total = (n > cap || total > cap / n) ? cap + 1 : total * n;
    } else if (hl_literal_char(*s)) {
      s++;
    } else {
      return -EINVAL;
    }
  }
  *count = total;
  *ngroups = g;
  return 0;
}

/* Writes the idx-th name of a validated entry into out. */
static int hl_entry_nth(const char *s, const char *end, const uint64_t *group_counts, int ngroups,
                        uint64_t idx, char *out, size_t outlen) {
  uint64_t pick[HL_MAX_GROUPS];
  for (int g = ngroups - 1; g >= 0; g--) {
    pick[g] = idx % group_counts[g];
    idx /= group_counts[g];
  }
  size_t o = 0;
  int g = 0;
  while (s < end) {
    if (*s == '[') {
      s++;
      uint64_t n, v = 0;
      int width = 1;
      if (hl_group(&s, end, UINT64_MAX - 1, &n, pick[g], &v, &width) != 0) return -EINVAL;
      g++;
      int w = snprintf(out + o, outlen - o, "%0*llu", width, (unsigned long long)v);
      if (w < 0 || (size_t)w >= outlen - o) return -EINVAL;
      o += (size_t)w;
    } else {
      if (o + 1 >= outlen) return -EINVAL;
      out[o++] = *s++;
    }
  }
  out[o] = '\0';
  return 0;
}

/* The end of the entry starting at s: the next comma outside brackets. */
static const char *hl_entry_end(const char *s) {
  int depth = 0;
  for (; *s != '\0'; s++) {
    if (*s == '[')
      depth++;
    else if (*s == ']')
      depth--;
    else if (*s == ',' && depth == 0)
      break;
  }
  return s;
}

void rdzv_hostlist_free(char **hosts, size_t count) {
  if (hosts == NULL) return;
  for (size_t i = 0; i < count; i++) free(hosts[i]);
  free(hosts);
}

int rdzv_hostlist_expand(const char *expr, size_t max_hosts, char ***hosts, size_t *count) {
  *hosts = NULL;
  *count = 0;
  if (expr == NULL || expr[0] == '\0') return -EINVAL;
  uint64_t cap = max_hosts;
  uint64_t total = 0;
  uint64_t gc[HL_MAX_GROUPS];
  int ng;
  /* Pass 1: validate and count, allocating nothing. */
  for (const char *s = expr;;) {
    const char *e = hl_entry_end(s);
    uint64_t n;
    int rc = hl_entry_count(s, e, cap, &n, gc, &ng);
    if (rc != 0) return rc;
    total += n;
    if (total > cap) return COHORT_ELIMIT;
    if (*e == '\0') break;
    s = e + 1;
  }
  char **out = calloc((size_t)total, sizeof *out);
  if (out == NULL) return -ENOMEM;
  size_t k = 0;
  int rc = 0;
  /* Pass 2: generate. */
  for (const char *s = expr;;) {
    const char *e = hl_entry_end(s);
    uint64_t n;
    hl_entry_count(s, e, cap, &n, gc, &ng);
    for (uint64_t i = 0; i < n; i++) {
      char name[BASE_HOST_MAX];
      rc = hl_entry_nth(s, e, gc, ng, i, name, sizeof name);
      if (rc != 0) goto out;
      out[k] = strdup(name);
      if (out[k] == NULL) {
        rc = -ENOMEM;
        goto out;
      }
      k++;
    }
    if (*e == '\0') break;
    s = e + 1;
  }
  *hosts = out;
  *count = k;
  return 0;
out:
  rdzv_hostlist_free(out, k);
  return rc;
}

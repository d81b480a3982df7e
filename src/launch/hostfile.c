/*
 * hostfile.c - the host list of `cohort launch`: hostfiles in the format
 * mpirun and DeepSpeed read (`node1 slots=8`), `--hosts` lists in the
 * format of `mpirun --host` (`node1:8,node2`), and --include/--exclude.
 *
 * Everything is checked as it is read, so a name that would reach ssh is
 * always a plain [user@]host: no option, no shell syntax, no blank.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "launch/launch.h"

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (err == NULL || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static int name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_';
}

/* A [user@]host of name characters; neither part empty or starting with '-'. */
static int host_name_valid(const char *s, size_t len) {
  if (len == 0 || len > LAUNCH_HOST_MAX) return 0;
  const char *at = memchr(s, '@', len);
  size_t user = at == NULL ? 0 : (size_t)(at - s);
  if (at != NULL && (user == 0 || user + 1 == len || s[user + 1] == '-')) return 0;
  if (s[0] == '-') return 0;
  for (size_t i = 0; i < len; i++)
    if (i != user || at == NULL) {
      if (!name_char(s[i])) return 0;
    }
  return 1;
}

/* Copies s[0..len) to a NUL-terminated buffer of size cap, cut if longer. */
static const char *shown(const char *s, size_t len, char *buf, size_t cap) {
  size_t n = len < cap - 1 ? len : cap - 1;
  for (size_t i = 0; i < n; i++) buf[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
  buf[n] = '\0';
  return buf;
}

/* Appends a host; where names a line or an entry for the error. */
static int hosts_add(launch_hosts *h, size_t *cap, const char *name, size_t len, int slots,
                     const char *where, char *err, size_t errlen) {
  char b[64];
  if (!host_name_valid(name, len)) {
    set_err(err, errlen,
            "%s: '%s' is not a host name ([user@]host of letters, digits, '.', '-', '_')", where,
            shown(name, len, b, sizeof b));
    return -EINVAL;
  }
  for (size_t i = 0; i < h->n; i++)
    if (strlen(h->v[i].name) == len && memcmp(h->v[i].name, name, len) == 0) {
      set_err(err, errlen, "%s: host '%s' is already listed", where, h->v[i].name);
      return -EINVAL;
    }
  if (h->n >= LAUNCH_MAX_HOSTS) {
    set_err(err, errlen, "%s: more than %d hosts", where, LAUNCH_MAX_HOSTS);
    return -E2BIG;
  }
  if (h->n == *cap) {
    size_t ncap = *cap == 0 ? 16 : *cap * 2;
    launch_host *nv = realloc(h->v, ncap * sizeof *nv);
    if (nv == NULL) return -ENOMEM;
    h->v = nv;
    *cap = ncap;
  }
  memcpy(h->v[h->n].name, name, len);
  h->v[h->n].name[len] = '\0';
  h->v[h->n].slots = slots;
  h->n++;
  return 0;
}

/* Parses a slot count s[0..len): 1..LAUNCH_MAX_SLOTS. */
static int parse_slots(const char *s, size_t len, int *out) {
  char buf[16];
  if (len == 0 || len >= sizeof buf) return -EINVAL;
  memcpy(buf, s, len);
  buf[len] = '\0';
  return base_parse_int(buf, 1, LAUNCH_MAX_SLOTS, out);
}

static int is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\r';
}

/* One hostfile line (comment already cut off); an empty line adds nothing. */
static int parse_line(launch_hosts *h, size_t *cap, const char *s, size_t len, size_t lineno,
                      char *err, size_t errlen) {
  char where[32], b[64];
  snprintf(where, sizeof where, "line %zu", lineno);
  size_t i = 0, host = 0, hostlen = 0;
  int slots = 0;
  for (int field = 0;; field++) {
    while (i < len && is_blank(s[i])) i++;
    if (i == len) break;
    size_t start = i;
    while (i < len && !is_blank(s[i])) i++;
    const char *f = s + start;
    size_t flen = i - start;
    if (field == 0) {
      host = start;
      hostlen = flen;
    } else if (flen > 6 && memcmp(f, "slots=", 6) == 0 && slots == 0) {
      if (parse_slots(f + 6, flen - 6, &slots) != 0) {
        set_err(err, errlen, "%s: slots takes a whole number from 1 to %d, not '%s'", where,
                LAUNCH_MAX_SLOTS, shown(f + 6, flen - 6, b, sizeof b));
        return -EINVAL;
      }
    } else {
      set_err(err, errlen, "%s: unexpected '%s' (a line is 'HOST [slots=N]')", where,
              shown(f, flen, b, sizeof b));
      return -EINVAL;
    }
  }
  if (hostlen == 0) return 0;
  return hosts_add(h, cap, s + host, hostlen, slots, where, err, errlen);
}

int launch_hostfile_parse(const char *text, size_t len, launch_hosts *out, char *err,
                          size_t errlen) {
  launch_hosts h = {NULL, 0};
  size_t cap = 0, lineno = 0, pos = 0;
  int rc = 0;
  while (pos < len && rc == 0) {
    const char *line = text + pos;
    const char *nl = memchr(line, '\n', len - pos);
    size_t linelen = nl == NULL ? len - pos : (size_t)(nl - line);
    pos += linelen + (nl != NULL);
    lineno++;
    const char *hash = memchr(line, '#', linelen);
    size_t used = hash == NULL ? linelen : (size_t)(hash - line);
    if (memchr(line, '\0', used) != NULL) {
      set_err(err, errlen, "line %zu: a NUL byte (is this a text file?)", lineno);
      rc = -EINVAL;
    } else {
      rc = parse_line(&h, &cap, line, used, lineno, err, errlen);
    }
  }
  if (rc == 0 && h.n == 0) {
    set_err(err, errlen, "no host in it (a line is 'HOST [slots=N]')");
    rc = -EINVAL;
  }
  if (rc != 0) {
    launch_hosts_free(&h);
    return rc;
  }
  *out = h;
  return 0;
}

int launch_hosts_parse_list(const char *spec, launch_hosts *out, char *err, size_t errlen) {
  launch_hosts h = {NULL, 0};
  size_t cap = 0;
  int rc = 0;
  const char *p = spec;
  char b[64];
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma == NULL ? strlen(p) : (size_t)(comma - p);
    const char *colon = memchr(p, ':', len);
    size_t hostlen = colon == NULL ? len : (size_t)(colon - p);
    int slots = 0;
    char where[96];
    snprintf(where, sizeof where, "--hosts entry '%s'", shown(p, len, b, sizeof b));
    if (colon != NULL && parse_slots(colon + 1, len - hostlen - 1, &slots) != 0) {
      set_err(err, errlen, "%s: the slots after ':' take a whole number from 1 to %d", where,
              LAUNCH_MAX_SLOTS);
      rc = -EINVAL;
    } else {
      rc = hosts_add(&h, &cap, p, hostlen, slots, where, err, errlen);
    }
    if (rc != 0 || comma == NULL) break;
    p = comma + 1;
  }
  if (rc != 0) {
    launch_hosts_free(&h);
    return rc;
  }
  *out = h;
  return 0;
}

/* 1 when name is one of the comma-separated entries of list. */
static int listed(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma == NULL ? strlen(p) : (size_t)(comma - p);
    if (len == n && memcmp(p, name, n) == 0) return 1;
    if (comma == NULL) return 0;
    p = comma + 1;
  }
}

/* Every entry of list names a host of h; else err names the first that does not. */
static int all_known(const launch_hosts *h, const char *list, const char *flag, char *err,
                     size_t errlen) {
  char b[64];
  for (const char *p = list;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma == NULL ? strlen(p) : (size_t)(comma - p);
    int found = 0;
    for (size_t i = 0; i < h->n && !found; i++)
      found = strlen(h->v[i].name) == len && memcmp(h->v[i].name, p, len) == 0;
    if (!found) {
      set_err(err, errlen, "%s names '%s', which is not in the host list", flag,
              shown(p, len, b, sizeof b));
      return -EINVAL;
    }
    if (comma == NULL) return 0;
    p = comma + 1;
  }
}

int launch_hosts_filter(launch_hosts *h, const char *include, const char *exclude, char *err,
                        size_t errlen) {
  if (include != NULL && exclude != NULL) {
    set_err(err, errlen, "give --include or --exclude, not both");
    return -EINVAL;
  }
  const char *list = include != NULL ? include : exclude;
  if (list == NULL) return 0;
  const char *flag = include != NULL ? "--include" : "--exclude";
  int rc = all_known(h, list, flag, err, errlen);
  if (rc != 0) return rc;
  size_t kept = 0;
  for (size_t i = 0; i < h->n; i++) kept += listed(list, h->v[i].name) == (include != NULL);
  if (kept == 0) {
    set_err(err, errlen, "%s leaves no host", flag);
    return -EINVAL;
  }
  size_t k = 0;
  for (size_t i = 0; i < h->n; i++)
    if (listed(list, h->v[i].name) == (include != NULL)) h->v[k++] = h->v[i];
  h->n = k;
  return 0;
}

void launch_hosts_free(launch_hosts *h) {
  if (h == NULL) return;
  free(h->v);
  h->v = NULL;
  h->n = 0;
}

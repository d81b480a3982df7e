/*
 * files.c - reading the small text files and directories of a sysfs, procfs
 * or /dev tree below a root, for the probes (probe.c, topo.c).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "doctor/internal.h"

/* root + "/" + rel, without doubling the slash; -ENAMETOOLONG on overflow. */
int doctor_join(char *out, size_t len, const char *root, const char *rel) {
  size_t rl = strlen(root);
  while (rl > 1 && root[rl - 1] == '/') rl--;
  if (rl == 1 && root[0] == '/') rl = 0;
  while (*rel == '/') rel++;
  int n = snprintf(out, len, "%.*s/%s", (int)rl, root, rel);
  if (n < 0 || (size_t)n >= len) return -ENAMETOOLONG;
  return 0;
}

/* Reads a small text file, trailing white space removed. 0 or -errno. */
int doctor_read_text(const char *path, char *buf, size_t len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  size_t got = 0;
  while (got + 1 < len) {
    ssize_t n = read(fd, buf + got, len - 1 - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = -errno;
      close(fd);
      return e;
    }
    if (n == 0) break;
    got += (size_t)n;
  }
  close(fd);
  buf[got] = '\0';
  while (got > 0 && isspace((unsigned char)buf[got - 1])) buf[--got] = '\0';
  return 0;
}

/* snprintf into a path buffer; -ENAMETOOLONG when it does not fit. */
int doctor_pathf(char *out, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(out, len, fmt, ap);
  va_end(ap);
  return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int doctor_read_textf(char *buf, size_t len, const char *fmt, ...) {
  char path[PATH_MAX];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(path, sizeof path, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof path) return -ENAMETOOLONG;
  return doctor_read_text(path, buf, len);
}

static int cmp_names(const void *a, const void *b) {
  return doctor_natural_cmp(*(char *const *)a, *(char *const *)b);
}

/*
 * The entries of a directory (no "." names: fixture trees keep empty
 * directories alive with dot files), in natural order. A missing directory
 * gives an empty list and -ENOENT.
 */
int doctor_list_dir(const char *path, char ***out, size_t *n) {
  *out = NULL;
  *n = 0;
  DIR *d = opendir(path);
  if (d == NULL) return -errno;
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (doctor_list_add(out, n, "%s", e->d_name) != 0) {
      rc = -ENOMEM;
      break;
    }
  }
  closedir(d);
  if (rc != 0) {
    doctor_list_free(*out, *n);
    *out = NULL;
    *n = 0;
    return rc;
  }
  if (*n > 1) qsort(*out, *n, sizeof **out, cmp_names);
  return 0;
}

int doctor_is_number(const char *s) {
  if (*s == '\0') return 0;
  for (; *s; s++)
    if (!isdigit((unsigned char)*s)) return 0;
  return 1;
}

/* strings.c - the doctor's string lists, natural order and environment. */
#include "doctor/internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int doctor_list_add(char ***list, size_t *n, const char *fmt, ...) {
  base_buf b = {0};
  va_list ap;
  va_start(ap, fmt);
  base_buf_vprintf(&b, fmt, ap);
  va_end(ap);
  char *s;
  if (base_buf_take(&b, &s, NULL) != 0) return -ENOMEM;
  char **p = realloc(*list, (*n + 1) * sizeof *p);
  if (p == NULL) {
    free(s);
    return -ENOMEM;
  }
  p[*n] = s;
  *list = p;
  (*n)++;
  return 0;
}

void doctor_list_free(char **list, size_t n) {
  for (size_t i = 0; i < n; i++) free(list[i]);
  free(list);
}

int doctor_natural_cmp(const char *a, const char *b) {
  while (*a != '\0' && *b != '\0') {
    if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
      /* Compare the digit runs as numbers: skip leading zeros, then the
       * longer run is larger, then the first differing digit decides. */
      while (*a == '0' && isdigit((unsigned char)a[1])) a++;
      while (*b == '0' && isdigit((unsigned char)b[1])) b++;
      size_t la = 0, lb = 0;
      while (isdigit((unsigned char)a[la])) la++;
      while (isdigit((unsigned char)b[lb])) lb++;
      if (la != lb) return la < lb ? -1 : 1;
      int c = memcmp(a, b, la);
      if (c != 0) return c < 0 ? -1 : 1;
      a += la;
      b += lb;
      continue;
    }
    if (*a != *b) return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
    a++;
    b++;
  }
  if (*a == *b) return 0;
  return *a == '\0' ? -1 : 1;
}

const char *doctor_env_get(char **envp, const char *name) {
  size_t l = strlen(name);
  for (char **e = envp; e != NULL && *e != NULL; e++)
    if (strncmp(*e, name, l) == 0 && (*e)[l] == '=') return *e + l + 1;
  return NULL;
}

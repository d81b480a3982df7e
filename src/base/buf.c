/* buf.c - the growable text buffer (buf.h). */
#include "base/buf.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void base_buf_init(base_buf *b) {
  memset(b, 0, sizeof *b);
}

void base_buf_free(base_buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

/* Room for extra more bytes and the NUL; 0, or -ENOMEM with oom set. */
static int reserve(base_buf *b, size_t extra) {
  if (b->oom) return -ENOMEM;
  if (extra > SIZE_MAX - b->len - 1) goto oom;
  size_t need = b->len + extra + 1;
  if (need <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need) {
    if (cap > SIZE_MAX / 2) goto oom;
    cap *= 2;
  }
  char *p = realloc(b->data, cap);
  if (p == NULL) goto oom;
  b->data = p;
  b->cap = cap;
  return 0;
oom:
  b->oom = 1;
  return -ENOMEM;
}

void base_buf_putn(base_buf *b, const char *s, size_t n) {
  if (reserve(b, n) != 0) return;
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void base_buf_puts(base_buf *b, const char *s) {
  base_buf_putn(b, s, strlen(s));
}

void base_buf_vprintf(base_buf *b, const char *fmt, va_list ap) {
  if (b->oom) return;
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) {
    b->oom = 1; /* an encoding error: the text would be incomplete */
    return;
  }
  if (reserve(b, (size_t)n) != 0) return;
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  b->len += (size_t)n;
}

void base_buf_printf(base_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  base_buf_vprintf(b, fmt, ap);
  va_end(ap);
}

int base_buf_take(base_buf *b, char **out, size_t *len) {
  if (b->data == NULL) base_buf_putn(b, "", 0);
  if (b->oom) {
    base_buf_free(b);
    return -ENOMEM;
  }
  *out = b->data;
  if (len != NULL) *len = b->len;
  memset(b, 0, sizeof *b);
  return 0;
}

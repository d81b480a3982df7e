/*
 * buf.h - a growable NUL-terminated text buffer, for the modules that
 * build a document in memory (doctor's reports, manifests, plots).
 *
 * A buffer starts zeroed (base_buf b = {0}, or base_buf_init). Appends
 * grow it by doubling; an allocation failure leaves the text as it was,
 * is remembered in oom, and makes every later append a no-op, so a caller
 * checks once at the end (base_buf_take, or b.oom). data is NULL until the
 * first append, then always NUL-terminated. Not thread-safe.
 */
#ifndef COHORT_BASE_BUF_H
#define COHORT_BASE_BUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct base_buf {
  char *data; /* NUL-terminated when non-NULL */
  size_t len; /* bytes before the NUL */
  size_t cap;
  int oom; /* an append failed for lack of memory */
} base_buf;

void base_buf_init(base_buf *b);
/* Frees the text and zeroes b; b may then be used again. */
void base_buf_free(base_buf *b);
void base_buf_putn(base_buf *b, const char *s, size_t n);
void base_buf_puts(base_buf *b, const char *s);
void base_buf_printf(base_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void base_buf_vprintf(base_buf *b, const char *fmt, va_list ap);
/*
 * Hands the text over to the caller (to free(); "" when nothing was
 * appended, never NULL) with its length in *len (may be NULL), and zeroes
 * b. Returns 0, or -ENOMEM after freeing the text when an append failed.
 */
int base_buf_take(base_buf *b, char **out, size_t *len);

#endif

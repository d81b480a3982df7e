/*
 * internal.h - helpers shared by the doctor's source files: a growable
 * string buffer, a list of owned strings, and natural-order comparison.
 * Not part of the doctor's contract.
 */
#ifndef COHORT_DOCTOR_INTERNAL_H
#define COHORT_DOCTOR_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>

/* A growable NUL-terminated string. An allocation failure is sticky in oom. */
typedef struct doctor_buf {
  char *data;
  size_t len, cap;
  int oom;
} doctor_buf;

void doctor_buf_printf(doctor_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void doctor_buf_puts(doctor_buf *b, const char *s);
/* Returns 0 and hands over the string (never NULL), or -ENOMEM. */
int doctor_buf_take(doctor_buf *b, char **out);

/* Appends a formatted line to a list of strings. Returns 0 or -ENOMEM. */
int doctor_list_add(char ***list, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void doctor_list_free(char **list, size_t n);

/* strverscmp-style order: "mlx5_2" before "mlx5_10", "3" before "10". */
int doctor_natural_cmp(const char *a, const char *b);

#endif

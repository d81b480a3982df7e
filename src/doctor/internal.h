/*
 * internal.h - helpers shared by the doctor's source files: a growable
 * string buffer, a list of owned strings, and natural-order comparison.
 * Not part of the doctor's contract.
 */
#ifndef COHORT_DOCTOR_INTERNAL_H
#define COHORT_DOCTOR_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>

#include "base/buf.h"
#include "doctor/doctor.h"

/* Appends a formatted line to a list of strings. Returns 0 or -ENOMEM. */
int doctor_list_add(char ***list, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void doctor_list_free(char **list, size_t n);

/* strverscmp-style order: "mlx5_2" before "mlx5_10", "3" before "10". */
int doctor_natural_cmp(const char *a, const char *b);

/* The value of NAME in envp ("NAME=value" strings, NULL-terminated, may be NULL), or NULL. */
const char *doctor_env_get(char **envp, const char *name);

/*
 * Whether NCCL would use port `port` of `dev` under an NCCL_IB_HCA value
 * (NULL: every port): a comma list of "name[:port]" entries matched as name
 * prefixes, "=" first for exact names, "^" first to exclude the entries.
 */
int doctor_hca_selected(const char *spec, const char *dev, int port);

/* Adds the verdicts of `cohort doctor --check` to r (after the derivation,
 * whose errors one check reports). 0 or -ENOMEM. */
int doctor_checks(const doctor_facts *f, char **envp, doctor_result *r);

/* ---- files below a root (files.c) ---- */

/* root + "/" + rel, without doubling the slash; -ENAMETOOLONG on overflow. */
int doctor_join(char *out, size_t len, const char *root, const char *rel);
/* Reads a small text file, trailing white space removed. 0 or -errno. */
int doctor_read_text(const char *path, char *buf, size_t len);
/* doctor_read_text() of a path given as a format. */
int doctor_read_textf(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* snprintf into a path buffer; -ENAMETOOLONG when it does not fit. */
int doctor_pathf(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/*
 * The entries of a directory (no "." names: fixture trees keep empty
 * directories alive with dot files), in natural order. A missing directory
 * gives an empty list and -ENOENT; free with doctor_list_free().
 */
int doctor_list_dir(const char *path, char ***out, size_t *n);
/* Whether s is a non-empty run of decimal digits. */
int doctor_is_number(const char *s);

#endif

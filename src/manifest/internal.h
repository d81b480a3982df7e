/*
 * internal.h - what manifest.c shares with k8s.c: checks of names and
 * counts, and the end of every renderer. Not used outside src/manifest.
 */
#ifndef COHORT_MANIFEST_INTERNAL_H
#define COHORT_MANIFEST_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "manifest/manifest.h"

/* Writes a one-line reason into err and returns -EINVAL. */
int manifest_seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* RFC 1123 label of at most maxlen characters (Service, pod host names). */
int manifest_dns_label_ok(const char *s, size_t maxlen);
/* RFC 1123 subdomain, as Kubernetes checks it for Secret names. */
int manifest_dns_subdomain_ok(const char *s);
/* Image references, host names and similar: printable ASCII, no spaces. */
int manifest_token_ok(const char *s);
/* The node and worker counts and the command every kind takes. */
int manifest_common_checks(int nodes, int nproc, char *const *cmd, size_t ncmd, char *err,
                           size_t errlen);
/* A byte count with the largest of the units (TiB, GiB, MiB, KiB names) that divides it. */
void manifest_size_str(uint64_t bytes, const char *const units[4], char *out, size_t outlen);
/* 0, or -ENOMEM with a reason when the buffer ran out of memory. */
int manifest_finish(base_buf *out, char *err, size_t errlen);

#endif

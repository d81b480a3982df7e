/*
 * base.h - small helpers every module uses: time and deadlines, strict
 * number parsing, logging to stderr, random bytes.
 *
 * Thread safety: all functions are safe to call from any thread.
 */
#ifndef COHORT_BASE_BASE_H
#define COHORT_BASE_BASE_H

#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"

#define BASE_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Milliseconds of CLOCK_MONOTONIC. */
int64_t base_now_ms(void);
/* Microseconds of CLOCK_MONOTONIC. */
int64_t base_now_us(void);

/* A deadline `ms` from now; ms < 0 means none (INT64_MAX). */
int64_t base_deadline_in(int64_t ms);
/* Milliseconds left until the deadline, clamped to [0, INT32_MAX] for poll(). */
int base_deadline_left(int64_t deadline_ms);

/* Sleeps for `ms` milliseconds, restarting after signals. */
void base_sleep_ms(int64_t ms);

/*
 * Strict integer parsing: the whole string must be a decimal number in
 * [min, max]. Returns 0 or -EINVAL / -ERANGE; *out untouched on error.
 */
int base_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);
int base_parse_int(const char *s, int min, int max, int *out);

/*
 * Parses a size with an optional K/M/G suffix (powers of 1024), e.g. "256M".
 * Returns 0 or -EINVAL / -ERANGE.
 */
int base_parse_size(const char *s, uint64_t *out);

/* Parses a duration in seconds, fractions allowed ("2.5"), into ms. */
int base_parse_seconds(const char *s, double max_seconds, int64_t *out_ms);

/* Copies at most dstlen-1 bytes and terminates; returns strlen(src). */
size_t base_strlcpy(char *dst, const char *src, size_t dstlen);

/*
 * Fills buf with random bytes from the kernel's generator (getrandom(2),
 * which blocks only until it is first seeded at boot), fit for tokens and
 * nonces. Returns 0 or -EIO.
 */
int base_random_bytes(void *buf, size_t len);

/* Lower-case hex of len bytes into out (2*len+1 bytes). */
void base_hex(const void *bytes, size_t len, char *out);

typedef enum base_log_level {
  BASE_LOG_ERROR = 0,
  BASE_LOG_WARN = 1,
  BASE_LOG_INFO = 2,
  BASE_LOG_DEBUG = 3
} base_log_level;

/*
 * Logs one line to stderr as "cohort[<tag>]: <message>" when level is at or
 * below the threshold (COHORT_LOG_LEVEL=error|warn|info|debug, default warn).
 * The line is written with a single write() so lines never interleave.
 */
void base_log(base_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void base_log_set_level(base_log_level level);
void base_log_set_tag(const char *tag);
int base_log_enabled(base_log_level level);

#endif

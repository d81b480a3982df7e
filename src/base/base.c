/* base.c - time, parsing, logging and randomness helpers. */
#include "base/base.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

int64_t base_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t base_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t base_deadline_in(int64_t ms) {
  if (ms < 0) return INT64_MAX;
  int64_t now = base_now_ms();
  if (ms > INT64_MAX - now) return INT64_MAX;
  return now + ms;
}

int base_deadline_left(int64_t deadline_ms) {
  if (deadline_ms == INT64_MAX) return INT_MAX;
  int64_t left = deadline_ms - base_now_ms();
  if (left < 0) return 0;
  if (left > INT_MAX) return INT_MAX;
  return (int)left;
}

void base_sleep_ms(int64_t ms) {
  if (ms <= 0) return;
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int base_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out) {
  if (s == NULL || *s == '\0' || isspace((unsigned char)*s)) return -EINVAL;
  errno = 0;
  char *end = NULL;
  long long v = strtoll(s, &end, 10);
  if (*end != '\0') return -EINVAL;
  if (errno == ERANGE || v < min || v > max) return -ERANGE;
  *out = (int64_t)v;
  return 0;
}

int base_parse_int(const char *s, int min, int max, int *out) {
  int64_t v;
  int rc = base_parse_i64(s, min, max, &v);
  if (rc == 0) *out = (int)v;
  return rc;
}

int base_parse_size(const char *s, uint64_t *out) {
  if (s == NULL || !isdigit((unsigned char)*s)) return -EINVAL;
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno == ERANGE) return -ERANGE;
  unsigned shift = 0;
  switch (*end) {
  case '\0':
    break;
  case 'k':
  case 'K':
    shift = 10;
    end++;
    break;
  case 'm':
  case 'M':
    shift = 20;
    end++;
    break;
  case 'g':
  case 'G':
    shift = 30;
    end++;
    break;
  default:
    return -EINVAL;
  }
  if (*end == 'i' || *end == 'B') end++; /* accept KiB/MB spellings loosely */
  if (*end == 'B') end++;
  if (*end != '\0') return -EINVAL;
  if (shift && v > (UINT64_MAX >> shift)) return -ERANGE;
  *out = (uint64_t)v << shift;
  return 0;
}

int base_parse_seconds(const char *s, double max_seconds, int64_t *out_ms) {
  if (s == NULL || *s == '\0' || isspace((unsigned char)*s) || *s == '-') return -EINVAL;
  errno = 0;
  char *end = NULL;
  double v = strtod(s, &end);
  if (*end != '\0' || !isfinite(v)) return -EINVAL;
  if (errno == ERANGE || v < 0 || v > max_seconds) return -ERANGE;
  *out_ms = (int64_t)llround(v * 1000.0);
  return 0;
}

size_t base_strlcpy(char *dst, const char *src, size_t dstlen) {
  size_t n = strlen(src);
  if (dstlen > 0) {
    size_t c = n < dstlen - 1 ? n : dstlen - 1;
    memcpy(dst, src, c);
    dst[c] = '\0';
  }
  return n;
}

int base_random_bytes(void *buf, size_t len) {
  unsigned char *p = buf;
  /* The kernel's generator: libcrypto's would cost every process the initialisation of its
   * providers and DRBG (milliseconds, most of a one-node launch's growth) for a few nonces. */
  while (len > 0) {
    ssize_t n = getrandom(p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -EIO;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

void base_hex(const void *bytes, size_t len, char *out) {
  static const char digits[] = "0123456789abcdef";
  const unsigned char *b = bytes;
  for (size_t i = 0; i < len; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
  out[2 * len] = '\0';
}

/* -1: not yet read from the environment. */
static int log_level = -1;
static char log_tag[32] = "";

void base_log_set_level(base_log_level level) {
  __atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
}

void base_log_set_tag(const char *tag) {
  base_strlcpy(log_tag, tag ? tag : "", sizeof log_tag);
}

int base_log_enabled(base_log_level level) {
  int cur = __atomic_load_n(&log_level, __ATOMIC_RELAXED);
  if (cur < 0) {
    const char *e = getenv("COHORT_LOG_LEVEL");
    cur = BASE_LOG_WARN;
    if (e != NULL) {
      if (strcmp(e, "error") == 0)
        cur = BASE_LOG_ERROR;
      else if (strcmp(e, "info") == 0)
        cur = BASE_LOG_INFO;
      else if (strcmp(e, "debug") == 0)
        cur = BASE_LOG_DEBUG;
    }
    __atomic_store_n(&log_level, cur, __ATOMIC_RELAXED);
  }
  return (int)level <= cur;
}

void base_log(base_log_level level, const char *fmt, ...) {
  if (!base_log_enabled(level)) return;
  char line[1024];
  int off;
  if (log_tag[0] != '\0')
    off = snprintf(line, sizeof line, "cohort[%s]: ", log_tag);
  else
    off = snprintf(line, sizeof line, "cohort: ");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + off, sizeof line - (size_t)off - 1, fmt, ap);
  va_end(ap);
  size_t n = strlen(line);
  line[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, n);
  (void)w;
}

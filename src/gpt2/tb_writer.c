/* tb_writer.c - TensorBoard event files: TFRecord framing and hand-encoded
 * Event protocol buffers. */
#include "gpt2/tb_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct gpt2_tb_writer {
  int fd;
  char *path;
};

/* ---- CRC32C ---- */

/* Bitwise, without a table: events are a few hundred bytes, and no shared
 * state means no initialisation race between writers. */
uint32_t gpt2_tb_crc32c(const void *data, size_t len) {
  const unsigned char *p = data;
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < len; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

/* TFRecord masks the CRC so that CRCs of data containing CRCs stay strong. */
uint32_t gpt2_tb_masked_crc(const void *data, size_t len) {
  uint32_t c = gpt2_tb_crc32c(data, len);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

/* ---- protocol buffer encoding ---- */

/* Field tags: (field number << 3) | wire type. */
enum {
  EVENT_WALL_TIME = (1 << 3) | 1,    /* double, fixed64 */
  EVENT_STEP = (2 << 3) | 0,         /* int64, varint */
  EVENT_FILE_VERSION = (3 << 3) | 2, /* string */
  EVENT_SUMMARY = (5 << 3) | 2,      /* Summary message */
  SUMMARY_VALUE = (1 << 3) | 2,      /* repeated Summary.Value */
  VALUE_TAG = (1 << 3) | 2,          /* string */
  VALUE_SIMPLE = (2 << 3) | 5,       /* float, fixed32 */
};

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) v >>= 7, n++;
  return n;
}

static unsigned char *put_varint(unsigned char *p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (unsigned char)(v | 0x80);
    v >>= 7;
  }
  *p++ = (unsigned char)v;
  return p;
}

static unsigned char *put_le(unsigned char *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) *p++ = (unsigned char)(v >> (8 * i));
  return p;
}

static unsigned char *put_bytes(unsigned char *p, int tag, const void *s, size_t n) {
  *p++ = (unsigned char)tag;
  p = put_varint(p, n);
  memcpy(p, s, n);
  return p + n;
}

static double wall_time(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Strict UTF-8 (protobuf strings must be valid UTF-8 for proto3 readers). */
static int utf8_ok(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    size_t len;
    uint32_t v, min;
    if (c < 0x80) {
      i++;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, v = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, v = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, v = c & 0x07, min = 0x10000;
    } else {
      return 0;
    }
    if (i + len > n) return 0;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return 0;
      v = (v << 6) | (s[i + k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    i += len;
  }
  return 1;
}

static int write_full(int fd, const unsigned char *p, size_t n) {
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/*
 * Frames and writes one Event: either a file_version (when version != NULL)
 * or a summary of n simple values, with one write().
 */
static int write_event(gpt2_tb_writer *w, int64_t step, const char *version, size_t n,
                       const char *const *tags, const float *values) {
  size_t summary_len = 0;
  for (size_t i = 0; i < n; i++) {
    size_t tl = strlen(tags[i]);
    size_t vl = 1 + varint_len(tl) + tl + 5;
    summary_len += 1 + varint_len(vl) + vl;
  }
  /* proto3 leaves fields at their default out; so does this writer. */
  size_t event_len = 9 + (step != 0 ? 1 + varint_len((uint64_t)step) : 0);
  if (version != NULL)
    event_len += 1 + varint_len(strlen(version)) + strlen(version);
  else
    event_len += 1 + varint_len(summary_len) + summary_len;

  size_t total = 8 + 4 + event_len + 4;
  unsigned char *rec = malloc(total);
  if (rec == NULL) return -ENOMEM;
  unsigned char *p = put_le(rec, event_len, 8);
  p = put_le(p, gpt2_tb_masked_crc(rec, 8), 4);
  unsigned char *data = p;

  double t = wall_time();
  uint64_t tbits;
  memcpy(&tbits, &t, sizeof tbits);
  *p++ = EVENT_WALL_TIME;
  p = put_le(p, tbits, 8);
  if (step != 0) {
    *p++ = EVENT_STEP;
    p = put_varint(p, (uint64_t)step); /* int64: two's complement, 10 bytes if negative */
  }
  if (version != NULL) {
    p = put_bytes(p, EVENT_FILE_VERSION, version, strlen(version));
  } else {
    *p++ = EVENT_SUMMARY;
    p = put_varint(p, summary_len);
    for (size_t i = 0; i < n; i++) {
      size_t tl = strlen(tags[i]);
      size_t vl = 1 + varint_len(tl) + tl + 5;
      *p++ = SUMMARY_VALUE;
      p = put_varint(p, vl);
      p = put_bytes(p, VALUE_TAG, tags[i], tl);
      uint32_t vbits;
      memcpy(&vbits, &values[i], sizeof vbits);
      *p++ = VALUE_SIMPLE;
      p = put_le(p, vbits, 4);
    }
  }
  p = put_le(p, gpt2_tb_masked_crc(data, event_len), 4);
  int rc = (size_t)(p - rec) == total ? write_full(w->fd, rec, total) : -EPROTO;
  free(rec);
  return rc;
}

/* Creates dir and the directories above it that are missing, as
 * TensorBoard's own writers do (mkdir -p). 0 or -errno. */
static int make_dirs(const char *dir) {
  char *path = strdup(dir);
  if (path == NULL) return -ENOMEM;
  int rc = 0;
  for (char *p = path + 1; rc == 0; p++) {
    if (*p != '/' && *p != '\0') continue;
    char c = *p;
    *p = '\0';
    if (mkdir(path, 0755) != 0 && errno != EEXIST) rc = -errno;
    *p = c;
    if (c == '\0') break;
  }
  free(path);
  return rc;
}

int gpt2_tb_open(const char *logdir, gpt2_tb_writer **out) {
  *out = NULL;
  if (logdir == NULL || *logdir == '\0') return -EINVAL;
  int made = make_dirs(logdir);
  if (made != 0) return made;
  char host[256];
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
  host[sizeof host - 1] = '\0';
  for (char *h = host; *h; h++)
    if (*h == '/') *h = '_';

  gpt2_tb_writer *w = calloc(1, sizeof *w);
  if (w == NULL) return -ENOMEM;
  w->fd = -1;
  size_t cap = strlen(logdir) + strlen(host) + 64;
  w->path = malloc(cap);
  if (w->path == NULL) {
    free(w);
    return -ENOMEM;
  }
  long long now = (long long)time(NULL);
  int rc = 0;
  /* Two writers in one second on one host get distinct names. */
  for (int attempt = 0; attempt < 100; attempt++) {
    if (attempt == 0)
      snprintf(w->path, cap, "%s/events.out.tfevents.%010lld.%s", logdir, now, host);
    else
      snprintf(w->path, cap, "%s/events.out.tfevents.%010lld.%s.%d", logdir, now, host, attempt);
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd >= 0 || errno != EEXIST) break;
  }
  if (w->fd < 0) rc = -errno;
  if (rc == 0) rc = write_event(w, 0, "brain.Event:2", 0, NULL, NULL);
  if (rc != 0) {
    if (w->fd >= 0) {
      close(w->fd);
      unlink(w->path);
    }
    free(w->path);
    free(w);
    return rc;
  }
  *out = w;
  return 0;
}

int gpt2_tb_add_scalars(gpt2_tb_writer *w, int64_t step, size_t n, const char *const *tags,
                        const float *values) {
  if (w == NULL || n == 0 || n > 4096 || tags == NULL || values == NULL) return -EINVAL;
  for (size_t i = 0; i < n; i++) {
    if (tags[i] == NULL) return -EINVAL;
    size_t tl = strlen(tags[i]);
    if (tl == 0 || tl > GPT2_TB_TAG_MAX || !utf8_ok((const unsigned char *)tags[i], tl))
      return -EINVAL;
  }
  return write_event(w, step, NULL, n, tags, values);
}

int gpt2_tb_add_scalar(gpt2_tb_writer *w, const char *tag, int64_t step, float value) {
  return gpt2_tb_add_scalars(w, step, 1, &tag, &value);
}

int gpt2_tb_flush(gpt2_tb_writer *w) {
  if (w == NULL) return -EINVAL;
  return fsync(w->fd) == 0 ? 0 : -errno;
}

const char *gpt2_tb_path(const gpt2_tb_writer *w) {
  return w ? w->path : NULL;
}

void gpt2_tb_close(gpt2_tb_writer *w) {
  if (w == NULL) return;
  close(w->fd);
  free(w->path);
  free(w);
}

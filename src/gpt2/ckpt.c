/* ckpt.c - atomic, checksummed checkpoints (see ckpt.h). */
#include "gpt2/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char ckpt_magic[8] = "COHGPT2";
static const char ckpt_end[8] = "GPT2END";

static inline uint64_t rotl64(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

uint64_t gpt2_ckpt_hash(uint64_t h, const void *data, size_t len) {
  /* Four independent multiply-rotate lanes over 8-byte words (fast enough
   * for gigabytes), folded together with the length at the end. */
  const uint8_t *p = data;
  const uint64_t k1 = 0x9e3779b185ebca87ull, k2 = 0xc2b2ae3d27d4eb4full;
  uint64_t l[4] = {h ^ k1, h ^ k2, h + k1, h - k2};
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    for (int j = 0; j < 4; j++) {
      uint64_t w;
      memcpy(&w, p + i + 8 * (size_t)j, 8);
      l[j] = rotl64(l[j] ^ (w * k2), 31) * k1;
    }
  }
  uint64_t r = rotl64(l[0], 1) ^ rotl64(l[1], 7) ^ rotl64(l[2], 12) ^ rotl64(l[3], 18);
  for (; i < len; i++) r = (r ^ p[i]) * 0x100000001b3ull;
  r ^= (uint64_t)len;
  r ^= r >> 33;
  r *= 0xff51afd7ed558ccdull;
  r ^= r >> 33;
  return r;
}

static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    size_t chunk = len < (1u << 30) ? len : (1u << 30);
    ssize_t n = write(fd, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int read_all(int fd, void *buf, size_t len) {
  char *p = buf;
  while (len > 0) {
    size_t chunk = len < (1u << 30) ? len : (1u << 30);
    ssize_t n = read(fd, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return -EIO;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int parse_name(const char *name, uint64_t *step) {
  unsigned long long s;
  int n = 0;
  if (sscanf(name, "ckpt_%llu.bin%n", &s, &n) != 1 || name[n] != '\0') return -1;
  *step = s;
  return 0;
}

static int cmp_desc(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* Steps of the ckpt_<step>.bin files in dir, newest first. */
static int list_steps(const char *dir, uint64_t **out, size_t *count) {
  DIR *d = opendir(dir);
  if (d == NULL) return -errno;
  uint64_t *steps = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  int rc = 0;
  while ((de = readdir(d)) != NULL) {
    uint64_t s;
    if (parse_name(de->d_name, &s) != 0) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      uint64_t *ns = realloc(steps, cap * sizeof(uint64_t));
      if (ns == NULL) {
        rc = -ENOMEM;
        break;
      }
      steps = ns;
    }
    steps[n++] = s;
  }
  closedir(d);
  if (rc != 0) {
    free(steps);
    return rc;
  }
  if (n > 0) qsort(steps, n, sizeof(uint64_t), cmp_desc);
  *out = steps;
  *count = n;
  return 0;
}

int gpt2_ckpt_save(const char *dir, const gpt2_ckpt_header *hdr_in, const float *params,
                   const float *state, int keep, char *err, size_t errlen) {
  gpt2_ckpt_header hdr = *hdr_in;
  memcpy(hdr.magic, ckpt_magic, sizeof(hdr.magic));
  hdr.version = GPT2_CKPT_VERSION;
  hdr.header_bytes = sizeof(hdr);
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    int e = errno;
    snprintf(err, errlen, "checkpoint: cannot create %s: %s", dir, strerror(e));
    return -e;
  }
  char tmp[4096], final[4096];
  snprintf(tmp, sizeof(tmp), "%s/.ckpt_%012" PRIu64 ".tmp.%d", dir, hdr.step, (int)getpid());
  snprintf(final, sizeof(final), "%s/ckpt_%012" PRIu64 ".bin", dir, hdr.step);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int e = errno;
    snprintf(err, errlen, "checkpoint: cannot create %s: %s", tmp, strerror(e));
    return -e;
  }
  uint64_t h = gpt2_ckpt_hash(0, &hdr, sizeof(hdr));
  h = gpt2_ckpt_hash(h, params, hdr.nparams * sizeof(float));
  h = gpt2_ckpt_hash(h, state, hdr.nstate * sizeof(float));
  int rc = write_all(fd, &hdr, sizeof(hdr));
  if (rc == 0) rc = write_all(fd, params, hdr.nparams * sizeof(float));
  if (rc == 0) rc = write_all(fd, state, hdr.nstate * sizeof(float));
  if (rc == 0) rc = write_all(fd, &h, sizeof(h));
  if (rc == 0) rc = write_all(fd, ckpt_end, sizeof(ckpt_end));
  if (rc == 0 && fsync(fd) != 0) rc = -errno;
  if (close(fd) != 0 && rc == 0) rc = -errno;
  if (rc == 0 && rename(tmp, final) != 0) rc = -errno;
  if (rc != 0) {
    snprintf(err, errlen, "checkpoint: writing %s: %s", final, strerror(-rc));
    unlink(tmp);
    return rc;
  }
  /* The rename is durable only once the directory entry is. */
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    if (fsync(dfd) != 0) rc = -errno;
    close(dfd);
  }
  if (rc != 0) {
    snprintf(err, errlen, "checkpoint: fsync of %s: %s", dir, strerror(-rc));
    return rc;
  }
  uint64_t *steps = NULL;
  size_t n = 0;
  if (keep > 0 && list_steps(dir, &steps, &n) == 0) {
    for (size_t i = (size_t)keep; i < n; i++) {
      char old[4096];
      snprintf(old, sizeof(old), "%s/ckpt_%012" PRIu64 ".bin", dir, steps[i]);
      unlink(old);
    }
  }
  free(steps);
  return 0;
}

/* The state's floats that every rank holds alike: nstate less the per-rank parts (per_rank floats
 * for each rank of the world that wrote it). */
static uint64_t shared_floats(const gpt2_ckpt_header *h, size_t per_rank) {
  uint64_t own = (uint64_t)per_rank * (uint64_t)(h->world > 0 ? h->world : 0);
  return h->nstate >= own ? h->nstate - own : UINT64_MAX;
}

static int same_config(const gpt2_ckpt_header *a, const gpt2_ckpt_header *b, size_t per_rank) {
  return a->vocab == b->vocab && a->npos == b->npos && a->layers == b->layers &&
         a->heads == b->heads && a->channels == b->channels && a->head == b->head &&
         a->opt_kind == b->opt_kind && a->nparams == b->nparams &&
         (per_rank == 0 ? a->nstate == b->nstate
                        : shared_floats(a, per_rank) == shared_floats(b, per_rank));
}

/* Reads the file's state (its world's per-rank parts) into the state of want's world: rank r's
 * part from the writer's rank r, zeros for ranks the writer did not have. The file's whole state
 * passes through a buffer of its own for the checksum. */
static int read_state(int fd, const gpt2_ckpt_header *hdr, const gpt2_ckpt_header *want,
                      size_t per_rank, float *state, uint64_t *h) {
  if (hdr->nstate == want->nstate) {
    if (read_all(fd, state, hdr->nstate * sizeof(float)) != 0) return -EIO;
    *h = gpt2_ckpt_hash(*h, state, hdr->nstate * sizeof(float));
    return 0;
  }
  float *all = malloc(hdr->nstate * sizeof(float) + 1);
  if (all == NULL) return -ENOMEM;
  if (read_all(fd, all, hdr->nstate * sizeof(float)) != 0) {
    free(all);
    return -EIO;
  }
  *h = gpt2_ckpt_hash(*h, all, hdr->nstate * sizeof(float));
  uint64_t base = shared_floats(hdr, per_rank), had = hdr->nstate - base;
  uint64_t want_own = want->nstate - base;
  memcpy(state, all, base * sizeof(float));
  memcpy(state + base, all + base, (had < want_own ? had : want_own) * sizeof(float));
  if (want_own > had) memset(state + base + had, 0, (want_own - had) * sizeof(float));
  free(all);
  return 0;
}

static void add_note(char *note, size_t notelen, const char *fmt, const char *path,
                     const char *why) {
  if (note == NULL || notelen == 0) return;
  size_t used = strlen(note);
  if (used + 1 >= notelen) return;
  snprintf(note + used, notelen - used, fmt, used ? "; " : "", path, why);
}

/* 1 loaded, 0 damaged (reason in why), negative: a fatal mismatch. */
static int load_one(const char *path, const gpt2_ckpt_header *want, size_t per_rank,
                    gpt2_ckpt_header *hdr, float *params, float *state, const char **why) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = strerror(errno);
    return 0;
  }
  int rc = 0;
  struct stat st;
  if (fstat(fd, &st) != 0 || read_all(fd, hdr, sizeof(*hdr)) != 0) {
    *why = "truncated header";
    goto out;
  }
  if (memcmp(hdr->magic, ckpt_magic, sizeof(ckpt_magic)) != 0 ||
      hdr->header_bytes != sizeof(*hdr)) {
    *why = "not a cohort-gpt2 checkpoint";
    goto out;
  }
  if (hdr->version != GPT2_CKPT_VERSION) {
    *why = "unsupported version";
    goto out;
  }
  if (hdr->nparams > (1ull << 40) || hdr->nstate > (1ull << 41) ||
      (uint64_t)st.st_size != sizeof(*hdr) + (hdr->nparams + hdr->nstate) * sizeof(float) + 16) {
    *why = "truncated (size does not match its header)";
    goto out;
  }
  if (!same_config(hdr, want, per_rank)) {
    rc = -EINVAL;
    goto out;
  }
  uint64_t h_file = 0;
  char end[8];
  uint64_t h = gpt2_ckpt_hash(0, hdr, sizeof(*hdr));
  if (read_all(fd, params, hdr->nparams * sizeof(float)) != 0) {
    *why = "truncated";
    goto out;
  }
  h = gpt2_ckpt_hash(h, params, hdr->nparams * sizeof(float));
  int st_rc = read_state(fd, hdr, want, per_rank, state, &h);
  if (st_rc == -ENOMEM) {
    *why = "out of memory";
    goto out;
  }
  if (st_rc != 0 || read_all(fd, &h_file, sizeof(h_file)) != 0 ||
      read_all(fd, end, sizeof(end)) != 0) {
    *why = "truncated";
    goto out;
  }
  if (h != h_file || memcmp(end, ckpt_end, sizeof(end)) != 0) {
    *why = "checksum mismatch (corrupt)";
    goto out;
  }
  rc = 1;
out:
  close(fd);
  return rc;
}

int gpt2_ckpt_load_latest(const char *dir, const gpt2_ckpt_header *want, gpt2_ckpt_header *hdr,
                          float *params, float *state, char *err, size_t errlen, char *note,
                          size_t notelen) {
  return gpt2_ckpt_load_latest_ranks(dir, want, 0, hdr, params, state, err, errlen, note, notelen);
}

int gpt2_ckpt_load_latest_ranks(const char *dir, const gpt2_ckpt_header *want, size_t per_rank,
                                gpt2_ckpt_header *hdr, float *params, float *state, char *err,
                                size_t errlen, char *note, size_t notelen) {
  if (note && notelen) note[0] = '\0';
  uint64_t *steps = NULL;
  size_t n = 0;
  int rc = list_steps(dir, &steps, &n);
  if (rc == -ENOENT) return 0;
  if (rc != 0) {
    snprintf(err, errlen, "checkpoint: cannot read %s: %s", dir, strerror(-rc));
    return rc;
  }
  rc = 0;
  for (size_t i = 0; i < n; i++) {
    char path[4096];
    const char *why = "";
    snprintf(path, sizeof(path), "%s/ckpt_%012" PRIu64 ".bin", dir, steps[i]);
    int r = load_one(path, want, per_rank, hdr, params, state, &why);
    if (r == 1) {
      rc = 1;
      break;
    }
    if (r < 0) {
      snprintf(err, errlen,
               "checkpoint: %s was written for a different model or optimiser (use another "
               "--ckpt-dir)",
               path);
      rc = r;
      break;
    }
    add_note(note, notelen, "%sskipped %s: %s", path, why);
  }
  free(steps);
  return rc;
}

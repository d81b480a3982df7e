/* data.c - fake batches and token files (see data.h). */
#include "gpt2/data.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpt2/rng.h"

int gpt2_batch_buf_alloc(gpt2_batch_buf *bb, int B, int T) {
  size_t BT = (size_t)B * (size_t)T;
  memset(bb, 0, sizeof(*bb));
  bb->tokens = calloc(BT, sizeof(int32_t));
  bb->targets = calloc(BT, sizeof(int32_t));
  bb->mask = calloc(BT, sizeof(int32_t));
  bb->start = calloc((size_t)B, sizeof(int32_t));
  bb->end = calloc((size_t)B, sizeof(int32_t));
  if (!bb->tokens || !bb->targets || !bb->mask || !bb->start || !bb->end) {
    gpt2_batch_buf_free(bb);
    return -ENOMEM;
  }
  return 0;
}

void gpt2_batch_buf_free(gpt2_batch_buf *bb) {
  free(bb->tokens);
  free(bb->targets);
  free(bb->mask);
  free(bb->start);
  free(bb->end);
  memset(bb, 0, sizeof(*bb));
}

static int map_file(const char *path, const uint8_t **map, size_t *len, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    snprintf(err, errlen, "data: %s: %s", path, strerror(e));
    return -e;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "data: %s: not a regular file", path);
    close(fd);
    return -EINVAL;
  }
  if (st.st_size == 0) {
    snprintf(err, errlen, "data: %s: empty file", path);
    close(fd);
    return -EINVAL;
  }
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    int e = errno;
    snprintf(err, errlen, "data: %s: mmap: %s", path, strerror(e));
    return -e;
  }
  *map = p;
  *len = (size_t)st.st_size;
  return 0;
}

/* Plain text: no NUL bytes in the first 64 KiB. */
static int looks_like_text(const uint8_t *p, size_t n) {
  size_t lim = n < 65536 ? n : 65536;
  for (size_t i = 0; i < lim; i++)
    if (p[i] == 0) return 0;
  return 1;
}

static int has_suffix(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

static int open_shard(gpt2_shard *sh, const char *path, int V, int T, char *err, size_t errlen) {
  memset(sh, 0, sizeof(*sh));
  int rc = map_file(path, &sh->map, &sh->map_len, err, errlen);
  if (rc != 0) return rc;
  const size_t hdr = GPT2_SHARD_HEADER_INTS * sizeof(int32_t);
  int32_t magic = 0;
  if (sh->map_len >= sizeof(magic)) memcpy(&magic, sh->map, sizeof(magic));
  if (magic == GPT2_SHARD_MAGIC) {
    if (sh->map_len < hdr) {
      snprintf(err, errlen, "data: %s: truncated shard header (%zu of %zu bytes)", path,
               sh->map_len, hdr);
      return -EINVAL;
    }
    int32_t h[3];
    memcpy(h, sh->map, sizeof(h));
    if (h[1] != GPT2_SHARD_VERSION) {
      snprintf(err, errlen, "data: %s: shard version %d not supported (expected %d)", path, h[1],
               GPT2_SHARD_VERSION);
      return -EINVAL;
    }
    if (h[2] < 0 || sh->map_len != hdr + (size_t)h[2] * 2) {
      snprintf(err, errlen,
               "data: %s: truncated or damaged shard: header says %d tokens (%zu bytes), file "
               "has %zu bytes",
               path, h[2], hdr + (size_t)(h[2] < 0 ? 0 : h[2]) * 2, sh->map_len);
      return -EINVAL;
    }
    sh->tokens = sh->map + hdr;
    sh->ntok = (size_t)h[2];
    sh->width = 2;
    for (size_t i = 0; i < sh->ntok; i++) {
      uint16_t t;
      memcpy(&t, sh->tokens + 2 * i, 2);
      if (t >= V) {
        snprintf(err, errlen,
                 "data: %s: token %u at position %zu is outside the vocabulary "
                 "(size %d); pass --vocab > %u",
                 path, t, i, V, t);
        return -EINVAL;
      }
    }
  } else if (!has_suffix(path, ".bin") && looks_like_text(sh->map, sh->map_len)) {
    if (V < 256) {
      snprintf(err, errlen, "data: %s: text files are byte-level (256 tokens); need --vocab >= 256",
               path);
      return -EINVAL;
    }
    sh->tokens = sh->map;
    sh->ntok = sh->map_len;
    sh->width = 1;
  } else {
    snprintf(err, errlen, "data: %s: neither a token shard (magic %d, expected %d) nor a text file",
             path, magic, GPT2_SHARD_MAGIC);
    return -EINVAL;
  }
  sh->windows = sh->ntok > (size_t)T ? (sh->ntok - 1) / (size_t)T : 0;
  return 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The files of a directory (hidden ones left out), sorted: *names (n of them), each allocated. */
static int list_dir(const char *path, char ***names, int *n, char *err, size_t errlen) {
  DIR *dir = opendir(path);
  if (dir == NULL) {
    int e = errno;
    snprintf(err, errlen, "data: %s: %s", path, strerror(e));
    return -e;
  }
  int rc = 0;
  struct dirent *de;
  while ((de = readdir(dir)) != NULL) {
    if (de->d_name[0] == '.') continue;
    char **nn = realloc(*names, (size_t)(*n + 1) * sizeof(char *));
    if (nn == NULL) {
      rc = -ENOMEM;
      break;
    }
    *names = nn;
    size_t len = strlen(path) + strlen(de->d_name) + 2;
    nn[*n] = malloc(len);
    if (nn[*n] == NULL) {
      rc = -ENOMEM;
      break;
    }
    snprintf(nn[*n], len, "%s/%s", path, de->d_name);
    (*n)++;
  }
  closedir(dir);
  if (rc == 0 && *n == 0) {
    snprintf(err, errlen, "data: %s: directory has no data files", path);
    rc = -ENOENT;
  }
  if (rc == 0) qsort(*names, (size_t)*n, sizeof(char *), cmp_str);
  return rc;
}

/* The data files under path: the file itself, or a directory's files. */
static int list_files(const char *path, char ***names, int *n, char *err, size_t errlen) {
  struct stat st;
  if (stat(path, &st) != 0) {
    int e = errno;
    snprintf(err, errlen, "data: %s: %s", path, strerror(e));
    return -e;
  }
  if (S_ISDIR(st.st_mode)) return list_dir(path, names, n, err, errlen);
  *names = malloc(sizeof(char *));
  if (*names == NULL) return -ENOMEM;
  (*names)[0] = strdup(path);
  if ((*names)[0] == NULL) return -ENOMEM;
  *n = 1;
  return 0;
}

int gpt2_data_open(gpt2_data *d, const char *path, gpt2_head head, int V, int B, int T,
                   uint64_t seed, char *err, size_t errlen) {
  memset(d, 0, sizeof(*d));
  d->head = head;
  d->V = V;
  d->B = B;
  d->T = T;
  d->seed = seed;
  if (path == NULL || strcmp(path, "fake") == 0) {
    d->fake = 1;
    return 0;
  }
  char **names = NULL;
  int n = 0;
  int rc = list_files(path, &names, &n, err, errlen);
  if (rc == 0) {
    d->shards = calloc((size_t)n, sizeof(gpt2_shard));
    if (d->shards == NULL) rc = -ENOMEM;
  }
  if (rc == -ENOMEM) snprintf(err, errlen, "data: out of memory");
  for (int i = 0; rc == 0 && i < n; i++) {
    rc = open_shard(&d->shards[i], names[i], V, T, err, errlen);
    d->nshards = i + 1;
    if (rc == 0) d->windows += d->shards[i].windows;
  }
  if (rc == 0 && d->windows == 0) {
    snprintf(err, errlen, "data: %s: fewer than %d tokens (seq-len + 1), nothing to train on", path,
             T + 1);
    rc = -EINVAL;
  }
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
  if (rc != 0) gpt2_data_close(d);
  return rc;
}

void gpt2_data_close(gpt2_data *d) {
  for (int i = 0; i < d->nshards; i++)
    if (d->shards[i].map) munmap((void *)d->shards[i].map, d->shards[i].map_len);
  free(d->shards);
  memset(d, 0, sizeof(*d));
}

static int32_t shard_token(const gpt2_shard *sh, size_t i) {
  if (sh->width == 1) return sh->tokens[i];
  uint16_t t;
  memcpy(&t, sh->tokens + 2 * i, 2);
  return t;
}

uint64_t gpt2_data_first(uint64_t pos, int rank, int accum, int B, int k) {
  return pos + ((uint64_t)rank * (uint64_t)accum + (uint64_t)k) * (uint64_t)B;
}

uint64_t gpt2_data_advance(uint64_t pos, int world, int accum, int B) {
  return pos + (uint64_t)world * (uint64_t)accum * (uint64_t)B;
}

void gpt2_data_fill(const gpt2_data *d, uint64_t g0, gpt2_batch_buf *bb, gpt2_batch *batch) {
  size_t T = (size_t)d->T;
  for (size_t b = 0; b < (size_t)d->B; b++) {
    uint64_t g = g0 + b;
    int32_t *tok = bb->tokens + b * T, *tgt = bb->targets + b * T, *msk = bb->mask + b * T;
    if (d->fake) {
      /* Like the seed: tokens uniform over the vocabulary, mask uniform over
       * {0, 1}, answer positions uniform over the sequence. */
      uint64_t st = gpt2_rng_derive(d->seed, g, 0xda7a, 0);
      uint32_t prev = gpt2_rng_below(&st, (uint32_t)d->V);
      for (size_t t = 0; t < T; t++) {
        uint32_t next = gpt2_rng_below(&st, (uint32_t)d->V);
        tok[t] = (int32_t)prev;
        tgt[t] = (int32_t)next;
        prev = next;
      }
      for (size_t t = 0; t < T; t++) msk[t] = (int32_t)gpt2_rng_below(&st, 2);
      bb->start[b] = (int32_t)gpt2_rng_below(&st, (uint32_t)T);
      bb->end[b] = (int32_t)gpt2_rng_below(&st, (uint32_t)T);
    } else {
      size_t w = (size_t)(g % d->windows);
      int s = 0;
      while (w >= d->shards[s].windows) w -= d->shards[s++].windows;
      const gpt2_shard *sh = &d->shards[s];
      for (size_t t = 0; t < T; t++) {
        tok[t] = shard_token(sh, w * T + t);
        tgt[t] = shard_token(sh, w * T + t + 1);
        msk[t] = 1;
      }
      bb->start[b] = bb->end[b] = 0;
    }
  }
  batch->tokens = bb->tokens;
  batch->targets = bb->targets;
  /* The padding mask is part of the QA workload; language modelling attends
   * to every earlier token. */
  batch->mask = (d->fake && d->head == GPT2_HEAD_QA) ? bb->mask : NULL;
  batch->start = bb->start;
  batch->end = bb->end;
}

int gpt2_shard_write(const char *path, const uint16_t *tokens, size_t ntok) {
  if (ntok > INT32_MAX) return -ERANGE;
  FILE *f = fopen(path, "wbe");
  if (f == NULL) return -errno;
  int32_t hdr[GPT2_SHARD_HEADER_INTS] = {GPT2_SHARD_MAGIC, GPT2_SHARD_VERSION, (int32_t)ntok};
  int ok = fwrite(hdr, sizeof(hdr), 1, f) == 1 && fwrite(tokens, 2, ntok, f) == ntok;
  if (fclose(f) != 0) ok = 0;
  return ok ? 0 : -EIO;
}

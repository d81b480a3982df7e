/*
 * fuzz_gpt2_data.c - libFuzzer target for the trainer's token data readers
 * (gpt2_data_open / gpt2_data_fill, src/gpt2/data.c): llm.c token shards
 * (.bin) and byte-level text files, alone or as a directory of files.
 *
 * byte 0: bit 0 names the file .bin (else .txt); bit 1 splits the rest into
 * two files in a directory (at byte 1's fraction); bits 2-3 pick the
 * vocabulary (50257, 256, 300 or 17); byte 2 (low 5 bits) + 1 is T, bits 5-6
 * + 1 is B. The harness writes the files in a private temporary directory.
 *
 * Checks: open fails with a one-line reason naming the file, or succeeds
 * with at least one window; then every batch (first, last, a wrapped-around
 * index) holds tokens and targets inside the vocabulary, and target t of a
 * sample is token t+1 (they come from one window).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpt2/data.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static char dir[64];
static char sub[96];
static char file_a[128], file_b[128];

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_gpt2_data: check failed: %s\n", what);
    abort();
  }
}

static void clear(void) {
  static const char *const names[] = {"a.bin", "a.txt", "b.bin", "b.txt"};
  char p[160];
  for (size_t i = 0; i < 4; i++) {
    snprintf(p, sizeof p, "%s/%s", sub, names[i]);
    unlink(p);
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    unlink(p);
  }
}

static void cleanup(void) {
  clear();
  rmdir(sub);
  rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_scratch_dir(dir, sizeof dir, "data");
  snprintf(sub, sizeof sub, "%s/d", dir);
  check(mkdir(sub, 0700) == 0, "mkdir");
  atexit(cleanup);
  return 0;
}

static void write_file(const char *path, const uint8_t *p, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  check(fd >= 0, "open for writing");
  size_t off = 0;
  while (off < n) {
    ssize_t w = write(fd, p + off, n - off);
    check(w > 0, "write");
    off += (size_t)w;
  }
  close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3 || size > 1 << 20) return 0;
  static const int vocab[] = {50257, 256, 300, 17};
  int bin = data[0] & 1, two = (data[0] & 2) != 0;
  int V = vocab[(data[0] >> 2) & 3];
  int T = (data[2] & 31) + 1, B = ((data[2] >> 5) & 3) + 1;
  const uint8_t *p = data + 3;
  size_t n = size - 3;
  const char *ext = bin ? "bin" : "txt";
  const char *path;
  clear();
  if (two) {
    size_t split = n * data[1] / 256;
    snprintf(file_a, sizeof file_a, "%s/a.%s", sub, ext);
    snprintf(file_b, sizeof file_b, "%s/b.%s", sub, ext);
    write_file(file_a, p, split);
    write_file(file_b, p + split, n - split);
    path = sub;
  } else {
    snprintf(file_a, sizeof file_a, "%s/a.%s", dir, ext);
    write_file(file_a, p, n);
    path = file_a;
  }
  gpt2_data d;
  char err[512] = "";
  int rc = gpt2_data_open(&d, path, GPT2_HEAD_LM, V, B, T, 1, err, sizeof err);
  if (rc != 0) {
    check(rc < 0 && err[0] != '\0' && strchr(err, '\n') == NULL, "open: no one-line reason");
    check(strstr(err, "data: ") == err, "open: the reason does not say it is about data");
    return 0;
  }
  check(d.windows >= 1, "open: success without a window");
  gpt2_batch_buf bb;
  check(gpt2_batch_buf_alloc(&bb, B, T) == 0, "batch buffer");
  uint64_t starts[3] = {0, d.windows > (size_t)B ? d.windows - (size_t)B : 0, 3 * d.windows + 1};
  for (size_t k = 0; k < 3; k++) {
    gpt2_batch batch;
    gpt2_data_fill(&d, starts[k], &bb, &batch);
    for (size_t i = 0; i < (size_t)B * (size_t)T; i++) {
      check(batch.tokens[i] >= 0 && batch.tokens[i] < V, "a token outside the vocabulary");
      check(batch.targets[i] >= 0 && batch.targets[i] < V, "a target outside the vocabulary");
      if ((i + 1) % (size_t)T != 0) check(batch.targets[i] == batch.tokens[i + 1], "window shift");
    }
  }
  gpt2_batch_buf_free(&bb);
  gpt2_data_close(&d);
  return 0;
}

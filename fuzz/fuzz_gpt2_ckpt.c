/*
 * fuzz_gpt2_ckpt.c - libFuzzer target for the trainer's checkpoint reader
 * (gpt2_ckpt_load_latest, src/gpt2/ckpt.c).
 *
 * The input after byte 0 is the newest checkpoint file (ckpt_<2>.bin) of a
 * private temporary directory. byte 0:
 *   bit 0: the harness repairs the trailer (checksum + end marker), so the
 *          fuzzer gets past the checksum and reaches the reads after it;
 *   bit 1: it repairs magic, version and header size;
 *   bit 2: an older, valid checkpoint (step 1, written by gpt2_ckpt_save)
 *          lies beside it, and the expected configuration is that one's.
 * Without bit 2 the expected configuration is the file's own (when its
 * sizes fit the input), so loading can succeed.
 *
 * Checks: 1 (loaded), 0 (none usable) or a negative code with a one-line
 * reason; with the valid older file present the result is never 0 (it is
 * loaded if the newest is damaged); a loaded checkpoint has the expected
 * configuration and, if it is the older one, its exact contents.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpt2/ckpt.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define NP 8
#define NS 16

static char dir[64];
static char newest[160], oldest[160];

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_gpt2_ckpt: check failed: %s\n", what);
    abort();
  }
}

static void cleanup(void) {
  unlink(newest);
  unlink(oldest);
  rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_scratch_dir(dir, sizeof dir, "ckpt");
  snprintf(newest, sizeof newest, "%s/ckpt_%012d.bin", dir, 2);
  snprintf(oldest, sizeof oldest, "%s/ckpt_%012d.bin", dir, 1);
  atexit(cleanup);
  return 0;
}

static gpt2_ckpt_header small_config(void) {
  gpt2_ckpt_header h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, "COHGPT2", 8);
  h.version = GPT2_CKPT_VERSION;
  h.header_bytes = sizeof h;
  h.vocab = 17;
  h.npos = 4;
  h.layers = 1;
  h.heads = 1;
  h.channels = 4;
  h.opt_kind = 1;
  h.world = 1;
  h.step = 1;
  h.nparams = NP;
  h.nstate = NS;
  return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 1 << 20) return 0;
  int fix_trailer = data[0] & 1, fix_header = data[0] & 2, with_old = data[0] & 4;
  size_t n = size - 1;
  uint8_t *file = malloc(n + 1);
  check(file != NULL, "out of memory");
  memcpy(file, data + 1, n);
  gpt2_ckpt_header h;
  if (fix_header && n >= sizeof h) {
    memcpy(&h, file, sizeof h);
    memcpy(h.magic, "COHGPT2", 8);
    h.version = GPT2_CKPT_VERSION;
    h.header_bytes = sizeof h;
    memcpy(file, &h, sizeof h);
  }
  if (fix_trailer && n >= sizeof h + 16) {
    uint64_t sum = gpt2_ckpt_hash(0, file, n - 16);
    memcpy(file + n - 16, &sum, 8);
    memcpy(file + n - 8, "GPT2END", 8);
  }
  unlink(newest);
  unlink(oldest);
  int fd = open(newest, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  check(fd >= 0, "open");
  check(write(fd, file, n) == (ssize_t)n, "write");
  close(fd);

  gpt2_ckpt_header want = small_config();
  float old_params[NP], old_state[NS];
  for (int i = 0; i < NP; i++) old_params[i] = (float)i * 0.5f;
  for (int i = 0; i < NS; i++) old_state[i] = (float)i * -0.25f;
  if (with_old) {
    /* keep=3 so the save does not prune the fuzzed file (step 2 is newer). */
    char err[256];
    check(gpt2_ckpt_save(dir, &want, old_params, old_state, 3, err, sizeof err) == 0,
          "cannot save the older checkpoint");
  } else if (n >= sizeof want) {
    gpt2_ckpt_header fh;
    memcpy(&fh, file, sizeof fh);
    /* The file's own configuration when its arrays could be in the input. */
    if (fh.nparams <= n / sizeof(float) && fh.nstate <= n / sizeof(float)) want = fh;
  }
  float *params = calloc(want.nparams + 1, sizeof(float));
  float *state = calloc(want.nstate + 1, sizeof(float));
  check(params != NULL && state != NULL, "out of memory");
  gpt2_ckpt_header got;
  char err[512] = "", note[1024] = "";
  int rc =
      gpt2_ckpt_load_latest(dir, &want, &got, params, state, err, sizeof err, note, sizeof note);
  check(rc == 1 || rc == 0 || rc < 0, "result");
  if (rc < 0) check(err[0] != '\0' && strchr(err, '\n') == NULL, "no one-line reason");
  if (with_old) check(rc != 0, "the valid older checkpoint was not found");
  if (rc == 1) {
    check(got.vocab == want.vocab && got.nparams == want.nparams && got.nstate == want.nstate,
          "loaded a checkpoint of another configuration");
    /* The newest was skipped (named in the note): what loaded is the older one. */
    if (with_old && strstr(note, "ckpt_000000000002.bin") != NULL) {
      check(memcmp(params, old_params, sizeof old_params) == 0 &&
                memcmp(state, old_state, sizeof old_state) == 0,
            "the older checkpoint's contents changed");
    }
  }
  free(params);
  free(state);
  free(file);
  return 0;
}

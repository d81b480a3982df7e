/*
 * fuzz_stacks.c - libFuzzer target for what the agent reads from workers
 * while it watches for hangs: stack texts (agent_stacks_classify over the input
 * as a Python traceback and as a native backtrace, src/agent/stacks.c) and
 * progress files (agent_progress_poll over the input as the file's content,
 * src/agent/progress.c).
 *
 * Checks: the verdict's strings are terminated inside their buffers, the
 * grouped lines too; a progress file's content never moves the step
 * backwards through garbage, and at most one line is reported for it.
 *
 * Build (clang only): cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCOHORT_FUZZ=ON
 * Run: build-fuzz/fuzz_stacks -max_total_time=60
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/progress.h"
#include "agent/stacks.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_stacks: check failed: %s\n", what);
    abort();
  }
}

static void classify(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (text == NULL) return;
  memcpy(text, data, size);
  text[size] = '\0';
  stacks_verdict v[2];
  for (int k = 0; k < 2; k++) {
    stacks_dump d = {
        .rank = k, .pid = 100, .kind = k ? STACKS_NATIVE : STACKS_PYTHON, .text = text};
    agent_stacks_classify(&d, &v[k]);
    check(memchr(v[k].where, '\0', sizeof v[k].where) != NULL, "where not terminated");
    check(memchr(v[k].frames, '\0', sizeof v[k].frames) != NULL, "frames not terminated");
  }
  int64_t silent[2] = {1, 2};
  const char *why = NULL;
  int cause = agent_stacks_blame(v, silent, 2, &why);
  check(cause == 0 || cause == 1, "blame out of range");
  char lines[64];
  agent_stacks_group_lines(v, 2, cause, lines, sizeof lines);
  check(memchr(lines, '\0', sizeof lines) != NULL, "lines not terminated");
  free(text);
}

/* One scratch directory for the whole run, removed at exit (libFuzzer ends
 * with exit()), so that runs leave nothing behind in /dev/shm. */
static char dir[256], path[320];

static void cleanup(void) {
  unlink(path);
  rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_scratch_dir(dir, sizeof dir, "stacks");
  snprintf(path, sizeof path, "%s/hb", dir);
  atexit(cleanup);
  return 0;
}

static void progress_file(const uint8_t *data, size_t size) {
  progress p;
  if (agent_progress_init(&p, 0, path, 0) != 0) return;
  int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) return;
  check(write(fd, data, size) == (ssize_t)size, "write");
  close(fd);
  char msg[256];
  int lines = agent_progress_poll(&p, 1, msg, sizeof msg);
  lines += agent_progress_poll(&p, 2, msg, sizeof msg);
  check(lines <= 1, "a bad file reported twice");
  check(p.step >= -1, "negative step");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  classify(data, size);
  progress_file(data, size);
  return 0;
}

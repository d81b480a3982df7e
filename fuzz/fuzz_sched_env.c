/*
 * fuzz_sched_env.c - libFuzzer target for the scheduler environment
 * (rdzv_env_discover, src/rdzv/sched.c: Slurm with hostlists, Kubernetes
 * Indexed Jobs, MASTER_ADDR/RANK/WORLD_SIZE replicas, Open MPI) and for the
 * shared rendezvous file's text (rdzv_file_parse, src/rdzv/file.c).
 *
 * byte 0: bit 0 selects the file parser; otherwise bits 1-3 choose the
 * explicit options (--node-rank, --nnodes, --master) that the environment
 * must be reconciled with. The rest: for the environment, NAME=VALUE lines
 * (each becomes one envp entry); for the file, its bytes.
 *
 * Checks: the environment gives 0, -ENOENT or -EINVAL (then with a one-line
 * reason); success gives a port in 1..65535 and a node count range that is
 * consistent; the file parser gives 0 or -EINVAL, and what it accepts formats
 * and parses back to the same values.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cohort/cohort.h"
#include "rdzv/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_sched_env: check failed: %s\n", what);
    abort();
  }
}

static void fuzz_file(const uint8_t *p, size_t n) {
  rdzv_file_info info;
  int rc = rdzv_file_parse((const char *)p, n, &info);
  check(rc == 0 || rc == -EINVAL, "file: unexpected error");
  if (rc == 0) {
    /* Not byte for byte ("port=080" is accepted), but value for value. */
    char buf[1024];
    int len = rdzv_file_format(&info, buf, sizeof buf);
    check(len > 0 && (size_t)len <= n, "file: accepted text does not format");
    rdzv_file_info back;
    check(rdzv_file_parse(buf, (size_t)len, &back) == 0 && back.ready == info.ready &&
              back.port == info.port && strcmp(back.job_id, info.job_id) == 0 &&
              strcmp(back.host, info.host) == 0,
          "file: accepted text does not format and parse back to the same values");
    /* Sealed under a token it opens to the same values; under another it is refused. */
    int sealed = rdzv_file_seal("tok", buf, (size_t)len, sizeof buf);
    check(sealed > len && rdzv_file_open("tok", buf, (size_t)sealed, &back) == 0 &&
              back.port == info.port && strcmp(back.host, info.host) == 0,
          "file: a sealed record does not open");
    check(rdzv_file_open("tok2", buf, (size_t)sealed, &back) == COHORT_EAUTH,
          "file: a record sealed under another token opens");
  }
  /* The same bytes as a sealed record: opened only with a valid MAC, never a crash. */
  rc = rdzv_file_open("tok", (const char *)p, n, &info);
  check(rc == 0 || rc == -EINVAL || rc == COHORT_EAUTH, "file: unexpected error when sealed");
}

static void fuzz_env(uint8_t flags, const uint8_t *p, size_t n) {
  /* One copy of the input, cut into lines: every line is an envp entry. */
  char *text = malloc(n + 1);
  check(text != NULL, "out of memory");
  memcpy(text, p, n);
  text[n] = '\0';
  size_t lines = 1;
  for (size_t i = 0; i < n; i++)
    if (text[i] == '\n') lines++;
  char **envp = calloc(lines + 1, sizeof *envp);
  check(envp != NULL, "out of memory");
  size_t k = 0;
  for (char *s = text, *save = NULL; (s = strtok_r(s, "\n", &save)) != NULL; s = NULL)
    envp[k++] = s;
  envp[k] = NULL;

  rdzv_opts o = {.method = RDZV_ENV, .node_rank = -1, .job_id = "fuzz"};
  if (flags & 2) o.node_rank = 1;
  if (flags & 4) o.nnodes_min = o.nnodes_max = 2;
  if (flags & 8) o.master = "10.0.0.1:29400";
  rdzv_target t;
  memset(&t, 0, sizeof t);
  char err[256] = "";
  int rc = rdzv_env_discover(&o, envp, &t, err, sizeof err);
  check(rc == 0 || rc == -ENOENT || rc == -EINVAL || rc == -ENOMEM, "env: unexpected error");
  if (rc == -EINVAL) check(err[0] != '\0' && strchr(err, '\n') == NULL, "env: no one-line reason");
  if (rc == 0) {
    check(t.port >= 1 && t.port <= 65535, "env: port");
    check(t.nnodes_min <= t.nnodes_max, "env: node counts");
    check(t.node_rank >= -1, "env: node rank");
    if (t.node_rank >= 0 && t.nnodes_max > 0) check(t.node_rank < t.nnodes_max, "env: rank range");
    check(memchr(t.source, '\0', sizeof t.source) != NULL, "env: source unterminated");
  }
  free(envp);
  free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 8192) return 0;
  if (data[0] & 1)
    fuzz_file(data + 1, size - 1);
  else
    fuzz_env(data[0], data + 1, size - 1);
  return 0;
}

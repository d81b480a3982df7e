/*
 * fuzz_cli.c - libFuzzer target for the command lines' parsers.
 *
 * The value parsers every command uses (base_parse_i64/int/size/seconds,
 * base_split_hostport, quoting), the manifest command, which is pure (argv
 * in, text out) and is fuzzed whole, and `cohort run`'s argument parser
 * (cmd_run_parse, which starts nothing).
 *
 * byte 0 % 4 == 2: the rest, cut at NUL bytes, is the argument vector of
 *   `cohort run`. It must answer 0 (then the command after "--" is non-empty
 *   and the settings are in range), 1 (help) or 2 (usage error).
 * else byte 0 % 2 == 0: the rest, cut at NUL bytes, is the argument vector
 *   of `cohort manifest` (cmd_manifest; its output goes to /dev/null through
 *   libFuzzer's -close_fd_mask=3). It must answer 0, 1 or 2.
 * byte 0 % 2 == 1: the rest is one value, given to every value parser.
 *
 * Checks: what the integer parsers accept prints back to the same number;
 * host:port splitting round-trips through base_join_hostport; a string
 * quoted for the shell reads back as itself (a small decoder of POSIX single
 * quotes); a doctor summary that parses formats back to itself.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "base/base.h"
#include "base/net.h"
#include "doctor/doctor.h"
#include "manifest/manifest.h"
#include "tools/cohort/cmd.h"
#include "tools/cohort/cmd_run.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ARGS 64

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_cli: check failed: %s\n", what);
    abort();
  }
}

/* Reads back a word made of unquoted safe characters and '...' / \' parts. */
static int shell_unquote(const char *q, char *out, size_t cap) {
  size_t o = 0;
  for (const char *p = q; *p;) {
    if (*p == '\'') {
      const char *e = strchr(p + 1, '\'');
      if (e == NULL) return -1;
      for (const char *c = p + 1; c < e; c++) {
        if (o + 1 >= cap) return -1;
        out[o++] = *c;
      }
      p = e + 1;
    } else if (*p == '\\' && p[1] != '\0') {
      if (o + 1 >= cap) return -1;
      out[o++] = p[1];
      p += 2;
    } else {
      /* Outside quotes only characters no shell treats specially may appear
       * (bash's brace expansion included; # and ~ matter at a word's start). */
      if (strchr(" \t\n\r\"$`\\|&;<>()*?[{}!", *p) != NULL) return -1;
      if (p == q && (*p == '#' || *p == '~')) return -1;
      if (o + 1 >= cap) return -1;
      out[o++] = *p++;
    }
  }
  out[o] = '\0';
  return 0;
}

static void values(const char *s) {
  int64_t v64;
  if (base_parse_i64(s, INT64_MIN, INT64_MAX, &v64) == 0) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v64);
    int64_t again;
    check(base_parse_i64(buf, INT64_MIN, INT64_MAX, &again) == 0 && again == v64, "i64");
  }
  int vi;
  if (base_parse_int(s, -1000, 1000, &vi) == 0) check(vi >= -1000 && vi <= 1000, "int range");
  uint64_t sz;
  int rc = base_parse_size(s, &sz);
  check(rc == 0 || rc == -EINVAL || rc == -ERANGE, "size: error code");
  rc = manifest_parse_size(s, &sz);
  check(rc == 0 || rc == -EINVAL || rc == -ERANGE, "manifest size: error code");
  if (rc == 0) check(sz > 0, "manifest size: zero accepted");
  int64_t ms;
  rc = base_parse_seconds(s, 86400.0, &ms);
  if (rc == 0) check(ms >= 0 && ms <= 86400000, "seconds: out of range");

  char host[BASE_HOST_MAX];
  int port = -1;
  for (int allow_zero = 0; allow_zero < 2; allow_zero++) {
    if (base_split_hostport(s, host, sizeof host, &port, allow_zero) != 0) continue;
    check(port >= (allow_zero ? 0 : 1) && port <= 65535, "hostport: port range");
    /* "[x]:1" is accepted with host "x" although x is no IPv6 literal, and
     * joins back as "x:1": round trips are checked for bracket-free hosts. */
    if (strpbrk(host, "[]") != NULL) continue;
    char joined[BASE_HOST_MAX + 16], host2[BASE_HOST_MAX];
    int port2 = -1;
    base_join_hostport(host, port, joined, sizeof joined);
    check(base_split_hostport(joined, host2, sizeof host2, &port2, allow_zero) == 0 &&
              strcmp(host, host2) == 0 && port == port2,
          "hostport: join/split does not round-trip");
  }

  base_buf b;
  base_buf_init(&b);
  manifest_shell_quote(&b, s);
  if (b.len > 0 || s[0] == '\0') {
    char *back = malloc(strlen(s) + 1);
    check(back != NULL, "out of memory");
    check(b.data != NULL, "shell quote: no output");
    check(shell_unquote(b.data, back, strlen(s) + 1) == 0 && strcmp(back, s) == 0,
          "shell quote does not read back as the string");
    free(back);
  }
  base_buf_free(&b);
  base_buf_init(&b);
  rc = manifest_yaml_quote(&b, s, 1);
  check(rc == 0 || rc == -EINVAL, "yaml quote: error code");
  if (rc == 0) check(b.len >= 2 && b.data[0] == '"' && b.data[b.len - 1] == '"', "yaml quotes");
  base_buf_free(&b);

  doctor_summary sum, back;
  if (doctor_summary_parse(s, &sum) == 0) {
    char line[DOCTOR_SUMMARY_MAX];
    check(doctor_summary_format(&sum, line, sizeof line) == 0 &&
              doctor_summary_parse(line, &back) == 0,
          "summary: does not format and parse back");
    char warn[1024];
    check(doctor_summary_compare("a", &sum, "b", &back, warn, sizeof warn) == 0,
          "summary: changed in a round trip");
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 8192) return 0;
  char *text = malloc(size);
  check(text != NULL, "out of memory");
  memcpy(text, data + 1, size - 1);
  text[size - 1] = '\0';
  if (data[0] % 2 == 1) {
    values(text);
    free(text);
    return 0;
  }
  char *argv[MAX_ARGS + 2];
  int argc = 0;
  int run = data[0] % 4 == 2;
  argv[argc++] = (char *)(run ? "run" : "manifest");
  for (size_t i = 0; i < size - 1 && argc < MAX_ARGS;) {
    argv[argc++] = text + i;
    i += strlen(text + i) + 1;
  }
  argv[argc] = NULL;
  if (run) {
    agent_config cfg;
    int rc = cmd_run_parse(argc, argv, &cfg);
    check(rc == 0 || rc == 1 || rc == AGENT_EXIT_USAGE, "run: exit status");
    if (rc == 0) {
      check(cfg.argv != NULL && cfg.argv[0] != NULL, "run: no command");
      check(cfg.nproc >= 1 && cfg.nproc <= AGENT_MAX_NPROC, "run: nproc range");
      check(cfg.max_restarts >= 0 && cfg.grace_ms >= 0 && cfg.join_timeout_ms > 0,
            "run: negative setting");
      check(cfg.rdzv.nnodes_min <= cfg.rdzv.nnodes_max, "run: nnodes MIN > MAX");
      check(cfg.rdzv.node_rank < 0 || cfg.rdzv.nnodes_max == 0 ||
                cfg.rdzv.node_rank < cfg.rdzv.nnodes_max,
            "run: node rank beyond nnodes");
      check(cfg.token == NULL || (cfg.token[0] != '\0' && strlen(cfg.token) <= 256),
            "run: token length");
      check(cfg.run_id == NULL || rdzv_job_id_valid(cfg.run_id), "run: job id");
    }
    free(text);
    return 0;
  }
  /* Node counts up to MANIFEST_MAX_NODES are valid and produce one docker
   * line each (megabytes of text): correct but slow under the sanitizers, so
   * such inputs are skipped; counts above the limit still reach its check. */
  for (int i = 1; i < argc; i++) {
    char *end = NULL;
    if (argv[i][0] < '0' || argv[i][0] > '9') continue;
    unsigned long long v = strtoull(argv[i], &end, 10);
    if (*end == '\0' && v > 4096 && v <= MANIFEST_MAX_NODES) {
      free(text);
      return 0;
    }
  }
  int rc = cmd_manifest(argc, argv);
  check(rc == 0 || rc == 1 || rc == 2, "manifest: exit status");
  free(text);
  return 0;
}

/*
 * fuzz_status.c - libFuzzer target for what `cohort status` and `cohort
 * stacks` read from a job's store: the nodes' snapshots and stack answers
 * (any node holding the token can write any bytes there).
 *
 * The input, cut at NUL bytes, is node 0's value followed by the other
 * nodes' (at most 16 values). byte 0 % 2 == 0: they are status snapshots:
 * parsed as the command does, made into the document at a time from the
 * input, rendered as the table and as JSON; the document must render both
 * ways. byte 0 % 2 == 1: they are stack answers, printed (to /dev/null
 * through libFuzzer's -close_fd_mask=3).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cohort/cmd_stacks.h"
#include "tools/cohort/cmd_status.h"
#include "tools/cohort/job.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_VALUES 16

static int split(const uint8_t *data, size_t size, const uint8_t **v, size_t *len) {
  int n = 0;
  size_t start = 0;
  for (size_t i = 0; i <= size && n < MAX_VALUES; i++) {
    if (i == size || data[i] == 0) {
      v[n] = data + start;
      len[n] = i - start;
      n++;
      start = i + 1;
    }
  }
  return n;
}

static void status_case(const uint8_t **v, const size_t *len, int n, int64_t now) {
  json_t *n0 = job_parse_snapshot(v[0], len[0]);
  if (n0 == NULL) return;
  json_t *nodes = json_array();
  for (int k = 0; k < n; k++) {
    json_t *s = job_parse_snapshot(v[k], len[k]);
    json_array_append_new(nodes, s != NULL ? s : json_null());
  }
  json_t *doc = status_document("fuzz", "127.0.0.1:1", n0, nodes, now);
  if (doc == NULL) abort();
  for (int as_json = 0; as_json < 2; as_json++) {
    char *text = status_render(doc, as_json);
    if (text == NULL) abort();
    free(text);
  }
  json_decref(doc);
  json_decref(n0);
}

static void stacks_case(const uint8_t **v, const size_t *len, int n) {
  json_t *answers[MAX_VALUES] = {0};
  for (int k = 0; k < n; k++) answers[k] = json_loadb((const char *)v[k], len[k], 0, NULL);
  stacks_print_answers(answers, n);
  for (int k = 0; k < n; k++) json_decref(answers[k]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const uint8_t *v[MAX_VALUES];
  size_t len[MAX_VALUES];
  int n = split(data + 1, size - 1, v, len);
  if (data[0] % 2 == 0)
    status_case(v, len, n, (int64_t)data[0] * 1000003);
  else
    stacks_case(v, len, n);
  return 0;
}

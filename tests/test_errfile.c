/*
 * test_errfile.c - the reader of PyTorch's error files (src/agent/errfile.c):
 * torch's two layouts, escapes decoded and folded into one line, cutting on
 * a character boundary, malformed documents, and the file reader's limits.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/errfile.h"
#include "tests/check.h"

static int parse(const char *json, char *out, size_t outlen) {
  return agent_error_json_message(json, strlen(json), out, outlen);
}

static void test_layouts(void) {
  char out[256];
  /* What torch 1.13's @record writes. */
  CHECK_EQ_INT(parse("{\"message\": {\"message\": \"ValueError: lr \\\"x\\\"\\nnext\\tline\", "
                     "\"extraInfo\": {\"py_callstack\": \"Traceback\\n  \\\"message\\\"\", "
                     "\"timestamp\": \"1700000000\"}}}",
                     out, sizeof out),
               0);
  CHECK_STREQ(out, "ValueError: lr \"x\" next line");
  /* Members in another order: the structure counts, not the text's order. */
  CHECK_EQ_INT(parse("{\"message\": {\"extraInfo\": {\"message\": \"no\"}, \"message\": \"yes\"}}",
                     out, sizeof out),
               0);
  CHECK_STREQ(out, "yes");
  CHECK_EQ_INT(parse("{\"message\": \"RuntimeError: caf\\u00e9 \\u001b[31m\"}", out, sizeof out),
               0);
  CHECK_STREQ(out, "RuntimeError: caf\xc3\xa9 ?[31m");
}

static void test_cut(void) {
  char out[8];
  /* "ab" then a two-byte é at bytes 6-7: seven bytes fit, é does not. */
  CHECK_EQ_INT(parse("{\"message\": \"abcdef\\u00e9\"}", out, sizeof out), 0);
  CHECK_STREQ(out, "abcdef");
  CHECK_EQ_INT(parse("{\"message\": \"abcdefghij\"}", out, sizeof out), 0);
  CHECK_STREQ(out, "abcdefg");
  CHECK_EQ_INT(parse("{\"message\": \"x\"}", out, 1), 0);
  CHECK_STREQ(out, "");
}

static void test_malformed(void) {
  char out[64];
  const char *bad[] = {
      "",
      "{}",
      "[\"message\"]",
      "{\"message\": 3}",
      "{\"message\": {\"message\": null}}",
      "{\"message\": {\"text\": \"x\"}}",
      "{\"message\": \"unterminated}",
      "{\"message\": \"x\"} trailing",
      "\"message\"",
      "{\"message\": \"NUL \\u0000 inside\"}",
      "{\"message\": \"bad utf-8 \xff\"}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    strcpy(out, "untouched");
    CHECK_EQ_INT(parse(bad[i], out, sizeof out), -EPROTO);
    CHECK_STREQ(out, "");
  }
}

static void test_file(void) {
  char dir[] = "/tmp/test_errfile.XXXXXX", path[64], out[64];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/e.json", dir);
  CHECK_EQ_INT(agent_error_file_message(path, out, sizeof out), -ENOENT);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (f == NULL) return;
  fputs("{\"message\": {\"message\": \"KeyError: 'x'\"}}", f);
  fclose(f);
  CHECK_EQ_INT(agent_error_file_message(path, out, sizeof out), 0);
  CHECK_STREQ(out, "KeyError: 'x'");
  CHECK_EQ_INT(truncate(path, 0), 0);
  CHECK_EQ_INT(agent_error_file_message(path, out, sizeof out), -ENODATA);
  CHECK_EQ_INT(truncate(path, AGENT_ERRFILE_MAX + 1), 0);
  CHECK_EQ_INT(agent_error_file_message(path, out, sizeof out), -EFBIG);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  test_layouts();
  test_cut();
  test_malformed();
  test_file();
  return check_report();
}

/*
 * test_tb.c - the TensorBoard event writer (src/gpt2/tb_writer.c).
 *
 *   test_tb            unit checks: CRC32C vectors, argument errors, file naming
 *   test_tb write DIR  writes the scalar series that test_tb.py decodes and checks
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpt2/tb_writer.h"
#include "tests/check.h"

static int write_series(const char *dir) {
  gpt2_tb_writer *w = NULL;
  int rc = gpt2_tb_open(dir, &w);
  if (rc != 0) {
    fprintf(stderr, "test_tb: open %s: %s\n", dir, strerror(-rc));
    return 1;
  }
  /* The series test_tb.py expects: loss and lr for steps 0..99, then one
   * event with three values, odd tags and steps. */
  for (int64_t step = 0; step < 100; step++) {
    rc |= gpt2_tb_add_scalar(w, "train/loss", step, 10.0f / (float)(step + 1));
    rc |= gpt2_tb_add_scalar(w, "train/lr", step, 0.0003f * (float)step);
  }
  const char *tags[3] = {"perf/tokens_per_s", "ünïcode ☃", "x"};
  float values[3] = {123456.75f, -1.5f, 3.0e38f};
  rc |= gpt2_tb_add_scalars(w, 1000000000000LL, 3, tags, values);
  rc |= gpt2_tb_add_scalar(w, "negative_step", -5, 0.25f);
  rc |= gpt2_tb_flush(w);
  printf("%s\n", gpt2_tb_path(w));
  gpt2_tb_close(w);
  return rc != 0;
}

static void test_crc(void) {
  /* The check value of CRC-32C and RFC 3720's test vectors. */
  CHECK(gpt2_tb_crc32c("123456789", 9) == 0xE3069283u);
  unsigned char zeros[32] = {0}, ones[32], inc[32];
  memset(ones, 0xFF, sizeof ones);
  for (int i = 0; i < 32; i++) inc[i] = (unsigned char)i;
  CHECK(gpt2_tb_crc32c(zeros, 32) == 0x8A9136AAu);
  CHECK(gpt2_tb_crc32c(ones, 32) == 0x62A8AB43u);
  CHECK(gpt2_tb_crc32c(inc, 32) == 0x46DD794Eu);
  CHECK(gpt2_tb_crc32c("", 0) == 0);
  uint32_t c = gpt2_tb_crc32c("123456789", 9);
  CHECK(gpt2_tb_masked_crc("123456789", 9) == ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

static void test_errors(void) {
  gpt2_tb_writer *w = (gpt2_tb_writer *)&w;
  CHECK_EQ_INT(gpt2_tb_open("/dev/null/dir/for/tb", &w), -ENOTDIR);
  CHECK(w == NULL);
  CHECK_EQ_INT(gpt2_tb_open("", &w), -EINVAL);

  char dir[] = "/tmp/cohort_test_tb_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  /* A directory that does not exist yet, two levels of it: created. */
  char deep[64];
  snprintf(deep, sizeof deep, "%s/runs/a", dir);
  CHECK_EQ_INT(gpt2_tb_open(deep, &w), 0);
  CHECK(w != NULL && strncmp(gpt2_tb_path(w), deep, strlen(deep)) == 0);
  unlink(gpt2_tb_path(w));
  gpt2_tb_close(w);
  CHECK(rmdir(deep) == 0);
  snprintf(deep, sizeof deep, "%s/runs", dir);
  CHECK(rmdir(deep) == 0);
  CHECK_EQ_INT(gpt2_tb_open(dir, &w), 0);
  gpt2_tb_writer *w2 = NULL;
  CHECK_EQ_INT(gpt2_tb_open(dir, &w2), 0); /* same second: a distinct file */
  CHECK(w != NULL && w2 != NULL && strcmp(gpt2_tb_path(w), gpt2_tb_path(w2)) != 0);
  CHECK(strstr(gpt2_tb_path(w), "/events.out.tfevents.") != NULL);
  char big[GPT2_TB_TAG_MAX + 2];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  struct stat st0, st1;
  CHECK(stat(gpt2_tb_path(w), &st0) == 0);
  CHECK_EQ_INT(gpt2_tb_add_scalar(w, "", 0, 1.0f), -EINVAL);
  CHECK_EQ_INT(gpt2_tb_add_scalar(w, big, 0, 1.0f), -EINVAL);
  CHECK_EQ_INT(gpt2_tb_add_scalar(w, "bad\xff", 0, 1.0f), -EINVAL);
  CHECK_EQ_INT(gpt2_tb_add_scalar(w, NULL, 0, 1.0f), -EINVAL);
  CHECK_EQ_INT(gpt2_tb_add_scalar(NULL, "x", 0, 1.0f), -EINVAL);
  CHECK_EQ_INT(gpt2_tb_add_scalars(w, 0, 0, NULL, NULL), -EINVAL);
  /* Rejected calls write nothing. */
  CHECK(stat(gpt2_tb_path(w), &st1) == 0 && st1.st_size == st0.st_size);
  big[GPT2_TB_TAG_MAX] = '\0';
  CHECK_EQ_INT(gpt2_tb_add_scalar(w, big, 0, NAN), 0);
  CHECK(stat(gpt2_tb_path(w), &st1) == 0 && st1.st_size > st0.st_size);
  unlink(gpt2_tb_path(w));
  unlink(gpt2_tb_path(w2));
  gpt2_tb_close(w);
  gpt2_tb_close(w2);
  gpt2_tb_close(NULL);
  CHECK(rmdir(dir) == 0);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "write") == 0) return write_series(argv[2]);
  if (argc != 1) {
    fprintf(stderr, "usage: test_tb [write DIR]\n");
    return 2;
  }
  test_crc();
  test_errors();
  return check_report();
}

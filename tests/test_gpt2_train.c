/*
 * test_gpt2_train.c - cohort-gpt2 as a program: usage errors, data errors,
 * gradient accumulation equivalence, and the checkpoint guarantee: a run
 * killed with SIGKILL and restarted produces, step for step, bitwise the same
 * losses as an uninterrupted run, also when its newest checkpoint is damaged.
 *
 * usage: test_gpt2_train PATH/TO/cohort-gpt2
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/check.h"
#include "tests/spawn_files.h"

static const char *bin;
static char tmp[256];

static pid_t spawn(const char *tag, const char **args) {
  static const char *const env[] = {"OMP_NUM_THREADS=2", NULL};
  return spawn_to_files(bin, tmp, tag, args, env);
}

static int wait_status(pid_t pid) {
  return spawn_wait(pid);
}

static int run(const char *tag, const char **args) {
  return wait_status(spawn(tag, args));
}

static char *slurp(const char *fmt, ...) {
  char path[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(path, sizeof(path), fmt, ap);
  va_end(ap);
  return spawn_slurp(path);
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

/* Loss text of each step of a metrics file (the last line of a step wins, so
 * a resumed run's replayed steps replace the killed run's). */
#define MAXSTEPS 128
static void losses_of(const char *jsonl, char out[MAXSTEPS][40]) {
  for (int i = 0; i < MAXSTEPS; i++) out[i][0] = '\0';
  const char *p = jsonl;
  while ((p = strstr(p, "{\"step\":")) != NULL) {
    int step = atoi(p + 8);
    const char *l = strstr(p, "\"loss\":");
    if (l && step > 0 && step < MAXSTEPS) {
      l += 7;
      size_t n = strcspn(l, ",}");
      if (n >= 40) n = 39;
      memcpy(out[step], l, n);
      out[step][n] = '\0';
    }
    p++;
  }
}

static void test_usage(void) {
  CHECK_EQ_INT(run("help", (const char *[]){"--help", NULL}), 0);
  char *out = slurp("%s/help.out", tmp);
  CHECK(strstr(out, "--grad-accum") != NULL && strstr(out, "--ckpt-dir") != NULL);
  free(out);
  const char *bad[][4] = {
      {"--bogus", NULL},       {"--batch", "0", NULL},          {"--batch", "x", NULL},
      {"--model", "1T", NULL}, {"--head", "mlm", NULL},         {"--seq-len", "2048", NULL},
      {"--heads", "5", NULL},  {"--lr", "nan", NULL},           {"--steps", NULL},
      {"extra", NULL},         {"--head", "qa", "--data", NULL}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    const char *args[6] = {bad[i][0], bad[i][1], bad[i][2], NULL};
    if (i == 10) args[3] = "/etc/hostname";
    int rc = run("bad", args);
    char *err = slurp("%s/bad.err", tmp);
    if (rc != 2 || count_lines(err) != 1)
      fprintf(stderr, "usage case %zu: exit %d, stderr: %s\n", i, rc, err);
    CHECK_EQ_INT(rc, 2);
    CHECK_EQ_INT(count_lines(err), 1);
    free(err);
  }
  /* A data file that is not tokens: one line naming it, exit 2. */
  char junk[512];
  snprintf(junk, sizeof(junk), "%s/junk.bin", tmp);
  FILE *f = fopen(junk, "wb");
  fwrite("\x01\x02\x03\x04garbage", 1, 11, f);
  fclose(f);
  int rc = run("junk", (const char *[]){"--model", "tiny", "--data", junk, NULL});
  char *err = slurp("%s/junk.err", tmp);
  CHECK_EQ_INT(rc, 2);
  CHECK(count_lines(err) == 1 && strstr(err, "junk.bin") != NULL);
  free(err);
}

/* Real tokens: an llm.c shard of a repeating pattern (learnable, so the
 * loss must fall well below log(V)), and a text file. */
static void test_token_data(void) {
  char shard[512], text[512], m[512];
  snprintf(shard, sizeof(shard), "%s/pattern.bin", tmp);
  snprintf(text, sizeof(text), "%s/words.txt", tmp);
  snprintf(m, sizeof(m), "%s/shard.jsonl", tmp);
  enum { NTOK = 4096 };
  int32_t hdr[256] = {20240520, 1, NTOK};
  uint16_t toks[NTOK];
  for (int i = 0; i < NTOK; i++) toks[i] = (uint16_t)((i * 7) % 13);
  FILE *f = fopen(shard, "wb");
  fwrite(hdr, sizeof(hdr), 1, f);
  fwrite(toks, sizeof(toks), 1, f);
  fclose(f);
  int rc = run("shard",
               (const char *[]){"--model", "tiny", "--data", shard, "--steps", "30", "--seq-len",
                                "16", "--lr", "3e-3", "--metrics", m, "--quiet", NULL});
  CHECK_EQ_INT(rc, 0);
  char *j = slurp("%s", m);
  char l[MAXSTEPS][40];
  losses_of(j, l);
  free(j);
  double first = atof(l[1]), last = atof(l[30]);
  if (!(first > 5.5 && last < 2.0)) fprintf(stderr, "shard: loss %g -> %g\n", first, last);
  CHECK(first > 5.5 && last < 2.0); /* log(512) = 6.24 at the start */
  f = fopen(text, "w");
  for (int i = 0; i < 200; i++) fputs("the quick brown fox jumps over the lazy dog. ", f);
  fclose(f);
  rc = run("text", (const char *[]){"--model", "tiny", "--data", text, "--steps", "3", "--seq-len",
                                    "32", "--quiet", NULL});
  CHECK_EQ_INT(rc, 0);
  /* A vocabulary too small for the shard's tokens: one line, exit 2. */
  rc = run("vocab", (const char *[]){"--model", "tiny", "--vocab", "10", "--data", shard, NULL});
  char *err = slurp("%s/vocab.err", tmp);
  CHECK_EQ_INT(rc, 2);
  CHECK(count_lines(err) == 1 && strstr(err, "outside the vocabulary") != NULL);
  free(err);
}

/* One rank, B=4 vs B=2 with two accumulation steps: the same global batch,
 * so the same losses up to float reordering. */
static void test_accum(void) {
  char m1[512], m2[512];
  snprintf(m1, sizeof(m1), "%s/acc1.jsonl", tmp);
  snprintf(m2, sizeof(m2), "%s/acc2.jsonl", tmp);
  const char *common[] = {"--model", "tiny", "--steps", "6", "--seq-len", "16", "--quiet"};
  const char *a1[16], *a2[16];
  int n = 0;
  for (; n < 7; n++) a1[n] = a2[n] = common[n];
  a1[n] = "--batch", a2[n++] = "--batch";
  a1[n] = "4", a2[n++] = "2";
  a1[n] = "--grad-accum", a2[n++] = "--grad-accum";
  a1[n] = "1", a2[n++] = "2";
  a1[n] = "--metrics";
  a2[n++] = "--metrics";
  a1[n] = m1, a2[n++] = m2;
  a1[n] = a2[n] = NULL;
  CHECK_EQ_INT(run("acc1", a1), 0);
  CHECK_EQ_INT(run("acc2", a2), 0);
  char *j1 = slurp("%s", m1), *j2 = slurp("%s", m2);
  char l1[MAXSTEPS][40], l2[MAXSTEPS][40];
  losses_of(j1, l1);
  losses_of(j2, l2);
  int ok = 1;
  for (int s = 1; s <= 6; s++) {
    double x = atof(l1[s]), y = atof(l2[s]);
    if (l1[s][0] == '\0' || fabs(x - y) > 1e-5 * fabs(x)) {
      fprintf(stderr, "accum step %d: %s vs %s\n", s, l1[s], l2[s]);
      ok = 0;
    }
  }
  CHECK(ok);
  free(j1);
  free(j2);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void test_resume(void) {
  enum { STEPS = 24 };
  char ma[512], mb[512], ckpt[512];
  snprintf(ma, sizeof(ma), "%s/a.jsonl", tmp);
  snprintf(mb, sizeof(mb), "%s/b.jsonl", tmp);
  snprintf(ckpt, sizeof(ckpt), "%s/ckpt", tmp);
  /* Big enough that a step takes a few milliseconds, so the kill lands
   * mid-run. */
  const char *model[] = {"--model", "tiny",    "--channels", "128",       "--layers",
                         "3",       "--batch", "8",          "--seq-len", "64",
                         "--steps", "24",      "--quiet",    "--seed",    "11"};
  const char *a[32], *b[32];
  int n = 0;
  for (; n < 15; n++) a[n] = b[n] = model[n];
  a[n] = "--metrics", a[n + 1] = ma, a[n + 2] = NULL;
  b[n] = "--metrics", b[n + 1] = mb, b[n + 2] = "--ckpt-dir", b[n + 3] = ckpt;
  b[n + 4] = "--ckpt-every", b[n + 5] = "3", b[n + 6] = NULL;
  CHECK_EQ_INT(run("a", a), 0);

  /* Kill B with SIGKILL once it has finished 7 steps. */
  pid_t pid = spawn("b1", b);
  int lines = 0;
  for (int i = 0; i < 20000; i++) {
    char *j = slurp("%s", mb);
    lines = count_lines(j);
    free(j);
    if (lines >= 7) break;
    sleep_ms(1);
  }
  kill(pid, SIGKILL);
  int st = wait_status(pid);
  CHECK_EQ_INT(st, 128 + SIGKILL);
  char *j = slurp("%s", mb);
  int killed_at = count_lines(j);
  free(j);
  fprintf(stderr, "resume test: killed after %d of %d steps\n", killed_at, STEPS);
  CHECK(killed_at >= 7 && killed_at < STEPS);

  /* Resume: the newest checkpoint is used. */
  CHECK_EQ_INT(run("b2", b), 0);
  char *out = slurp("%s/b2.out", tmp);
  CHECK(strstr(out, "resumed from") != NULL);
  free(out);

  /* Every step of the killed-and-resumed run equals the uninterrupted one. */
  char *ja = slurp("%s", ma), *jb = slurp("%s", mb);
  char la[MAXSTEPS][40], lb[MAXSTEPS][40];
  losses_of(ja, la);
  losses_of(jb, lb);
  int same = 1;
  for (int s = 1; s <= STEPS; s++) {
    if (la[s][0] == '\0' || strcmp(la[s], lb[s]) != 0) {
      fprintf(stderr, "resume step %d: uninterrupted %s, resumed %s\n", s, la[s], lb[s]);
      same = 0;
    }
  }
  CHECK(same);
  free(ja);
  free(jb);

  /* Run again with the job complete: it resumes at the last step, runs none, says so. */
  CHECK_EQ_INT(run("b2b", b), 0);
  out = slurp("%s/b2b.out", tmp);
  CHECK(strstr(out, "0 steps run: the checkpoint resumed is already at step 24 of 24") != NULL);
  CHECK(strstr(out, "nan") == NULL);
  free(out);

  /* Damage the newest checkpoint (step 24): a rerun with more steps skips
   * it with a message and resumes from the previous one (21, kept by the
   * default --ckpt-keep 2). */
  char path[600];
  snprintf(path, sizeof(path), "%s/ckpt_%012d.bin", ckpt, STEPS);
  int fd = open(path, O_RDWR);
  CHECK(fd >= 0);
  unsigned char byte = 0;
  CHECK(pread(fd, &byte, 1, 5000) == 1);
  byte ^= 1;
  CHECK(pwrite(fd, &byte, 1, 5000) == 1);
  close(fd);
  b[11] = "25"; /* --steps */
  CHECK_EQ_INT(run("b3", b), 0);
  char *err = slurp("%s/b3.err", tmp);
  out = slurp("%s/b3.out", tmp);
  CHECK(strstr(err, "checksum") != NULL);
  CHECK(strstr(out, "resumed from") != NULL && strstr(out, "at step 21") != NULL);
  free(err);
  free(out);
}

/* OpenBLAS's kernels, as the header line names them: on a CPU with AVX2 and
 * FMA never the Prescott fallback (Debian 12's OpenBLAS does not know recent
 * Xeons, this VM's among them: cohort-gpt2 starts again with
 * OPENBLAS_CORETYPE set); kernels the user names are kept. */
static void test_blas_core(void) {
  static const char *const unset[] = {"OMP_NUM_THREADS=1", "OPENBLAS_CORETYPE", NULL};
  static const char *const named[] = {"OMP_NUM_THREADS=1", "OPENBLAS_CORETYPE=Prescott", NULL};
  const char *args[] = {"--model", "tiny", "--steps", "1", "--seq-len", "16", NULL};
  CHECK_EQ_INT(spawn_wait(spawn_to_files(bin, tmp, "blas", args, unset)), 0);
  char *out = slurp("%s/blas.out", tmp);
  CHECK(strstr(out, " threads, OpenBLAS ") != NULL);
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    CHECK(strstr(out, "OpenBLAS Prescott kernels") == NULL);
#endif
  free(out);
  CHECK_EQ_INT(spawn_wait(spawn_to_files(bin, tmp, "blas2", args, named)), 0);
  out = slurp("%s/blas2.out", tmp);
  CHECK(strstr(out, "OpenBLAS Prescott kernels") != NULL);
  free(out);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_gpt2_train PATH/TO/cohort-gpt2\n");
    return 2;
  }
  bin = argv[1];
  snprintf(tmp, sizeof(tmp), "/tmp/test_gpt2_train.XXXXXX");
  if (mkdtemp(tmp) == NULL) return 1;
  test_usage();
  test_blas_core();
  test_token_data();
  test_accum();
  test_resume();
  char cmd[300];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
  if (check_failed_count == 0 && system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
  return check_report();
}

/*
 * test_manifest.c - unit tests of src/manifest: YAML and shell quoting,
 * size parsing and the validation of each template's options. The rendered
 * templates are parsed by real YAML and shell parsers in test_manifest.py.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "manifest/manifest.h"
#include "tests/check.h"

static char *yaml(const char *s, int dollar) {
  static char out[512];
  base_buf b;
  base_buf_init(&b);
  int rc = manifest_yaml_quote(&b, s, dollar);
  if (rc != 0)
    snprintf(out, sizeof out, "<error %d>", rc);
  else
    snprintf(out, sizeof out, "%s", b.data);
  base_buf_free(&b);
  return out;
}

static char *sh(const char *s) {
  static char out[512];
  base_buf b;
  base_buf_init(&b);
  manifest_shell_quote(&b, s);
  snprintf(out, sizeof out, "%s", b.data);
  base_buf_free(&b);
  return out;
}

static void test_yaml_quote(void) {
  CHECK_STREQ(yaml("plain", 0), "\"plain\"");
  CHECK_STREQ(yaml("", 0), "\"\"");
  CHECK_STREQ(yaml("a \"b\": c", 0), "\"a \\\"b\\\": c\"");
  CHECK_STREQ(yaml("back\\slash", 0), "\"back\\\\slash\"");
  CHECK_STREQ(yaml("t\tn\nr\r", 0), "\"t\\tn\\nr\\r\"");
  CHECK_STREQ(yaml("\x01\x7f", 0), "\"\\x01\\x7F\"");
  CHECK_STREQ(yaml("$(HOME) $$", 0), "\"$(HOME) $$\"");
  CHECK_STREQ(yaml("$(HOME) $$", 1), "\"$$(HOME) $$$$\"");
  /* Printable non-ASCII passes through; NEL, LS and BOM are escaped. */
  CHECK_STREQ(yaml("\xc3\xbc \xe2\x98\x83", 0), "\"\xc3\xbc \xe2\x98\x83\"");
  CHECK_STREQ(yaml("\xc2\x85", 0), "\"\\x85\"");
  CHECK_STREQ(yaml("\xe2\x80\xa8", 0), "\"\\u2028\"");
  CHECK_STREQ(yaml("\xef\xbb\xbf", 0), "\"\\uFEFF\"");
  CHECK_STREQ(yaml("\xc2\x9b", 0), "\"\\x9B\"");
  /* Invalid UTF-8: truncated, overlong, surrogate, out of range, stray. */
  CHECK_STREQ(yaml("\xc3", 0), "<error -22>");
  CHECK_STREQ(yaml("\xc0\xaf", 0), "<error -22>");
  CHECK_STREQ(yaml("\xed\xa0\x80", 0), "<error -22>");
  CHECK_STREQ(yaml("\xf4\x90\x80\x80", 0), "<error -22>");
  CHECK_STREQ(yaml("a\x80", 0), "<error -22>");
}

static void test_shell_quote(void) {
  CHECK_STREQ(sh("python3"), "python3");
  CHECK_STREQ(sh("--lr=0.1"), "--lr=0.1");
  CHECK_STREQ(sh(""), "''");
  CHECK_STREQ(sh("a b"), "'a b'");
  CHECK_STREQ(sh("it's"), "'it'\\''s'");
  CHECK_STREQ(sh("$HOME"), "'$HOME'");
  CHECK_STREQ(sh("~"), "'~'");
  CHECK_STREQ(sh("*"), "'*'");
  CHECK_STREQ(sh("a\nb"), "'a\nb'");
}

static void test_parse_size(void) {
  uint64_t v = 0;
  CHECK_EQ_INT(manifest_parse_size("8G", &v), 0);
  CHECK(v == 8ull << 30);
  CHECK_EQ_INT(manifest_parse_size("512Mi", &v), 0);
  CHECK(v == 512ull << 20);
  CHECK_EQ_INT(manifest_parse_size("1TiB", &v), 0);
  CHECK(v == 1ull << 40);
  CHECK_EQ_INT(manifest_parse_size("4096", &v), 0);
  CHECK(v == 4096);
  CHECK_EQ_INT(manifest_parse_size("0", &v), -EINVAL);
  CHECK_EQ_INT(manifest_parse_size("8X", &v), -EINVAL);
  CHECK_EQ_INT(manifest_parse_size("G", &v), -EINVAL);
  CHECK_EQ_INT(manifest_parse_size("-1G", &v), -EINVAL);
  CHECK_EQ_INT(manifest_parse_size("8Gx", &v), -EINVAL);
  CHECK_EQ_INT(manifest_parse_size("99999999999999999999", &v), -ERANGE);
  CHECK_EQ_INT(manifest_parse_size("99999999999T", &v), -ERANGE);
}

static char *cmd_default[] = {"python3", "train.py"};

static int k8s_rc(const char *name, int nodes, const char *image, const char *secret, char *err) {
  manifest_k8s_opts o = {.name = name,
                         .image = image,
                         .nodes = nodes,
                         .nproc_per_node = 2,
                         .port = MANIFEST_DEFAULT_PORT,
                         .token_secret = secret,
                         .token = "0123456789abcdef0123456789abcdef",
                         .cmd = cmd_default,
                         .ncmd = 2};
  base_buf b;
  base_buf_init(&b);
  int rc = manifest_k8s(&o, &b, err, 256);
  /* A failed render leaves no partial output behind. */
  if (rc != 0 && b.len != 0) rc = 1;
  base_buf_free(&b);
  return rc;
}

static void test_k8s_validation(void) {
  char err[256];
  CHECK_EQ_INT(k8s_rc("train", 2, "img", NULL, err), 0);
  CHECK_EQ_INT(k8s_rc("train", 2, "img", "my.secret-1", err), 0);
  CHECK_EQ_INT(k8s_rc("Train", 2, "img", NULL, err), -EINVAL);
  CHECK(strstr(err, "--name") != NULL);
  CHECK_EQ_INT(k8s_rc("-train", 2, "img", NULL, err), -EINVAL);
  CHECK_EQ_INT(k8s_rc("train-", 2, "img", NULL, err), -EINVAL);
  CHECK_EQ_INT(k8s_rc("a_b", 2, "img", NULL, err), -EINVAL);
  CHECK_EQ_INT(k8s_rc("", 2, "img", NULL, err), -EINVAL);
  /* 61 characters leave room for "-0" ... "-9" but not for "-10". */
  char name[80];
  memset(name, 'a', 61);
  name[61] = '\0';
  CHECK_EQ_INT(k8s_rc(name, 10, "img", NULL, err), 0);
  CHECK_EQ_INT(k8s_rc(name, 11, "img", NULL, err), -EINVAL);
  CHECK_EQ_INT(k8s_rc("train", 0, "img", NULL, err), -EINVAL);
  CHECK(strstr(err, "--nodes") != NULL);
  CHECK_EQ_INT(k8s_rc("train", 2, "my image", NULL, err), -EINVAL);
  CHECK_EQ_INT(k8s_rc("train", 2, "", NULL, err), -EINVAL);
  CHECK_EQ_INT(k8s_rc("train", 2, "img", "Bad_Secret", err), -EINVAL);
  CHECK(strstr(err, "--token-secret") != NULL);
  CHECK_EQ_INT(k8s_rc("train", 2, "img", "a..b", err), -EINVAL);
  CHECK(strstr(err, "--token-secret") != NULL);

  char *bad_utf8[] = {"python3", "\xff"};
  manifest_k8s_opts o = {.name = "t",
                         .image = "i",
                         .nodes = 1,
                         .nproc_per_node = 1,
                         .port = 1,
                         .token = "t",
                         .cmd = bad_utf8,
                         .ncmd = 2};
  base_buf b;
  base_buf_init(&b);
  CHECK_EQ_INT(manifest_k8s(&o, &b, err, sizeof err), -EINVAL);
  CHECK(strstr(err, "argument 2") != NULL);
  o.ncmd = 0;
  CHECK_EQ_INT(manifest_k8s(&o, &b, err, sizeof err), -EINVAL);
  CHECK(strstr(err, "--") != NULL);
  /* Without --token-secret the Secret needs a token: the job is never left open. */
  o.cmd = cmd_default;
  o.ncmd = 2;
  const char *no_token[] = {NULL, "", "a b", "t\n"};
  for (size_t i = 0; i < sizeof no_token / sizeof no_token[0]; i++) {
    o.token = no_token[i];
    CHECK_EQ_INT(manifest_k8s(&o, &b, err, sizeof err), -EINVAL);
    CHECK(strstr(err, "token") != NULL);
  }
  CHECK_EQ_INT(b.len, 0);
  base_buf_free(&b);
}

typedef int (*kube_fn)(const manifest_k8s_opts *, base_buf *, char *, size_t);

/* The controllers' kinds: their pod names bound --name, Trainer fixes the
 * port, and the metrics port must be a port of its own. */
static void test_kube_kinds(void) {
  static const struct {
    kube_fn fn;
    int longest; /* the longest name for 10 nodes (indices up to 9) */
  } kinds[] = {{manifest_k8s, 61},
               {manifest_jobset, 54},
               {manifest_trainjob, 54},
               {manifest_pytorchjob, 54}};
  char name[80], err[256];
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    manifest_k8s_opts o = {.image = "img",
                           .nodes = 10,
                           .nproc_per_node = 2,
                           .port = MANIFEST_DEFAULT_PORT,
                           .token = "0123456789abcdef0123456789abcdef",
                           .cmd = cmd_default,
                           .ncmd = 2};
    base_buf b;
    base_buf_init(&b);
    memset(name, 'a', sizeof name);
    name[kinds[k].longest] = '\0';
    o.name = name;
    CHECK_EQ_INT(kinds[k].fn(&o, &b, err, sizeof err), 0);
    base_buf_free(&b);
    name[kinds[k].longest] = 'a';
    name[kinds[k].longest + 1] = '\0';
    CHECK_EQ_INT(kinds[k].fn(&o, &b, err, sizeof err), -EINVAL);
    CHECK(strstr(err, "--name") != NULL);
    o.name = "t";
    o.metrics_port = o.port;
    CHECK_EQ_INT(kinds[k].fn(&o, &b, err, sizeof err), -EINVAL);
    CHECK(strstr(err, "--metrics-port") != NULL);
    o.metrics_port = 9400;
    CHECK_EQ_INT(kinds[k].fn(&o, &b, err, sizeof err), 0);
    CHECK(strstr(b.data, "\"--metrics-port\"\n") != NULL);
    CHECK(strstr(b.data, "prometheus.io/port: \"9400\"") != NULL);
    CHECK(strstr(b.data, "terminationMessagePolicy: FallbackToLogsOnError") != NULL);
    CHECK(strstr(b.data, "PodMonitor") == NULL);
    base_buf_free(&b);
    o.pod_monitor = 1;
    CHECK_EQ_INT(kinds[k].fn(&o, &b, err, sizeof err), 0);
    CHECK(strstr(b.data, "kind: PodMonitor\n") != NULL);
    base_buf_free(&b);
    o.metrics_port = 0;
    CHECK_EQ_INT(kinds[k].fn(&o, &b, err, sizeof err), -EINVAL);
    CHECK(strstr(err, "--pod-monitor needs --metrics-port") != NULL);
    CHECK_EQ_INT(b.len, 0);
  }
  manifest_k8s_opts o = {.name = "t",
                         .image = "img",
                         .nodes = 2,
                         .nproc_per_node = 1,
                         .port = 29500,
                         .token = "t",
                         .cmd = cmd_default,
                         .ncmd = 2};
  base_buf b;
  base_buf_init(&b);
  CHECK_EQ_INT(manifest_trainjob(&o, &b, err, sizeof err), -EINVAL);
  CHECK(strstr(err, "29400") != NULL);
  CHECK_EQ_INT(b.len, 0);
  base_buf_free(&b);
}

static int slurm_rc(const char *time, const char *partition, const char *job_name) {
  manifest_slurm_opts o = {.nodes = 2,
                           .nproc_per_node = 4,
                           .time = time,
                           .partition = partition,
                           .job_name = job_name,
                           .cmd = cmd_default,
                           .ncmd = 2};
  base_buf b;
  base_buf_init(&b);
  char err[256];
  int rc = manifest_slurm(&o, &b, err, sizeof err);
  base_buf_free(&b);
  return rc;
}

static void test_slurm_validation(void) {
  const char *good_times[] = {"30",      "30:00",      "12:00:00", "2-0",
                              "2-12:30", "2-12:30:00", "UNLIMITED"};
  for (size_t i = 0; i < sizeof good_times / sizeof good_times[0]; i++)
    CHECK_EQ_INT(slurm_rc(good_times[i], NULL, NULL), 0);
  const char *bad_times[] = {"", "1:2:3:4", "1-2-3", "1:", "-1", "1h", "1 2", "2-"};
  for (size_t i = 0; i < sizeof bad_times / sizeof bad_times[0]; i++)
    CHECK_EQ_INT(slurm_rc(bad_times[i], NULL, NULL), -EINVAL);
  CHECK_EQ_INT(slurm_rc(NULL, "gpu,cpu", "my_job-1.x"), 0);
  CHECK_EQ_INT(slurm_rc(NULL, "gpu part", NULL), -EINVAL);
  CHECK_EQ_INT(slurm_rc(NULL, NULL, "a;b"), -EINVAL);
  CHECK_EQ_INT(slurm_rc(NULL, NULL, "a\nb"), -EINVAL);
}

static int docker_rc(const char *master, const char *gpus, int port, const char *token) {
  manifest_docker_opts o = {.nodes = 2,
                            .nproc_per_node = 4,
                            .image = "img",
                            .master_addr = master,
                            .port = port,
                            .gpus = gpus,
                            .token = token,
                            .cmd = cmd_default,
                            .ncmd = 2};
  base_buf b;
  base_buf_init(&b);
  char err[256];
  int rc = manifest_docker(&o, &b, err, sizeof err);
  base_buf_free(&b);
  return rc;
}

static void test_docker_validation(void) {
  CHECK_EQ_INT(docker_rc("10.0.0.1", "all", 29400, "tok"), 0);
  CHECK_EQ_INT(docker_rc("node-0.cluster", NULL, 1, "tok"), 0);
  CHECK_EQ_INT(docker_rc("fd00::1", NULL, 29400, "tok"), 0);
  CHECK_EQ_INT(docker_rc("a b", NULL, 29400, "tok"), -EINVAL);
  CHECK_EQ_INT(docker_rc("a;b", NULL, 29400, "tok"), -EINVAL);
  CHECK_EQ_INT(docker_rc(NULL, NULL, 29400, "tok"), -EINVAL);
  CHECK_EQ_INT(docker_rc("h", NULL, 0, "tok"), -EINVAL);
  CHECK_EQ_INT(docker_rc("h", NULL, 65536, "tok"), -EINVAL);
  CHECK_EQ_INT(docker_rc("h", "", 29400, "tok"), -EINVAL);
  CHECK_EQ_INT(docker_rc("h", NULL, 29400, NULL), -EINVAL); /* no token, no lines */
  CHECK_EQ_INT(docker_rc("h", NULL, 29400, "a b"), -EINVAL);
}

static void test_docker_ipv6_master(void) {
  manifest_docker_opts o = {.nodes = 1,
                            .nproc_per_node = 1,
                            .image = "img",
                            .master_addr = "fd00::1",
                            .port = 29400,
                            .cmd = cmd_default,
                            .ncmd = 2,
                            .token = "t0k",
                            .shm_bytes = 3ull << 40};
  base_buf b;
  base_buf_init(&b);
  char err[256];
  CHECK_EQ_INT(manifest_docker(&o, &b, err, sizeof err), 0);
  CHECK(b.data != NULL && strstr(b.data, "--master '[fd00::1]:29400'") != NULL);
  /* docker's --shm-size has no "t" unit. */
  CHECK(b.data != NULL && strstr(b.data, "--shm-size 3072g ") != NULL);
  CHECK(b.data != NULL &&
        strstr(b.data, "printf 'COHORT_TOKEN=%s\\n' t0k > cohort-job.env") != NULL);
  base_buf_free(&b);
}

/* --hang-timeout reaches cohort run's line in every template, and only when given. */
static void test_hang_timeout_passed(void) {
  for (int hang = 0; hang <= 10; hang += 10) {
    manifest_k8s_opts k = {.name = "j",
                           .image = "img",
                           .nodes = 2,
                           .nproc_per_node = 1,
                           .port = 29400,
                           .token = "t0k",
                           .hang_timeout = hang,
                           .cmd = cmd_default,
                           .ncmd = 2};
    manifest_slurm_opts s = {
        .nodes = 2, .nproc_per_node = 1, .hang_timeout = hang, .cmd = cmd_default, .ncmd = 2};
    manifest_docker_opts d = {.nodes = 2,
                              .nproc_per_node = 1,
                              .image = "img",
                              .master_addr = "h0",
                              .port = 29400,
                              .token = "t0k",
                              .hang_timeout = hang,
                              .cmd = cmd_default,
                              .ncmd = 2};
    base_buf b[3];
    char err[256];
    for (int i = 0; i < 3; i++) base_buf_init(&b[i]);
    CHECK_EQ_INT(manifest_k8s(&k, &b[0], err, sizeof err), 0);
    CHECK_EQ_INT(manifest_slurm(&s, &b[1], err, sizeof err), 0);
    CHECK_EQ_INT(manifest_docker(&d, &b[2], err, sizeof err), 0);
    const char *want[3] = {"- \"--hang-timeout\"\n        - \"10\"\n        - \"--\"\n",
                           "--nproc-per-node 1 --hang-timeout 10 -- ",
                           "--nproc-per-node 1 --hang-timeout 10 -- "};
    for (int i = 0; i < 3; i++) {
      CHECK(b[i].data != NULL);
      if (hang)
        CHECK(strstr(b[i].data, want[i]) != NULL);
      else
        CHECK(strstr(b[i].data, "hang") == NULL);
      base_buf_free(&b[i]);
    }
  }
}

int main(void) {
  test_hang_timeout_passed();
  test_yaml_quote();
  test_shell_quote();
  test_parse_size();
  test_k8s_validation();
  test_kube_kinds();
  test_slurm_validation();
  test_docker_validation();
  test_docker_ipv6_master();
  return check_report();
}

/*
 * test_launch.c - src/launch without a network: hostfiles and --hosts
 * lists (good and bad), --include/--exclude, the remote command's quoting
 * (checked by a real shell), ssh's argv, the bounded fan-out (output,
 * exit codes, the bound, the deadline), and the pre-flight's verdicts with a
 * stand-in for ssh that runs the command here. tests/test_launch.sh runs
 * the real ssh against real sshd servers.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "launch/launch.h"
#include "tests/check.h"

static char tmpdir[256];

/* "name:slots name:slots ..." of a parsed list. */
static void describe(const launch_hosts *h, char *out, size_t cap) {
  size_t len = 0;
  out[0] = '\0';
  for (size_t i = 0; i < h->n; i++)
    len += (size_t)snprintf(out + len, cap - len, "%s%s:%d", i ? " " : "", h->v[i].name,
                            h->v[i].slots);
}

/* Parses text as a hostfile and compares; want NULL expects an error whose
 * text contains err_part. */
static int hostfile_is(const char *text, const char *want, const char *err_part) {
  launch_hosts h = {NULL, 0};
  char err[LAUNCH_ERR_MAX] = "", got[1024];
  int rc = launch_hostfile_parse(text, strlen(text), &h, err, sizeof err);
  if (want == NULL) {
    int ok = rc == -EINVAL && h.v == NULL && h.n == 0 && strstr(err, err_part) != NULL;
    if (!ok) fprintf(stderr, "  hostfile '%s': rc %d err '%s'\n", text, rc, err);
    return ok;
  }
  if (rc != 0) {
    fprintf(stderr, "  hostfile '%s': rc %d err '%s'\n", text, rc, err);
    return 0;
  }
  describe(&h, got, sizeof got);
  launch_hosts_free(&h);
  if (strcmp(got, want) != 0) fprintf(stderr, "  hostfile '%s' -> '%s'\n", text, got);
  return strcmp(got, want) == 0;
}

static int list_is(const char *spec, const char *want, const char *err_part) {
  launch_hosts h = {NULL, 0};
  char err[LAUNCH_ERR_MAX] = "", got[1024];
  int rc = launch_hosts_parse_list(spec, &h, err, sizeof err);
  if (want == NULL) {
    int ok = rc == -EINVAL && h.n == 0 && strstr(err, err_part) != NULL;
    if (!ok) fprintf(stderr, "  --hosts '%s': rc %d err '%s'\n", spec, rc, err);
    return ok;
  }
  if (rc != 0) return 0;
  describe(&h, got, sizeof got);
  launch_hosts_free(&h);
  if (strcmp(got, want) != 0) fprintf(stderr, "  --hosts '%s' -> '%s'\n", spec, got);
  return strcmp(got, want) == 0;
}

static void test_hostfile(void) {
  CHECK(hostfile_is("node1 slots=8\nnode2 slots=8\n", "node1:8 node2:8", NULL));
  CHECK(hostfile_is("# a cluster\n\n  node1   slots=2  # the first\n\tnode2\r\n\n",
                    "node1:2 node2:0", NULL));
  CHECK(hostfile_is("root@10.0.0.1 slots=1\nworker-3.cluster_a",
                    "root@10.0.0.1:1 worker-3.cluster_a:0", NULL));
  CHECK(hostfile_is("", NULL, "no host"));
  CHECK(hostfile_is("# only a comment\n\n", NULL, "no host"));
  CHECK(hostfile_is("node1\nnode1 slots=2\n", NULL, "line 2: host 'node1' is already listed"));
  CHECK(hostfile_is("node1 slots=0\n", NULL, "line 1: slots takes a whole number"));
  CHECK(hostfile_is("node1 slots=1025\n", NULL, "slots takes"));
  CHECK(hostfile_is("node1 slots=x\n", NULL, "slots takes"));
  CHECK(hostfile_is("node1 slots=2 slots=3\n", NULL, "unexpected 'slots=3'"));
  CHECK(hostfile_is("node1 max_slots=2\n", NULL, "unexpected 'max_slots=2'"));
  CHECK(hostfile_is("\n\n-oProxyCommand=x\n", NULL, "line 3: '-oProxyCommand=x' is not a host"));
  CHECK(hostfile_is("a;reboot\n", NULL, "is not a host name"));
  CHECK(hostfile_is("user@-x\n", NULL, "is not a host name"));
  CHECK(hostfile_is("@host\n", NULL, "is not a host name"));
  CHECK(hostfile_is("a@b@c\n", NULL, "is not a host name"));
  CHECK(hostfile_is("node$(id)\n", NULL, "is not a host name"));
  char big[300];
  memset(big, 'a', 299);
  big[299] = '\0';
  CHECK(hostfile_is(big, NULL, "is not a host name"));
  /* A NUL byte inside the text is an error, not the end of the file. */
  launch_hosts h = {NULL, 0};
  char err[LAUNCH_ERR_MAX];
  CHECK_EQ_INT(launch_hostfile_parse("a\n\0b\n", 5, &h, err, sizeof err), -EINVAL);
  CHECK(strstr(err, "line 2: a NUL byte") != NULL);
}

static void test_hosts_list(void) {
  CHECK(list_is("node1:4,node2,node3:1", "node1:4 node2:0 node3:1", NULL));
  CHECK(list_is("solo", "solo:0", NULL));
  CHECK(list_is("", NULL, "is not a host name"));
  CHECK(list_is("a,,b", NULL, "is not a host name"));
  CHECK(list_is("a,", NULL, "is not a host name"));
  CHECK(list_is("a:", NULL, "the slots after ':'"));
  CHECK(list_is("a:0", NULL, "the slots after ':'"));
  CHECK(list_is("a:2:3", NULL, "the slots after ':'"));
  CHECK(list_is("a,b,a", NULL, "'a' is already listed"));
  CHECK(list_is("a b", NULL, "is not a host name"));
}

static int filter_is(const char *spec, const char *inc, const char *exc, const char *want,
                     const char *err_part) {
  launch_hosts h = {NULL, 0};
  char err[LAUNCH_ERR_MAX] = "", got[1024];
  if (launch_hosts_parse_list(spec, &h, err, sizeof err) != 0) return 0;
  int rc = launch_hosts_filter(&h, inc, exc, err, sizeof err);
  describe(&h, got, sizeof got);
  launch_hosts_free(&h);
  if (want == NULL) return rc == -EINVAL && strstr(err, err_part) != NULL;
  if (rc != 0 || strcmp(got, want) != 0)
    fprintf(stderr, "  filter -> %d '%s' '%s'\n", rc, got, err);
  return rc == 0 && strcmp(got, want) == 0;
}

static void test_filter(void) {
  CHECK(filter_is("a,b:2,c", NULL, NULL, "a:0 b:2 c:0", NULL));
  CHECK(filter_is("a,b:2,c", "c,b", NULL, "b:2 c:0", NULL)); /* the list's order is kept */
  CHECK(filter_is("a,b:2,c", NULL, "b", "a:0 c:0", NULL));
  CHECK(filter_is("a,b,c", "a", "b", NULL, "not both"));
  CHECK(filter_is("a,b,c", "d", NULL, NULL, "--include names 'd', which is not in the host list"));
  CHECK(filter_is("a,b,c", NULL, "a,x", NULL, "--exclude names 'x'"));
  CHECK(filter_is("a,b", NULL, "a,b", NULL, "--exclude leaves no host"));
}

/* Runs the joined words through sh and compares what it received. */
static void test_shell_join(void) {
  char *words[] = {"plain", "two words", "it's",     "$HOME", "`id`",
                   "a\"b",  "",          "\\n;|&*?", "'",     NULL};
  char *joined = NULL;
  CHECK_EQ_INT(launch_shell_join(words, &joined), 0);
  char script[2048];
  snprintf(script, sizeof script, "for w in %s; do printf '<%%s>' \"$w\"; done", joined);
  char *argv[] = {"sh", "-c", script, NULL};
  char **argvs[] = {argv};
  launch_result r;
  CHECK_EQ_INT(launch_run_all(argvs, 1, 1, 10000, &r), 0);
  CHECK_STREQ(r.out, "<plain><two words><it's><$HOME><`id`><a\"b><><\\n;|&*?><'>");
  free(joined);
}

static void test_ssh_argv(void) {
  launch_ssh s = {.program = NULL, .connect_timeout_s = 7};
  CHECK_EQ_INT(launch_ssh_set_opts(&s, "  -p 2222\t-F /x/ssh_config "), 0);
  char **v = NULL;
  CHECK_EQ_INT(launch_ssh_argv(&s, "node1", "'cohort' '--version'", &v), 0);
  char joined[512] = "";
  for (size_t i = 0; v[i] != NULL; i++) {
    strcat(joined, i ? "|" : "");
    strcat(joined, v[i]);
  }
  CHECK_STREQ(joined, "ssh|-o|BatchMode=yes|-o|ConnectTimeout=7|-p|2222|-F|/x/ssh_config|--|node1|"
                      "'cohort' '--version'");
  free(v);
  launch_ssh_free(&s);
  CHECK(s.opts == NULL);
  CHECK_EQ_INT(launch_ssh_set_opts(&s, NULL), 0);
  CHECK(s.opts != NULL && s.opts[0] == NULL);
  launch_ssh_free(&s);

  /* With a control directory: one master connection per host, shared, before the user's
   * options (which may not undo it by ssh's first-value-wins rule). */
  launch_ssh m = {.connect_timeout_s = 7, .control_dir = "/tmp/cohort-ssh-x"};
  CHECK_EQ_INT(launch_ssh_set_opts(&m, "-p 2222"), 0);
  CHECK_EQ_INT(launch_ssh_argv(&m, "node1", "true", &v), 0);
  joined[0] = '\0';
  for (size_t i = 0; v[i] != NULL; i++) {
    strcat(joined, i ? "|" : "");
    strcat(joined, v[i]);
  }
  CHECK_STREQ(joined,
              "ssh|-o|BatchMode=yes|-o|ConnectTimeout=7|-o|ControlMaster=auto|-o|"
              "ControlPath=/tmp/cohort-ssh-x/%C|-o|ControlPersist=30|-p|2222|--|node1|true");
  free(v);
  launch_ssh_free(&m);
}

/* Host i's remote command: node rank, slots, master, job id, run's words, the command. */
static void test_remote_command(void) {
  launch_job job = {.cohort_path = "/opt/cohort bin/cohort"};
  char err[LAUNCH_ERR_MAX], *cmd = NULL;
  char *words[] = {"--role", "it's", NULL},
       *command[] = {"python3", "train.py", "--lr", "1e-3", NULL};
  CHECK_EQ_INT(launch_hosts_parse_list("root@n0:4,n1", &job.hosts, err, sizeof err), 0);
  job.run_words = words;
  job.command = command;
  CHECK_EQ_INT(launch_remote_command(&job, 1, "n0:29400", "j1", &cmd), 0);
  CHECK_STREQ(cmd, "exec 'sh' '-c' 'read -r COHORT_TOKEN && export COHORT_TOKEN && exec \"$@\"' "
                   "'sh' '/opt/cohort bin/cohort' 'run' '--launcher-stdin' '--nnodes' '2' "
                   "'--node-rank' '1' '--master' 'n0:29400' '--job' 'j1' '--nproc-per-node' '1' "
                   "'--role' 'it'\\''s' '--' 'python3' 'train.py' '--lr' '1e-3'");
  free(cmd);
  job.nproc = 3;
  CHECK_EQ_INT(launch_remote_command(&job, 0, "n0:29400", "j1", &cmd), 0);
  CHECK(
      strstr(cmd, "'--node-rank' '0' '--master' 'n0:29400' '--job' 'j1' '--nproc-per-node' '3'") !=
      NULL);
  free(cmd);
  job.nproc = 0;
  CHECK_EQ_INT(launch_remote_command(&job, 0, "n0:29400", "j1", &cmd), 0);
  CHECK(strstr(cmd, "'--nproc-per-node' '4'") != NULL);
  free(cmd);
  launch_hosts_free(&job.hosts);
}

/* Writes an executable script. */
static void write_script(const char *path, const char *body) {
  FILE *f = fopen(path, "w");
  if (f == NULL) return;
  fprintf(f, "#!/bin/sh\n%s\n", body);
  fclose(f);
  chmod(path, 0755);
}

/* The most commands of the fan-out running at once: each command (the script `overlap` DIR WANT)
 * marks itself running in DIR, prints how many are running as it starts, waits (at most 3 s)
 * until WANT have started, and holds a moment more before it ends. */
static int most_at_once(const char *script, const char *dir, int want, size_t n, int max_parallel) {
  char w[16];
  snprintf(w, sizeof w, "%d", want);
  char *argv[] = {"sh", (char *)script, (char *)dir, w, NULL};
  char **argvs[8];
  launch_result r[8];
  for (size_t i = 0; i < n; i++) argvs[i] = argv;
  mkdir(dir, 0755);
  CHECK_EQ_INT(launch_run_all(argvs, n, max_parallel, 60000, r), 0);
  int most = 0;
  for (size_t i = 0; i < n; i++) {
    CHECK(WIFEXITED(r[i].status) && WEXITSTATUS(r[i].status) == 0);
    if (atoi(r[i].out) > most) most = atoi(r[i].out);
  }
  return most;
}

static void test_run_all(void) {
  char *ok[] = {"sh", "-c", "echo out; echo err >&2; exit 3", NULL};
  char *missing[] = {"/nonexistent/cohort-test-program", NULL};
  char *slow[] = {"sleep", "30", NULL};
  char **argvs[] = {ok, missing, slow};
  launch_result r[3];
  int64_t t0 = base_now_ms();
  CHECK_EQ_INT(launch_run_all(argvs, 3, 8, 500, r), 0);
  int64_t took = base_now_ms() - t0;
  CHECK(WIFEXITED(r[0].status) && WEXITSTATUS(r[0].status) == 3);
  CHECK_STREQ(r[0].out, "out\n");
  CHECK_STREQ(r[0].err, "err\n");
  CHECK_EQ_INT(r[1].spawn_errno, ENOENT);
  CHECK(r[2].timed_out && !r[0].timed_out);
  /* Not before the timeout; killed there, not waited for (it sleeps 30 s). */
  CHECK(took >= 450 && took < 15000);

  /* The bound: 6 commands, 2 at a time, two (not one, not more) run together; with a bound of 6
   * all six do. */
  char script[300], dir[300];
  snprintf(script, sizeof script, "%s/overlap", tmpdir);
  write_script(
      script, "d=$1\n"
              "touch \"$d/run.$$\" \"$d/started.$$\"\n"
              "ls \"$d\" | grep -c '^run\\.'\n"
              "i=0\n"
              "while [ \"$(ls \"$d\" | grep -c '^started\\.')\" -lt \"$2\" ] && [ $i -lt 30 ]; do\n"
              "  sleep 0.1; i=$((i + 1))\n"
              "done\n"
              "sleep 0.2\n"
              "rm \"$d/run.$$\"");
  snprintf(dir, sizeof dir, "%s/overlap2", tmpdir);
  CHECK_EQ_INT(most_at_once(script, dir, 2, 6, 2), 2);
  snprintf(dir, sizeof dir, "%s/overlap6", tmpdir);
  CHECK_EQ_INT(most_at_once(script, dir, 6, 6, 6), 6);

  /* Output beyond the kept start is read and dropped, so the child is not blocked. */
  launch_result rn[1];
  char *flood[] = {"sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' x; echo done >&2", NULL};
  char **floods[] = {flood};
  CHECK_EQ_INT(launch_run_all(floods, 1, 1, 20000, rn), 0);
  CHECK_EQ_INT(strlen(rn[0].out), sizeof rn[0].out - 1);
  CHECK_STREQ(rn[0].err, "done\n");
}

/*
 * The pre-flight's verdicts, with a stand-in for ssh: it skips the options
 * up to "--", then acts by host name: "down" fails as ssh does (255),
 * "hang" never answers, others run the command here with HOST set.
 */
/* launch_ssh_release: `ssh -O exit` to each host's master, then the directory goes. */
static void test_ssh_release(void) {
  char fake_ssh[300], log[300], dir[300];
  snprintf(fake_ssh, sizeof fake_ssh, "%s/ssh-release", tmpdir);
  snprintf(log, sizeof log, "%s/released", tmpdir);
  snprintf(dir, sizeof dir, "%s/control-XXXXXX", tmpdir);
  char script[600];
  snprintf(script, sizeof script, "while [ \"$1\" != -O ]; do shift; done; echo \"$@\" >> %s", log);
  write_script(fake_ssh, script);
  launch_ssh s = {.program = fake_ssh, .connect_timeout_s = 1, .control_dir = mkdtemp(dir)};
  CHECK(s.control_dir != NULL);
  launch_hosts h = {NULL, 0};
  char err[LAUNCH_ERR_MAX];
  CHECK_EQ_INT(launch_hosts_parse_list("a,u@b", &h, err, sizeof err), 0);
  CHECK_EQ_INT(launch_ssh_release(&s, &h, 5000), 0);
  char text[256] = "";
  FILE *f = fopen(log, "r");
  if (f != NULL) {
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
  }
  CHECK(strstr(text, "-O exit -- a\n") != NULL);
  CHECK(strstr(text, "-O exit -- u@b\n") != NULL);
  CHECK(access(dir, F_OK) != 0);
  launch_ssh none = {.program = fake_ssh};
  CHECK_EQ_INT(launch_ssh_release(&none, &h, 5000), 0); /* nothing to release */
  launch_hosts_free(&h);
}

static void test_preflight(void) {
  char fake_ssh[300], fake_cohort[300];
  snprintf(fake_ssh, sizeof fake_ssh, "%s/ssh", tmpdir);
  snprintf(fake_cohort, sizeof fake_cohort, "%s/cohort", tmpdir);
  write_script(fake_ssh, "while [ \"$1\" != -- ]; do shift; done; shift\n"
                         "case $1 in\n"
                         "down) echo 'ssh: connect to host down port 22: No route to host' >&2; "
                         "exit 255;;\n"
                         "hang) exec sleep 30;;\n"
                         "esac\n"
                         "HOST=$1 exec sh -c \"$2\"");
  write_script(fake_cohort, "case $HOST in old) echo 'cohort 0.0.9';; broken) echo oops >&2; "
                            "exit 4;; *) echo 'cohort 0.1.0';; esac");
  launch_ssh s = {.program = fake_ssh, .connect_timeout_s = 1};
  launch_ssh_set_opts(&s, "-x");
  launch_hosts h = {NULL, 0};
  char err[LAUNCH_ERR_MAX];
  CHECK_EQ_INT(launch_hosts_parse_list("a,old,down,hang,broken,b", &h, err, sizeof err), 0);
  char *report = NULL;
  int64_t t0 = base_now_ms();
  CHECK_EQ_INT(launch_preflight(&s, &h, fake_cohort, "cohort 0.1.0", 3, 1500, &report), 0);
  CHECK(base_now_ms() - t0 < 20000); /* "hang" given up at the timeout, not waited for (30 s) */
  char want[2048];
  snprintf(want, sizeof want,
           "old: runs 'cohort 0.0.9', not 'cohort 0.1.0' as this machine does\n"
           "down: unreachable over ssh: ssh: connect to host down port 22: No route to host\n"
           "hang: no answer over ssh within 2 s\n"
           "broken: '%s --version' failed with exit code 4: oops\n",
           fake_cohort);
  CHECK_STREQ(report, want);
  free(report);
  report = NULL;
  /* A missing remote binary. */
  CHECK_EQ_INT(launch_preflight(&s, &h, "/nonexistent/cohort", "cohort 0.1.0", 3, 1500, &report),
               0);
  CHECK(report != NULL && strstr(report, "a: /nonexistent/cohort is not there (give the remote "
                                         "path with --cohort PATH)\n") != NULL);
  free(report);
  report = NULL;
  /* Every host fine: no report. */
  launch_hosts_free(&h);
  CHECK_EQ_INT(launch_hosts_parse_list("a,b,c", &h, err, sizeof err), 0);
  CHECK_EQ_INT(launch_preflight(&s, &h, fake_cohort, "cohort 0.1.0", 2, 5000, &report), 0);
  CHECK(report == NULL);
  launch_hosts_free(&h);
  launch_ssh_free(&s);
  unlink(fake_ssh);
  unlink(fake_cohort);
}

/*
 * `test_launch preflight COHORT EXPECT SSH_OPTS HOSTS TIMEOUT_MS`: the
 * pre-flight through the system's ssh, for tests/test_launch.sh (real sshd
 * servers). Prints the report; exit 0 when every host is fine, 1 when not,
 * 3 on an error.
 */
static int preflight_main(char **argv) {
  launch_ssh s = {.program = NULL, .connect_timeout_s = 2};
  launch_hosts h = {NULL, 0};
  char err[LAUNCH_ERR_MAX], *report = NULL;
  int64_t timeout_ms;
  if (launch_ssh_set_opts(&s, argv[2]) != 0 ||
      launch_hosts_parse_list(argv[3], &h, err, sizeof err) != 0 ||
      base_parse_i64(argv[4], 1, 600000, &timeout_ms) != 0)
    return 3;
  int rc = launch_preflight(&s, &h, argv[0], argv[1], 16, timeout_ms, &report);
  if (report != NULL) fputs(report, stdout);
  free(report);
  launch_hosts_free(&h);
  launch_ssh_free(&s);
  return rc != 0 ? 3 : report != NULL;
}

int main(int argc, char **argv) {
  if (argc == 7 && strcmp(argv[1], "preflight") == 0) return preflight_main(argv + 2);
  snprintf(tmpdir, sizeof tmpdir, "/tmp/cohort-test-launch-XXXXXX");
  if (mkdtemp(tmpdir) == NULL) return 1;
  test_hostfile();
  test_hosts_list();
  test_filter();
  test_shell_join();
  test_ssh_argv();
  test_ssh_release();
  test_remote_command();
  test_run_all();
  test_preflight();
  rmdir(tmpdir);
  return check_report();
}

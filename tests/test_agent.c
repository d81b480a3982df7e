/*
 * test_agent.c - `cohort run` on one node, with real worker processes:
 * environment, output relay, log files, fail-together, restarts, signal
 * forwarding, no orphans, exec errors and usage errors, and the error
 * directories of agents killed with their guard removed by the next agent.
 *
 * usage: test_agent /path/to/cohort
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/check.h"
#include "tests/proc.h"

static const char *cohort;
static char tmpdir[256];

/* Runs argv to its end with extra_env added; a failure to start is a failed
 * check, and the caller reads r only when this returned 0. */
static int run_env(char *const argv[], char *const extra_env[], int timeout_ms, proc_result *r) {
  int rc = proc_run(argv, extra_env, timeout_ms, r);
  if (rc != 0) fprintf(stderr, "cannot start %s\n", argv[0]);
  CHECK_EQ_INT(rc, 0);
  return rc;
}

static int run(char *const argv[], int timeout_ms, proc_result *r) {
  return run_env(argv, NULL, timeout_ms, r);
}

/* Counts lines of text equal to or starting with `prefix`. */
static int count_lines(const char *text, const char *prefix) {
  int n = 0;
  size_t pl = strlen(prefix);
  for (const char *p = text; p && *p;) {
    if (strncmp(p, prefix, pl) == 0) n++;
    const char *nl = strchr(p, '\n');
    if (nl == NULL) break;
    p = nl + 1;
  }
  return n;
}

static void test_env(void) {
  char *argv[] = {(char *)cohort,
                  "run",
                  "--nproc-per-node",
                  "3",
                  "--run-id",
                  "envtest",
                  "--",
                  "sh",
                  "-c",
                  "echo \"E $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK "
                  "$GROUP_WORLD_SIZE $ROLE_RANK $ROLE_WORLD_SIZE $ROLE_NAME $MASTER_ADDR "
                  "$TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS $TORCHELASTIC_RUN_ID "
                  "$OMP_NUM_THREADS $COHORT_JOB_ID\"; echo \"P $MASTER_PORT\"; "
                  "echo \"S ${COHORT_STORE:+store} ${COHORT_TOKEN:+token}\"",
                  NULL};
  proc_result r;
  if (run(argv, 20000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 0);
  for (int rank = 0; rank < 3; rank++) {
    char want[256];
    snprintf(want, sizeof want,
             "[r%d] E %d %d 3 3 0 1 %d 3 default 127.0.0.1 0 0 envtest 1 envtest\n", rank, rank,
             rank, rank);
    CHECK(strstr(r.out, want) != NULL);
    snprintf(want, sizeof want, "[r%d] S store token\n", rank);
    CHECK(strstr(r.out, want) != NULL);
  }
  /* Every rank sees the same MASTER_PORT, a real port number. */
  int ports[3] = {0};
  for (int rank = 0; rank < 3; rank++) {
    char pat[32];
    snprintf(pat, sizeof pat, "[r%d] P ", rank);
    const char *p = strstr(r.out, pat);
    CHECK(p != NULL);
    if (p) ports[rank] = atoi(p + strlen(pat));
  }
  CHECK(ports[0] > 0 && ports[0] < 65536);
  CHECK(ports[0] == ports[1] && ports[1] == ports[2]);
  proc_result_free(&r);

  /* A user's OMP_NUM_THREADS is kept. */
  char *argv2[] = {(char *)cohort, "run", "--nproc-per-node",        "2", "--",
                   "sh",           "-c",  "echo T=$OMP_NUM_THREADS", NULL};
  char *env[] = {"OMP_NUM_THREADS=7", NULL};
  if (run_env(argv2, env, 20000, &r) != 0) return;
  CHECK(strstr(r.out, "[r0] T=7\n") != NULL);
  CHECK(strstr(r.out, "[r1] T=7\n") != NULL);
  proc_result_free(&r);

  /* --net auto adds derived settings but never overrides the user's. */
  char *argv3[] = {(char *)cohort,
                   "run",
                   "--",
                   "sh",
                   "-c",
                   "echo \"N=$NCCL_SOCKET_IFNAME D=${NCCL_IB_DISABLE:-unset}\"",
                   NULL};
  char *env3[] = {"NCCL_SOCKET_IFNAME=mine0", NULL};
  if (run_env(argv3, env3, 20000, &r) != 0) return;
  CHECK(strstr(r.out, "[r0] N=mine0 D=1\n") != NULL);
  proc_result_free(&r);
  char *argv4[] = {(char *)cohort,
                   "run",
                   "--net",
                   "off",
                   "--",
                   "sh",
                   "-c",
                   "echo \"D=${NCCL_IB_DISABLE:-unset}\"",
                   NULL};
  if (run(argv4, 20000, &r) != 0) return;
  CHECK(strstr(r.out, "[r0] D=unset\n") != NULL);
  proc_result_free(&r);
}

/* Lines written in pieces by several workers at once arrive whole, each with
 * its own rank's prefix. */
static void test_relay(void) {
  char *argv[] = {(char *)cohort,
                  "run",
                  "--nproc-per-node",
                  "4",
                  "--",
                  "sh",
                  "-c",
                  "i=0; while [ $i -lt 300 ]; do printf \"part1-$RANK-\"; printf \"part2-$RANK-\"; "
                  "printf \"end-$RANK\\n\"; printf \"e$RANK\\n\" >&2; i=$((i+1)); done; "
                  "printf \"unterminated-$RANK\"",
                  NULL};
  proc_result r;
  if (run(argv, 30000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 0);
  int good = 0, bad = 0;
  for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
    int rank = -1;
    char body[128];
    if (sscanf(line, "[r%d] %127s", &rank, body) == 2) {
      char want[128];
      snprintf(want, sizeof want, "part1-%d-part2-%d-end-%d", rank, rank, rank);
      char want2[64];
      snprintf(want2, sizeof want2, "unterminated-%d", rank);
      if (strcmp(body, want) == 0)
        good++;
      else if (strcmp(body, want2) != 0)
        bad++;
    } else {
      bad++;
    }
  }
  CHECK_EQ_INT(good, 4 * 300);
  CHECK_EQ_INT(bad, 0);
  for (int rank = 0; rank < 4; rank++) {
    char want[32];
    snprintf(want, sizeof want, "[r%d] e%d", rank, rank);
    CHECK_EQ_INT(count_lines(r.err, want), 300);
  }
  proc_result_free(&r);
}

static void test_log_dir(void) {
  char dir[300];
  snprintf(dir, sizeof dir, "%s/logs", tmpdir);
  char *argv[] = {(char *)cohort,
                  "run",
                  "--nproc-per-node",
                  "2",
                  "--log-dir",
                  dir,
                  "--",
                  "sh",
                  "-c",
                  "echo hello-$RANK; echo oops-$RANK >&2",
                  NULL};
  proc_result r;
  if (run(argv, 20000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 0);
  CHECK(strstr(r.out, "hello") == NULL); /* files only, no --tee */
  for (int rank = 0; rank < 2; rank++) {
    char path[400], want[64], buf[256] = {0};
    snprintf(path, sizeof path, "%s/attempt0/rank%d.log", dir, rank);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (f) {
      size_t n = fread(buf, 1, sizeof buf - 1, f);
      buf[n] = '\0';
      fclose(f);
    }
    snprintf(want, sizeof want, "hello-%d\n", rank);
    CHECK(strstr(buf, want) != NULL);
    snprintf(want, sizeof want, "oops-%d\n", rank);
    CHECK(strstr(buf, want) != NULL);
  }
  proc_result_free(&r);
  char *argv2[] = {
      (char *)cohort, "run", "--nproc-per-node", "2", "--log-dir", dir, "--tee", "3", "--",
      "sh",           "-c",  "echo hello-$RANK", NULL};
  if (run(argv2, 20000, &r) != 0) return;
  CHECK(strstr(r.out, "[r1] hello-1\n") != NULL);
  proc_result_free(&r);
}

static void test_fail_together(void) {
  /* Rank 2 fails; the others would sleep for a minute. */
  char *argv[] = {(char *)cohort,
                  "run",
                  "--nproc-per-node",
                  "4",
                  "--",
                  "sh",
                  "-c",
                  "if [ $RANK = 2 ]; then echo preparing; echo about to fail; sleep 0.3; exit 3; "
                  "fi; sleep 60",
                  NULL};
  proc_result r;
  if (run(argv, 30000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 1);
  CHECK(r.seconds < 10.0); /* bound generous for a noisy machine: not a benchmark */
  CHECK(strstr(r.err, "job failed: rank 2 (local rank 2") != NULL);
  CHECK(strstr(r.err, "exited with code 3") != NULL);
  CHECK(strstr(r.err, "last lines of rank 2") != NULL);
  CHECK(strstr(r.err, "|  about to fail") != NULL || strstr(r.err, "| about to fail") != NULL);
  CHECK(strstr(r.err, "rank 0: stopped by cohort (SIGTERM) after rank 2 failed") != NULL);
  CHECK(strstr(r.err, "rank 3: stopped by cohort (SIGTERM) after rank 2 failed") != NULL);
  proc_result_free(&r);

  /* Killed by a signal: the report names it. */
  char *argv2[] = {(char *)cohort,
                   "run",
                   "--nproc-per-node",
                   "2",
                   "--",
                   "sh",
                   "-c",
                   "if [ $RANK = 1 ]; then kill -SEGV $$; fi; sleep 60",
                   NULL};
  if (run(argv2, 30000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 1);
  CHECK(strstr(r.err, "job failed: rank 1") != NULL);
  CHECK(strstr(r.err, "killed by SIGSEGV") != NULL);
  proc_result_free(&r);

  /* A hung (SIGSTOPped) worker is named and still stopped promptly. */
  char *argv4[] = {(char *)cohort,
                   "run",
                   "--nproc-per-node",
                   "2",
                   "--",
                   "sh",
                   "-c",
                   "if [ $RANK = 1 ]; then kill -STOP $$; sleep 60; fi; sleep 0.5; "
                   "echo timed out waiting for rank 1; exit 1",
                   NULL};
  if (run(argv4, 30000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 1);
  CHECK(r.seconds < 10.0);
  CHECK(strstr(r.err, "rank 1: was stopped (SIGSTOP or traced) when the job failed") != NULL);
  proc_result_free(&r);

  /* A worker deaf to SIGTERM gets SIGKILL after the grace period. */
  char *argv3[] = {(char *)cohort,
                   "run",
                   "--nproc-per-node",
                   "2",
                   "--grace",
                   "1",
                   "--",
                   "sh",
                   "-c",
                   "if [ $RANK = 1 ]; then sleep 0.3; exit 5; fi; trap '' TERM; "
                   "while :; do sleep 0.1; done",
                   NULL};
  if (run(argv3, 30000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 1);
  CHECK(r.seconds >= 1.0 && r.seconds < 15.0);
  CHECK(strstr(r.err, "rank 0: stopped by cohort (SIGKILL)") != NULL);
  proc_result_free(&r);
}

/* A worker the agent stops with SIGTERM that dies of another signal first (its own handler, a
 * crash, an outside SIGKILL) is reported as such, not as stopped by cohort. */
static void test_stopped_otherwise(void) {
  char *argv[] = {(char *)cohort,
                  "run",
                  "--nproc-per-node",
                  "3",
                  "--",
                  "sh",
                  "-c",
                  "if [ $RANK = 1 ]; then sleep 0.3; exit 3; fi; "
                  "if [ $RANK = 0 ]; then trap 'kill -KILL $$' TERM; fi; sleep 60 & wait",
                  NULL};
  proc_result r;
  if (run(argv, 30000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 1);
  CHECK(strstr(r.err, "job failed: rank 1 (local rank 1") != NULL);
  CHECK(strstr(r.err, "rank 0: also was killed by SIGKILL (signal 9), not by cohort's SIGTERM") !=
        NULL);
  CHECK(strstr(r.err, "rank 2: stopped by cohort (SIGTERM) after rank 1 failed") != NULL);
  proc_result_free(&r);
}

static void test_restarts(void) {
  char *argv[] = {(char *)cohort,
                  "run",
                  "--nproc-per-node",
                  "2",
                  "--max-restarts",
                  "2",
                  "--",
                  "sh",
                  "-c",
                  "echo attempt $TORCHELASTIC_RESTART_COUNT; "
                  "if [ $TORCHELASTIC_RESTART_COUNT -lt 2 ] && [ $RANK = 1 ]; then exit 1; fi; "
                  "sleep 0.2",
                  NULL};
  proc_result r;
  if (run(argv, 30000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 0);
  CHECK(strstr(r.out, "[r0] attempt 2\n") != NULL);
  CHECK(strstr(r.out, "[r1] attempt 2\n") != NULL);
  CHECK(strstr(r.err, "restarting all workers (restart 1 of 2)") != NULL);
  CHECK(strstr(r.err, "restarting all workers (restart 2 of 2)") != NULL);
  proc_result_free(&r);

  char *argv2[] = {(char *)cohort, "run", "--nproc-per-node", "2", "--max-restarts", "1", "--",
                   "sh",           "-c",  "exit 4",           NULL};
  if (run(argv2, 30000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 1);
  CHECK(strstr(r.err, "no restarts left (1 used)") != NULL);
  proc_result_free(&r);
}

/* An agent started by a worker of a restarted job: its own workers live.
 * The outer job's cgroup was killed (cgroup.kill) at the first attempt's
 * end; a kernel that compares the kill counts of the parent's cgroup and
 * the new one SIGKILLs every child clone3 starts in the inner agent's
 * cgroup, which the agent must notice and fork instead. */
static void test_nested_after_restart(void) {
  char inner[1024];
  snprintf(inner, sizeof inner,
           "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then exit 1; fi; "
           "exec %s run --nproc-per-node 2 -- sh -c 'echo inner $RANK'",
           cohort);
  char *argv[] = {
      (char *)cohort, "run", "--nproc-per-node", "1", "--max-restarts", "1", "--", "sh", "-c",
      inner,          NULL};
  proc_result r;
  if (run(argv, 30000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 0);
  CHECK(strstr(r.out, "[r0] [r0] inner 0\n") != NULL);
  CHECK(strstr(r.out, "[r0] [r1] inner 1\n") != NULL);
  proc_result_free(&r);
}

static int wait_for_text(proc_handle *h, char **buf, size_t *len, const char *text, int n,
                         int timeout_ms) {
  int open_ = 1;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (open_ && proc_elapsed(&t0) * 1000 < timeout_ms) {
    if (*buf != NULL && count_lines(*buf, text) >= n) return 1;
    struct pollfd p = {.fd = h->outfd, .events = POLLIN};
    if (poll(&p, 1, 100) > 0) proc_append(h->outfd, buf, len, &open_);
  }
  return *buf != NULL && count_lines(*buf, text) >= n;
}

static void test_signals(void) {
  char *argv[] = {(char *)cohort,
                  "run",
                  "--nproc-per-node",
                  "2",
                  "--",
                  "sh",
                  "-c",
                  "trap 'echo got-USR1' USR1; trap 'echo got-TERM; exit 0' TERM; echo ready; "
                  "while :; do sleep 0.05; done",
                  NULL};
  proc_handle h;
  if (proc_start(argv, NULL, &h) != 0) return;
  char *buf = NULL;
  size_t len = 0;
  CHECK(wait_for_text(&h, &buf, &len, "[r", 2, 10000));
  kill(h.pid, SIGUSR1);
  CHECK(wait_for_text(&h, &buf, &len, "[r0] got-USR1", 1, 10000));
  CHECK(wait_for_text(&h, &buf, &len, "[r1] got-USR1", 1, 10000));
  kill(h.pid, SIGTERM);
  proc_result r;
  proc_wait(&h, 15000, &r);
  CHECK_EQ_INT(proc_exit_code(&r), 128 + SIGTERM);
  CHECK(strstr(r.out, "[r0] got-TERM") != NULL);
  CHECK(strstr(r.out, "[r1] got-TERM") != NULL);
  proc_result_free(&r);
  free(buf);

  /* A second SIGINT escalates to SIGKILL well before the 60 s grace. */
  char *argv2[] = {(char *)cohort,
                   "run",
                   "--nproc-per-node",
                   "2",
                   "--grace",
                   "60",
                   "--",
                   "sh",
                   "-c",
                   "trap '' INT; echo ready; while :; do sleep 0.05; done",
                   NULL};
  if (proc_start(argv2, NULL, &h) != 0) return;
  buf = NULL;
  len = 0;
  CHECK(wait_for_text(&h, &buf, &len, "[r", 2, 10000));
  kill(h.pid, SIGINT);
  usleep(300 * 1000);
  kill(h.pid, SIGINT);
  proc_wait(&h, 20000, &r);
  CHECK_EQ_INT(proc_exit_code(&r), 128 + SIGINT);
  CHECK(r.seconds < 15.0);
  proc_result_free(&r);
  free(buf);
}

static pid_t read_pid(const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return -1;
  int pid = -1;
  if (fscanf(f, "%d", &pid) != 1) pid = -1;
  fclose(f);
  return pid;
}

static void test_no_orphans(void) {
  /* A worker forks a long-lived grandchild and fails: the grandchild goes too. */
  char script[600];
  snprintf(script, sizeof script,
           "sleep 300 & echo $! > %s/gc-$RANK; if [ $RANK = 1 ]; then sleep 0.3; exit 2; fi; "
           "wait",
           tmpdir);
  char *argv[] = {(char *)cohort, "run", "--nproc-per-node", "2", "--", "sh", "-c", script, NULL};
  proc_result r;
  if (run(argv, 30000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 1);
  for (int rank = 0; rank < 2; rank++) {
    char path[300];
    snprintf(path, sizeof path, "%s/gc-%d", tmpdir, rank);
    pid_t gc = read_pid(path);
    CHECK(gc > 0);
    if (gc > 0) CHECK(proc_gone(gc, 3000));
  }
  proc_result_free(&r);

  /* The agent is SIGKILLed: workers and grandchildren die with it. */
  snprintf(script, sizeof script,
           "sleep 300 & echo $! > %s/gk-$RANK; echo $$ > %s/wk-$RANK; echo started; wait", tmpdir,
           tmpdir);
  char *argv2[] = {(char *)cohort, "run", "--nproc-per-node", "2", "--", "sh", "-c", script, NULL};
  proc_handle h;
  if (proc_start(argv2, NULL, &h) != 0) return;
  char *buf = NULL;
  size_t len = 0;
  CHECK(wait_for_text(&h, &buf, &len, "[r", 2, 10000));
  usleep(200 * 1000);
  kill(h.pid, SIGKILL);
  proc_wait(&h, 10000, &r);
  for (int rank = 0; rank < 2; rank++) {
    char path[300];
    snprintf(path, sizeof path, "%s/gk-%d", tmpdir, rank);
    pid_t gc = read_pid(path);
    snprintf(path, sizeof path, "%s/wk-%d", tmpdir, rank);
    pid_t wk = read_pid(path);
    CHECK(gc > 0 && wk > 0);
    if (wk > 0) CHECK(proc_gone(wk, 3000));
    if (gc > 0) CHECK(proc_gone(gc, 3000));
  }
  proc_result_free(&r);
  free(buf);
}

static void test_exec_errors(void) {
  char *argv[] = {(char *)cohort,        "run", "--nproc-per-node", "2", "--",
                  "no-such-command-xyz", NULL};
  proc_result r;
  if (run(argv, 20000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 127);
  CHECK(strstr(r.err, "cannot execute 'no-such-command-xyz': No such file or directory") != NULL);
  CHECK_EQ_INT(count_lines(r.err, "cohort"), 1);
  proc_result_free(&r);

  char path[300];
  snprintf(path, sizeof path, "%s/not-executable", tmpdir);
  FILE *f = fopen(path, "w");
  if (f) {
    fputs("#!/bin/sh\necho hi\n", f);
    fclose(f);
  }
  chmod(path, 0644);
  char *argv2[] = {(char *)cohort, "run", "--", path, NULL};
  if (run(argv2, 20000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 126);
  CHECK(strstr(r.err, "Permission denied") != NULL);
  proc_result_free(&r);
}

static void expect_usage(char *const argv[], const char *msg) {
  proc_result r;
  if (run(argv, 10000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 2);
  CHECK_EQ_INT(count_lines(r.err, "cohort run: "), 1);
  if (strstr(r.err, msg) == NULL) fprintf(stderr, "expected '%s' in: %s\n", msg, r.err);
  CHECK(strstr(r.err, msg) != NULL);
  proc_result_free(&r);
}

static void test_usage(void) {
  char *a1[] = {(char *)cohort, "run", "--nproc-per-node", "0", "--", "true", NULL};
  expect_usage(a1, "from 1 to 1024");
  char *a2[] = {(char *)cohort, "run", "--nproc-per-node", "100000", "--", "true", NULL};
  expect_usage(a2, "from 1 to 1024");
  /* A program without "--" is torchrun's (through Python): tests/test_torchrun_cli.sh. */
  char *a3[] = {(char *)cohort, "run", "-m", "--no-python", "true", NULL};
  expect_usage(a3, "exclude each other");
  char *a4[] = {(char *)cohort, "run", "--bogus", "--", "true", NULL};
  expect_usage(a4, "unknown option '--bogus'");
  char *a5[] = {(char *)cohort, "run", "--", NULL};
  expect_usage(a5, "no command");
  char *a6[] = {(char *)cohort, "run", "--grace", "soon", "--", "true", NULL};
  expect_usage(a6, "--grace");
  char *a7[] = {(char *)cohort, "run", "--run-id", "a/b", "--", "true", NULL};
  expect_usage(a7, "--run-id");
  char *a8[] = {(char *)cohort, "run", "--nproc-per-node", NULL};
  expect_usage(a8, "needs a value");
  /* A malformed scheduler environment is an error, not a silent single-node run. */
  char *a10[] = {(char *)cohort, "run", "--", "true", NULL};
  char *bad_env[] = {"SLURM_JOB_ID=x", "SLURM_NODEID=0", NULL};
  proc_result rs;
  if (run_env(a10, bad_env, 10000, &rs) == 0) {
    CHECK(proc_exit_code(&rs) != 0);
    CHECK(rs.err != NULL && strstr(rs.err, "SLURM_JOB_ID='x' is not a job number") != NULL);
    CHECK_EQ_INT(count_lines(rs.err, "cohort"), 1);
    proc_result_free(&rs);
  }
  char *a9[] = {(char *)cohort, "run", "--help", NULL};
  proc_result r;
  if (run(a9, 10000, &r) != 0) return;
  CHECK_EQ_INT(proc_exit_code(&r), 0);
  CHECK(strstr(r.out, "--nproc-per-node") != NULL);
  proc_result_free(&r);
}

/* The cohort-errors-* directories in dir, counted. */
static int count_err_dirs(const char *dir) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "ls -d %s/cohort-errors-* 2>/dev/null | wc -l", dir);
  FILE *f = popen(cmd, "r");
  int n = -1;
  if (f == NULL || fscanf(f, "%d", &n) != 1) n = -1;
  if (f != NULL) pclose(f);
  return n;
}

/* An agent killed with its guard and workers (as a test's cleanup of a network namespace does)
 * leaves its cohort-errors-* directory; the next agent with the same TMPDIR removes it, but not
 * that of a live agent nor a directory without the agents' lock file. */
static void test_dead_agents_dirs(void) {
  char tmp[300], env_tmp[320], foreign[340];
  snprintf(tmp, sizeof tmp, "%s/errdirs", tmpdir);
  CHECK(mkdir(tmp, 0700) == 0);
  snprintf(env_tmp, sizeof env_tmp, "TMPDIR=%s", tmp);
  char *env[] = {env_tmp, NULL};
  snprintf(foreign, sizeof foreign, "%s/cohort-errors-foreign", tmp);
  CHECK(mkdir(foreign, 0700) == 0);
  char *sleeper[] = {(char *)cohort, "run", "--", "sh", "-c", "echo started; exec sleep 300", NULL};
  proc_handle dead, live;
  if (proc_start(sleeper, env, &dead) != 0) return;
  char *buf = NULL;
  size_t len = 0;
  CHECK(wait_for_text(&dead, &buf, &len, "[r0] started", 1, 30000));
  /* Its children (the guard, the worker), then the agent. */
  char path[100], kids[512] = "";
  snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)dead.pid, (int)dead.pid);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL && fgets(kids, sizeof kids, f) != NULL);
  if (f != NULL) fclose(f);
  int nkids = 0;
  for (char *p = strtok(kids, " \n"); p != NULL; p = strtok(NULL, " \n"), nkids++)
    kill((pid_t)atoi(p), SIGKILL);
  CHECK(nkids >= 2);
  kill(dead.pid, SIGKILL);
  proc_result r;
  proc_wait(&dead, 10000, &r);
  proc_result_free(&r);
  free(buf);
  CHECK_EQ_INT(count_err_dirs(tmp), 2); /* the dead agent's and the foreign one */
  buf = NULL;
  len = 0;
  if (proc_start(sleeper, env, &live) != 0) return;
  CHECK(wait_for_text(&live, &buf, &len, "[r0] started", 1, 30000));
  free(buf);
  CHECK_EQ_INT(count_err_dirs(tmp), 2); /* the live agent's and the foreign one */
  char *one[] = {(char *)cohort, "run", "--", "true", NULL};
  if (run_env(one, env, 30000, &r) == 0) {
    CHECK_EQ_INT(proc_exit_code(&r), 0);
    proc_result_free(&r);
  }
  CHECK_EQ_INT(count_err_dirs(tmp), 2);
  struct stat st;
  CHECK(stat(foreign, &st) == 0);
  kill(live.pid, SIGTERM);
  proc_wait(&live, 30000, &r);
  proc_result_free(&r);
  CHECK_EQ_INT(count_err_dirs(tmp), 1); /* the foreign one */
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_agent COHORT_BINARY\n");
    return 2;
  }
  cohort = argv[1];
  snprintf(tmpdir, sizeof tmpdir, "/tmp/cohort-test-agent-XXXXXX");
  if (mkdtemp(tmpdir) == NULL) return 2;
  test_usage();
  test_env();
  test_relay();
  test_log_dir();
  test_fail_together();
  test_stopped_otherwise();
  test_restarts();
  test_nested_after_restart();
  test_signals();
  test_no_orphans();
  test_exec_errors();
  test_dead_agents_dirs();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  return check_report();
}

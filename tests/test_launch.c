/*
 * test_launch.c - src/launch without a network: hostfiles and --hosts
 * lists (good and bad), --include/--exclude, the remote command's quoting
 * (checked by a real shell), ssh's argv, the verdicts on a host's answer,
 * finding this machine in a list, and whole jobs with a stand-in for ssh
 * that runs the command here and a stand-in for cohort that answers the
 * handshake: one session per host, the token to all only once all answered
 * this version, one line per host with a problem and nothing started
 * otherwise, the fan-out's bound. tests/test_launch.sh runs the real ssh
 * against real sshd servers.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/launcher.h"
#include "base/base.h"
#include "launch/internal.h"
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
  char script[2048], out[512] = "";
  snprintf(script, sizeof script, "for w in %s; do printf '<%%s>' \"$w\"; done", joined);
  FILE *f = popen(script, "r");
  CHECK(f != NULL);
  if (f != NULL) {
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    pclose(f);
  }
  CHECK_STREQ(out, "<plain><two words><it's><$HOME><`id`><a\"b><><\\n;|&*?><'>");
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
  CHECK_STREQ(cmd, "exec '/opt/cohort bin/cohort' 'run' '--launcher-stdin' '--nnodes' '2' "
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

/* The file's text ("" when it is not there). */
static void slurp(const char *path, char *out, size_t cap) {
  out[0] = '\0';
  FILE *f = fopen(path, "r");
  if (f == NULL) return;
  size_t n = fread(out, 1, cap - 1, f);
  out[n] = '\0';
  fclose(f);
}

static size_t count_lines(const char *text, const char *part) {
  size_t n = 0;
  for (const char *p = text; (p = strstr(p, part)) != NULL; p += strlen(part)) n++;
  return n;
}

/* Every verdict on a host's answer, word for word. */
static void test_judge(void) {
  char line[512];
  const char *c = "/opt/cohort", *want = "cohort 0.1.0";
  launch_answer ok = {.version = "cohort 0.1.0", .err = ""};
  CHECK_EQ_INT(launch_judge_answer(&ok, c, want, 30000, line, sizeof line), 0);
  CHECK_STREQ(line, "");
  struct {
    launch_answer a;
    const char *line;
  } bad[] = {
      {{.version = "cohort 0.0.9", .err = ""},
       "runs 'cohort 0.0.9', not 'cohort 0.1.0' as this machine does"},
      {{.ended = 1,
        .status = W_EXITCODE(255, 0),
        .err = "ssh: connect to host d port 22: No route"},
       "unreachable over ssh: ssh: connect to host d port 22: No route"},
      {{.ended = 1, .status = W_EXITCODE(255, 0), .err = ""},
       "unreachable over ssh: ssh failed (exit 255)"},
      {{.ended = 1, .status = W_EXITCODE(127, 0), .err = "sh: 1: /opt/cohort: not found"},
       "/opt/cohort is not there (give the remote path with --cohort PATH)"},
      {{.ended = 1, .status = W_EXITCODE(4, 0), .err = "oops"},
       "'/opt/cohort run' ended with exit code 4 before it answered: oops"},
      {{.ended = 1, .status = SIGKILL, .err = ""}, "ssh was killed by signal 9"},
      {{.timed_out = 1, .err = ""}, "no answer over ssh within 30 s"},
      {{.spawn_errno = ENOENT, .err = ""}, "cannot run ssh: No such file or directory"},
      {{.version = "cohort 0.1.0", .ended = 1, .status = W_EXITCODE(2, 0), .err = "bad option"},
       "'/opt/cohort run' ended with exit code 2 before the job started: bad option"},
  };
  for (size_t i = 0; i < BASE_ARRAY_LEN(bad); i++) {
    CHECK_EQ_INT(launch_judge_answer(&bad[i].a, c, want, 30000, line, sizeof line), 1);
    CHECK_STREQ(line, bad[i].line);
  }
}

/* This machine in a list: by a loopback name or address, never with a user@. */
static void test_local_host(void) {
  launch_hosts h = {NULL, 0};
  char err[LAUNCH_ERR_MAX];
  CHECK_EQ_INT(launch_hosts_parse_list("192.0.2.1,localhost,127.0.0.1", &h, err, sizeof err), 0);
  CHECK_EQ_INT(launch_local_host(&h), 1);
  launch_hosts_free(&h);
  CHECK_EQ_INT(launch_hosts_parse_list("root@127.0.0.1,192.0.2.1", &h, err, sizeof err), 0);
  CHECK_EQ_INT(launch_local_host(&h), -1);
  launch_hosts_free(&h);
}

/* The agent's end of the handshake: the token line, and nothing after it taken. */
static void test_read_token(void) {
  int p[2];
  char tok[16], rest[16] = "";
  CHECK_EQ_INT(pipe(p), 0);
  CHECK_EQ_INT(write(p[1], "abc\nstop\n", 9), 9);
  close(p[1]);
  CHECK_EQ_INT(agent_launcher_read_token(p[0], tok, sizeof tok), 0);
  CHECK_STREQ(tok, "abc");
  CHECK_EQ_INT(read(p[0], rest, sizeof rest - 1), 5);
  CHECK_STREQ(rest, "stop\n");
  CHECK_EQ_INT(agent_launcher_read_token(p[0], tok, sizeof tok), -ENODATA);
  close(p[0]);
  const char *bad[] = {"\n", "0123456789abcdefXYZ\n", "no newline"};
  for (size_t i = 0; i < BASE_ARRAY_LEN(bad); i++) {
    CHECK_EQ_INT(pipe(p), 0);
    CHECK_EQ_INT(write(p[1], bad[i], strlen(bad[i])), (int)strlen(bad[i]));
    close(p[1]);
    CHECK_EQ_INT(agent_launcher_read_token(p[0], tok, sizeof tok), i == 2 ? -ENODATA : -EINVAL);
    close(p[0]);
  }
}

/*
 * Jobs through stand-ins. ssh: logs "start HOST" (one line per session),
 * skips the options up to "--", then acts by host name: "down" fails as ssh
 * does (255), "hang" never answers, others run the command here with HOST
 * set (after SSH_DELAY seconds). cohort: logs "answer HOST", answers its
 * version ("old" an older one, "broken" fails first), then waits for the
 * token; with it, it logs "started HOST TOKEN" and says so on stdout,
 * without it "no token HOST".
 */
static char fake_ssh[300], fake_cohort[300], job_log[300], job_out[300], job_err[300];

static void fakes_write(void) {
  char body[1200];
  snprintf(fake_ssh, sizeof fake_ssh, "%s/ssh", tmpdir);
  snprintf(fake_cohort, sizeof fake_cohort, "%s/cohort", tmpdir);
  snprintf(job_log, sizeof job_log, "%s/log", tmpdir);
  snprintf(job_out, sizeof job_out, "%s/out", tmpdir);
  snprintf(job_err, sizeof job_err, "%s/err", tmpdir);
  snprintf(body, sizeof body,
           "while [ \"$1\" != -- ]; do shift; done; shift\n"
           "echo \"start $1\" >> %s\n"
           "case $1 in\n"
           "down) echo 'ssh: connect to host down port 22: No route to host' >&2; exit 255;;\n"
           "hang) exec sleep 30;;\n"
           "esac\n"
           "sleep ${SSH_DELAY:-0}\n"
           "HOST=$1 exec sh -c \"$2\"",
           job_log);
  write_script(fake_ssh, body);
  snprintf(body, sizeof body,
           "h=${HOST:-here}\n"
           "echo \"answer $h\" >> %s\n"
           "case $h in old) echo 'cohort 0.0.9';; broken) echo oops >&2; exit 4;;\n"
           "*) echo 'cohort 0.1.0';; esac\n"
           "read -r token || { echo \"no token $h\" >> %s; exit 129; }\n"
           "echo \"started $h $token\" >> %s\n"
           "echo \"$h started with a token of ${#token} characters\"",
           job_log, job_log, job_log);
  write_script(fake_cohort, body);
}

/* Runs a job on hosts (local: the index of this machine's, or -1) with the stand-ins. */
static int fake_job(const char *hosts, long local, int fanout, int64_t answer_ms, int *status) {
  char err[LAUNCH_ERR_MAX], *command[] = {"true", NULL};
  launch_job job = {.cohort_path = fake_cohort,
                    .command = command,
                    .expect = "cohort 0.1.0",
                    .fanout = fanout,
                    .answer_ms = answer_ms,
                    .local = local,
                    .stop_grace_ms = 1000};
  job.ssh.program = fake_ssh;
  unlink(job_log);
  job.out_fd = open(job_out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  job.err_fd = open(job_err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int rc = launch_hosts_parse_list(hosts, &job.hosts, err, sizeof err);
  if (rc == 0) rc = launch_job_run(&job, status);
  close(job.out_fd);
  close(job.err_fd);
  launch_hosts_free(&job.hosts);
  return rc;
}

/* Every host fine: one session each, the same fresh token to each, every agent started. */
static void test_job_start(void) {
  char log[4096], out[1024], err[1024];
  int status = -1;
  CHECK_EQ_INT(fake_job("a,b,c", -1, 0, 20000, &status), 0);
  CHECK_EQ_INT(status, 0);
  slurp(job_log, log, sizeof log);
  slurp(job_out, out, sizeof out);
  slurp(job_err, err, sizeof err);
  const char *hosts[] = {"a", "b", "c"};
  char token[80] = "";
  for (size_t i = 0; i < 3; i++) {
    char start[16], line[64];
    snprintf(start, sizeof start, "start %s\n", hosts[i]);
    CHECK_EQ_INT(count_lines(log, start), 1); /* one ssh session per host */
    snprintf(line, sizeof line, "%s started with a token of 64 characters\n", hosts[i]);
    CHECK(strstr(out, line) != NULL);
    snprintf(start, sizeof start, "started %s ", hosts[i]);
    const char *t = strstr(log, start);
    CHECK(t != NULL);
    if (t == NULL) continue;
    t += strlen(start);
    if (i == 0) snprintf(token, sizeof token, "%.64s", t);
    CHECK(strncmp(t, token, 64) == 0);
  }
  CHECK_STREQ(err, "");
  /* This machine's agent runs without ssh. */
  CHECK_EQ_INT(fake_job("a,b", 0, 0, 20000, &status), 0);
  CHECK_EQ_INT(status, 0);
  slurp(job_log, log, sizeof log);
  CHECK_EQ_INT(count_lines(log, "start "), 1);
  CHECK_EQ_INT(count_lines(log, "start b\n"), 1);
  CHECK_EQ_INT(count_lines(log, "started here "), 1);
  CHECK_EQ_INT(count_lines(log, "started b "), 1);
}

/* Hosts with problems: one line each, in host order; no host gets the token. */
static void test_job_refused(void) {
  char log[4096], out[1024], err[2048], want[2048];
  int status = -1;
  int64_t t0 = base_now_ms();
  CHECK_EQ_INT(fake_job("a,old,down,hang,broken,b", -1, 0, 1500, &status), 0);
  CHECK(base_now_ms() - t0 < 20000); /* "hang" given up at its time, not waited for (30 s) */
  CHECK_EQ_INT(status, 1);
  slurp(job_log, log, sizeof log);
  slurp(job_out, out, sizeof out);
  slurp(job_err, err, sizeof err);
  snprintf(want, sizeof want,
           "cohort launch: old: runs 'cohort 0.0.9', not 'cohort 0.1.0' as this machine does\n"
           "cohort launch: down: unreachable over ssh: ssh: connect to host down port 22: No "
           "route to host\n"
           "cohort launch: hang: no answer over ssh within 2 s\n"
           "cohort launch: broken: '%s run' ended with exit code 4 before it answered: oops\n"
           "cohort launch: nothing was started\n",
           fake_cohort);
  CHECK_STREQ(err, want);
  CHECK_EQ_INT(count_lines(log, "started "), 0);
  CHECK_STREQ(out, "");
  /* The hosts that answered were waiting; their sessions ended without the token. */
  CHECK_EQ_INT(count_lines(log, "no token a\n"), 1);
  CHECK_EQ_INT(count_lines(log, "no token b\n"), 1);
  CHECK_EQ_INT(count_lines(log, "no token old\n"), 1);
  /* A missing remote binary. */
  char *keep = strdup(fake_cohort);
  snprintf(fake_cohort, sizeof fake_cohort, "%s/nonexistent/cohort", tmpdir);
  CHECK_EQ_INT(fake_job("a", -1, 0, 20000, &status), 0);
  CHECK_EQ_INT(status, 1);
  slurp(job_err, err, sizeof err);
  snprintf(want, sizeof want,
           "cohort launch: a: %s is not there (give the remote path with --cohort PATH)\n"
           "cohort launch: nothing was started\n",
           fake_cohort);
  CHECK_STREQ(err, want);
  snprintf(fake_cohort, sizeof fake_cohort, "%s", keep);
  free(keep);
}

/* Reads fd to its end into out (NUL-terminated) and closes it. */
static void read_all(int fd, char *out, size_t cap) {
  size_t len = 0;
  ssize_t got;
  while (len + 1 < cap && (got = read(fd, out + len, cap - 1 - len)) > 0) len += (size_t)got;
  out[len] = '\0';
  close(fd);
}

static void noop_handler(int sig) {
  (void)sig;
}

/* Starts argv with launch_spawn_start (stdin a pipe, a session of its own), writes in to its
 * stdin, and reads its stdout and stderr to their ends; 1 when it exited 0. */
static int spawn_run(char *const *argv, const char *in, char *out, char *err, size_t cap) {
  pid_t pid = 0;
  int fds[3], exec_fd = -1, status = -1;
  if (launch_spawn_start(argv, 1, 1, &pid, fds, &exec_fd) != 0) return 0;
  int ok = launch_spawn_finish(exec_fd) == 0;
  ok &= write(fds[0], in, strlen(in)) == (ssize_t)strlen(in);
  close(fds[0]);
  read_all(fds[1], out, cap);
  read_all(fds[2], err, cap);
  ok &= waitpid(pid, &status, 0) == pid;
  return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* What every session's client starts with, whatever the launcher's signal state: no blocked
 * or ignored signal, a session of its own, its streams on the pipes. */
static void test_spawn(void) {
  /* grep reads its own signal state (a shell's would show the shell's, which blocks every
   * signal while it waits for a child). */
  char *sigs[] = {"grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status", NULL};
  char *shell[] = {"sh", "-c",
                   "[ \"$(cut -d' ' -f6 /proc/$$/stat)\" = $$ ] && echo leader; "
                   "echo to-stderr >&2; read -r x; echo \"in: $x\"",
                   NULL};
  struct sigaction ign = {.sa_handler = SIG_IGN}, h = {.sa_handler = noop_handler}, old_pipe,
                   old_term;
  sigset_t usr1, old_mask;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  sigaction(SIGPIPE, &ign, &old_pipe);
  sigaction(SIGTERM, &h, &old_term);
  sigprocmask(SIG_BLOCK, &usr1, &old_mask);
  char out[512], err[512], out2[512], err2[512];
  int ok = spawn_run(sigs, "", out, err, sizeof out);
  int ok2 = spawn_run(shell, "token\n", out2, err2, sizeof out2);
  sigaction(SIGPIPE, &old_pipe, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  sigprocmask(SIG_SETMASK, &old_mask, NULL);
  CHECK(ok);
  /* Signals 32 .. SIGRTMIN-1 are glibc's own (thread cancellation, set*id): its sigaction
   * refuses them, every glibc program sets their handlers as it starts, and GNU make runs its
   * commands (make test) with them ignored. */
  unsigned long long blocked = 1, ignored = 1, glibc = 0;
  for (int sig = 32; sig < SIGRTMIN; sig++) glibc |= 1ULL << (sig - 1);
  CHECK(sscanf(out, "SigBlk:\t%llx\nSigIgn:\t%llx\n", &blocked, &ignored) == 2);
  CHECK(blocked == 0 && (ignored & ~glibc) == 0);
  CHECK(ok2);
  CHECK_STREQ(out2, "leader\nin: token\n");
  CHECK_STREQ(err2, "to-stderr\n");
  pid_t pid = 0;
  int fds[3], exec_fd = -1, status = -1;
  /* A program that is not there: its errno, and the child exits 127. */
  char *missing[] = {"/nonexistent/ssh", NULL};
  CHECK_EQ_INT(launch_spawn_start(missing, 0, 0, &pid, fds, &exec_fd), 0);
  CHECK_EQ_INT(launch_spawn_finish(exec_fd), ENOENT);
  CHECK_EQ_INT((int)waitpid(pid, &status, 0), (int)pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 127);
  close(fds[1]);
  close(fds[2]);
  /* A caller without stdin and stdout: its new pipes are fds 0 and 1, and still reach the
   * child's right streams. */
  pid_t caller = fork();
  if (caller == 0) {
    close(0);
    close(1);
    char *echo[] = {"sh", "-c", "read -r x; echo \"in: $x\"; echo err >&2", NULL};
    if (launch_spawn_start(echo, 1, 0, &pid, fds, &exec_fd) != 0 || launch_spawn_finish(exec_fd))
      _exit(2);
    if (write(fds[0], "t\n", 2) != 2) _exit(3);
    close(fds[0]);
    read_all(fds[1], out, sizeof out);
    read_all(fds[2], err, sizeof err);
    waitpid(pid, NULL, 0);
    _exit(strcmp(out, "in: t\n") == 0 && strcmp(err, "err\n") == 0 ? 0 : 4);
  }
  CHECK_EQ_INT((int)waitpid(caller, &status, 0), (int)caller);
  CHECK(WIFEXITED(status));
  CHECK_EQ_INT(WEXITSTATUS(status), 0);
}

/* An ssh that cannot be executed: every host says so on its line, with a fan-out of one too
 * (each slot is filled again at once, not after a timeout), and nothing starts. */
static void test_job_no_ssh(void) {
  char err[2048], log[4096], keep[sizeof fake_ssh];
  int status = -1;
  snprintf(keep, sizeof keep, "%s", fake_ssh);
  snprintf(fake_ssh, sizeof fake_ssh, "%s/nonexistent/ssh", tmpdir);
  for (int fanout = 0; fanout <= 1; fanout++) {
    int64_t t0 = base_now_ms();
    CHECK_EQ_INT(fake_job("a,b,c", -1, fanout, 20000, &status), 0);
    CHECK(base_now_ms() - t0 < 10000);
    CHECK_EQ_INT(status, 1);
    slurp(job_err, err, sizeof err);
    CHECK_STREQ(err, "cohort launch: a: cannot run ssh: No such file or directory\n"
                     "cohort launch: b: cannot run ssh: No such file or directory\n"
                     "cohort launch: c: cannot run ssh: No such file or directory\n"
                     "cohort launch: nothing was started\n");
  }
  /* With this machine's agent among them (no ssh): it answers, and is not started either. */
  CHECK_EQ_INT(fake_job("a,b", 0, 0, 20000, &status), 0);
  CHECK_EQ_INT(status, 1);
  slurp(job_err, err, sizeof err);
  CHECK_STREQ(err, "cohort launch: b: cannot run ssh: No such file or directory\n"
                   "cohort launch: nothing was started\n");
  slurp(job_log, log, sizeof log);
  CHECK_EQ_INT(count_lines(log, "answer here\n"), 1);
  CHECK_EQ_INT(count_lines(log, "no token here\n"), 1);
  CHECK_EQ_INT(count_lines(log, "started "), 0);
  snprintf(fake_ssh, sizeof fake_ssh, "%s", keep);
}

/* At most --fanout sessions connecting at once: a new one starts as one answers. */
static void test_job_fanout(void) {
  char log[4096];
  int status = -1;
  setenv("SSH_DELAY", "0.2", 1);
  CHECK_EQ_INT(fake_job("a,b,c,d,e,f", -1, 2, 20000, &status), 0);
  unsetenv("SSH_DELAY");
  CHECK_EQ_INT(status, 0);
  slurp(job_log, log, sizeof log);
  int connecting = 0, most = 0;
  for (const char *p = log; *p; p = strchr(p, '\n') + 1) {
    if (strncmp(p, "start ", 6) == 0) connecting++;
    if (strncmp(p, "answer ", 7) == 0) connecting--;
    if (connecting > most) most = connecting;
    if (strchr(p, '\n') == NULL) break;
  }
  CHECK_EQ_INT(most, 2);
  CHECK_EQ_INT(count_lines(log, "started "), 6);
}

/* A stop before every host answered: nothing starts, the status is the signal's. */
static void test_job_stopped_early(void) {
  char log[4096];
  int status = -1;
  pid_t parent = getpid(), killer = fork();
  if (killer == 0) {
    usleep(500000);
    kill(parent, SIGTERM);
    _exit(0);
  }
  int64_t t0 = base_now_ms();
  CHECK_EQ_INT(fake_job("a,hang", -1, 0, 20000, &status), 0);
  CHECK(base_now_ms() - t0 < 15000);
  waitpid(killer, NULL, 0);
  CHECK_EQ_INT(status, 128 + SIGTERM);
  slurp(job_log, log, sizeof log);
  CHECK_EQ_INT(count_lines(log, "started "), 0);
  CHECK_EQ_INT(count_lines(log, "no token a\n"), 1);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/cohort-test-launch-XXXXXX");
  if (mkdtemp(tmpdir) == NULL) return 1;
  test_hostfile();
  test_hosts_list();
  test_filter();
  test_shell_join();
  test_ssh_argv();
  test_remote_command();
  test_judge();
  test_local_host();
  test_read_token();
  test_spawn();
  fakes_write();
  test_job_start();
  test_job_refused();
  test_job_no_ssh();
  test_job_fanout();
  test_job_stopped_early();
  const char *files[] = {fake_ssh, fake_cohort, job_log, job_out, job_err};
  for (size_t i = 0; i < BASE_ARRAY_LEN(files); i++) unlink(files[i]);
  rmdir(tmpdir);
  return check_report();
}

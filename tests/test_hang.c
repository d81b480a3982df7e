/*
 * test_hang.c - stack collection and classification (src/agent/stacks.c)
 * and progress tracking (src/agent/progress.c), on real processes: Python
 * workers sleeping, spinning and blocked on a pipe (through cohort's
 * start-up hook), this program's own children, debuggers that hang, and no
 * debugger at all.
 *
 * Usage: test_hang SOURCE_DIR
 */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/progress.h"
#include "agent/stacks.h"
#include "agent/worker.h"
#include "base/base.h"
#include "base/net.h"
#include "base/proc.h"
#include "tests/check.h"
#include "tests/proc.h"

static const char *src_dir;
static char tmp_dir[] = "/tmp/cohort-test-hang-XXXXXX";

/* Whether the ELF file at path carries line tables (.debug_line). A build with -g (the default
 * RelWithDebInfo, Debug) does; Release does not, and its native frames name functions without
 * file:line: the checks of native stacks expect what the build gives. */
static int has_line_info(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return 0;
  Elf64_Ehdr eh;
  Elf64_Shdr *sh = NULL;
  char *names = NULL;
  int found = 0;
  if (fread(&eh, sizeof eh, 1, f) != 1 || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shstrndx == SHN_UNDEF ||
      eh.e_shstrndx >= eh.e_shnum)
    goto out;
  sh = calloc(eh.e_shnum, sizeof *sh);
  if (sh == NULL || fseek(f, (long)eh.e_shoff, SEEK_SET) != 0 ||
      fread(sh, sizeof *sh, eh.e_shnum, f) != eh.e_shnum)
    goto out;
  const Elf64_Shdr *strs = &sh[eh.e_shstrndx];
  names = malloc(strs->sh_size + 1);
  if (names == NULL || fseek(f, (long)strs->sh_offset, SEEK_SET) != 0 ||
      fread(names, 1, strs->sh_size, f) != strs->sh_size)
    goto out;
  names[strs->sh_size] = '\0';
  for (int i = 0; i < eh.e_shnum && !found; i++)
    found = sh[i].sh_name < strs->sh_size && strcmp(names + sh[i].sh_name, ".debug_line") == 0;
out:
  free(names);
  free(sh);
  fclose(f);
  return found;
}

/* The line of a fixture under tests/torch/ that carries `marker`. */
static int line_of(const char *file, const char *marker) {
  char path[4096], buf[512];
  snprintf(path, sizeof path, "%s/tests/torch/%s", src_dir, file);
  FILE *f = fopen(path, "r");
  int n = 0, found = 0;
  while (f && fgets(buf, sizeof buf, f)) {
    n++;
    if (strstr(buf, marker)) found = n;
  }
  if (f) fclose(f);
  return found;
}

/* Reads what fd gives into buf until `want` shows in it (or 60 s). */
static int read_until(int fd, char *buf, size_t cap, size_t *len, const char *want) {
  int64_t until = base_now_ms() + 60000;
  while (base_now_ms() < until && !strstr(buf, want) && *len < cap - 1) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 200) <= 0) continue;
    ssize_t k = read(fd, buf + *len, cap - 1 - *len);
    if (k <= 0) break;
    *len += (size_t)k;
    buf[*len] = '\0';
  }
  return strstr(buf, want) != NULL;
}

/* Waits (up to 60 s) until pid's main thread sleeps in the kernel: a process
 * whose one blocking call is the one the test put it in is then inside it. */
static int wait_sleeping(pid_t pid) {
  int64_t until = base_now_ms() + 60000;
  base_proc_stat st;
  while (base_proc_stat_read("/proc", pid, &st) == 0 && base_now_ms() < until) {
    if (st.state == 'S') return 1;
    base_sleep_ms(5);
  }
  return 0;
}

/* Waits for the fixture's "ready", printed on the line of the call it
 * announces (any traceback from then on names that line), and for a
 * blocking call (sleep, pipe), until the process sleeps in it. */
static int wait_ready(proc_handle *h, const char *mode) {
  char buf[256] = "";
  size_t len = 0;
  if (!read_until(h->outfd, buf, sizeof buf, &len, "ready")) return 0;
  return strcmp(mode, "spin") == 0 || wait_sleeping(h->pid);
}

static char env_path[4200], env_file[4200], env_sig[64];

/* Starts the fixture in `mode` with the hook on PYTHONPATH (hook = 1). */
static int start_fixture(const char *mode, int hook, int rank, proc_handle *h) {
  char script[4096];
  snprintf(script, sizeof script, "%s/tests/torch/hang_fixture.py", src_dir);
  snprintf(env_path, sizeof env_path, "PYTHONPATH=%s/src/agent/python", src_dir);
  snprintf(env_file, sizeof env_file, "COHORT_STACKS_FILE=%s/py%d.txt", tmp_dir, rank);
  snprintf(env_sig, sizeof env_sig, "COHORT_STACKS_SIGNAL=%d", agent_stacks_py_signal());
  char *env[] = {env_path, env_file, env_sig, NULL};
  char *argv[] = {"/usr/bin/python3", script, (char *)mode, NULL};
  if (proc_start(argv, hook ? env : NULL, h) != 0) return 0;
  return wait_ready(h, mode);
}

static void stop(proc_handle *h) {
  kill(-h->pid, SIGKILL);
  waitpid(h->pid, NULL, 0);
  close(h->outfd);
  close(h->errfd);
}

static stacks_opts opts(const char *path, int64_t ms) {
  static char dir[4200];
  snprintf(dir, sizeof dir, "%s/stacks", tmp_dir);
  stacks_opts o = {
      .dir = dir, .path = path, .proc_root = "/proc", .deadline_ms = base_deadline_in(ms)};
  return o;
}

/* A Python worker in each of its three ways of hanging: the traceback names
 * the fixture's line and function, it is no collective, and it goes on. */
static void test_python_modes(void) {
  const char *modes[3] = {"sleep", "spin", "pipe"};
  const char *funcs[3] = {"load_batch", "busy_loop", "read_pipe"};
  const char *marks[3] = {"LINE-SLEEP", "LINE-SPIN", "LINE-PIPE"};
  proc_handle h[3];
  stacks_target t[3];
  char files[3][4200];
  int ok = 1;
  for (int i = 0; i < 3; i++) {
    ok &= start_fixture(modes[i], 1, i, &h[i]);
    snprintf(files[i], sizeof files[i], "%s/py%d.txt", tmp_dir, i);
    t[i] = (stacks_target){.rank = i, .pid = h[i].pid, .py_file = files[i]};
  }
  CHECK(ok);
  stacks_dump d[3];
  stacks_opts o = opts(getenv("PATH"), 10000);
  CHECK_EQ_INT(agent_stacks_collect(t, 3, &o, d), 0);
  /* Each rank's own hook answered (STACKS_PYTHON below), not a debugger after it was given up. */
  for (int i = 0; i < 3; i++) {
    CHECK_EQ_INT(d[i].kind, STACKS_PYTHON);
    stacks_verdict v;
    agent_stacks_classify(&d[i], &v);
    char want[256];
    snprintf(want, sizeof want, "%s, hang_fixture.py:%d", funcs[i],
             line_of("hang_fixture.py", marks[i]));
    CHECK_EQ_INT(v.collected, 1);
    CHECK_EQ_INT(v.in_collective, 0);
    if (strcmp(v.where, want) != 0) fprintf(stderr, "where '%s', want '%s'\n", v.where, want);
    CHECK(strcmp(v.where, want) == 0);
    CHECK(strstr(v.frames, "hang_fixture.py") != NULL);
    /* The file in the log directory has the whole traceback. */
    char path[4300];
    snprintf(path, sizeof path, "%s/stacks/rank%d.txt", tmp_dir, i);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size > 50);
    /* Dumping does not stop the worker. */
    CHECK(kill(h[i].pid, 0) == 0 && !proc_gone(h[i].pid, 200));
  }
  /* A second request gives one dump again, not two appended. */
  stacks_dump d2[1];
  CHECK_EQ_INT(agent_stacks_collect(t, 1, &o, d2), 0);
  CHECK_EQ_INT(d2[0].kind, STACKS_PYTHON);
  const char *first = strstr(d2[0].text, "load_batch");
  CHECK(first != NULL && strstr(first + 1, "load_batch") == NULL);
  agent_stacks_dump_free(d2, 1);
  agent_stacks_dump_free(d, 3);
  for (int i = 0; i < 3; i++) stop(&h[i]);
}

/* Where this program's child waits: a function of its own, by name. */
__attribute__((noinline)) static void child_waits_here(void) {
  for (;;) pause(); /* LINE-C-WAIT */
}

static pid_t fork_waiting_child(void) {
  pid_t pid = fork();
  if (pid == 0) {
    child_waits_here();
    _exit(0);
  }
  CHECK(wait_sleeping(pid)); /* in pause(), its one blocking call */
  return pid;
}

static void reap_child(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* A symlink dir holding only `name` -> target, as a search path. */
static const char *tool_dir(const char *sub, const char *name, const char *target) {
  static char dir[4200];
  snprintf(dir, sizeof dir, "%s/%s", tmp_dir, sub);
  mkdir(dir, 0755);
  char link[4300];
  snprintf(link, sizeof link, "%s/%s", dir, name);
  unlink(link);
  CHECK(symlink(target, link) == 0);
  return dir;
}

/* A native process through eu-stack, then through gdb: the frame of this
 * file is found in the main thread (by file:line when this program has line
 * tables, else by its function's name alone). */
static void test_native(void) {
  const char *paths[2] = {"/usr/bin", tool_dir("gdbonly", "gdb", "/usr/bin/gdb")};
  int lines = has_line_info("/proc/self/exe");
  if (!lines) fprintf(stderr, "test_hang has no line tables: native frames by function name\n");
  for (int k = 0; k < 2; k++) {
    pid_t pid = fork_waiting_child();
    stacks_target t = {.rank = 5, .pid = pid};
    stacks_dump d;
    stacks_opts o = opts(paths[k], 20000);
    CHECK_EQ_INT(agent_stacks_collect(&t, 1, &o, &d), 0);
    CHECK_EQ_INT(d.kind, STACKS_NATIVE);
    stacks_verdict v;
    agent_stacks_classify(&d, &v);
    CHECK_EQ_INT(v.in_collective, 0);
    /* Without line tables `where` is the innermost function alone (pause). */
    int where_ok = lines ? strstr(v.where, "test_hang.c:") != NULL
                         : v.where[0] != '\0' && strchr(v.where, ':') == NULL;
    if (!where_ok || strstr(v.frames, "child_waits_here") == NULL)
      fprintf(stderr, "%s: where '%s'\nframes:\n%s\ntext:\n%s\n", paths[k], v.where, v.frames,
              d.text);
    CHECK(where_ok);
    CHECK(strstr(v.frames, "child_waits_here") != NULL);
    agent_stacks_dump_free(&d, 1);
    reap_child(pid);
  }
}

/* No debugger on the path: the process state, its wait channel and what
 * to install. A Python worker without the hook falls to the same path. */
static void test_no_debugger(void) {
  proc_handle h;
  CHECK(start_fixture("sleep", 0, 9, &h));
  char file[4200];
  snprintf(file, sizeof file, "%s/py9.txt", tmp_dir);
  stacks_target t = {.rank = 9, .pid = h.pid, .py_file = file};
  stacks_dump d;
  stacks_opts o = opts("", 5000);
  CHECK_EQ_INT(agent_stacks_collect(&t, 1, &o, &d), 0);
  CHECK_EQ_INT(d.kind, STACKS_PROC_STATE);
  if (strstr(d.text, "process state S") == NULL) fprintf(stderr, "text: %s\n", d.text);
  CHECK(strstr(d.text, "process state S") != NULL);
  CHECK(strstr(d.text, "install gdb or elfutils") != NULL);
  stacks_verdict v;
  agent_stacks_classify(&d, &v);
  CHECK_EQ_INT(v.collected, 0);
  agent_stacks_dump_free(&d, 1);
  stop(&h);
}

/* A debugger that never finishes is killed at the deadline. */
static void test_stuck_debugger(void) {
  char script[4300];
  snprintf(script, sizeof script, "%s/stuck", tmp_dir);
  mkdir(script, 0755);
  snprintf(script, sizeof script, "%s/stuck/eu-stack", tmp_dir);
  FILE *f = fopen(script, "w");
  fprintf(f, "#!/bin/sh\necho '#0 0x1 partial_frame'\nexec sleep 60\n");
  fclose(f);
  chmod(script, 0755);
  char dir[4300];
  snprintf(dir, sizeof dir, "%s/stuck", tmp_dir);
  pid_t pid = fork_waiting_child();
  stacks_target t = {.rank = 1, .pid = pid};
  stacks_dump d;
  int64_t t0 = base_now_ms();
  stacks_opts o = opts(dir, 1000);
  CHECK_EQ_INT(agent_stacks_collect(&t, 1, &o, &d), 0);
  int64_t took = base_now_ms() - t0;
  /* Not before the deadline; killed there, not waited for (it sleeps 60 s). */
  CHECK(took >= 900 && took < 30000);
  CHECK(strstr(d.text, "did not finish before the deadline") != NULL);
  CHECK(strstr(d.text, "partial_frame") != NULL);
  agent_stacks_dump_free(&d, 1);
  reap_child(pid);
  /* A real debugger killed while attached: the target runs on. */
  pid = fork_waiting_child();
  t.pid = pid;
  o = opts("/usr/bin", 1);
  CHECK_EQ_INT(agent_stacks_collect(&t, 1, &o, &d), 0);
  base_sleep_ms(100);
  CHECK(!agent_worker_is_frozen(pid));
  agent_stacks_dump_free(&d, 1);
  reap_child(pid);
}

/* The hook runs the sitecustomize it shadows, and a program that installs
 * its own handler for the same signal still gets its signals. */
static void test_hook_chains(void) {
  char dir[4300], path[4400];
  snprintf(dir, sizeof dir, "%s/site", tmp_dir);
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/sitecustomize.py", dir);
  FILE *f = fopen(path, "w");
  fprintf(f, "import os\nopen(os.environ['MARK'], 'w').write('ran')\n");
  fclose(f);
  char pp[4600], mark[4400], file[4400], sig[64];
  snprintf(pp, sizeof pp, "PYTHONPATH=%s/src/agent/python:%s", src_dir, dir);
  snprintf(mark, sizeof mark, "MARK=%s/marked", tmp_dir);
  snprintf(file, sizeof file, "COHORT_STACKS_FILE=%s/chain.txt", tmp_dir);
  snprintf(sig, sizeof sig, "COHORT_STACKS_SIGNAL=%d", agent_stacks_py_signal());
  char *env[] = {pp, mark, file, sig, NULL};
  /* A program with its own handler for the signal: after the hook, it
   * still gets its signal, and the dump is written too. */
  char prog[512];
  snprintf(prog, sizeof prog,
           "import os, signal, time\n"
           "hits = []\n"
           "signal.signal(%d, lambda s, f: hits.append(s))\n"
           "os.kill(os.getpid(), %d)\n"
           "time.sleep(0.3)\n"
           "print('hits', len(hits), flush=True)\n",
           agent_stacks_py_signal(), agent_stacks_py_signal());
  char *argv[] = {"/usr/bin/python3", "-c", prog, NULL};
  proc_result r;
  CHECK_EQ_INT(proc_run(argv, env, 20000, &r), 0);
  CHECK_EQ_INT(proc_exit_code(&r), 0);
  snprintf(path, sizeof path, "%s/marked", tmp_dir);
  struct stat st;
  CHECK(stat(path, &st) == 0);
  CHECK(strstr(r.out, "hits 1") != NULL);
  proc_result_free(&r);
}

/* Native texts as gdb and eu-stack print them for a libcohort worker
 * waiting in an allreduce: a victim, the collective and the caller named. */
static void test_classify_native_texts(void) {
  const char *gdb =
      "Thread 2 (Thread 0x7f00 (LWP 101) \"cohort-progress\"):\n"
      "#0  0x00007f in poll () from /lib/libc.so.6\n"
      "#1  0x000055 in progress_main (arg=0x1) at /src/coll/engine.c:80\n"
      "Thread 1 (Thread 0x7f01 (LWP 100) \"worker\"):\n"
      "#0  0x00007f in __GI___clock_nanosleep (a=1) at ../sysdeps/clock_nanosleep.c:48\n"
      "#1  0x000055 in coll_wait (c=0x1) at /src/coll/comm.c:300\n"
      "#2  0x000055 in cohort_allreduce (comm=0x1, send=0x2) at /src/coll/comm.c:400\n"
      "#3  0x000055 in train_step (i=5) at /src/tests/test_hang_worker.c:41\n"
      "#4  0x000055 in main () at /src/tests/test_hang_worker.c:60\n";
  stacks_dump d = {.rank = 2, .pid = 100, .kind = STACKS_NATIVE, .text = (char *)gdb};
  stacks_verdict v;
  agent_stacks_classify(&d, &v);
  CHECK_EQ_INT(v.in_collective, 1);
  CHECK_STREQ(v.where, "cohort_allreduce, test_hang_worker.c:41");
  const char *eu = "PID 100 - process\n"
                   "TID 101:\n#0  0x00007f poll\n"
                   "TID 100:\n"
                   "#0  0x00007f __GI___poll\n    ../sysdeps/poll.c:29:10\n"
                   "#1  0x000055 cohort_barrier\n    /src/coll/comm.c:500:3\n"
                   "#2  0x000055 main\n    /src/tests/test_hang_worker.c:77:5\n"
                   "#3  0x00007f\n";
  d.text = (char *)eu;
  agent_stacks_classify(&d, &v);
  CHECK_EQ_INT(v.in_collective, 1);
  CHECK_STREQ(v.where, "cohort_barrier, test_hang_worker.c:77");
  CHECK(strstr(v.frames, "__GI___poll at ../sysdeps/poll.c:29") != NULL);
  /* A frame without a symbol is named so, not an empty report line. */
  CHECK(strstr(v.frames, "    \n") == NULL);
  CHECK(strstr(v.frames, "?? (no symbol)") != NULL);
  /* A Python rank in torch.distributed, and one in DDP's backward. */
  const char *py = "Thread 0x7f02 (most recent call first):\n"
                   "  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n"
                   "  File \"/usr/lib/python3.11/threading.py\", line 995 in _bootstrap\n\n"
                   "Current thread 0x7f01 (most recent call first):\n"
                   "  File \"/usr/lib/python3/dist-packages/torch/distributed/"
                   "distributed_c10d.py\", line 1536 in all_reduce\n"
                   "  File \"/job/train.py\", line 41 in step\n"
                   "  File \"/job/train.py\", line 60 in <module>\n";
  d.kind = STACKS_PYTHON;
  d.text = (char *)py;
  agent_stacks_classify(&d, &v);
  CHECK_EQ_INT(v.in_collective, 1);
  CHECK_STREQ(v.where, "all_reduce, train.py:41");
  const char *ddp = "Thread 0x7f01 (most recent call first):\n"
                    "  File \"/usr/lib/python3/dist-packages/torch/autograd/__init__.py\", "
                    "line 197 in backward\n"
                    "  File \"/usr/lib/python3/dist-packages/torch/_tensor.py\", line 487 in "
                    "backward\n"
                    "  File \"/job/train.py\", line 33 in main\n"
                    "  File \"/job/train.py\", line 70 in <module>\n";
  d.text = (char *)ddp;
  agent_stacks_classify(&d, &v);
  CHECK_EQ_INT(v.in_collective, 1);
  CHECK_STREQ(v.where, "backward (DDP's gradient all_reduce), train.py:33");
  /* Garbage is no stack, not a crash. */
  d.text = (char *)"#\n#x\nThread \n  File \"\n  File \"a\", line \nTID :\n\x01\xff";
  agent_stacks_classify(&d, &v);
  CHECK_EQ_INT(v.in_collective, 0);
}

static stacks_verdict verdict(int rank, int collected, int coll, const char *where) {
  stacks_verdict v;
  memset(&v, 0, sizeof v);
  v.rank = rank;
  v.collected = collected;
  v.in_collective = coll;
  snprintf(v.where, sizeof v.where, "%s", where);
  return v;
}

/* The cause is the rank not in a collective, not the first to fall silent;
 * then the odd one out; the others grouped by place. */
static void test_blame(void) {
  stacks_verdict v[4] = {
      verdict(3, 1, 1, "all_reduce, t.py:41"), verdict(0, 1, 1, "all_reduce, t.py:41"),
      verdict(2, 1, 0, "load_batch, t.py:12"), verdict(1, 1, 1, "all_reduce, t.py:41")};
  int64_t silent[4] = {30000, 20000, 10000, 25000};
  const char *why = NULL;
  CHECK_EQ_INT(agent_stacks_blame(v, silent, 4, &why), 2);
  CHECK_STREQ(why, "is not in a collective");
  char lines[1024];
  agent_stacks_group_lines(v, 4, 2, lines, sizeof lines);
  CHECK_STREQ(lines, "ranks 0-1,3 waiting in all_reduce, t.py:41");
  /* Everyone waits, one in another collective. */
  v[2] = verdict(2, 1, 1, "barrier, t.py:50");
  CHECK_EQ_INT(agent_stacks_blame(v, silent, 4, &why), 2);
  CHECK(strstr(why, "different collective") != NULL);
  /* Everyone waits in the same one; one gave no stack. */
  v[2] = verdict(2, 0, 0, "unknown (no debugger)");
  CHECK_EQ_INT(agent_stacks_blame(v, silent, 4, &why), 2);
  agent_stacks_group_lines(v, 4, -1, lines, sizeof lines);
  CHECK_STREQ(lines, "ranks 0-1,3 waiting in all_reduce, t.py:41\nrank 2  unknown (no debugger)");
  /* All the same: the longest silent. */
  v[2] = verdict(2, 1, 1, "all_reduce, t.py:41");
  CHECK_EQ_INT(agent_stacks_blame(v, silent, 4, &why), 0);
  /* The report: the cause, its frames, the others grouped, the files. */
  v[2] = verdict(2, 1, 0, "load_batch, t.py:12");
  snprintf(v[2].frames, sizeof v[2].frames, "    load_batch at /j/t.py:12\n");
  stacks_place at[4] = {
      {1, "h1", 40, 30000}, {0, "h0", 10, 20000}, {1, "h1", 30, 10000}, {0, "h0", 20, 25000}};
  char rep[2048];
  CHECK_EQ_INT(agent_stacks_report(v, at, 4, "logs/attempt0/stacks", rep, sizeof rep), 2);
  CHECK_STREQ(rep, "job hung: rank 2 (node 1, h1, pid 30) made no progress for 10.0 s and is not "
                   "in a collective: load_batch, t.py:12\n"
                   "    load_batch at /j/t.py:12\n"
                   "ranks 0-1,3 waiting in all_reduce, t.py:41\n"
                   "full stacks: logs/attempt0/stacks/rank<R>.txt on each node");
  CHECK_EQ_INT(agent_stacks_report(v, at, 0, NULL, rep, sizeof rep), -1);
  CHECK_EQ_INT(agent_stacks_report(v, at, 4, NULL, rep, 16), 2);
  CHECK_EQ_INT((int)strlen(rep), 15);
  int ranks[6] = {0, 1, 2, 4, 6, 7};
  agent_stacks_rank_list(ranks, 6, lines, sizeof lines);
  CHECK_STREQ(lines, "0-2,4,6-7");
}

/* Runs a shell command (beats from a real process), waits for it. */
static void sh(const char *fmt, const char *path) {
  char cmd[8400];
  snprintf(cmd, sizeof cmd, fmt, path, path);
  CHECK_EQ_INT(system(cmd), 0);
}

/* Beats by writing, by touching, by a rename over it; output counts only
 * until the first beat; step numbers are read. */
static void test_progress_file(void) {
  char path[512], msg[8400];
  snprintf(path, sizeof path, "%s/hb0", tmp_dir);
  progress p;
  CHECK_EQ_INT(agent_progress_init(&p, 0, path, 1000), 0);
  CHECK_EQ_INT(agent_progress_poll(&p, 1500, msg, sizeof msg), 0);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 1500), 500); /* creation is no beat */
  agent_progress_output(&p, 2000);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 2500), 500);
  sh(": > %s", path);
  base_sleep_ms(20);
  sh("touch %s", path);
  CHECK_EQ_INT(agent_progress_poll(&p, 3000, msg, sizeof msg), 0);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 3000), 0);
  agent_progress_output(&p, 4000); /* beaten: output no longer counts */
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 4000), 1000);
  base_sleep_ms(20);
  sh("touch %s", path);
  agent_progress_poll(&p, 4100, msg, sizeof msg);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 4100), 0);
  sh("/usr/bin/python3 -c \"import sys; open(sys.argv[1], 'w').write('17')\" %s", path);
  CHECK_EQ_INT(agent_progress_poll(&p, 5000, msg, sizeof msg), 0);
  CHECK_EQ_INT(p.step, 17);
  char mv[2048];
  snprintf(mv, sizeof mv, "echo 19 > %s.tmp && mv %s.tmp %s", path, path, path);
  CHECK_EQ_INT(system(mv), 0);
  CHECK_EQ_INT(agent_progress_poll(&p, 6000, msg, sizeof msg), 0);
  CHECK_EQ_INT(p.step, 19);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 6000), 0);
  /* Not moving: no beat. */
  CHECK_EQ_INT(agent_progress_poll(&p, 7000, msg, sizeof msg), 0);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 7000), 1000);
}

/* The hook's automatic progress file: a touch is progress but no beat and
 * does not end the start-up; once written, the start-up is over. */
static void test_auto_progress(void) {
  char path[512], msg[8400];
  snprintf(path, sizeof path, "%s/hb-auto", tmp_dir);
  progress p;
  CHECK_EQ_INT(agent_progress_init(&p, 0, path, 1000), 0);
  CHECK_EQ_INT(agent_progress_watch_auto(&p), 0);
  CHECK_EQ_INT(agent_progress_poll(&p, 1500, msg, sizeof msg), 0);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 1500), 500); /* creation is no progress */
  base_sleep_ms(20);
  sh("touch %s.auto", path);
  CHECK_EQ_INT(agent_progress_poll(&p, 2000, msg, sizeof msg), 0);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 2000), 0);
  CHECK(!p.started && !p.beaten);
  agent_progress_output(&p, 3000); /* no beat: output still counts */
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 3000), 0);
  CHECK_EQ_INT(agent_progress_poll(&p, 3500, msg, sizeof msg), 0);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 3500), 500); /* unchanged: nothing */
  sh("echo step > %s.auto", path);
  CHECK_EQ_INT(agent_progress_poll(&p, 4000, msg, sizeof msg), 0);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 4000), 0);
  CHECK(p.started && !p.beaten);
}

/* Deleted, a directory, garbage: one line each, once; beats resume. */
static void test_progress_file_bad(void) {
  char path[512], msg[8400];
  snprintf(path, sizeof path, "%s/hb1", tmp_dir);
  progress p;
  CHECK_EQ_INT(agent_progress_init(&p, 3, path, 0), 0);
  sh("rm %s", path);
  CHECK_EQ_INT(agent_progress_poll(&p, 100, msg, sizeof msg), 1);
  CHECK(strstr(msg, "rank 3: progress file") && strstr(msg, "was deleted"));
  CHECK(strchr(msg, '\n') == NULL);
  CHECK_EQ_INT(agent_progress_poll(&p, 200, msg, sizeof msg), 0);
  sh("mkdir %s", path);
  CHECK_EQ_INT(agent_progress_poll(&p, 300, msg, sizeof msg), 1);
  CHECK(strstr(msg, "not a regular file") != NULL);
  CHECK_EQ_INT(agent_progress_poll(&p, 400, msg, sizeof msg), 0);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 400), 400);
  sh("rmdir %s && head -c 300 /dev/urandom > %s", path);
  CHECK_EQ_INT(agent_progress_poll(&p, 500, msg, sizeof msg), 1);
  CHECK(strstr(msg, "holds no step number") != NULL);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 500), 0); /* a write is still a beat */
  sh("head -c 100 /dev/urandom > %s", path);
  CHECK_EQ_INT(agent_progress_poll(&p, 600, msg, sizeof msg), 0);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 600), 0);
  sh("echo 5 > %s", path);
  CHECK_EQ_INT(agent_progress_poll(&p, 700, msg, sizeof msg), 0);
  CHECK_EQ_INT(p.step, 5);
  /* Beaten, then deleted: its output counts again until it beats again. */
  agent_progress_output(&p, 800);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 800), 100);
  sh("rm %s", path);
  CHECK_EQ_INT(agent_progress_poll(&p, 900, msg, sizeof msg), 1);
  agent_progress_output(&p, 1000);
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 1000), 0);
  sh("echo 6 > %s", path);
  CHECK_EQ_INT(agent_progress_poll(&p, 1100, msg, sizeof msg), 0);
  agent_progress_output(&p, 1200); /* beating again: output no longer counts */
  CHECK_EQ_INT(agent_progress_silent_ms(&p, 1200), 100);
  /* A path that cannot be created is an error, not a crash. */
  CHECK(agent_progress_init(&p, 0, "/nonexistent-dir/hb", 0) < 0);
}

/* Writes step into path, its mtime t0 + at_ms: a rank's beat at that moment. */
static void beat_at(const char *path, int step, const struct timespec *t0, int64_t at_ms) {
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (f == NULL) return;
  fprintf(f, "%d", step);
  fclose(f);
  int64_t ns = t0->tv_nsec + (at_ms % 1000) * 1000000;
  struct timespec ts[2];
  ts[0].tv_sec = ts[1].tv_sec = t0->tv_sec + at_ms / 1000 + ns / 1000000000;
  ts[0].tv_nsec = ts[1].tv_nsec = ns % 1000000000;
  CHECK(utimensat(AT_FDCWD, path, ts, 0) == 0);
}

/* Four ranks beating step numbers, one ten times slower per step: it alone is a
 * straggler, reported once; an even job has none. The step times are those of the
 * files' mtimes, which the test sets (as a rank's write would at that moment):
 * real sleeping ranks measured this machine's scheduler too, and under load a
 * fast rank's median came out 1.5x its peers' now and then. */
static void test_stragglers(void) {
  progress p[4];
  char path[4][512];
  struct timespec t0;
  clock_gettime(CLOCK_REALTIME, &t0);
  for (int i = 0; i < 4; i++) {
    snprintf(path[i], sizeof path[i], "%s/st%d", tmp_dir, i);
    CHECK_EQ_INT(agent_progress_init(&p[i], i, path[i], base_now_ms()), 0);
  }
  char msg[8400];
  /* Steps 0-6, each rank's beats 50 ms apart (rank 2: 500) plus a jitter of a few ms. */
  for (int step = 0; step < 7; step++)
    for (int i = 0; i < 4; i++) {
      beat_at(path[i], step, &t0, (int64_t)step * (i == 2 ? 500 : 50) + (step * 7 + i * 3) % 5);
      agent_progress_poll(&p[i], base_now_ms(), msg, sizeof msg);
      CHECK_EQ_INT(p[i].step, step);
    }
  double ms[4];
  for (int i = 0; i < 4; i++) ms[i] = agent_progress_step_ms(&p[i]);
  CHECK(ms[0] >= 46 && ms[0] <= 54 && ms[2] >= 496 && ms[2] <= 504);
  int flagged[4] = {0}, out[4];
  double ratio[4];
  CHECK_EQ_INT(agent_progress_stragglers(ms, 4, 1.5, flagged, out, ratio), 1);
  CHECK_EQ_INT(out[0], 2);
  CHECK(ratio[0] > 2.0);
  /* Once per episode; over when it catches up; 0 turns it off. */
  CHECK_EQ_INT(agent_progress_stragglers(ms, 4, 1.5, flagged, out, ratio), 0);
  CHECK_EQ_INT(agent_progress_stragglers(ms, 4, 0, flagged, out, ratio), 0);
  double even[4] = {100, 104, 97, 101};
  CHECK_EQ_INT(agent_progress_stragglers(even, 4, 1.5, flagged, out, ratio), 0);
  CHECK_EQ_INT(flagged[2], 0);
  double two[2] = {100, 300}, unknown[3] = {0, 100, 0};
  int f2[3] = {0};
  CHECK_EQ_INT(agent_progress_stragglers(two, 2, 1.5, f2, out, ratio), 1);
  CHECK_EQ_INT(out[0], 1);
  CHECK_EQ_INT(agent_progress_stragglers(unknown, 3, 1.5, f2, out, ratio), 0);
}

/* Two gloo DDP ranks, rank 1 stuck in `mode`: its Python traceback names
 * the script's line, rank 0 waits in the gradient all_reduce, and the
 * report blames rank 1 although rank 0 fell silent too. */
static void test_torch_mode(const char *mode, const char *marker) {
  int port = 0;
  CHECK_EQ_INT(base_free_port("127.0.0.1", &port), 0);
  char script[4096];
  snprintf(script, sizeof script, "%s/tests/torch/ddp_hang.py", src_dir);
  proc_handle h[2];
  stacks_target t[2];
  char files[2][512];
  for (int r = 0; r < 2; r++) {
    static char env[2][10][600];
    snprintf(env[r][0], sizeof env[r][0], "PYTHONPATH=%s/src/agent/python", src_dir);
    snprintf(files[r], sizeof files[r], "%s/torch%d.txt", tmp_dir, r);
    snprintf(env[r][1], sizeof env[r][1], "COHORT_STACKS_FILE=%s", files[r]);
    snprintf(env[r][2], sizeof env[r][2], "COHORT_STACKS_SIGNAL=%d", agent_stacks_py_signal());
    snprintf(env[r][3], sizeof env[r][3], "RANK=%d", r);
    snprintf(env[r][4], sizeof env[r][4], "WORLD_SIZE=2");
    snprintf(env[r][5], sizeof env[r][5], "MASTER_ADDR=127.0.0.1");
    snprintf(env[r][6], sizeof env[r][6], "MASTER_PORT=%d", port);
    snprintf(env[r][7], sizeof env[r][7], "HANG_RANK=1");
    snprintf(env[r][8], sizeof env[r][8], "HANG_MODE=%s", mode);
    snprintf(env[r][9], sizeof env[r][9], "GLOO_SOCKET_IFNAME=lo");
    char *envp[11];
    for (int k = 0; k < 10; k++) envp[k] = env[r][k];
    envp[10] = NULL;
    char *argv[] = {"/usr/bin/python3", script, NULL};
    CHECK_EQ_INT(proc_start(argv, envp, &h[r]), 0);
    t[r] = (stacks_target){.rank = r, .pid = h[r].pid, .py_file = files[r]};
  }
  /* The stuck rank says so; give the other time to reach its wait. */
  char buf[4096] = "";
  size_t len = 0;
  read_until(h[1].outfd, buf, sizeof buf, &len, "hanging");
  CHECK(strstr(buf, "hanging") != NULL);
  base_sleep_ms(1500);
  stacks_dump d[2];
  stacks_opts o = opts(getenv("PATH"), 10000);
  CHECK_EQ_INT(agent_stacks_collect(t, 2, &o, d), 0);
  stacks_verdict v[2];
  for (int r = 0; r < 2; r++) {
    CHECK_EQ_INT(d[r].kind, STACKS_PYTHON);
    agent_stacks_classify(&d[r], &v[r]);
  }
  char want[256];
  snprintf(want, sizeof want, "get_batch, ddp_hang.py:%d", line_of("ddp_hang.py", marker));
  CHECK_STREQ(v[1].where, want);
  CHECK_EQ_INT(v[0].in_collective, 1);
  snprintf(want, sizeof want, "ddp_hang.py:%d", line_of("ddp_hang.py", "DDP-BACKWARD"));
  CHECK(strstr(v[0].where, want) != NULL);
  stacks_place at[2] = {{0, "h", h[0].pid, 9000}, {0, "h", h[1].pid, 8000}};
  char rep[4096];
  CHECK_EQ_INT(agent_stacks_report(v, at, 2, NULL, rep, sizeof rep), 1);
  fprintf(stderr, "%s: %s\n", mode, rep);
  agent_stacks_dump_free(d, 2);
  for (int r = 0; r < 2; r++) stop(&h[r]);
}

/* Two libcohort ranks under `cohort run`, rank 1 skipping an allreduce:
 * native backtraces show rank 0 in cohort_allreduce called from the
 * worker's line, and rank 1 asleep, to blame. */
static void test_native_collective(const char *cohort, const char *worker_bin) {
  char *argv[] = {(char *)cohort, "run", "--nproc-per-node", "2", "--", (char *)worker_bin, NULL};
  static char hang[] = "HANG_RANK=1";
  char *env[] = {hang, NULL};
  proc_handle h;
  CHECK_EQ_INT(proc_start(argv, env, &h), 0);
  char buf[8192] = "";
  size_t len = 0;
  CHECK(read_until(h.outfd, buf, sizeof buf, &len, "[r1] hanging"));
  stacks_target t[2];
  for (int r = 0; r < 2; r++) {
    char tag[32];
    snprintf(tag, sizeof tag, "[r%d] pid ", r);
    const char *p = strstr(buf, tag);
    t[r] = (stacks_target){.rank = r, .pid = p ? atoi(p + strlen(tag)) : 0};
  }
  CHECK(t[0].pid > 0 && t[1].pid > 0);
  /* Rank 1 past its last allreduce: asleep once its main thread sleeps; rank 0 waits in an
   * allreduce that cannot end (its main thread sleeps on the progress thread). */
  for (int r = 0; r < 2; r++) CHECK(t[r].pid > 0 && wait_sleeping(t[r].pid));
  stacks_dump d[2];
  stacks_verdict v[2];
  stacks_opts o = opts(getenv("PATH"), 15000);
  if (t[0].pid > 0 && t[1].pid > 0 && agent_stacks_collect(t, 2, &o, d) == 0) {
    for (int r = 0; r < 2; r++) agent_stacks_classify(&d[r], &v[r]);
    /* The worker's line when it has line tables; else the collective's name alone, and rank 1's
     * frames reach the worker's main without a collective. */
    int lines = has_line_info(worker_bin);
    char want[256];
    if (lines)
      snprintf(want, sizeof want, "cohort_allreduce, test_hang_worker.c:%d",
               line_of("../test_hang_worker.c", "WORKER-ALLREDUCE"));
    else
      snprintf(want, sizeof want, "cohort_allreduce");
    if (strcmp(v[0].where, want) != 0) fprintf(stderr, "rank 0:\n%s\n", d[0].text);
    CHECK_STREQ(v[0].where, want);
    CHECK_EQ_INT(v[0].in_collective, 1);
    CHECK_EQ_INT(v[1].in_collective, 0);
    snprintf(want, sizeof want, "test_hang_worker.c:%d",
             line_of("../test_hang_worker.c", "WORKER-SLEEP"));
    int rank1_ok = lines ? strstr(v[1].where, want) != NULL : strstr(v[1].frames, "main") != NULL;
    if (!rank1_ok) fprintf(stderr, "rank 1: where '%s'\n%s\n", v[1].where, d[1].text);
    CHECK(rank1_ok);
    stacks_place at[2] = {{0, "h", t[0].pid, 2000}, {0, "h", t[1].pid, 1000}};
    char rep[4096];
    CHECK_EQ_INT(agent_stacks_report(v, at, 2, NULL, rep, sizeof rep), 1);
    fprintf(stderr, "native: %s\n", rep);
    agent_stacks_dump_free(d, 2);
  }
  kill(h.pid, SIGTERM);
  proc_result r;
  proc_wait(&h, 20000, &r);
  proc_result_free(&r);
}

int main(int argc, char **argv) {
  if (argc < 2 || (argc == 3 && strcmp(argv[2], "--torch") != 0) || argc > 4) {
    fprintf(stderr, "usage: test_hang SOURCE_DIR [--torch | COHORT WORKER]\n");
    return 2;
  }
  src_dir = argv[1];
  if (mkdtemp(tmp_dir) == NULL) return 1;
  char cmd[4200];
  if (argc == 3) {
    /* PyTorch (python3-torch): only in the slow label. */
    test_torch_mode("sleep", "HANG-SLEEP");
    test_torch_mode("spin", "HANG-SPIN");
    test_torch_mode("pipe", "HANG-PIPE");
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", tmp_dir);
    return check_report();
  }
  test_classify_native_texts();
  test_blame();
  test_python_modes();
  test_native();
  test_no_debugger();
  test_stuck_debugger();
  test_hook_chains();
  test_progress_file();
  test_auto_progress();
  test_progress_file_bad();
  test_stragglers();
  if (argc == 4) test_native_collective(argv[2], argv[3]);
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", tmp_dir);
  return check_report();
}

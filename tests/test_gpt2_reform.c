/*
 * test_gpt2_reform.c - cohort-gpt2 survives a lost rank and takes a new one,
 * in the same processes, and ends bit for bit where runs given the same
 * membership schedule in advance end.
 *
 * The test plays the agent of docs/reform.md: it hosts a store on loopback,
 * forks 3 ranks of cohort-gpt2 each with one end of its own control channel
 * (COHORT_CONTROL_FD), and when a rank's progress file says it completed step K
 * it kills it with SIGKILL, tells the survivors `reshape`, waits for their
 * `ready` and sends each its place in the new membership of 2 (`form`). A
 * few steps later it ends that membership too (`reshape grow=1`, as for a
 * joining node) and starts a newcomer (COHORT_NEWCOMER=1) as rank 2 of 3:
 * the survivors finish the step in flight and re-form after it (the line says
 * "step in flight none", and only the newcomer gets the state; COHORT_GROW_BREAK=0:
 * case break-tcp instead sends it as a slow step begins, which it breaks, and the
 * line says "step in flight dropped"). The run
 * prints one line per re-form naming the step it went on from; the test
 * then runs the same schedule as runs chained by checkpoints (3 ranks to N,
 * 2 ranks resumed to M, 3 ranks resumed to the end) and compares the final
 * checkpoints byte for byte and the loss of every step.
 *
 * Cases: --grad-compress none, bf16 and powersgd (after its warm-up, and a
 * loss during it), over TCP and over shared memory (the single-copy path of
 * the gradient buffers), the lost rank the last, the middle one or rank 0
 * (PowerSGD's errors are each rank's own, and a checkpoint resumed on fewer
 * ranks keeps the first ones', so with PowerSGD the last rank is lost). And
 * --zero 1 under re-form is refused with one line. And a survivor a step behind
 * (run_behind): it receives the step the others completed and writes its metrics
 * line; nothing is computed again. A newcomer that catches up in the background
 * (catchup-*, the plain exchange and PowerSGD): each donor streams from a copy of
 * its share only (rank 0's line says ceil(B/2) bytes of the B); with PowerSGD it
 * contributes a fixed number of steps after its join (COHORT_GPT2_TEST_HOLD), so
 * it replays several compressing steps, and in catchup-psgd-cross warm-up steps
 * then compressing ones. In catchup-r0-* the newcomer joins as rank 0 (the survivors
 * ranks 1 and 2), in catchup-mid-tcp as rank 1: it catches up all the same, and rank 0
 * writes every step's line once.
 *
 * usage: test_gpt2_reform PATH/TO/cohort-gpt2 [NAME]   (NAME: only the cases named so, a prefix)
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"
#include "tests/check.h"
#include "tests/spawn_files.h"

static const char *bin;
static char tmp[256];
static char store_addr[64];
static int store_port;

enum { STEPS = 24, MAXSTEPS = 64 };

typedef struct proc {
  pid_t pid;
  int ctl; /* the agent's end of its control channel, -1 none */
  char tag[64];
} proc;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Starts one rank of job `job` in round `round`; ctl: with a control channel; newcomer: started
 * into a running job. */
static proc spawn_rank(const char *tag, int rank, int world, const char *job, int round, int ctl,
                       int newcomer, const char *transport, const char **args) {
  proc p = {.pid = -1, .ctl = -1};
  snprintf(p.tag, sizeof p.tag, "%s", tag);
  int sv[2] = {-1, -1};
  if (ctl && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return p;
  if (ctl) fcntl(sv[1], F_SETFD, 0); /* the worker's end is inherited */
  char e[10][400];
  snprintf(e[0], sizeof e[0], "RANK=%d", rank);
  snprintf(e[1], sizeof e[1], "LOCAL_RANK=%d", rank);
  snprintf(e[2], sizeof e[2], "WORLD_SIZE=%d", world);
  snprintf(e[3], sizeof e[3], "LOCAL_WORLD_SIZE=%d", world);
  snprintf(e[4], sizeof e[4], "COHORT_STORE=%s", store_addr);
  snprintf(e[5], sizeof e[5], "COHORT_JOB_ID=%s", job);
  snprintf(e[6], sizeof e[6], "COHORT_ROUND=%d", round);
  snprintf(e[7], sizeof e[7], "COHORT_PROGRESS=%s/%s.progress", tmp, tag);
  close(open(e[7] + strlen("COHORT_PROGRESS="), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  snprintf(e[8], sizeof e[8], "COHORT_TRANSPORT=%s", transport);
  if (ctl)
    snprintf(e[9], sizeof e[9], "COHORT_CONTROL_FD=%d", sv[1]);
  else
    snprintf(e[9], sizeof e[9], "COHORT_CONTROL_FD");
  const char *env[] = {"OMP_NUM_THREADS=1",
                       "OMP_WAIT_POLICY=passive",
                       "COHORT_TIMEOUT_MS=30000",
                       newcomer ? "COHORT_NEWCOMER=1" : "COHORT_NEWCOMER",
                       e[0],
                       e[1],
                       e[2],
                       e[3],
                       e[4],
                       e[5],
                       e[6],
                       e[7],
                       e[8],
                       e[9],
                       NULL};
  p.pid = spawn_to_files(bin, tmp, tag, args, env);
  if (ctl) {
    close(sv[1]);
    p.ctl = sv[0];
  }
  return p;
}

/* The next message of verb `verb` from p within timeout_s (others skipped), into msg. */
static int expect(proc *p, const char *verb, char *msg, size_t len, double timeout_s) {
  double end = now_s() + timeout_s;
  size_t vl = strlen(verb);
  while (now_s() < end) {
    struct pollfd pfd = {.fd = p->ctl, .events = POLLIN};
    if (poll(&pfd, 1, 100) <= 0) continue;
    ssize_t n = recv(p->ctl, msg, len - 1, 0);
    if (n <= 0) return -1;
    msg[n] = '\0';
    if (strncmp(msg, verb, vl) == 0 && (msg[vl] == ' ' || msg[vl] == '\0')) return 0;
  }
  fprintf(stderr, "%s: no '%s' within %.0f s\n", p->tag, verb, timeout_s);
  return -1;
}

static int say(proc *p, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return send(p->ctl, msg, (size_t)n, MSG_NOSIGNAL) == n ? 0 : -1;
}

static int form(proc *p, int epoch, int rank, int size, const char *job) {
  return say(p,
             "form epoch=%d rank=%d size=%d local_rank=%d local_size=%d node_rank=0 nnodes=1 "
             "store=%s job=%s master_addr=127.0.0.1 master_port=%d",
             epoch, rank, size, rank, size, store_addr, job, store_port);
}

/* The step a rank's progress file names, -1 before the first. */
static long progress(const proc *p) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.progress", tmp, p->tag);
  char *s = spawn_slurp(path);
  long v = s[0] ? atol(s) : -1;
  free(s);
  return v;
}

static int wait_progress(const proc *p, long step, double timeout_s) {
  double end = now_s() + timeout_s;
  while (now_s() < end) {
    if (progress(p) >= step) return 0;
    if (waitpid(p->pid, NULL, WNOHANG) == p->pid) break;
    usleep(1000);
  }
  fprintf(stderr, "%s: progress never reached step %ld\n", p->tag, step);
  return -1;
}

/* Waits for p with a deadline, killing it after; its exit status (128+N for signal N). */
static int reap(proc *p, double timeout_s) {
  double end = now_s() + timeout_s;
  int st = 0;
  pid_t got = 0;
  while ((got = waitpid(p->pid, &st, WNOHANG)) == 0 && now_s() < end) usleep(10000);
  if (got == 0) {
    fprintf(stderr, "%s: still running after %.0f s, killed\n", p->tag, timeout_s);
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
  }
  if (p->ctl >= 0) close(p->ctl);
  p->ctl = -1;
  return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

static char *out_of(const char *tag) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.out", tmp, tag);
  return spawn_slurp(path);
}

/* Every step's loss and world from a metrics file (a step written twice: the later line). */
static int metrics_of(const char *path, double loss[MAXSTEPS], int world[MAXSTEPS]) {
  char *j = spawn_slurp(path);
  int n = 0;
  for (const char *p = j; (p = strstr(p, "{\"step\":")) != NULL; p++) {
    int step = atoi(p + 8);
    const char *l = strstr(p, "\"loss\":"), *w = strstr(p, "\"world\":");
    if (l && w && step > 0 && step < MAXSTEPS) {
      loss[step] = atof(l + 7);
      world[step] = atoi(w + 8);
      n++;
    }
  }
  free(j);
  return n;
}

static int same_file(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  int same = fa != NULL && fb != NULL;
  while (same) {
    int ca = fgetc(fa), cb = fgetc(fb);
    if (ca != cb) same = 0;
    if (ca == EOF || cb == EOF) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return same;
}

typedef struct reform_case {
  const char *name;
  const char *compress;  /* --grad-compress */
  const char *transport; /* COHORT_TRANSPORT */
  int victim;            /* the rank lost */
  int kill_at;           /* after the victim's progress reaches this step */
  int psgd_start;        /* --powersgd-start */
  /* > 0: the newcomer catches up while the survivors train (--grad-compress none), its state
   * streamed at this many bytes per second (COHORT_STREAM_RATE): slow, so that the survivors
   * train steps before it contributes. */
  long rate;
  /* > 0: the newcomer contributes no sooner than this many steps after its join, however soon its
   * state is in (COHORT_GPT2_TEST_HOLD). */
  int hold;
  /* 1: the newcomer catches up across PowerSGD's start step (joins in the warm-up, contributes
   * after a compressing step). */
  int cross;
  /* The newcomer's rank at the grow (the survivors keep their order around it): 2, the last, or
   * below the survivors' ranks, 0 or 1. */
  int newrank;
} reform_case;

/* The case that runs (run_case's): > 0, every step takes this many ms more
 * (COHORT_GPT2_TEST_STEP_MS) and the grow comes as one begins, within the share of it that
 * breaks it (COHORT_GROW_BREAK=0.9): the step is dropped. 0: grows are deferred
 * (COHORT_GROW_BREAK=0). */
static int break_ms;

/* One run of a case: its job, its files (named by `kind`: live, or chain for the runs chained by
 * checkpoints, which share them) and the trainer's arguments, which point into the rest. */
typedef struct run_setup {
  char job[64], metrics[512], ckpt[512], steps[16], psgd[16];
  const char *args[40];
} run_setup;

static void setup_run(run_setup *u, const reform_case *c, const char *kind, int part, long steps) {
  if (part >= 0)
    snprintf(u->job, sizeof u->job, "%s.%s%d", c->name, kind, part);
  else
    snprintf(u->job, sizeof u->job, "%s.%s", c->name, kind);
  snprintf(u->metrics, sizeof u->metrics, "%s/%s.%s.jsonl", tmp, c->name, kind);
  snprintf(u->ckpt, sizeof u->ckpt, "%s/%s.%s.ckpt", tmp, c->name, kind);
  snprintf(u->steps, sizeof u->steps, "%ld", steps);
  snprintf(u->psgd, sizeof u->psgd, "%d", c->psgd_start);
  const char *base[] = {"--model",
                        "tiny",
                        "--seq-len",
                        "32",
                        "--batch",
                        "2",
                        "--data",
                        "/usr/share/common-licenses/GPL-3",
                        "--lr",
                        "3e-3",
                        "--schedule",
                        "const",
                        "--warmup",
                        "2",
                        "--grad-compress",
                        c->compress,
                        "--powersgd-start",
                        u->psgd,
                        "--bucket-mb",
                        "1",
                        "--quiet",
                        "--steps",
                        u->steps,
                        "--metrics",
                        u->metrics,
                        "--ckpt-dir",
                        u->ckpt,
                        "--ckpt-every",
                        "1000",
                        NULL};
  int n = 0;
  for (; base[n] != NULL; n++) u->args[n] = base[n];
  u->args[n] = NULL;
}

/* The live run's three ranks started on their control channels (rank 0 with
 * COHORT_GPT2_TEST_FAIL=fail unless NULL), each one's hello awaited: 1 when all said it. */
static int start_live(const reform_case *c, run_setup *u, const char *fail, proc p[3]) {
  char tag[80], msg[1024];
  for (int r = 0; r < 3; r++) {
    snprintf(tag, sizeof tag, "%s.live.r%d", c->name, r);
    if (r == 0 && fail != NULL) setenv("COHORT_GPT2_TEST_FAIL", fail, 1);
    p[r] = spawn_rank(tag, r, 3, u->job, 0, 1, 0, c->transport, u->args);
    unsetenv("COHORT_GPT2_TEST_FAIL");
  }
  int ok = 1;
  for (int r = 0; r < 3; r++) ok &= expect(&p[r], "hello", msg, sizeof msg, 60) == 0;
  return ok;
}

/* Every step's loss and world of a run (metrics_of) and its lines. */
typedef struct run_metrics {
  double loss[MAXSTEPS];
  int world[MAXSTEPS];
  int lines;
} run_metrics;

/* The live run beside the chained runs: 1 when their final checkpoints are the same bytes (both
 * named on stderr when not); each one's metrics. */
static int compare_runs(const reform_case *c, run_metrics *live, run_metrics *chain) {
  char a[512], b[512];
  snprintf(a, sizeof a, "%s/%s.live.ckpt/ckpt_%012d.bin", tmp, c->name, STEPS);
  snprintf(b, sizeof b, "%s/%s.chain.ckpt/ckpt_%012d.bin", tmp, c->name, STEPS);
  int same = same_file(a, b);
  if (!same) fprintf(stderr, "%s: %s and %s differ\n", c->name, a, b);
  *live = *chain = (run_metrics){.lines = 0};
  snprintf(a, sizeof a, "%s/%s.live.jsonl", tmp, c->name);
  snprintf(b, sizeof b, "%s/%s.chain.jsonl", tmp, c->name);
  live->lines = metrics_of(a, live->loss, live->world);
  chain->lines = metrics_of(b, chain->loss, chain->world);
  return same;
}

/* The step a re-form line of `out` names for `epoch`, or -1. */
static long reform_step(const char *out, int epoch, int from, int to) {
  char want[96];
  snprintf(want, sizeof want, "re-formed (epoch %d): world %d -> %d at step ", epoch, from, to);
  const char *p = strstr(out, want);
  return p ? atol(p + strlen(want)) : -1;
}

/* The survivors s[0..1] (the victim lost) re-form as 2; `on` steps later the membership of 2
 * ends and a newcomer, started here as s[2], joins as rank c->newrank (the survivors in their
 * order around it). 1 when every message came. */
static int shrink_grow(const reform_case *c, run_setup *u, int victim, int on, proc *s) {
  char tag[80], msg[1024];
  int ok = 1;
  for (int i = 0; i < 2; i++)
    ok = ok && say(&s[i], "reshape epoch=0 why=rank %d lost", victim) == 0;
  for (int i = 0; i < 2; i++) ok = ok && expect(&s[i], "ready", msg, sizeof msg, 60) == 0;
  for (int i = 0; i < 2; i++) ok = ok && form(&s[i], 1, i, 2, u->job) == 0;
  for (int i = 0; i < 2; i++) ok = ok && expect(&s[i], "formed", msg, sizeof msg, 60) == 0;
  ok = ok && wait_progress(&s[0], progress(&s[0]) + on, 60) == 0;
  /* Held while it is sent: a tiny step takes milliseconds, and this process, descheduled under
   * load, once let them train to the end before the reshape came. Breaking, sent as a slow step
   * begins (its progress just written), unheld: a stop would spend its window. */
  for (int i = 0; i < 2 && !break_ms; i++) kill(s[i].pid, SIGSTOP);
  for (int i = 0; i < 2; i++) ok = ok && say(&s[i], "reshape epoch=1 grow=1 why=a node joins") == 0;
  for (int i = 0; i < 2 && !break_ms; i++) kill(s[i].pid, SIGCONT);
  for (int i = 0; i < 2; i++) ok = ok && expect(&s[i], "ready", msg, sizeof msg, 60) == 0;
  snprintf(tag, sizeof tag, "%s.live.new", c->name);
  char hold[32];
  snprintf(hold, sizeof hold, "%d", c->hold);
  if (c->hold > 0) setenv("COHORT_GPT2_TEST_HOLD", hold, 1);
  s[2] = spawn_rank(tag, c->newrank, 3, u->job, 2, 1, 1, c->transport, u->args);
  unsetenv("COHORT_GPT2_TEST_HOLD");
  for (int i = 0; i < 2; i++) ok = ok && form(&s[i], 2, i < c->newrank ? i : i + 1, 3, u->job) == 0;
  for (int i = 0; i < 2; i++) ok = ok && expect(&s[i], "formed", msg, sizeof msg, 60) == 0;
  return ok;
}

/* How the join of the newcomer went, from rank 0's epoch-2 line (60 s at most; the ranks may still
 * run): 1 when the grow dropped no step (deferred to a step boundary every rank agreed on, so no
 * survivor is behind) and the newcomer alone gets the state, in the background with the plain
 * exchange and PowerSGD; else 0 (the line on stderr). */
static int grow_join_ok(const reform_case *c, const proc *r0) {
  int plain = strcmp(c->compress, "bf16") != 0; /* the exchanges that catch up */
  for (int i = 0; i < 600; i++) {
    char *out = out_of(r0->tag), *at = strstr(out, "re-formed (epoch 2)");
    char *end = at != NULL ? strchr(at, '\n') : NULL;
    if (end != NULL) *end = '\0';
    const char *step = break_ms ? "(step in flight dropped)" : "(step in flight none)";
    int ok = end != NULL && strstr(at, step) != NULL &&
             (strstr(at, "), 1 rank(s) catching up: ") != NULL ||
              (!plain && strstr(at, "), 1 rank(s) received ") != NULL));
    if (end != NULL && !ok) fprintf(stderr, "%s: the grow's line: %s\n", c->name, at);
    free(out);
    if (end != NULL) return ok;
    usleep(100000);
  }
  fprintf(stderr, "%s: no re-form line for the grow\n", c->name);
  return 0;
}

/* Rank 0's catch-up lines: of the state's B bytes, rank 0 (donor 0 of the 2 survivors) held a
 * copy of its share only, ceil(B/2) bytes, not a snapshot of the whole state. A rank 0 that caught
 * up itself held none and says nothing of it. */
static void check_share_copy(const char *out, int donor) {
  const char *b = strstr(out, "1 rank(s) catching up: ");
  const char *h = strstr(out, "a copy of its share only: ");
  CHECK(b != NULL && (h != NULL) == donor);
  if (b == NULL || h == NULL) return;
  unsigned long long bytes = strtoull(b + strlen("1 rank(s) catching up: "), NULL, 10);
  unsigned long long held = strtoull(h + strlen("a copy of its share only: "), NULL, 10);
  if (held != bytes / 2 + bytes % 2) fprintf(stderr, "copy of %llu of %llu bytes\n", held, bytes);
  CHECK(bytes > 0 && held == bytes / 2 + bytes % 2);
}

/* The live run: 3 ranks, the victim lost at kill_at, a newcomer a few steps after the first
 * re-form. Sets N and M, the steps the re-forms went on from. */
static int live(const reform_case *c, long *N, long *M) {
  char rate[32];
  run_setup u;
  setup_run(&u, c, "live", -1, STEPS);
  proc p[3];
  snprintf(rate, sizeof rate, "%ld", c->rate);
  if (c->rate > 0) setenv("COHORT_STREAM_RATE", rate, 1);
  char slow[16];
  snprintf(slow, sizeof slow, "%d", break_ms);
  if (break_ms) setenv("COHORT_GPT2_TEST_STEP_MS", slow, 1);
  if (break_ms) setenv("COHORT_GROW_BREAK", "0.9", 1);
  int ok = start_live(c, &u, NULL, p);
  unsetenv("COHORT_STREAM_RATE");
  /* The loss: the victim killed as soon as it completed step kill_at. */
  ok = ok && wait_progress(&p[c->victim], c->kill_at, 60) == 0;
  kill(p[c->victim].pid, SIGKILL);
  CHECK_EQ_INT(reap(&p[c->victim], 10), 128 + SIGKILL);
  proc s[3];
  int ns = 0;
  for (int r = 0; r < 3; r++)
    if (r != c->victim) s[ns++] = p[r];
  ok = ok && shrink_grow(c, &u, c->victim, 2, s);
  unsetenv("COHORT_GPT2_TEST_STEP_MS");
  setenv("COHORT_GROW_BREAK", "0", 1);
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(reap(&s[i], 120), 0);
  CHECK(ok);
  char *out = out_of(s[0].tag);
  *N = reform_step(out, 1, 3, 2);
  /* From the grow on, rank 0 is the newcomer when it joined as rank 0. */
  const proc *r0 = c->newrank == 0 ? &s[2] : &s[0];
  if (c->newrank == 0) {
    free(out);
    out = out_of(r0->tag);
  }
  *M = reform_step(out, 2, 2, 3);
  if (*N < c->kill_at || *M <= *N || *M >= STEPS) fprintf(stderr, "%s: %s\n", c->name, out);
  CHECK(*N >= c->kill_at && *M > *N && *M < STEPS);
  CHECK(strstr(out, "summary: ") != NULL);
  CHECK(grow_join_ok(c, r0));
  /* Caught up in the background (the plain exchange, PowerSGD), or received at the re-form
   * (bf16): rank 0 names the ranks that caught up, and the newcomer says it replayed. */
  char who[64], *nout = out_of(s[2].tag);
  snprintf(who, sizeof who, "rank(s) %d-%d caught up: ", c->newrank, c->newrank);
  int streamed = strstr(out, "1 rank(s) catching up: ") != NULL && strstr(out, who) != NULL &&
                 strstr(nout, "(newcomer): caught up: snapshot of step ") != NULL;
  if (c->rate > 0 && !streamed) fprintf(stderr, "%s: %s\n%s\n", c->name, out, nout);
  CHECK(c->rate == 0 || streamed);
  if (streamed) check_share_copy(out, c->newrank != 0);
  CHECK(strcmp(c->compress, "bf16") != 0 || !streamed);
  free(nout);
  free(out);
  /* The new memberships' gradient buffers are shared again (cohort_mem_alloc after each re-form:
   * the single-copy path over shared memory). */
  char path[600];
  snprintf(path, sizeof path, "%s/%s.err", tmp, r0->tag);
  char *err = spawn_slurp(path);
  CHECK(strstr(err, "gradients in private memory") == NULL);
  free(err);
  return ok;
}

/* One run of the chain: `world` ranks from the checkpoint (if any) to `to`. */
static int chain_run(const reform_case *c, int world, long to, int part) {
  char tag[80];
  run_setup u;
  setup_run(&u, c, "chain", part, to);
  proc p[3];
  for (int r = 0; r < world; r++) {
    snprintf(tag, sizeof tag, "%s.chain%d.r%d", c->name, part, r);
    p[r] = spawn_rank(tag, r, world, u.job, 0, 0, 0, c->transport, u.args);
  }
  int ok = 1;
  for (int r = 0; r < world; r++) ok &= reap(&p[r], 120) == 0;
  return ok;
}

/* The last step that 2 ranks trained: M, or later when the newcomer caught up meanwhile (its
 * steps count as the survivors' world: the metrics say 2). */
static long last_of_two(const reform_case *c, long M) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.live.jsonl", tmp, c->name);
  static run_metrics lv;
  lv = (run_metrics){.lines = 0};
  metrics_of(path, lv.loss, lv.world);
  long K = M;
  for (long st = M + 1; st <= STEPS && lv.world[st] == 2; st++) K = st;
  return K;
}

/* PowerSGD with the newcomer below the survivors' ranks: its error feedback (zero) sits at its
 * rank, the survivors' at theirs, where a checkpoint resumed on more ranks gives the first ranks
 * the errors and the last a zero one; so from its first step the run is not the chained one (a
 * run of its own, with each rank's error where it is). Up to then (the steps at world 2 while it
 * caught up, step K the last) every loss equals the chain's bit for bit, and its replay gave it
 * the donors' parameters (the trainer checks them and fails otherwise); after K all three train,
 * every step's line once. */
static void caught_up_below(const reform_case *c, long N, long K) {
  static run_metrics lv, ch;
  char path[512];
  snprintf(path, sizeof path, "%s/%s.live.jsonl", tmp, c->name);
  lv.lines = metrics_of(path, lv.loss, lv.world);
  snprintf(path, sizeof path, "%s/%s.chain.jsonl", tmp, c->name);
  ch.lines = metrics_of(path, ch.loss, ch.world);
  CHECK_EQ_INT(ch.lines, K);
  CHECK_EQ_INT(lv.lines, STEPS);
  int losses = 1, worlds = 1;
  for (int st = 1; st <= STEPS; st++) {
    losses &= st > K || lv.loss[st] == ch.loss[st];
    worlds &= lv.world[st] == (st <= N || st > K ? 3 : 2);
  }
  if (!losses || !worlds)
    fprintf(stderr, "%s: re-forms at %ld, world 3 again after %ld\n", c->name, N, K);
  CHECK(losses);
  CHECK(worlds);
  CHECK(K < STEPS && lv.loss[1] != lv.loss[STEPS]);
}

static void run_case(const reform_case *c) {
  long N = -1, M = -1;
  int ok = live(c, &N, &M);
  CHECK(ok);
  if (!ok) return;
  long K = last_of_two(c, M);
  /* Slowly streamed, the survivors train at least one step before the newcomer contributes. */
  if (c->rate > 0) CHECK(K > M);
  if (c->hold > 0 && K < M + c->hold)
    fprintf(stderr, "%s: caught up over steps %ld-%ld, held %d\n", c->name, M + 1, K, c->hold);
  if (c->hold > 0) CHECK(K >= M + c->hold);
  /* Its steps at world 2 (0-based M to K - 1) run the warm-up's plain exchange, then compress. */
  if (c->cross && !(M < c->psgd_start && K > c->psgd_start))
    fprintf(stderr, "%s: caught up over steps %ld-%ld, PowerSGD from %d\n", c->name, M + 1, K,
            c->psgd_start + 1);
  if (c->cross) CHECK(M < c->psgd_start && K > c->psgd_start);
  CHECK(chain_run(c, 3, N, 0));
  CHECK(chain_run(c, 2, K, 1));
  if (strcmp(c->compress, "powersgd") == 0 && c->newrank != 2) {
    caught_up_below(c, N, K);
    return;
  }
  CHECK(chain_run(c, 3, STEPS, 2));
  static run_metrics lv, ch;
  int same = compare_runs(c, &lv, &ch);
  if (!same)
    fprintf(stderr, "%s: re-forms at %ld, %ld, world 3 again after %ld\n", c->name, N, M, K);
  CHECK(same);
  CHECK_EQ_INT(ch.lines, STEPS);
  int losses = 1, worlds = 1;
  for (int st = 1; st <= STEPS; st++) {
    losses &= lv.loss[st] == ch.loss[st];
    worlds &= lv.world[st] == (st <= N || st > K ? 3 : 2) && lv.world[st] == ch.world[st];
  }
  CHECK(losses);
  CHECK(worlds);
  /* Caught up in the background, rank 0 (a survivor, or the newcomer from its join on: the line of
   * the join's step from the report the lowest donor hands it) wrote every step's line once. */
  if (c->rate > 0) CHECK_EQ_INT(lv.lines, STEPS);
  /* Training moved. */
  CHECK(lv.loss[1] != lv.loss[STEPS]);
}

/*
 * A survivor a step behind (COHORT_GPT2_TEST_FAIL): rank 0's step K completes all its collectives,
 * then fails as when a peer is lost right after them, once ranks 1 and 2 completed K too; it
 * starts the re-form (`ready` with step K-1; the others say K). The ranks go on from K: rank 0
 * counts as new and receives K's state, and writes K's metrics line from the report that came
 * with it; no step is computed again, so the run ends bit for bit where a run without the
 * failure ends, every step's line once. On the way a membership ends while the ranks connect it
 * (they go round again).
 */
static void run_behind(const reform_case *c) {
  char msg[1024], go[600], fail[700];
  run_setup u;
  setup_run(&u, c, "live", -1, STEPS);
  const char *job = u.job;
  snprintf(go, sizeof go, "%s/%s.go", tmp, c->name);
  snprintf(fail, sizeof fail, "%d:%s", c->kill_at, go);
  proc p[3];
  int ok = start_live(c, &u, fail, p);
  for (int r = 1; r < 3; r++) ok = ok && wait_progress(&p[r], c->kill_at, 60) == 0;
  close(open(go, O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  char want[64];
  ok = ok && expect(&p[0], "ready", msg, sizeof msg, 60) == 0;
  snprintf(want, sizeof want, "ready epoch=0 step=%d", c->kill_at - 1);
  CHECK_STREQ(msg, want);
  for (int r = 1; r < 3; r++) ok = ok && say(&p[r], "reshape epoch=0 why=rank 0 failed") == 0;
  snprintf(want, sizeof want, "ready epoch=0 step=%d", c->kill_at);
  for (int r = 1; r < 3; r++) {
    ok = ok && expect(&p[r], "ready", msg, sizeof msg, 60) == 0;
    CHECK_STREQ(msg, want);
  }
  /* Membership 1 never connects (its rank 3 never comes) and ends while the ranks connect: they
   * go round again (cohort_comm_reform's COHORT_ERESHAPED is no failure). */
  for (int r = 0; r < 3; r++) ok = ok && form(&p[r], 1, r, 4, job) == 0;
  usleep(300000);
  for (int r = 0; r < 3; r++) ok = ok && say(&p[r], "reshape epoch=1 why=rank 3 lost") == 0;
  for (int r = 0; r < 3; r++) ok = ok && expect(&p[r], "ready", msg, sizeof msg, 60) == 0;
  for (int r = 0; r < 3; r++) ok = ok && form(&p[r], 2, r, 3, job) == 0;
  for (int r = 0; r < 3; r++) ok = ok && expect(&p[r], "formed", msg, sizeof msg, 60) == 0;
  for (int r = 0; r < 3; r++) CHECK_EQ_INT(reap(&p[r], 120), 0);
  CHECK(ok);
  char *out = out_of(p[0].tag);
  long at = reform_step(out, 2, 3, 3);
  if (at != c->kill_at || strstr(out, "1 rank(s) received") == NULL) fprintf(stderr, "%s\n", out);
  CHECK_EQ_INT(at, c->kill_at);
  CHECK(strstr(out, "1 rank(s) received") != NULL);
  free(out);
  /* The same run without the failure. */
  CHECK(chain_run(c, 3, STEPS, 0));
  static run_metrics lv, ch;
  CHECK(compare_runs(c, &lv, &ch));
  CHECK_EQ_INT(lv.lines, STEPS); /* every step's line once, K's included */
  CHECK_EQ_INT(ch.lines, STEPS);
  int same = 1;
  for (int st = 1; st <= STEPS; st++)
    same &= lv.loss[st] == ch.loss[st] && lv.world[st] == 3 && ch.world[st] == 3;
  if (!same || lv.loss[c->kill_at] == 0.0)
    fprintf(stderr, "%s: step %d's line: loss %g\n", c->name, c->kill_at, lv.loss[c->kill_at]);
  CHECK(same);
}

/*
 * The donor lost while the newcomer catches up: 3 ranks, rank 2 lost at kill_at, a newcomer joins
 * the 2 survivors and its state streams slowly from rank 0; a second into it, rank 0 is killed
 * too. The newcomer's stream fails (no hang), the two left re-form
 * (the survivor as rank 0, the newcomer as rank 1), the newcomer catches up from the new rank 0,
 * and the run ends well with its last step's line. The grow, deferred to a step boundary, catches
 * no survivor a step behind: the newcomer always catches up in the background.
 */
static void run_donor_lost(const reform_case *c) {
  char msg[1024], rate[32];
  run_setup u;
  setup_run(&u, c, "live", -1, STEPS);
  const char *job = u.job;
  proc p[3];
  snprintf(rate, sizeof rate, "%ld", c->rate);
  setenv("COHORT_STREAM_RATE", rate, 1);
  int ok = start_live(c, &u, NULL, p);
  ok = ok && wait_progress(&p[2], c->kill_at, 60) == 0;
  kill(p[2].pid, SIGKILL);
  CHECK_EQ_INT(reap(&p[2], 10), 128 + SIGKILL);
  ok = ok && shrink_grow(c, &u, 2, 1, p);
  unsetenv("COHORT_STREAM_RATE");
  if (!ok || !grow_join_ok(c, &p[0])) {
    CHECK(!"the grow's join caught up in the background");
    for (int i = 0; i < 3; i++) reap(&p[i], 120);
    return;
  }
  /* The survivors train at world 2 while the state streams (the tiny model's steps to the end,
   * where they wait for it); a second into the stream's 4 the donor is lost. */
  usleep(1000000);
  kill(p[0].pid, SIGKILL);
  CHECK_EQ_INT(reap(&p[0], 10), 128 + SIGKILL);
  for (int i = 1; i < 3; i++) ok = ok && say(&p[i], "reshape epoch=2 why=rank 0 lost") == 0;
  for (int i = 1; i < 3; i++) ok = ok && expect(&p[i], "ready", msg, sizeof msg, 60) == 0;
  for (int i = 1; i < 3; i++) ok = ok && form(&p[i], 3, i - 1, 2, job) == 0;
  for (int i = 1; i < 3; i++) ok = ok && expect(&p[i], "formed", msg, sizeof msg, 60) == 0;
  for (int i = 1; i < 3; i++) CHECK_EQ_INT(reap(&p[i], 120), 0);
  CHECK(ok);
  char *out = out_of(p[1].tag), *nout = out_of(p[2].tag);
  char path[600];
  snprintf(path, sizeof path, "%s/%s.err", tmp, p[2].tag);
  char *nerr = spawn_slurp(path);
  /* Caught up twice begun, once ended: from the survivor, now rank 0. */
  int good = strstr(out, "re-formed (epoch 3): world 3 -> 2") != NULL &&
             strstr(out, "1 rank(s) catching up") != NULL && strstr(out, "caught up") != NULL &&
             strstr(nout, "caught up") != NULL &&
             strstr(nerr, "the state stream from the donors failed") != NULL;
  if (!good) fprintf(stderr, "%s:\n%s\n%s\n%s\n", c->name, out, nout, nerr);
  CHECK(good);
  free(out);
  free(nout);
  free(nerr);
  static run_metrics lv;
  snprintf(path, sizeof path, "%s/%s.live.jsonl", tmp, c->name);
  lv.lines = metrics_of(path, lv.loss, lv.world);
  CHECK(lv.lines >= STEPS && lv.loss[STEPS] != 0.0);
}

/* ZeRO-1 shards the optimiser state: under re-form it is refused at start with one line. */
static void zero_refused(void) {
  const char *args[] = {"--model", "tiny", "--steps", "2", "--zero", "1", NULL};
  proc p = spawn_rank("zero", 0, 2, "zero", 0, 1, 0, "tcp", args);
  CHECK_EQ_INT(reap(&p, 60), 2);
  char path[512];
  snprintf(path, sizeof path, "%s/zero.err", tmp);
  char *err = spawn_slurp(path);
  CHECK(strstr(err, "--zero 1 cannot re-form") != NULL);
  CHECK(strchr(err, '\n') == strrchr(err, '\n'));
  free(err);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_gpt2_reform PATH/TO/cohort-gpt2\n");
    return 2;
  }
  bin = argv[1];
  const char *only = argc > 2 ? argv[2] : ""; /* the cases whose names start so */
  signal(SIGPIPE, SIG_IGN);
  snprintf(tmp, sizeof tmp, "/tmp/test_gpt2_reform.XXXXXX");
  if (mkdtemp(tmp) == NULL) return 1;
  store_server *srv = NULL;
  store_server_opts so = {.bind_host = "127.0.0.1"};
  if (store_server_start(&so, &srv) != 0) {
    fprintf(stderr, "cannot start a store\n");
    return 1;
  }
  store_port = store_server_port(srv);
  snprintf(store_addr, sizeof store_addr, "127.0.0.1:%d", store_port);
  if (only[0] == '\0') zero_refused();
  setenv("COHORT_GROW_BREAK", "0", 1); /* grows deferred, but where a case says otherwise */
  static const reform_case cases[] = {
      {"none-shm", "none", "shm", 1, 3, 10, 0, 0, 0, 2},
      {"none-tcp", "none", "tcp", 0, 3, 10, 0, 0, 0, 2},
      {"bf16-shm", "bf16", "shm", 0, 3, 10, 0, 0, 0, 2},
      {"bf16-tcp", "bf16", "tcp", 1, 3, 10, 0, 0, 0, 2},
      {"psgd-shm", "powersgd", "shm", 2, 4, 2, 0, 0, 0, 2},
      {"psgd-tcp", "powersgd", "tcp", 2, 4, 2, 0, 0, 0, 2},
      /* Lost during PowerSGD's warm-up (plain exchange to step 8), compressing after. */
      {"psgd-warmup", "powersgd", "shm", 2, 2, 8, 0, 0, 0, 2},
      /* The newcomer catches up while the survivors train: its state streamed slowly. */
      {"catchup-tcp", "none", "tcp", 1, 3, 10, 30000000, 0, 0, 2},
      {"catchup-shm", "none", "shm", 2, 3, 10, 30000000, 0, 0, 2},
      /* The same with PowerSGD: the newcomer's factors -0.0, its replay from the kept factors; it
       * contributes 6 steps after its join (a test's hold), so it replays 6 compressing steps. */
      {"catchup-psgd-tcp", "powersgd", "tcp", 2, 2, 2, 30000000, 6, 0, 2},
      {"catchup-psgd-shm", "powersgd", "shm", 2, 2, 2, 30000000, 6, 0, 2},
      /* It joins in the warm-up (after step 4) and catches up across the start step (7): 2
       * steps of the plain exchange, 2 compressing. */
      {"catchup-psgd-cross", "powersgd", "tcp", 2, 1, 6, 30000000, 4, 1, 2},
      /* The newcomer below the survivors' ranks (a replacement for a lost rank 0, or a node that
       * planned the round first): rank 0, or rank 1 between them. */
      {"catchup-r0-tcp", "none", "tcp", 1, 3, 10, 30000000, 0, 0, 0},
      {"catchup-r0-shm", "none", "shm", 2, 3, 10, 30000000, 0, 0, 0},
      {"catchup-mid-tcp", "none", "tcp", 2, 3, 10, 30000000, 0, 0, 1},
      /* PowerSGD, the newcomer rank 0: bit for bit up to its first step (caught_up_below). */
      {"catchup-r0-psgd", "powersgd", "tcp", 2, 2, 2, 30000000, 6, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (strncmp(cases[i].name, only, strlen(only)) == 0) run_case(&cases[i]);
  /* The grow comes early in a slow step, which it breaks. */
  static const reform_case brk = {"break-tcp", "none", "tcp", 1, 3, 10, 0, 0, 0, 2};
  break_ms = 400;
  if (strncmp(brk.name, only, strlen(only)) == 0) run_case(&brk);
  break_ms = 0;
  /* A survivor behind: PowerSGD (its error as the completed step left it) and the plain exchange.
   */
  static const reform_case behind[] = {
      {"behind-psgd", "powersgd", "tcp", 0, 5, 2, 0, 0, 0, 2},
      {"behind-none", "none", "shm", 0, 5, 10, 0, 0, 0, 2},
  };
  for (size_t i = 0; i < sizeof behind / sizeof behind[0]; i++)
    if (strncmp(behind[i].name, only, strlen(only)) == 0) run_behind(&behind[i]);
  /* The donor lost mid-stream: 1.6 MB at 400 kB/s, about 4 s. */
  static const reform_case donor = {"donor-lost", "none", "tcp", 2, 3, 10, 400000, 0, 0, 2};
  if (strncmp(donor.name, only, strlen(only)) == 0) run_donor_lost(&donor);
  store_server_stop(srv);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", tmp);
  return check_report();
}

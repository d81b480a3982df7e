/*
 * test_reform_coll.c - re-forming libcohort communicators (cohort_comm_reform,
 * the control channel, the state transfer) with real processes; the test
 * plays the agent.
 *
 * The parent hosts a store (store_fork.h), makes one socketpair(SEQPACKET)
 * per worker and keeps the agent's end, forks workers that create their
 * communicators with COHORT_CONTROL_FD naming the other end, and drives them
 * with the agent's messages (reshape, form, stop). Parent and workers share
 * one page (MAP_SHARED) for the expectations of the next membership, the
 * workers' progress and their timings; every worker checks its own results
 * and exits non-zero when one is wrong.
 *
 *   test_reform_coll unit       the message parser; no channel: -ENOTSUP; a
 *                               bad COHORT_CONTROL_FD; malformed messages,
 *                               stop and a closed channel; a rank started
 *                               ahead (COHORT_AWAIT_FORM=1: no rank variables,
 *                               hello with await_form=1, its first membership
 *                               ended while connecting, the next joined and
 *                               the state received); the same for a
 *                               replacement not started ahead (its rank
 *                               variables given, its first membership ended
 *                               inside cohort_comm_create); a reshape between
 *                               collectives; a reshape while connecting a
 *                               membership, and one that never connects;
 *                               20 re-forms in a row leave no fd,
 *                               /dev/shm mapping or thread behind (tcp, shm).
 *   test_reform_coll kill T     (T: tcp, shm, single) kill -9 of a rank
 *                               mid-allreduce: ERESHAPED on every survivor
 *                               fast; shrink, grow with a newcomer and hand it
 *                               the state; the donor killed mid-transfer:
 *                               ERESHAPED, another survivor donates; stop.
 *   test_reform_coll idle T     (T: tcp, shm) kill -9 of a rank while the
 *                               others are between collectives: both say
 *                               `broken` before they call a collective
 *                               (the peer watch); after the re-form a
 *                               peer's destroy is a goodbye, not a loss.
 *   test_reform_coll grow T     (T: tcp, shm) grows deferred
 *                               (cohort_comm_defer_grow): a grow reshape during
 *                               an allreduce ends no collective; the ranks agree
 *                               on a boundary and re-form there with a newcomer;
 *                               a loss while a grow is pending, a grow past
 *                               COHORT_GROW_DEFER_MS, and one not deferred end
 *                               the membership (ERESHAPED) as today.
 *   test_reform_coll break T    (T: tcp, shm) a grow within the program's break
 *                               window (cohort_comm_grow_break_for) ends the
 *                               allreduce in flight at once (ERESHAPED, its
 *                               peer stopped); one after the window is
 *                               deferred; opening a window with a grow
 *                               pending ends the membership then.
 *   test_reform_coll reshape T  a rank stopped (SIGSTOP): the agent's reshape
 *                               makes the survivors' allreduce return
 *                               ERESHAPED within a second of the message;
 *                               a survivor told later, which learns of it
 *                               from a peer's connection (in a collective,
 *                               and between collectives), names the
 *                               agent's reason too.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "check.h"
#include "coll/coll.h"
#include "coll/control.h"
#include "cohort/cohort.h"
#include "store_fork.h"

#define MAXW 8
#define OP_TIMEOUT_MS 30000 /* the operation timeout a lost peer must never cost */
#define FAST_MS 10000       /* "not the timeout": kill -9 to ERESHAPED */
#define MSG_FAST_MS 5000    /* reshape message to ERESHAPED (expected: milliseconds) */
#define STATE_BYTES (32u << 20)
#define XFER_MID (STATE_BYTES / 2) /* the newcomer short of this: the donor has more to send */
#define KILL_TRIES 20              /* rounds of the donor-kill scenario before it gives up */
#define PHASE_DONE 1000            /* a worker's phase once through its last collective */

/* What parent and workers share. */
typedef struct slot {
  _Atomic int phase;       /* the worker's progress (scenario-specific) */
  _Atomic int go;          /* the parent's permission to go on */
  _Atomic long long t_err; /* base_now_ms() when a collective returned its error */
  _Atomic int err;         /* that error */
  _Atomic int want_rank, want_size, want_epoch, want_new; /* of the next membership */
  _Atomic long long xfer_us; /* the state transfer's duration on a newcomer */
  char errmsg[300];
} slot;

typedef struct shared {
  slot s[MAXW];
  unsigned char state[STATE_BYTES]; /* a newcomer's state buffer the parent can watch */
} shared;

static shared *g_sh;
static char g_store[64];
static char g_job[64];
static cohort_transport g_tport;
static int g_single; /* buffers from cohort_mem_alloc (the single-copy path) */
static int g_agent[MAXW] = {-1, -1, -1, -1, -1, -1, -1, -1};  /* the agent's ends */
static int g_worker[MAXW] = {-1, -1, -1, -1, -1, -1, -1, -1}; /* the workers' ends */
static pid_t g_pid[MAXW];

/* ---- the fake agent's side ---- */

static int agent_send(int w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int agent_send(int w, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return send(g_agent[w], msg, (size_t)n, MSG_NOSIGNAL) == n ? 0 : -1;
}

static int agent_send_raw(int w, const void *buf, size_t len) {
  return send(g_agent[w], buf, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

/* The `broken` messages read from each worker, and the last one's text. */
static int g_broken[MAXW];
static char g_broken_msg[MAXW][200];

/* Reads messages from worker w until one starts with verb (copied into out): 0, or -1 after
 * timeout_ms or when the channel ends. A `broken` on the way is counted. */
static int agent_expect(int w, const char *verb, int timeout_ms, char *out, size_t outlen) {
  int64_t end = base_now_ms() + timeout_ms;
  for (;;) {
    struct pollfd p = {.fd = g_agent[w], .events = POLLIN};
    int left = (int)(end - base_now_ms());
    if (left <= 0 || poll(&p, 1, left) <= 0) break;
    char buf[1100];
    ssize_t n = recv(g_agent[w], buf, sizeof buf - 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) break;
    buf[n] = '\0';
    if (strncmp(buf, "broken ", 7) == 0) {
      g_broken[w]++;
      base_strlcpy(g_broken_msg[w], buf, sizeof g_broken_msg[w]);
    }
    size_t vl = strlen(verb);
    if (strncmp(buf, verb, vl) == 0 && (buf[vl] == ' ' || buf[vl] == '\0')) {
      if (out != NULL) base_strlcpy(out, buf, outlen);
      return 0;
    }
  }
  fprintf(stderr, "agent: no '%s' from worker %d\n", verb, w);
  return -1;
}

/* The form of membership e for worker w: rank r of n. */
static int agent_form(int w, int e, int r, int n) {
  atomic_store(&g_sh->s[w].want_rank, r);
  atomic_store(&g_sh->s[w].want_size, n);
  atomic_store(&g_sh->s[w].want_epoch, e);
  return agent_send(w,
                    "form epoch=%d rank=%d size=%d local_rank=%d local_size=%d node_rank=0 "
                    "nnodes=1 store=%s job=%s master_addr=127.0.0.1 master_port=29500",
                    e, r, n, r, n, g_store, g_job);
}

static int wait_phase(int w, int phase, int timeout_ms) {
  int64_t end = base_now_ms() + timeout_ms;
  while (atomic_load(&g_sh->s[w].phase) < phase) {
    if (base_now_ms() > end) {
      fprintf(stderr, "agent: worker %d never reached phase %d (at %d)\n", w, phase,
              atomic_load(&g_sh->s[w].phase));
      return -1;
    }
    base_sleep_ms(1);
  }
  return 0;
}

static void release(int w) {
  atomic_store(&g_sh->s[w].go, 1);
}

/* A worker's channel: the agent's end close-on-exec, the worker's inherited. */
static int make_channel(int w) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return -1;
  g_agent[w] = sv[0];
  g_worker[w] = sv[1];
  return 0;
}

/* Forks worker w running fn(w) with its channel (and no other's) and newcomer set as asked. */
static pid_t spawn(int w, int newcomer, int (*fn)(int w)) {
  if (make_channel(w) != 0) return -1;
  memset(&g_sh->s[w], 0, sizeof g_sh->s[w]);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    check_passed_count = check_failed_count = 0; /* the worker's own checks */
    for (int i = 0; i < MAXW; i++) {
      if (g_agent[i] >= 0) close(g_agent[i]);
      if (i != w && g_worker[i] >= 0) close(g_worker[i]);
    }
    fcntl(g_worker[w], F_SETFD, 0);
    char fd[16];
    snprintf(fd, sizeof fd, "%d", g_worker[w]);
    setenv("COHORT_CONTROL_FD", fd, 1);
    if (newcomer)
      setenv("COHORT_NEWCOMER", "1", 1);
    else
      unsetenv("COHORT_NEWCOMER");
    exit(fn(w)); /* exit, not _exit: leak checkers run at exit */
  }
  close(g_worker[w]);
  g_worker[w] = -1;
  g_pid[w] = pid;
  return pid;
}

/* Reaps worker w: 1 when it exited 0 (named on stderr otherwise). */
static int reap(int w, int timeout_ms) {
  int64_t end = base_now_ms() + timeout_ms;
  int st = 0;
  for (;;) {
    pid_t r = waitpid(g_pid[w], &st, WNOHANG);
    if (r == g_pid[w]) break;
    if (base_now_ms() > end) {
      fprintf(stderr, "worker %d hung; killing it\n", w);
      kill(g_pid[w], SIGKILL);
      waitpid(g_pid[w], &st, 0);
      break;
    }
    base_sleep_ms(5);
  }
  if (g_agent[w] >= 0) close(g_agent[w]);
  g_agent[w] = -1;
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 1;
  fprintf(stderr, "worker %d: %s %d\n", w, WIFSIGNALED(st) ? "killed by signal" : "exit status",
          WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
  return 0;
}

static void kill_worker(int w, int sig) {
  kill(g_pid[w], sig);
  if (sig == SIGKILL) {
    waitpid(g_pid[w], NULL, 0);
    close(g_agent[w]);
    g_agent[w] = -1;
  }
}

static store_fork g_sf;

static int start_world(const char *name) {
  store_server_opts so = {.bind_host = "127.0.0.1"};
  if (store_fork_start(&so, 1, &g_sf) != 0) return -1;
  snprintf(g_store, sizeof g_store, "127.0.0.1:%d", g_sf.port);
  snprintf(g_job, sizeof g_job, "trf-%s-%d", name, (int)getpid());
  return 0;
}

/* ---- the workers' side ---- */

static cohort_comm *w_create(int rank, int size, int epoch) {
  cohort_comm_config cfg = {.rank = rank,
                            .size = size,
                            .store_addr = g_store,
                            .job_id = g_job,
                            .timeout_ms = OP_TIMEOUT_MS,
                            .transport = g_tport,
                            .restart = epoch};
  cohort_comm *c = NULL;
  int rc = cohort_comm_create(&cfg, &c);
  if (rc != 0) fprintf(stderr, "rank %d: create: %s\n", rank, cohort_strerror(rc));
  return c;
}

/* Records a collective's failure for the parent. */
static void w_record(int w, cohort_comm *c, int rc) {
  atomic_store(&g_sh->s[w].t_err, base_now_ms());
  atomic_store(&g_sh->s[w].err, rc);
  snprintf(g_sh->s[w].errmsg, sizeof g_sh->s[w].errmsg, "%s", cohort_comm_error_message(c));
}

/* Whether rank w's error message names the agent's reason (named on stderr when not). */
static int names_why(int w, const char *msg, const char *why) {
  if (strstr(msg, why) != NULL) return 1;
  fprintf(stderr, "worker %d: '%s' does not name the agent's reason '%s'\n", w, msg, why);
  return 0;
}

/* Re-forms and checks the membership the parent announced. 0 or the reform's error. */
static int w_reform(int w, cohort_comm *c) {
  int rc = cohort_comm_reform(c);
  if (rc != 0) {
    fprintf(stderr, "worker %d: reform: %s (%s)\n", w, cohort_strerror(rc),
            cohort_comm_error_message(c));
    return rc;
  }
  CHECK_EQ_INT(cohort_comm_rank(c), atomic_load(&g_sh->s[w].want_rank));
  CHECK_EQ_INT(cohort_comm_size(c), atomic_load(&g_sh->s[w].want_size));
  CHECK_EQ_INT(cohort_comm_epoch(c), atomic_load(&g_sh->s[w].want_epoch));
  CHECK_STREQ(cohort_comm_error_message(c), "");
  return 0;
}

/* An allreduce of (rank + 1) over the membership: checks n(n+1)/2 in every element. */
static int w_sum_check(cohort_comm *c, size_t count) {
  int r = cohort_comm_rank(c), n = cohort_comm_size(c);
  int32_t *v = malloc(count * sizeof *v);
  for (size_t i = 0; i < count; i++) v[i] = r + 1;
  int rc = cohort_allreduce(c, v, v, count, COHORT_I32, COHORT_SUM);
  int bad = 0;
  for (size_t i = 0; rc == 0 && i < count; i++) bad += v[i] != n * (n + 1) / 2;
  free(v);
  CHECK_EQ_INT(rc, 0);
  CHECK_EQ_INT(bad, 0);
  return rc;
}

/* Allreduces until one fails (phase 1 after the first success); records the failure. */
static int w_loop_until_error(int w, cohort_comm *c, float *buf, size_t count) {
  int rc = 0;
  int64_t end = base_now_ms() + 120000;
  for (long it = 0; rc == 0 && it < 1000000 && base_now_ms() < end; it++) {
    for (size_t i = 0; i < count; i += 4096) buf[i] = 1.0f;
    rc = cohort_allreduce(c, buf, buf, count, COHORT_F32, COHORT_SUM);
    if (rc == 0 && it == 0) atomic_store(&g_sh->s[w].phase, 1);
    if (rc == 0) cohort_comm_set_step(c, it);
  }
  w_record(w, c, rc);
  return rc;
}

static int wait_go(int w) {
  int64_t end = base_now_ms() + 60000;
  while (!atomic_load(&g_sh->s[w].go) && base_now_ms() < end) base_sleep_ms(1);
  atomic_store(&g_sh->s[w].go, 0);
  return 0;
}

/* ---- unit: the parser ---- */

static void parse_ok(const char *msg, int verb) {
  coll_ctl_msg m;
  char err[128] = "";
  int rc = coll_ctl_parse(msg, strlen(msg), &m, err, sizeof err);
  if (rc != 0) fprintf(stderr, "parse '%s': %s\n", msg, err);
  CHECK_EQ_INT(rc, 0);
  CHECK_EQ_INT(m.verb, verb);
}

static void parse_bad(const char *msg, size_t len) {
  coll_ctl_msg m;
  char err[128] = "";
  CHECK_EQ_INT(coll_ctl_parse(msg, len, &m, err, sizeof err), COHORT_EPROTO);
  CHECK(err[0] != '\0');
}

static void test_parser(void) {
  coll_ctl_msg m;
  char err[128];
  const char *form = "form epoch=3 rank=1 size=4 local_rank=1 local_size=2 node_rank=0 nnodes=2 "
                     "store=10.0.0.1:29400 job=j1 master_addr=10.0.0.1 master_port=29500";
  CHECK_EQ_INT(coll_ctl_parse(form, strlen(form), &m, err, sizeof err), 0);
  CHECK_EQ_INT(m.verb, COLL_CTL_FORM);
  CHECK_EQ_INT(m.epoch, 3);
  CHECK_EQ_INT(m.rank, 1);
  CHECK_EQ_INT(m.size, 4);
  CHECK_EQ_INT(m.local_size, 2);
  CHECK_EQ_INT(m.nnodes, 2);
  CHECK_EQ_INT(m.master_port, 29500);
  CHECK_STREQ(m.store, "10.0.0.1:29400");
  CHECK_STREQ(m.job, "j1");
  const char *rs = "reshape epoch=2 why=node 3 lost:  heartbeat\tstale";
  CHECK_EQ_INT(coll_ctl_parse(rs, strlen(rs), &m, err, sizeof err), 0);
  CHECK_EQ_INT(m.verb, COLL_CTL_RESHAPE);
  CHECK_EQ_INT(m.epoch, 2);
  CHECK_STREQ(m.why, "node 3 lost:  heartbeat?stale");
  CHECK_EQ_INT(m.grow, -1);
  CHECK_EQ_INT(m.defer_ms, -1);
  const char *grow = "reshape grow=1 defer_ms=20000 epoch=4 why=node 3 joins";
  CHECK_EQ_INT(coll_ctl_parse(grow, strlen(grow), &m, err, sizeof err), 0);
  CHECK_EQ_INT(m.verb, COLL_CTL_RESHAPE);
  CHECK_EQ_INT(m.epoch, 4);
  CHECK_EQ_INT(m.grow, 1);
  CHECK_EQ_INT(m.defer_ms, 20000);
  parse_ok("stop why=too few nodes\n", COLL_CTL_STOP);
  parse_ok("stop", COLL_CTL_STOP);
  parse_ok("reshape", COLL_CTL_RESHAPE);
  parse_ok("frobnicate x=1", COLL_CTL_UNKNOWN);
  parse_ok("form epoch=1 rank=0 size=1 store=h:1 job=j future=yes", COLL_CTL_FORM);
  parse_bad("", 0);
  parse_bad("\n", 1);
  parse_bad("form epoch=1 rank=0 size=1 store=h:1", 36);       /* no job */
  parse_bad("form epoch=1 rank=2 size=2 store=h:1 job=j", 42); /* rank >= size */
  parse_bad("form epoch=x rank=0 size=1 store=h:1 job=j", 42);
  parse_bad("form epoch=1 rank=0 size=1 store=nohostport job=j", 49);
  parse_bad("reshape epoch=-1", 16);
  parse_bad("reshape grow=2", 14);
  parse_bad("reshape grow=1 defer_ms=-1", 26);
  parse_bad("reshape epoch", 13);
  parse_bad("reshape epoch=1\x01", 16);
  parse_bad("reshape epoch=1\0 rank=0", 23);
  parse_bad("rank=\x7f", 6);
  char big[1100];
  memset(big, 'a', sizeof big);
  memcpy(big, "stop why=", 9);
  parse_bad(big, sizeof big);
  char longjob[300] = "form epoch=1 rank=0 size=1 store=h:1 job=";
  memset(longjob + strlen(longjob), 'j', 220);
  parse_bad(longjob, strlen(longjob));
}

/* ---- unit: without a channel, and a bad one ---- */

static void test_no_channel(void) {
  unsetenv("COHORT_CONTROL_FD");
  unsetenv("COHORT_NEWCOMER");
  snprintf(g_job, sizeof g_job, "trf-alone-%d", (int)getpid());
  cohort_comm *c = w_create(0, 1, 5);
  CHECK(c != NULL);
  if (c == NULL) return;
  CHECK_EQ_INT(cohort_comm_reform(c), -ENOTSUP);
  CHECK_EQ_INT(cohort_comm_grow_break_for(c, 10), -ENOTSUP);
  CHECK_EQ_INT(cohort_comm_epoch(c), 5);
  CHECK_EQ_INT(cohort_comm_is_new(c, 0), 0);
  CHECK_EQ_INT(cohort_comm_is_new(c, 1), -EINVAL);
  CHECK_EQ_INT(cohort_comm_set_step(c, 7), 0);
  char b[64] = "state";
  CHECK_EQ_INT(cohort_comm_state_transfer(c, b, sizeof b), 0); /* no new rank */
  CHECK_EQ_INT(cohort_comm_mark_new(c), 0);
  CHECK_EQ_INT(cohort_comm_is_new(c, 0), 1);
  CHECK_EQ_INT(cohort_comm_state_transfer(c, b, sizeof b), COHORT_ENOSTATE);
  cohort_comm_destroy(c);
  setenv("COHORT_NEWCOMER", "1", 1);
  c = w_create(0, 1, 0);
  CHECK(c != NULL && cohort_comm_is_new(c, 0) == 1);
  cohort_comm_destroy(c);
  unsetenv("COHORT_NEWCOMER");
  int p[2];
  CHECK(pipe(p) == 0);
  const char *bad[] = {"abc", "-1", "999999", NULL};
  char pfd[16];
  snprintf(pfd, sizeof pfd, "%d", p[0]);
  bad[3] = pfd; /* not a socket */
  for (int i = 0; i < 4; i++) {
    setenv("COHORT_CONTROL_FD", bad[i], 1);
    cohort_comm *x = w_create(0, 1, 0);
    CHECK(x == NULL);
    cohort_comm_destroy(x);
  }
  unsetenv("COHORT_CONTROL_FD");
  close(p[0]);
  close(p[1]);
  CHECK(strstr(cohort_strerror(COHORT_ERESHAPED), "cohort_comm_reform") != NULL);
  CHECK(strstr(cohort_strerror(COHORT_ENOSTATE), "checkpoint") != NULL);
}

/* ---- unit: malformed messages, a reshape between collectives, stop, a closed channel ---- */

static int w_protocol(int w) {
  cohort_comm *c = w_create(w, 2, 0);
  if (c == NULL) return 1;
  atomic_store(&g_sh->s[w].phase, 1);
  wait_go(w); /* the parent sent garbage meanwhile, then a reshape */
  /* The garbage changed nothing: collectives run until the reshape, which the control thread
   * handles after the garbage (in order): once it has, all of it was seen. */
  int32_t v = 1;
  int64_t end = base_now_ms() + 20000;
  int rc = 0;
  while (rc == 0 && base_now_ms() < end) {
    v = 1;
    rc = cohort_allreduce(c, &v, &v, 1, COHORT_I32, COHORT_SUM);
    CHECK(rc != 0 || v == 2);
  }
  CHECK_EQ_INT(rc, COHORT_ERESHAPED);
  while (atomic_load(&c->ended) < 0 && base_now_ms() < end) base_sleep_ms(1);
  /* The malformed messages: EPROTO from the next reform, once. */
  CHECK_EQ_INT(cohort_comm_reform(c), COHORT_EPROTO);
  CHECK(strstr(cohort_comm_error_message(c), "malformed") != NULL);
  CHECK_EQ_INT(w_reform(w, c), 0);
  w_sum_check(c, 1000);
  /* A reshape with no collective in flight: the next one returns ERESHAPED at once. */
  atomic_store(&g_sh->s[w].phase, 2);
  wait_go(w);
  v = 1;
  CHECK_EQ_INT(cohort_allreduce(c, &v, &v, 1, COHORT_I32, COHORT_SUM), COHORT_ERESHAPED);
  /* The agent's reason, from this rank's own control thread or through the peer that took the
   * same reshape first (its segment's reason, or its connection's abort record, which this rank's
   * peer watch reads when it sees the connection end). Either way before any collective. */
  CHECK(names_why(w, cohort_comm_error_message(c), "unit test reshape"));
  cohort_request *rq = NULL;
  CHECK_EQ_INT(cohort_iallreduce(c, &v, &v, 1, COHORT_I32, COHORT_SUM, &rq), COHORT_ERESHAPED);
  CHECK_EQ_INT(w_reform(w, c), 0);
  CHECK_EQ_INT(cohort_comm_epoch(c), 2);
  w_sum_check(c, 1000);
  /* A membership whose third rank never comes, ended by the agent while connecting. */
  int64_t t0 = base_now_ms();
  CHECK_EQ_INT(cohort_comm_reform(c), COHORT_ERESHAPED);
  CHECK(base_now_ms() - t0 < OP_TIMEOUT_MS / 2);
  /* The same without the agent's word: the membership cannot connect within the timeout. */
  CHECK_EQ_INT(cohort_comm_set_timeout(c, 1500), 0);
  t0 = base_now_ms();
  CHECK_EQ_INT(cohort_comm_reform(c), COHORT_ERESHAPED);
  CHECK(base_now_ms() - t0 >= 1000);
  CHECK(strstr(cohort_comm_error_message(c), "connecting membership 4") != NULL);
  CHECK_EQ_INT(cohort_comm_set_timeout(c, OP_TIMEOUT_MS), 0);
  /* Worker 0 is stopped by the agent, worker 1's channel closes. */
  rc = cohort_comm_reform(c);
  CHECK_EQ_INT(rc, COHORT_EABORTED);
  const char *why = w == 0 ? "the agent stopped the job: unit test over" : "channel closed";
  if (strstr(cohort_comm_error_message(c), why) == NULL)
    fprintf(stderr, "worker %d: '%s' lacks '%s'\n", w, cohort_comm_error_message(c), why);
  CHECK(strstr(cohort_comm_error_message(c), why) != NULL);
  CHECK_EQ_INT(cohort_allreduce(c, &v, &v, 1, COHORT_I32, COHORT_SUM), COHORT_EABORTED);
  cohort_comm_destroy(c);
  return check_report() != 0;
}

static void test_protocol(void) {
  g_tport = COHORT_TRANSPORT_AUTO;
  if (start_world("proto") != 0) {
    CHECK(!"store");
    return;
  }
  for (int w = 0; w < 2; w++) spawn(w, 0, w_protocol);
  for (int w = 0; w < 2; w++) {
    CHECK_EQ_INT(agent_expect(w, "hello", 20000, NULL, 0), 0);
    CHECK_EQ_INT(wait_phase(w, 1, 30000), 0);
    /* Garbage during the membership: no crash, collectives unaffected. */
    static const char nul[] = "reshape epoch=0\0 x=1";
    agent_send_raw(w, nul, sizeof nul - 1);
    agent_send(w, "gibberish without fields");
    agent_send(w, "form epoch=1 rank=5 size=2 store=%s job=%s", g_store, g_job);
    char big[1500];
    memset(big, 'x', sizeof big);
    agent_send_raw(w, big, sizeof big);
    agent_send(w, "reshape epoch=0 why=after the garbage");
    release(w);
  }
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "ready", 20000, NULL, 0), 0);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "ready", 20000, NULL, 0), 0);
  for (int w = 0; w < 2; w++) agent_form(w, 1, w, 2);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "formed", 20000, NULL, 0), 0);
  for (int w = 0; w < 2; w++) {
    CHECK_EQ_INT(wait_phase(w, 2, 30000), 0);
    agent_send(w, "reshape epoch=0 why=stale, ignored");
    agent_send(w, "reshape epoch=1 why=unit test reshape");
  }
  base_sleep_ms(100); /* the control thread handles it on its own */
  for (int w = 0; w < 2; w++) release(w);
  char ready[200];
  for (int w = 0; w < 2; w++) {
    CHECK_EQ_INT(agent_expect(w, "ready", 20000, ready, sizeof ready), 0);
    CHECK(strncmp(ready, "ready epoch=1 step=", 19) == 0);
  }
  /* Reverse the ranks: the new membership's order is the agent's. */
  for (int w = 0; w < 2; w++) agent_form(w, 2, 1 - w, 2);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "ready", 20000, NULL, 0), 0);
  for (int w = 0; w < 2; w++) agent_form(w, 3, w, 3); /* rank 2 never comes */
  base_sleep_ms(300);
  for (int w = 0; w < 2; w++) agent_send(w, "reshape epoch=3 why=rank 2 lost while connecting");
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "ready", 20000, NULL, 0), 0);
  for (int w = 0; w < 2; w++) agent_form(w, 4, w, 3); /* again, and no reshape */
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "ready", 20000, NULL, 0), 0);
  agent_send(0, "stop why=unit test over");
  close(g_agent[1]);
  g_agent[1] = -1;
  for (int w = 0; w < 2; w++) CHECK(reap(w, 30000));
  store_fork_stop(&g_sf);
}

/* ---- unit: 20 re-forms leave nothing behind ---- */

#define LEAK_ROUNDS 20

/* Entries of /proc/self/<dir>. */
static int count_dir(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
    if (e->d_name[0] != '.') n++;
  if (d) closedir(d);
  return n;
}

/* Mappings of /dev/shm objects (segments and shared buffers; the allocator's own anonymous
 * mappings come and go, under ASan especially, and are not ours to count). */
static int count_shm_maps(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512];
  int n = 0;
  while (f != NULL && fgets(line, sizeof line, f) != NULL) n += strstr(line, "/dev/shm/") != NULL;
  if (f) fclose(f);
  return n;
}

/*
 * Out of the round's allreduce: says "done" to the agent and goes on with barriers until the
 * agent's `reshape` (sent once both ranks are out) ends the membership. A rank that re-formed
 * on its own would end it under a peer still finishing the allreduce (the peer would get
 * COHORT_ERESHAPED from it).
 */
static int w_until_reshaped(cohort_comm *c) {
  const char *fd = getenv("COHORT_CONTROL_FD");
  if (fd == NULL || send(atoi(fd), "done", 4, MSG_NOSIGNAL) != 4) return -1;
  for (int k = 0; k < 100000; k++) {
    int rc = cohort_barrier(c);
    if (rc == COHORT_ERESHAPED) return 0;
    if (rc != 0) return rc;
  }
  return -1;
}

static int w_leaks(int w) {
  cohort_comm *c = w_create(w, 2, 0);
  if (c == NULL) return 1;
  int fds = 0, maps = 0, tasks = 0;
  for (int round = 0; round <= LEAK_ROUNDS; round++) {
    void *buf = NULL;
    size_t bytes = 1u << 20;
    CHECK_EQ_INT(cohort_mem_alloc(c, bytes, &buf), 0);
    if (buf == NULL) break;
    float *f = buf;
    for (size_t i = 0; i < bytes / sizeof *f; i++) f[i] = 1.0f;
    CHECK_EQ_INT(cohort_allreduce(c, f, f, bytes / sizeof *f, COHORT_F32, COHORT_SUM), 0);
    CHECK(f[0] == 2.0f && f[bytes / sizeof *f - 1] == 2.0f);
    if (round == 0) { /* counted once everything of a membership is in place */
      fds = count_dir("/proc/self/fd");
      maps = count_shm_maps();
      tasks = count_dir("/proc/self/task");
    }
    if (round == LEAK_ROUNDS) {
      CHECK_EQ_INT(count_dir("/proc/self/fd"), fds);
      CHECK_EQ_INT(count_shm_maps(), maps);
      CHECK_EQ_INT(count_dir("/proc/self/task"), tasks);
      if (g_tport == COHORT_TRANSPORT_SHM) CHECK(maps >= 2 && c->single_copy_ops > 0);
      cohort_mem_free(c, buf);
      break;
    }
    CHECK_EQ_INT(w_until_reshaped(c), 0);
    CHECK_EQ_INT(w_reform(w, c), 0);
    CHECK(f[0] == 2.0f); /* the old membership's buffer: private now, contents kept */
    CHECK_EQ_INT(cohort_mem_free(c, buf), 0);
  }
  cohort_comm_destroy(c);
  return check_report() != 0;
}

static void test_leaks(cohort_transport t) {
  g_tport = t;
  if (start_world(t == COHORT_TRANSPORT_SHM ? "leak-shm" : "leak-tcp") != 0) {
    CHECK(!"store");
    return;
  }
  for (int w = 0; w < 2; w++) spawn(w, 0, w_leaks);
  for (int round = 1; round <= LEAK_ROUNDS; round++) {
    for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "done", 30000, NULL, 0), 0);
    for (int w = 0; w < 2; w++) agent_send(w, "reshape epoch=%d why=round %d", round - 1, round);
    for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "ready", 30000, NULL, 0), 0);
    for (int w = 0; w < 2; w++) agent_form(w, round, w, 2);
  }
  for (int w = 0; w < 2; w++) CHECK(reap(w, 60000));
  store_fork_stop(&g_sf);
}

/* ---- kill: a rank lost mid-allreduce, a newcomer, the donor lost mid-transfer ---- */

static unsigned char pattern(size_t i) {
  return (unsigned char)((i * 131u + 7u) % 251u + 1u); /* never 0 */
}

static size_t pattern_diff(const unsigned char *b, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += b[i] != pattern(i);
  return bad;
}

/* ---- unit: TCP's abort record (tport.h) ---- */

/* Both ends of one connection as TCP transports: a is rank 0, b rank 1. */
static int tcp_pair(coll_tcp **a, coll_tcp **b) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return -1;
  int fa[2] = {-1, sv[0]}, fb[2] = {sv[1], -1};
  if (coll_tcp_create(0, 2, fa, 4096, a) != 0 || coll_tcp_create(1, 2, fb, 4096, b) != 0) return -1;
  return 0;
}

/* len bytes from a to rank 1, all taken (they fit the socket's buffer). */
static void tcp_put(coll_tcp *a, const char *buf, size_t len) {
  size_t off = 0;
  for (int i = 0; i < 1000 && off < len; i++) {
    struct iovec v = {.iov_base = (void *)(buf + off), .iov_len = len - off};
    long n = coll_tcp_ops.send(a, 1, &v, 1);
    if (n < 0) break;
    off += (size_t)n;
  }
  CHECK_EQ_INT((long long)off, (long long)len);
}

/* Everything b receives from rank 0 until the stream ends: its length. Read at most `step` bytes
 * at a time (small ones through staging), or by peek and consume when step is 0. */
static size_t tcp_drain_by(coll_tcp *b, char *out, size_t cap, size_t step) {
  size_t got = 0;
  for (int i = 0; i < 100000 && got < cap; i++) {
    size_t want = step == 0 || cap - got < step ? cap - got : step;
    long n;
    if (step == 0) {
      const void *data = NULL;
      n = coll_tcp_ops.peek(b, 0, &data);
      if (n > (long)want) n = (long)want;
      if (n > 0) {
        memcpy(out + got, data, (size_t)n);
        coll_tcp_ops.consume(b, 0, (size_t)n);
      }
    } else {
      n = coll_tcp_ops.recv(b, 0, out + got, want);
    }
    if (n < 0) break;
    if (n == 0) base_sleep_ms(1);
    got += (size_t)n;
  }
  return got;
}

static size_t tcp_drain(coll_tcp *b, char *out, size_t cap) {
  return tcp_drain_by(b, out, cap, cap);
}

/*
 * a sends `sent` bytes of a message of `frame` bytes (0: none started), then aborts with why; b
 * reads the stream to its end. The record must follow a whole message or cut one short by more
 * than its length (b's read ends before the message does), never complete one; b's transport
 * names the reason exactly when it came.
 */
static void abort_case_by(size_t frame, size_t sent, int want_record, const char *why,
                          size_t step) {
  coll_tcp *a = NULL, *b = NULL;
  if (tcp_pair(&a, &b) != 0) {
    CHECK(!"tcp pair");
    return;
  }
  size_t cap = 200000;
  char *buf = calloc(1, cap), *got = calloc(1, cap);
  for (size_t i = 0; i < cap; i++) buf[i] = (char)pattern(i);
  if (frame > 0) coll_tcp_ops.frame(a, 1, frame);
  tcp_put(a, buf, sent);
  coll_tcp_ops.abort(a, 0, why);
  coll_tcp_ops.abort(a, 0, "a second abort sends nothing more");
  size_t n = tcp_drain_by(b, got, cap, step);
  CHECK_EQ_INT((long long)n, (long long)(sent + (want_record ? COLL_ABORT_LEN : 0)));
  CHECK(memcmp(got, buf, sent) == 0);
  int rank = -1;
  char msg[400] = "";
  CHECK_EQ_INT(coll_tcp_ops.aborted(b, &rank, msg, sizeof msg), want_record);
  if (want_record) {
    CHECK_EQ_INT(rank, 0);
    if (strlen(why) < 300)
      CHECK_STREQ(msg, why);
    else /* cut to fit */
      CHECK(strlen(msg) >= 300 && strncmp(msg, why, strlen(msg)) == 0);
  }
  coll_tcp_destroy(a);
  coll_tcp_destroy(b);
  free(buf);
  free(got);
}

/* The same read in large receives (straight into the destination: staging keeps a copy of the
 * stream's end), in small ones and by peek (through staging, which keeps the bytes read before its
 * unread ones across its compactions). */
static void abort_case(size_t frame, size_t sent, int want_record, const char *why) {
  static const size_t steps[] = {SIZE_MAX, 100, 0};
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
    abort_case_by(frame, sent, want_record, why, steps[i]);
}

/* b's stream ends with `tail` (len bytes) written raw, then the end: what its transport makes of
 * it. */
static int forged_record(const char *tail, size_t len) {
  coll_tcp *a = NULL, *b = NULL;
  if (tcp_pair(&a, &b) != 0) return -1;
  int fd = coll_tcp_fd(a, 1);
  CHECK_EQ_INT((long long)write(fd, tail, len), (long long)len);
  shutdown(fd, SHUT_WR);
  char got[1000];
  tcp_drain(b, got, sizeof got);
  int rank = -1;
  char msg[400];
  int rc = coll_tcp_ops.aborted(b, &rank, msg, sizeof msg);
  coll_tcp_destroy(a);
  coll_tcp_destroy(b);
  return rc;
}

/* Frames of RACE_FRAME bytes (byte i of the stream: pattern(i)) sent by a thread of their own
 * until it finds the transport aborted. */
#define RACE_FRAME 1000
static void *race_sender(void *arg) {
  coll_tcp *a = arg;
  char buf[RACE_FRAME];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (char)pattern(i);
  for (int f = 0; f < 1000000; f++) {
    coll_tcp_ops.frame(a, 1, RACE_FRAME);
    for (size_t off = 0; off < RACE_FRAME;) {
      struct iovec v = {.iov_base = buf + off, .iov_len = RACE_FRAME - off};
      long n = coll_tcp_ops.send(a, 1, &v, 1);
      if (n < 0) return NULL;
      if (n == 0) sched_yield();
      off += (size_t)n;
    }
  }
  return NULL;
}

/* An abort from another thread than the one sending, at a different point of the stream each
 * round: the record, when it comes, ends the stream and never completes a frame (it follows a
 * whole one, or cuts one short by more than its length); what precedes it is what was sent. */
static void test_tcp_abort_race(void) {
  int records = 0, rounds = 40;
  size_t cap = 1 << 22;
  char *got = malloc(cap);
  for (int r = 0; r < rounds; r++) {
    coll_tcp *a = NULL, *b = NULL;
    if (tcp_pair(&a, &b) != 0) {
      CHECK(!"tcp pair");
      break;
    }
    pthread_t th;
    pthread_create(&th, NULL, race_sender, a);
    size_t n = 0, cut = 5000 + (size_t)r * 997;
    for (int i = 0; i < 1000000 && n < cut; i++) {
      long k = coll_tcp_ops.recv(b, 0, got + n, cut - n);
      if (k < 0) break;
      n += (size_t)k;
    }
    coll_tcp_ops.abort(a, 0, "the race");
    pthread_join(th, NULL);
    n += tcp_drain_by(b, got + n, cap - n, cap);
    int rank = -1;
    char msg[400] = "";
    int rec = coll_tcp_ops.aborted(b, &rank, msg, sizeof msg);
    size_t body = rec ? n - COLL_ABORT_LEN : n;
    records += rec;
    if (rec) {
      size_t left = (RACE_FRAME - body % RACE_FRAME) % RACE_FRAME;
      CHECK(left == 0 || left > COLL_ABORT_LEN);
      CHECK_STREQ(msg, "the race");
      CHECK(memcmp(got + body, COLL_ABORT_HEAD, COLL_ABORT_MARK_LEN) == 0);
    }
    size_t bad = 0;
    for (size_t i = 0; i < body; i++) bad += got[i] != (char)pattern(i % RACE_FRAME);
    CHECK_EQ_INT((long long)bad, 0);
    coll_tcp_destroy(a);
    coll_tcp_destroy(b);
  }
  CHECK(records > 0); /* most rounds: the record is left out only within its length of an end */
  free(got);
}

static void test_tcp_abort_record(void) {
  abort_case(0, 0, 1, "rank 0: nothing sent yet");
  abort_case(1000, 1000, 1, "rank 0: a whole message sent");
  abort_case(100000, 50000, 1, "rank 0: half of a large message sent");
  abort_case(1000, 1000 - COLL_ABORT_LEN, 0, "rank 0: the record would end the message");
  abort_case(1000, 900, 0, "rank 0: the record would overrun the message");
  char big[600];
  memset(big, 'w', sizeof big);
  big[sizeof big - 1] = '\0';
  abort_case(0, 0, 1, big); /* the reason cut to fit */
  char rec[COLL_ABORT_LEN];
  memset(rec, 0, sizeof rec);
  memcpy(rec, COLL_ABORT_HEAD, COLL_ABORT_MARK_LEN);
  memcpy(rec + sizeof rec - COLL_ABORT_MARK_LEN, COLL_ABORT_TAIL, COLL_ABORT_MARK_LEN);
  memcpy(rec + COLL_ABORT_MARK_LEN, "3 forged", 8);
  CHECK_EQ_INT(forged_record(rec, sizeof rec), 1);
  memcpy(rec + COLL_ABORT_MARK_LEN, "x forged", 8); /* no rank */
  CHECK_EQ_INT(forged_record(rec, sizeof rec), 0);
  memset(rec + COLL_ABORT_MARK_LEN, 'y', sizeof rec - 2 * COLL_ABORT_MARK_LEN); /* no end */
  CHECK_EQ_INT(forged_record(rec, sizeof rec), 0);
  CHECK_EQ_INT(forged_record(rec, sizeof rec - 1), 0); /* cut short */
  CHECK_EQ_INT(forged_record(COLL_BYE, COLL_BYE_LEN), 0);
}

/* ---- unit: a rank started ahead of its membership (COHORT_AWAIT_FORM=1) ---- */

#define AHEAD_BYTES (1u << 20)

/* The configuration from the environment: ahead needs a control channel, and no rank variables. */
static void config_ahead(void) {
  cohort_comm_config cfg;
  const char *vars[] = {"RANK", "WORLD_SIZE", "COHORT_STORE", "COHORT_JOB_ID", "COHORT_ROUND"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
  setenv("COHORT_AWAIT_FORM", "1", 1);
  unsetenv("COHORT_CONTROL_FD");
  CHECK_EQ_INT(cohort_comm_config_from_env(&cfg), COHORT_ENOENV); /* no form could come */
  setenv("COHORT_CONTROL_FD", "3", 1);
  CHECK_EQ_INT(cohort_comm_config_from_env(&cfg), 0);
  CHECK_EQ_INT(cfg.await_form, COHORT_AWAIT_FORM_NOW);
  unsetenv("COHORT_AWAIT_FORM");
  CHECK_EQ_INT(cohort_comm_config_from_env(&cfg), COHORT_ENOENV); /* not ahead: RANK needed */
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("COHORT_STORE", "127.0.0.1:1", 1);
  setenv("COHORT_JOB_ID", "j", 1);
  CHECK_EQ_INT(cohort_comm_config_from_env(&cfg), 0);
  CHECK_EQ_INT(cfg.await_form, COHORT_AWAIT_FORM_ABLE);
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
  unsetenv("COHORT_CONTROL_FD");
  /* Ahead by hand without a channel: refused at once, nothing to wait for. */
  cfg = (cohort_comm_config){.await_form = COHORT_AWAIT_FORM_NOW};
  cohort_comm *c = NULL;
  CHECK_EQ_INT(cohort_comm_create(&cfg, &c), COHORT_ENOENV);
  CHECK(c == NULL);
}

/* Worker 2 once cohort_comm_create returned: in the membership the agent announced last, new,
 * it receives the state and sums with the others. */
static int w_joined(int w, cohort_comm *c) {
  CHECK_EQ_INT(cohort_comm_rank(c), atomic_load(&g_sh->s[w].want_rank));
  CHECK_EQ_INT(cohort_comm_size(c), atomic_load(&g_sh->s[w].want_size));
  CHECK_EQ_INT(cohort_comm_epoch(c), atomic_load(&g_sh->s[w].want_epoch));
  CHECK_EQ_INT(cohort_comm_is_new(c, 2), 1);
  unsigned char *st = calloc(1, AHEAD_BYTES);
  CHECK_EQ_INT(cohort_comm_state_transfer(c, st, AHEAD_BYTES), 0);
  CHECK_EQ_INT(pattern_diff(st, AHEAD_BYTES), 0);
  free(st);
  w_sum_check(c, 1000);
  cohort_comm_destroy(c);
  return check_report() != 0;
}

/* Worker 2, started ahead: nothing of a membership in its environment; cohort_comm_create returns
 * once it joined the agent's second form (the first ended while it connected). */
static int w_ahead(int w) {
  setenv("COHORT_AWAIT_FORM", "1", 1);
  cohort_comm_config cfg;
  CHECK_EQ_INT(cohort_comm_config_from_env(&cfg), 0);
  CHECK_EQ_INT(cfg.await_form, COHORT_AWAIT_FORM_NOW);
  cfg.timeout_ms = OP_TIMEOUT_MS;
  cfg.transport = g_tport;
  cohort_comm *c = NULL;
  CHECK_EQ_INT(cohort_comm_create(&cfg, &c), 0);
  return c == NULL ? 1 : w_joined(w, c);
}

/* Worker 2 not started ahead: a replacement spawned into membership 1 with its rank variables
 * (COHORT_NEWCOMER=1, a configuration filled by hand); that membership ends while
 * cohort_comm_create connects it, and create returns once it joined the next. */
static int w_late(int w) {
  cohort_comm *c = w_create(2, 3, 1);
  return c == NULL ? 1 : w_joined(w, c);
}

/* Workers 0 and 1, the running membership of 2: re-form with the rank started ahead. */
static int w_ahead_peer(int w) {
  cohort_comm *c = w_create(w, 2, 0);
  if (c == NULL) return 1;
  w_sum_check(c, 1000);
  atomic_store(&g_sh->s[w].phase, 1);
  wait_go(w); /* the rank started ahead went through its first membership meanwhile */
  CHECK_EQ_INT(w_until_reshaped(c), 0);
  if (w_reform(w, c) != 0) return 1;
  CHECK_EQ_INT(cohort_comm_is_new(c, 2), 1);
  unsigned char *st = malloc(AHEAD_BYTES);
  for (size_t i = 0; st != NULL && i < AHEAD_BYTES; i++) st[i] = pattern(i);
  CHECK_EQ_INT(cohort_comm_state_transfer(c, st, AHEAD_BYTES), 0);
  free(st);
  w_sum_check(c, 1000);
  cohort_comm_destroy(c);
  return check_report() != 0;
}

/* Rank 0 of 2 whose rank 1 never comes and no reshape either: cohort_comm_create fails with the
 * timeout, as without a channel (no other membership is coming: it must not wait for one). */
static int w_alone(int w) {
  (void)w;
  cohort_comm_config cfg = {.rank = 0,
                            .size = 2,
                            .store_addr = g_store,
                            .job_id = g_job,
                            .timeout_ms = 1500,
                            .transport = g_tport};
  cohort_comm *c = NULL;
  CHECK_EQ_INT(cohort_comm_create(&cfg, &c), -ETIMEDOUT);
  CHECK(c == NULL);
  return check_report() != 0;
}

static void test_alone(void) {
  g_tport = COHORT_TRANSPORT_AUTO;
  if (start_world("alone") != 0) {
    CHECK(!"store");
    return;
  }
  spawn(0, 0, w_alone);
  CHECK_EQ_INT(agent_expect(0, "hello", 20000, NULL, 0), 0);
  CHECK(reap(0, 20000)); /* the 1.5 s timeout, not COHORT_REFORM_TIMEOUT_MS */
  store_fork_stop(&g_sf);
}

/*
 * A third rank joins a running membership of two. ahead: it was started ahead (no rank
 * variables); its first form (membership 1) never connects, since ranks 0 and 1 are not told.
 * Else it was spawned into membership 1 with its rank variables and connects that at once.
 * Either way the agent ends membership 1 while the rank connects: it says ready and waits for
 * the next, and all three form membership 2.
 */
static void test_joiner(int ahead) {
  if (ahead) config_ahead();
  g_tport = COHORT_TRANSPORT_AUTO;
  if (start_world(ahead ? "ahead" : "late") != 0) {
    CHECK(!"store");
    return;
  }
  char msg[200];
  for (int w = 0; w < 2; w++) spawn(w, 0, w_ahead_peer);
  for (int w = 0; w < 2; w++) {
    CHECK_EQ_INT(agent_expect(w, "hello", 20000, msg, sizeof msg), 0);
    CHECK(strstr(msg, "await_form") == NULL); /* a config filled by hand cannot be started ahead */
  }
  spawn(2, 1, ahead ? w_ahead : w_late);
  CHECK_EQ_INT(agent_expect(2, "hello", 20000, msg, sizeof msg), 0);
  char want[64];
  snprintf(want, sizeof want, "hello pid=%d%s", (int)g_pid[2], ahead ? " await_form=1" : "");
  CHECK_STREQ(msg, want);
  if (ahead) agent_form(2, 1, 2, 3);
  base_sleep_ms(300); /* connecting membership 1 */
  agent_send(2, "reshape epoch=1 why=a member lost while it connected");
  CHECK_EQ_INT(agent_expect(2, "ready", 20000, msg, sizeof msg), 0);
  CHECK_STREQ(msg, "ready epoch=1 step=-1");
  /* The running membership ends (the late node joins): all three form membership 2. */
  for (int w = 0; w < 2; w++) {
    CHECK_EQ_INT(wait_phase(w, 1, 30000), 0);
    release(w);
  }
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "done", 30000, NULL, 0), 0);
  for (int w = 0; w < 2; w++) agent_send(w, "reshape epoch=0 why=a node joins");
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "ready", 20000, NULL, 0), 0);
  for (int w = 0; w < 3; w++) agent_form(w, 2, w, 3);
  for (int w = 0; w < 3; w++) CHECK_EQ_INT(agent_expect(w, "formed", 30000, msg, sizeof msg), 0);
  CHECK_STREQ(msg, "formed epoch=2 step=-1");
  for (int w = 0; w < 3; w++) CHECK(reap(w, 60000));
  store_fork_stop(&g_sf);
}

/* The single-copy path in the current membership: an allreduce of cohort_mem_alloc buffers. */
static void w_single_check(cohort_comm *c) {
  size_t count = 1u << 18;
  float *f = NULL;
  CHECK_EQ_INT(cohort_mem_alloc(c, count * sizeof *f, (void **)&f), 0);
  if (f == NULL) return;
  uint64_t before = c->single_copy_ops;
  for (size_t i = 0; i < count; i++) f[i] = 1.0f;
  CHECK_EQ_INT(cohort_allreduce(c, f, f, count, COHORT_F32, COHORT_SUM), 0);
  CHECK(f[0] == (float)cohort_comm_size(c) && f[count - 1] == (float)cohort_comm_size(c));
  CHECK(c->single_copy_ops > before);
  CHECK_EQ_INT(cohort_mem_free(c, f), 0);
}

/* Membership 2: the donor was lost mid-transfer; the newcomer (last rank) is still new and the
 * lowest survivor donates. Then the agent stops the job. */
static int w_after_donor_loss(int w, cohort_comm *c, unsigned char *st) {
  if (w_reform(w, c) != 0) return 1;
  int n = cohort_comm_size(c);
  CHECK_EQ_INT(cohort_comm_is_new(c, 0), 0);
  CHECK_EQ_INT(cohort_comm_is_new(c, n - 1), 1);
  CHECK_EQ_INT(cohort_comm_state_transfer(c, st, STATE_BYTES), 0);
  if (w == 4) CHECK_EQ_INT(pattern_diff(st, STATE_BYTES), 0);
  CHECK_EQ_INT(cohort_comm_is_new(c, n - 1), 0);
  w_sum_check(c, 1000);
  /* Re-forming ends the membership for everyone: a peer still inside the allreduce would get
   * COHORT_ERESHAPED. Wait until all are through it. */
  atomic_store(&g_sh->s[w].phase, PHASE_DONE);
  wait_go(w);
  CHECK_EQ_INT(cohort_comm_reform(c), COHORT_EABORTED);
  CHECK(strstr(cohort_comm_error_message(c), "the agent stopped the job: test over") != NULL);
  return 0;
}

/* cohort_comm_state_transferv: pieces of other sizes (the same total) are refused on every rank,
 * the bits kept; then three pieces (one empty), the newcomer's middle one in a buffer of its
 * own. */
static int w_pieces(cohort_comm *c, unsigned char *st, int newcomer) {
  size_t half = STATE_BYTES / 2, skew = newcomer ? 8 : 0;
  unsigned char *other = calloc(1, half);
  if (other == NULL) return 1;
  if (newcomer) CHECK_EQ_INT(cohort_comm_mark_new(c), 0);
  cohort_iov bad[2] = {{st, half + skew}, {st + half + skew, half - skew}};
  CHECK_EQ_INT(cohort_comm_state_transferv(c, bad, 2), COHORT_EMISMATCH);
  for (int r = 0; r < 4; r++) CHECK_EQ_INT(cohort_comm_is_new(c, r), r == 3);
  if (newcomer) memset(st, 0, STATE_BYTES);
  cohort_iov iov[4] = {{st, 1000},
                       {NULL, 0},
                       {newcomer ? other : st + 1000, half - 1000},
                       {st + half, STATE_BYTES - half}};
  CHECK_EQ_INT(cohort_comm_state_transferv(c, iov, 4), 0);
  for (int r = 0; r < 4; r++) CHECK_EQ_INT(cohort_comm_is_new(c, r), 0);
  if (newcomer) {
    size_t bad_at = 0;
    for (size_t i = 0; i < STATE_BYTES && bad_at == 0; i++) {
      unsigned char got = i < 1000 ? st[i] : i < half ? other[i - 1000] : st[i];
      if (got != pattern(i)) bad_at = i + 1;
    }
    CHECK_EQ_INT((long long)bad_at, 0);
    for (size_t i = 1000; i < half; i++) st[i] = pattern(i); /* whole again for what follows */
  }
  free(other);
  return 0;
}

/* Membership 1: three survivors and the newcomer (rank 3). */
static int w_after_grow(int w, cohort_comm *c) {
  CHECK_EQ_INT(cohort_comm_size(c), 4);
  CHECK_EQ_INT(cohort_comm_epoch(c), 1);
  for (int r = 0; r < 4; r++) CHECK_EQ_INT(cohort_comm_is_new(c, r), r == 3);
  w_sum_check(c, 100000);
  if (g_single) w_single_check(c);
  int newcomer = w == 4;
  unsigned char *st = newcomer ? g_sh->state : malloc(STATE_BYTES);
  for (size_t i = 0; i < STATE_BYTES; i++) st[i] = newcomer ? 0 : pattern(i);
  int64_t t0 = base_now_us();
  CHECK_EQ_INT(cohort_comm_state_transfer(c, st, STATE_BYTES), 0);
  if (newcomer) atomic_store(&g_sh->s[w].xfer_us, base_now_us() - t0);
  if (newcomer) CHECK_EQ_INT(pattern_diff(st, STATE_BYTES), 0);
  for (int r = 0; r < 4; r++) CHECK_EQ_INT(cohort_comm_is_new(c, r), 0);
  if (w_pieces(c, st, newcomer) != 0) return 1;
  /* Again, the newcomer wanting the state anew; the parent kills the donor during it (tries
   * again when the transfer outran it: see kill_donor_mid_transfer). */
  int rc = 0;
  for (int attempt = 0; rc == 0 && attempt < KILL_TRIES; attempt++) {
    if (newcomer) {
      memset(st, 0, STATE_BYTES);
      CHECK_EQ_INT(cohort_comm_mark_new(c), 0);
    }
    atomic_store(&g_sh->s[w].phase, 2 + attempt);
    wait_go(w);
    rc = cohort_comm_state_transfer(c, st, STATE_BYTES);
  }
  w_record(w, c, rc);
  CHECK_EQ_INT(rc, COHORT_ERESHAPED);
  int fails = w_after_donor_loss(w, c, st);
  if (!newcomer) free(st);
  return fails;
}

static int w_kill(int w) {
  cohort_comm *c = w_create(w, 4, 0);
  if (c == NULL) return 1;
  size_t count = 1u << 20;
  float *buf = NULL;
  if (g_single)
    CHECK_EQ_INT(cohort_mem_alloc(c, count * sizeof *buf, (void **)&buf), 0);
  else
    buf = calloc(count, sizeof *buf);
  if (buf == NULL) return 1;
  int rc = w_loop_until_error(w, c, buf, count);
  CHECK_EQ_INT(rc, COHORT_ERESHAPED);
  if (g_single) CHECK(c->single_copy_ops > 0);
  if (w_reform(w, c) != 0) return 1;
  if (g_single)
    CHECK_EQ_INT(cohort_mem_free(c, buf), 0); /* private now: freed alone */
  else
    free(buf);
  int fails = w_after_grow(w, c);
  cohort_comm_destroy(c);
  return fails || check_report() != 0;
}

static int w_newcomer(int w) {
  cohort_comm *c = w_create(3, 4, 1);
  if (c == NULL) return 1;
  int fails = w_after_grow(w, c);
  cohort_comm_destroy(c);
  return fails || check_report() != 0;
}

/* The survivors' errors: ERESHAPED, soon after t (the kill or the message). */
static void check_survivors(const int *ws, int n, long long t, int bound_ms, const char *what) {
  long long worst = 0;
  for (int i = 0; i < n; i++) {
    slot *s = &g_sh->s[ws[i]];
    long long d = atomic_load(&s->t_err) - t;
    if (atomic_load(&s->err) != COHORT_ERESHAPED || d > bound_ms || d < 0)
      fprintf(stderr, "worker %d: %s (%s) %lld ms after the %s\n", ws[i],
              cohort_strerror(atomic_load(&s->err)), s->errmsg, d, what);
    CHECK_EQ_INT(atomic_load(&s->err), COHORT_ERESHAPED);
    CHECK(d >= 0 && d < bound_ms);
    if (d > worst) worst = d;
  }
  printf("%s to COHORT_ERESHAPED on every survivor: %lld ms (worst of %d)\n", what, worst, n);
}

/* Kills the donor (worker 0) once the newcomer (worker 4) has part of the state, stopping the
 * newcomer first so the transfer cannot finish meanwhile. "Mid-transfer" means the donor has not
 * sent everything yet: it may run ahead of the stopped newcomer by what the link buffers (the
 * 1 MiB shared-memory ring, or the loopback socket buffers, a few MiB), so the newcomer must not
 * have reached XFER_MID. A donor killed with its part sent is another case: the ranks that had
 * its answer to the closing allreduce may see the transfer succeed. On a loaded machine this
 * process may look too late: then the workers go round again, up to KILL_TRIES times. Returns
 * the time of the kill, or -1. */
static long long kill_donor_mid_transfer(void) {
  const int ws[] = {0, 1, 3, 4};
  volatile unsigned char *st = g_sh->state;
  for (int attempt = 0; attempt < KILL_TRIES; attempt++) {
    for (int i = 0; i < 4; i++)
      if (wait_phase(ws[i], 2 + attempt, 60000) != 0) return -1;
    for (int i = 0; i < 4; i++) release(ws[i]);
    int64_t end = base_now_ms() + 60000;
    while (st[1u << 20] == 0 && base_now_ms() < end) {
    }
    /* Stopped for sure (the signal is asynchronous) before its progress is read. */
    int wst = 0;
    kill(g_pid[4], SIGSTOP);
    if (waitpid(g_pid[4], &wst, WUNTRACED) != g_pid[4] || !WIFSTOPPED(wst)) return -1;
    if (st[1u << 20] != 0 && st[XFER_MID] == 0) {
      long long t = base_now_ms();
      kill_worker(0, SIGKILL);
      kill(g_pid[4], SIGCONT);
      printf("donor killed mid-transfer at attempt %d\n", attempt + 1);
      return t;
    }
    kill(g_pid[4], SIGCONT);
  }
  fprintf(stderr, "agent: the transfer always finished before the donor could be killed\n");
  return -1;
}

static void test_kill(const char *tname) {
  if (start_world(tname) != 0) {
    CHECK(!"store");
    return;
  }
  for (int w = 0; w < 4; w++) spawn(w, 0, w_kill);
  for (int w = 0; w < 4; w++) CHECK_EQ_INT(agent_expect(w, "hello", 20000, NULL, 0), 0);
  for (int w = 0; w < 4; w++) CHECK_EQ_INT(wait_phase(w, 1, 60000), 0);
  base_sleep_ms(100);
  long long t = base_now_ms();
  kill_worker(2, SIGKILL);
  const int surv[] = {0, 1, 3};
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(agent_expect(surv[i], "ready", 20000, NULL, 0), 0);
  check_survivors(surv, 3, t, FAST_MS, "kill -9 of a rank");
  /* Grow back: the survivors keep their order (0, 1, 2), the newcomer is rank 3. */
  spawn(4, 1, w_newcomer);
  for (int i = 0; i < 3; i++) agent_form(surv[i], 1, i, 4);
  CHECK_EQ_INT(agent_expect(4, "hello", 20000, NULL, 0), 0);
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(agent_expect(surv[i], "formed", 30000, NULL, 0), 0);
  /* The survivors' engines said `broken` for membership 0 as they found the peer gone, without
   * waiting for their programs' next cohort_comm_reform (each of them, or at least one when
   * another's abort reached a survivor first). */
  int nbroken = 0;
  for (int i = 0; i < 3; i++) {
    nbroken += g_broken[surv[i]] > 0;
    if (g_broken[surv[i]] > 0) {
      CHECK(strncmp(g_broken_msg[surv[i]], "broken epoch=0 why=", 19) == 0);
      CHECK(strstr(g_broken_msg[surv[i]], "rank") != NULL);
    }
  }
  CHECK(nbroken >= 1);
  printf("%d of 3 survivors said broken (%s)\n", nbroken, g_broken_msg[surv[0]]);
  long long us = atomic_load(&g_sh->s[4].xfer_us);
  printf("state transfer of %u MiB to the newcomer: %lld us, %.0f MB/s\n", STATE_BYTES >> 20, us,
         us > 0 ? (double)STATE_BYTES / (double)us : 0.0);
  for (int w = 0; w < 5; w++)
    if (w != 2) CHECK_EQ_INT(wait_phase(w, 2, 60000), 0);
  t = kill_donor_mid_transfer();
  CHECK(t >= 0);
  const int left[] = {1, 3, 4};
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(agent_expect(left[i], "ready", 20000, NULL, 0), 0);
  check_survivors(left, 3, t, FAST_MS, "kill -9 of the donor");
  for (int i = 0; i < 3; i++) agent_form(left[i], 2, i, 3);
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(agent_expect(left[i], "formed", 30000, NULL, 0), 0);
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(wait_phase(left[i], PHASE_DONE, 60000), 0);
  for (int i = 0; i < 3; i++) release(left[i]);
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(agent_expect(left[i], "ready", 30000, NULL, 0), 0);
  for (int i = 0; i < 3; i++) agent_send(left[i], "stop why=test over");
  for (int i = 0; i < 3; i++) CHECK(reap(left[i], 30000));
  store_fork_stop(&g_sf);
}

/* ---- reshape: a stopped rank, and the agent's message ---- */

#define WHY_STOPPED "rank 2 stopped answering"
#define WHY_IDLE "node 9 lost: the idle reshape"

/* Membership 0 of 3 until the agent ends it (rank 2 stopped); membership 1 of 2 until the agent's
 * reshape reaches rank 0 alone between collectives; then membership 2. */
static int w_reshape(int w) {
  cohort_comm *c = w_create(w, 3, 0);
  if (c == NULL) return 1;
  size_t count = 1u << 18;
  float *buf = calloc(count, sizeof *buf);
  CHECK_EQ_INT(w_loop_until_error(w, c, buf, count), COHORT_ERESHAPED);
  CHECK(names_why(w, cohort_comm_error_message(c), WHY_STOPPED));
  free(buf);
  if (w_reform(w, c) != 0) return 1;
  w_sum_check(c, 100000);
  atomic_store(&g_sh->s[w].phase, 2);
  wait_go(w);
  CHECK_EQ_INT(cohort_comm_failed(c), COHORT_ERESHAPED);
  CHECK(names_why(w, cohort_comm_error_message(c), WHY_IDLE));
  if (w_reform(w, c) == 0) w_sum_check(c, 100000);
  cohort_comm_destroy(c);
  return check_report() != 0;
}

/*
 * The agent's reshape reaches rank 0 first and rank 1 only later, so rank 1 may learn of the end
 * from rank 0's connections first (as when its control thread is slower): its error must name the
 * agent's reason all the same, over TCP as over shared memory. Once inside an allreduce (rank 2
 * stopped: both wait), once between collectives (rank 1's peer watch finds rank 0's hang-up and
 * says `broken` with the reason).
 */
static void test_reshape(const char *tname) {
  if (start_world(tname) != 0) {
    CHECK(!"store");
    return;
  }
  for (int w = 0; w < 3; w++) spawn(w, 0, w_reshape);
  for (int w = 0; w < 3; w++) CHECK_EQ_INT(wait_phase(w, 1, 60000), 0);
  kill(g_pid[2], SIGSTOP);
  base_sleep_ms(300); /* the survivors now wait for it */
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(atomic_load(&g_sh->s[w].t_err), 0);
  long long t = base_now_ms();
  agent_send(0, "reshape epoch=0 why=" WHY_STOPPED);
  while (atomic_load(&g_sh->s[0].t_err) == 0 && base_now_ms() - t < MSG_FAST_MS) base_sleep_ms(1);
  base_sleep_ms(200); /* rank 1 meanwhile sees rank 0's connection end, if it waits on it */
  agent_send(1, "reshape epoch=0 why=" WHY_STOPPED);
  const int surv[] = {0, 1};
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "ready", 20000, NULL, 0), 0);
  check_survivors(surv, 2, t, MSG_FAST_MS, "reshape message");
  for (int w = 0; w < 2; w++) printf("worker %d: %s\n", w, g_sh->s[w].errmsg);
  kill_worker(2, SIGKILL);
  for (int w = 0; w < 2; w++) agent_form(w, 1, w, 2);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "formed", 30000, NULL, 0), 0);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(wait_phase(w, 2, 60000), 0);
  agent_send(0, "reshape epoch=1 why=" WHY_IDLE);
  char msg[300] = "";
  CHECK_EQ_INT(agent_expect(1, "broken", FAST_MS, msg, sizeof msg), 0);
  CHECK(strncmp(msg, "broken epoch=1 why=", 19) == 0);
  CHECK(names_why(1, msg, WHY_IDLE));
  printf("rank 1 between collectives: %s\n", msg);
  for (int w = 0; w < 2; w++) release(w);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "ready", 20000, NULL, 0), 0);
  for (int w = 0; w < 2; w++) agent_form(w, 2, w, 2);
  for (int w = 0; w < 2; w++) CHECK(reap(w, 30000));
  store_fork_stop(&g_sf);
}

/* ---- idle: a rank lost while the others compute between collectives ---- */

/* One allreduce, then no collective until the parent says so: by then the peer watch must have
 * failed the membership (the kill) and said `broken`. After the re-form, worker 0 destroys its
 * communicator and exits while worker 1 is idle: a goodbye, not a loss. */
static int w_idle(int w) {
  cohort_comm *c = w_create(w, 3, 0);
  if (c == NULL) return 1;
  w_sum_check(c, 1000);
  atomic_store(&g_sh->s[w].phase, 1);
  wait_go(w);
  CHECK_EQ_INT(cohort_comm_failed(c), COHORT_ERESHAPED);
  CHECK(strstr(cohort_comm_error_message(c), "no collective was in flight") != NULL);
  CHECK_EQ_INT(cohort_barrier(c), COHORT_ERESHAPED);
  if (w_reform(w, c) != 0) return 1;
  w_sum_check(c, 1000);
  atomic_store(&g_sh->s[w].phase, 2);
  wait_go(w);
  if (w == 1) {
    base_sleep_ms(300); /* worker 0 is gone: its hang-up reached the watch meanwhile */
    CHECK_EQ_INT(cohort_comm_failed(c), 0);
    atomic_store(&g_sh->s[w].phase, 3);
  }
  cohort_comm_destroy(c);
  return check_report() != 0;
}

/* Reads what worker w has sent so far (counting `broken`), without waiting. */
static void drain(int w) {
  char buf[1100];
  ssize_t n;
  while ((n = recv(g_agent[w], buf, sizeof buf - 1, MSG_DONTWAIT)) > 0)
    g_broken[w] += strncmp(buf, "broken ", 7) == 0;
}

static void test_idle(const char *tname) {
  char name[32], msg[300] = "";
  snprintf(name, sizeof name, "idle-%s", tname);
  if (start_world(name) != 0) {
    CHECK(!"store");
    return;
  }
  for (int w = 0; w < 3; w++) spawn(w, 0, w_idle);
  for (int w = 0; w < 3; w++) CHECK_EQ_INT(wait_phase(w, 1, 60000), 0);
  long long t = base_now_ms();
  kill_worker(2, SIGKILL);
  /* The survivors wait in wait_go, calling nothing of libcohort: only the watch can say it. */
  for (int w = 0; w < 2; w++) {
    CHECK_EQ_INT(agent_expect(w, "broken", FAST_MS, msg, sizeof msg), 0);
    CHECK(strncmp(msg, "broken epoch=0 why=", 19) == 0);
    CHECK_EQ_INT(atomic_load(&g_sh->s[w].phase), 1);
  }
  printf("kill -9 of an idle rank to `broken` from both survivors (idle): %lld ms; %s\n",
         base_now_ms() - t, msg);
  for (int w = 0; w < 2; w++) release(w);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "ready", 20000, NULL, 0), 0);
  for (int w = 0; w < 2; w++) agent_form(w, 1, w, 2);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "formed", 30000, NULL, 0), 0);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(wait_phase(w, 2, 60000), 0);
  drain(1);
  g_broken[1] = 0;
  release(0);
  CHECK(reap(0, 30000));
  release(1);
  CHECK_EQ_INT(wait_phase(1, 3, 30000), 0);
  drain(1);
  CHECK_EQ_INT(g_broken[1], 0); /* worker 0 left in good order */
  CHECK(reap(1, 30000));
  store_fork_stop(&g_sf);
}

/* ---- grow: a node joining, deferred to a boundary the ranks agree on ---- */

#define WHY_GROW "a node joins"
#define WHY_LOSS "node 7 lost while a node joins"

/* Allreduces until one fails; phase `seen` once a grow is pending here. Records the failure. */
static int w_loop_grow(int w, cohort_comm *c, int seen) {
  size_t count = 1u << 16;
  float *buf = calloc(count, sizeof *buf);
  int rc = buf == NULL ? -ENOMEM : 0;
  int64_t end = base_now_ms() + 120000;
  while (rc == 0 && base_now_ms() < end) {
    rc = cohort_allreduce(c, buf, buf, count, COHORT_F32, COHORT_SUM);
    if (rc == 0 && cohort_comm_grow_pending(c) == 1 && atomic_load(&g_sh->s[w].phase) < seen)
      atomic_store(&g_sh->s[w].phase, seen);
  }
  w_record(w, c, rc);
  free(buf);
  return rc;
}

/* Membership 1 of 3 (the newcomer, rank 2, joined), and what follows on every rank: a loss while
 * a grow is pending ends the membership at once; a grow not re-formed within the deferral ends
 * it after it; without the deferral a grow ends it at once. */
static int w_grown(int w, cohort_comm *c) {
  CHECK_EQ_INT(cohort_comm_grow_pending(c), 0);
  w_sum_check(c, 100000);
  atomic_store(&g_sh->s[w].phase, 2);
  CHECK_EQ_INT(w_loop_grow(w, c, 3), COHORT_ERESHAPED);
  CHECK(names_why(w, g_sh->s[w].errmsg, WHY_LOSS));
  if (w_reform(w, c) != 0) return 1;
  w_sum_check(c, 1000);
  setenv("COHORT_GROW_DEFER_MS", "500", 1);
  CHECK_EQ_INT(cohort_comm_defer_grow(c, 1), 0);
  atomic_store(&g_sh->s[w].phase, 4);
  CHECK_EQ_INT(w_loop_grow(w, c, 5), COHORT_ERESHAPED);
  CHECK(names_why(w, g_sh->s[w].errmsg, "COHORT_GROW_DEFER_MS"));
  if (w_reform(w, c) != 0) return 1;
  CHECK_EQ_INT(cohort_comm_defer_grow(c, 0), 0);
  w_sum_check(c, 1000);
  atomic_store(&g_sh->s[w].phase, 6);
  CHECK_EQ_INT(w_loop_grow(w, c, 7), COHORT_ERESHAPED);
  CHECK(names_why(w, g_sh->s[w].errmsg, WHY_GROW));
  CHECK(strstr(g_sh->s[w].errmsg, "COHORT_GROW_DEFER_MS") == NULL);
  cohort_comm_destroy(c);
  return check_report() != 0;
}

/* Allreduces, each followed by the agreement a program makes (the pending flags' maximum), until
 * the ranks agree that a grow is pending (phase `phase` after the first); every collective
 * completes. Then a barrier, so that the caller may re-form at that boundary on a healthy
 * communicator. 1 when all of it held. */
static int w_until_agreed(int w, cohort_comm *c, int phase) {
  size_t count = 1u << 18;
  float *buf = calloc(count, sizeof *buf);
  int rc = buf == NULL ? -ENOMEM : 0, agreed = 0;
  int64_t end = base_now_ms() + 120000;
  for (long it = 0; rc == 0 && !agreed && base_now_ms() < end; it++) {
    rc = cohort_allreduce(c, buf, buf, count, COHORT_F32, COHORT_SUM);
    if (rc == 0 && it == 0) atomic_store(&g_sh->s[w].phase, phase);
    cohort_comm_set_step(c, it);
    int32_t f = cohort_comm_grow_pending(c);
    if (rc == 0) rc = cohort_allreduce(c, &f, &f, 1, COHORT_I32, COHORT_MAX);
    agreed = rc == 0 && f == 1;
  }
  free(buf);
  w_record(w, c, rc);
  CHECK_EQ_INT(rc, 0);
  CHECK(agreed);
  CHECK_EQ_INT(cohort_comm_failed(c), 0);
  /* This rank's own message may come a moment after a peer's flag said so. */
  for (int i = 0; i < FAST_MS && cohort_comm_grow_pending(c) != 1; i++) base_sleep_ms(1);
  CHECK_EQ_INT(cohort_comm_grow_pending(c), 1);
  cohort_barrier(c); /* no rank closes its connections before every rank is through the flags */
  return agreed;
}

/* Membership 0 of 2, grows deferred: the ranks agree on a boundary after the grow and re-form
 * there. */
static int w_grow(int w) {
  cohort_comm *c = w_create(w, 2, 0);
  if (c == NULL) return 1;
  CHECK_EQ_INT(cohort_comm_defer_grow(c, 1), 0);
  if (!w_until_agreed(w, c, 1) || w_reform(w, c) != 0) return 1;
  return w_grown(w, c);
}

static int w_grow_new(int w) {
  cohort_comm *c = w_create(2, 3, 1);
  if (c == NULL) return 1;
  CHECK_EQ_INT(cohort_comm_defer_grow(c, 1), 0);
  return w_grown(w, c);
}

/* Sends a reshape to workers 0-2 once each reached `phase`; the time it was sent. */
static long long reshape_at(int phase, const char *msg) {
  for (int w = 0; w < 3; w++) CHECK_EQ_INT(wait_phase(w, phase, 60000), 0);
  long long t = base_now_ms();
  for (int w = 0; w < 3; w++) agent_send(w, "%s", msg);
  return t;
}

/* Every worker said ready (within `ms` of t when ms > 0), and gets membership `epoch` of 3. */
static void reform_all(int epoch, long long t, int ms, const char *what) {
  const int ws[] = {0, 1, 2};
  for (int w = 0; w < 3; w++) CHECK_EQ_INT(agent_expect(w, "ready", 30000, NULL, 0), 0);
  if (ms > 0) check_survivors(ws, 3, t, ms, what);
  for (int w = 0; w < 3; w++) agent_form(w, epoch, w, 3);
  for (int w = 0; w < 3; w++) CHECK_EQ_INT(agent_expect(w, "formed", 30000, NULL, 0), 0);
}

/* Two workers running fn reach their phase 1, then rank 1 is stopped: rank 0 waits for it
 * inside an allreduce. 0, or -1 (a check failed). */
static int rank1_stopped(const char *name, int (*fn)(int w)) {
  if (start_world(name) != 0) {
    CHECK(!"store");
    return -1;
  }
  for (int w = 0; w < 2; w++) spawn(w, 0, fn);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(wait_phase(w, 1, 60000), 0);
  int st = 0;
  kill(g_pid[1], SIGSTOP);
  CHECK(waitpid(g_pid[1], &st, WUNTRACED) == g_pid[1] && WIFSTOPPED(st));
  base_sleep_ms(200);
  return 0;
}

/*
 * A grow reshape reaches rank 0 while it waits in an allreduce for rank 1 (stopped): the
 * allreduce completes once rank 1 goes on, both ranks agree on the boundary and re-form there
 * with a newcomer as rank 2; the membership of 3 works. Then, with a grow pending, a loss's
 * reshape ends the membership at once; a grow not re-formed within COHORT_GROW_DEFER_MS ends it
 * after that; with the deferral off, a grow ends it at once as a loss does.
 */
static void test_grow(const char *tname) {
  char name[32];
  snprintf(name, sizeof name, "grow-%s", tname);
  if (rank1_stopped(name, w_grow) != 0) return;
  for (int w = 0; w < 2; w++) agent_send(w, "reshape epoch=0 grow=1 defer_ms=600000 why=" WHY_GROW);
  base_sleep_ms(300);
  CHECK_EQ_INT(atomic_load(&g_sh->s[0].t_err), 0); /* no collective of rank 0 failed */
  kill(g_pid[1], SIGCONT);
  char msg[200] = "";
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "ready", 30000, msg, sizeof msg), 0);
  printf("deferred grow: %s\n", msg);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(atomic_load(&g_sh->s[w].err), 0);
  spawn(2, 1, w_grow_new);
  for (int w = 0; w < 2; w++) agent_form(w, 1, w, 3);
  CHECK_EQ_INT(agent_expect(2, "hello", 20000, NULL, 0), 0);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "formed", 30000, NULL, 0), 0);
  reshape_at(2, "reshape epoch=1 grow=1 why=" WHY_GROW);
  long long t = reshape_at(3, "reshape epoch=1 why=" WHY_LOSS);
  reform_all(2, t, MSG_FAST_MS, "a loss while a grow is pending");
  t = reshape_at(4, "reshape epoch=2 grow=1 why=" WHY_GROW);
  reform_all(3, t, OP_TIMEOUT_MS, "a grow past COHORT_GROW_DEFER_MS=500");
  t = reshape_at(6, "reshape epoch=3 grow=1 why=" WHY_GROW);
  for (int w = 0; w < 3; w++) CHECK(reap(w, 30000));
  const int ws[] = {0, 1, 2};
  check_survivors(ws, 3, t, MSG_FAST_MS, "a grow not deferred");
  store_fork_stop(&g_sf);
}

/* ---- grow-break: a grow early in a step ends it at once, a later one is deferred ---- */

#define BREAK_CALL "cohort_comm_grow_break_for"

/*
 * Membership 0 of 2, grows deferred, a break window of 10 minutes open: allreduces until one
 * fails, which the grow does (ERESHAPED naming the call, nothing pending). Membership 1: a window
 * of 100 ms that passed before the grow came: it is deferred, the ranks agree on it and re-form
 * at that boundary. Membership 2, no window: a grow comes and is pending; opening a window then
 * ends the membership at once (1), and the next collective returns ERESHAPED (worker 0 opens its
 * window once worker 1 saw the grow pending, worker 1 once worker 0's collective failed).
 */
static int w_break(int w) {
  cohort_comm *c = w_create(w, 2, 0);
  if (c == NULL) return 1;
  CHECK_EQ_INT(cohort_comm_defer_grow(c, 1), 0);
  CHECK_EQ_INT(cohort_comm_grow_break_for(c, -1), -EINVAL);
  CHECK_EQ_INT(cohort_comm_grow_break_for(c, 600000), 0);
  size_t count = 1u << 18;
  float *buf = calloc(count, sizeof *buf);
  CHECK_EQ_INT(w_loop_until_error(w, c, buf, count), COHORT_ERESHAPED);
  free(buf);
  if (w == 0) CHECK(names_why(w, g_sh->s[w].errmsg, BREAK_CALL)); /* 1's: either's reason */
  CHECK_EQ_INT(cohort_comm_grow_pending(c), 0);
  if (w_reform(w, c) != 0) return 1;
  CHECK_EQ_INT(cohort_comm_grow_break_for(c, 100), 0);
  base_sleep_ms(300);
  if (!w_until_agreed(w, c, 3) || w_reform(w, c) != 0) return 1;
  w_sum_check(c, 1000);
  atomic_store(&g_sh->s[w].phase, 5);
  for (int i = 0; i < FAST_MS && cohort_comm_grow_pending(c) != 1; i++) base_sleep_ms(1);
  CHECK_EQ_INT(cohort_comm_grow_pending(c), 1);
  CHECK_EQ_INT(cohort_comm_grow_break_for(c, 0), 0); /* no window: still deferred */
  CHECK_EQ_INT(cohort_comm_failed(c), 0);
  atomic_store(&g_sh->s[w].phase, 6);
  CHECK_EQ_INT(w == 0 ? wait_phase(1, 6, 60000) : wait_phase(0, 7, 60000), 0);
  CHECK_EQ_INT(cohort_comm_grow_break_for(c, 1000), 1);
  int32_t v = 1;
  int rc = cohort_allreduce(c, &v, &v, 1, COHORT_I32, COHORT_SUM);
  w_record(w, c, rc);
  atomic_store(&g_sh->s[w].phase, 7);
  CHECK_EQ_INT(rc, COHORT_ERESHAPED);
  if (w == 0) CHECK(names_why(w, g_sh->s[w].errmsg, BREAK_CALL));
  cohort_comm_destroy(c);
  return check_report() != 0;
}

/* Both workers ready for membership e-1's end, then given membership e of 2 (the same ranks). */
static void reform_two(int e) {
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "ready", 30000, NULL, 0), 0);
  for (int w = 0; w < 2; w++) agent_form(w, e, w, 2);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(agent_expect(w, "formed", 30000, NULL, 0), 0);
}

/*
 * A grow reaches rank 0 within its break window while it waits in an allreduce for rank 1
 * (stopped): the allreduce returns ERESHAPED before rank 1 goes on (deferred, it would wait for
 * it), and rank 1's too once it does. A grow after the window is deferred to the boundary the
 * ranks agree on; a grow pending when a window opens ends the membership then.
 */
static void test_grow_break(const char *tname) {
  char name[32];
  snprintf(name, sizeof name, "break-%s", tname);
  if (rank1_stopped(name, w_break) != 0) return;
  long long t = base_now_ms();
  for (int w = 0; w < 2; w++) agent_send(w, "reshape epoch=0 grow=1 defer_ms=600000 why=" WHY_GROW);
  for (int i = 0; i < MSG_FAST_MS && atomic_load(&g_sh->s[0].t_err) == 0; i++) base_sleep_ms(1);
  const int w0[] = {0};
  check_survivors(w0, 1, t, MSG_FAST_MS, "grow within the break window, its peer stopped,");
  kill(g_pid[1], SIGCONT);
  for (int i = 0; i < OP_TIMEOUT_MS && atomic_load(&g_sh->s[1].t_err) == 0; i++) base_sleep_ms(1);
  const int ws[] = {0, 1};
  check_survivors(ws, 2, t, OP_TIMEOUT_MS, "grow within the break window");
  reform_two(1);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(wait_phase(w, 3, 60000), 0);
  for (int w = 0; w < 2; w++) agent_send(w, "reshape epoch=1 grow=1 defer_ms=600000 why=" WHY_GROW);
  reform_two(2);
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(atomic_load(&g_sh->s[w].err), 0); /* deferred */
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(wait_phase(w, 5, 60000), 0);
  for (int w = 0; w < 2; w++) agent_send(w, "reshape epoch=2 grow=1 defer_ms=600000 why=" WHY_GROW);
  for (int w = 0; w < 2; w++) CHECK(reap(w, 60000));
  for (int w = 0; w < 2; w++) CHECK_EQ_INT(atomic_load(&g_sh->s[w].err), COHORT_ERESHAPED);
  store_fork_stop(&g_sf);
}

/* tcp, shm, or single (shared memory with cohort_mem_alloc buffers). */
static int set_transport(const char *t) {
  g_single = strcmp(t, "single") == 0;
  if (strcmp(t, "tcp") == 0)
    g_tport = COHORT_TRANSPORT_TCP;
  else if (strcmp(t, "shm") == 0 || g_single)
    g_tport = COHORT_TRANSPORT_SHM;
  else
    return -1;
  return 0;
}

static int unit(void) {
  test_parser();
  test_tcp_abort_record();
  test_tcp_abort_race();
  test_no_channel();
  test_protocol();
  test_joiner(1);
  test_joiner(0);
  test_alone();
  test_leaks(COHORT_TRANSPORT_TCP);
  test_leaks(COHORT_TRANSPORT_SHM);
  return check_report();
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_sh == MAP_FAILED) return 1;
  if (argc >= 2 && strcmp(argv[1], "unit") == 0) return unit();
  if (argc >= 3 && strcmp(argv[1], "kill") == 0 && set_transport(argv[2]) == 0) {
    test_kill(argv[2]);
    return check_report();
  }
  if (argc >= 3 && strcmp(argv[1], "idle") == 0 && set_transport(argv[2]) == 0) {
    test_idle(argv[2]);
    return check_report();
  }
  if (argc >= 3 && strcmp(argv[1], "grow") == 0 && set_transport(argv[2]) == 0) {
    test_grow(argv[2]);
    return check_report();
  }
  if (argc >= 3 && strcmp(argv[1], "break") == 0 && set_transport(argv[2]) == 0) {
    test_grow_break(argv[2]);
    return check_report();
  }
  if (argc >= 3 && strcmp(argv[1], "reshape") == 0 && set_transport(argv[2]) == 0) {
    test_reshape(argv[2]);
    return check_report();
  }
  fprintf(stderr,
          "usage: test_reform_coll unit | kill tcp|shm|single | idle tcp|shm | reshape tcp|shm | "
          "grow tcp|shm | break tcp|shm\n");
  return 2;
}

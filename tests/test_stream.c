/*
 * test_stream.c - the state streamed to new ranks in the background
 * (cohort_comm_state_stream_begin/poll/end, src/coll/stream.c) with real
 * forked ranks over a store of the test's own; no agent (a rank counts itself
 * new with cohort_comm_mark_new).
 *
 *   test_stream T    (T: tcp, shm: the communicator's transport; the stream
 *                    has a connection of its own either way)
 *     - 3 ranks, rank 2 new: pieces of the same sizes (one empty) arrive
 *       whole, while every rank's main thread keeps allreducing (the stream
 *       made slow with COHORT_STREAM_RATE: the allreduces complete during it);
 *       the receiver is no longer new afterwards;
 *     - pieces of other sizes: COHORT_EMISMATCH on every rank;
 *     - no new rank: it has ended at once;
 *     - the donor killed mid-stream: the receiver's poll gives an error (not a
 *       hang) and end returns it.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "cohort/cohort.h"
#include "store_fork.h"

#define NRANKS 3
#define BIG ((size_t)8 << 20)
#define OP_TIMEOUT_MS 30000

typedef struct shared {
  atomic_int phase[NRANKS]; /* the kill case: 1 once the receiver has bytes */
  atomic_llong during;      /* allreduces the ranks completed while the stream ran */
} shared;

static shared *g_sh;
static char g_store[64], g_job[96];
static cohort_transport g_tport;

static unsigned char pattern(size_t i) {
  return (unsigned char)(i * 2654435761u >> 13);
}

static cohort_comm *create(int rank) {
  cohort_comm_config cfg = {.rank = rank,
                            .size = NRANKS,
                            .store_addr = g_store,
                            .job_id = g_job,
                            .timeout_ms = OP_TIMEOUT_MS,
                            .transport = g_tport};
  cohort_comm *c = NULL;
  int rc = cohort_comm_create(&cfg, &c);
  if (rc != 0) fprintf(stderr, "rank %d: create: %s\n", rank, cohort_strerror(rc));
  return c;
}

/* An allreduce of ones: 0 when every element is NRANKS. */
static int sum_ok(cohort_comm *c) {
  int32_t v[256];
  for (int i = 0; i < 256; i++) v[i] = 1;
  int rc = cohort_allreduce(c, v, v, 256, COHORT_I32, COHORT_SUM);
  for (int i = 0; i < 256 && rc == 0; i++)
    if (v[i] != NRANKS) rc = -1;
  return rc;
}

/* Every rank polls its end of the stream and allreduces until every rank's end has ended
 * (agreed by the allreduce of a flag: the ranks leave the loop together). */
static int run_during(cohort_comm *c, cohort_stream *s) {
  long long during = 0;
  int rc = 0, st = 0;
  for (int it = 0; it < 100000 && rc == 0; it++) {
    st = cohort_comm_state_stream_poll(s, NULL);
    int32_t running = st == 0;
    rc = cohort_allreduce(c, &running, &running, 1, COHORT_I32, COHORT_SUM);
    if (rc == 0 && running == 0) break;
    if (rc == 0) rc = sum_ok(c);
    during += rc == 0;
    usleep(2000);
  }
  atomic_fetch_add(&g_sh->during, during);
  CHECK_EQ_INT(rc, 0);
  return st;
}

static int case_pieces(cohort_comm *c, int rank) {
  int newcomer = rank == NRANKS - 1;
  unsigned char *a = malloc(BIG), b[1000];
  if (a == NULL) return 1;
  for (size_t i = 0; i < BIG; i++) a[i] = newcomer ? 0 : pattern(i);
  for (size_t i = 0; i < sizeof b; i++) b[i] = newcomer ? 0 : pattern(i + 7);
  if (newcomer) CHECK_EQ_INT(cohort_comm_mark_new(c), 0);
  cohort_iov iov[3] = {{b, sizeof b}, {NULL, 0}, {a, BIG}};
  cohort_stream *s = NULL;
  CHECK_EQ_INT(cohort_comm_state_stream_begin(c, iov, 3, &s), 0);
  if (s == NULL) return 1;
  CHECK_EQ_INT(run_during(c, s), 1);
  CHECK_EQ_INT(cohort_comm_state_stream_end(c, s), 0);
  size_t bad = 0;
  for (size_t i = 0; i < BIG; i++) bad += a[i] != pattern(i);
  for (size_t i = 0; i < sizeof b; i++) bad += b[i] != pattern(i + 7);
  CHECK_EQ_INT(bad, 0);
  CHECK_EQ_INT(cohort_comm_is_new(c, rank), 0);
  /* Pieces of other sizes, the same total: refused on every rank. */
  if (newcomer) CHECK_EQ_INT(cohort_comm_mark_new(c), 0);
  cohort_iov skew[2] = {{a, BIG / 2 + (newcomer ? 8 : 0)}, {a + BIG / 2 + (newcomer ? 8 : 0), 0}};
  skew[1].len = BIG - skew[0].len;
  CHECK_EQ_INT(cohort_comm_state_stream_begin(c, skew, 2, &s), COHORT_EMISMATCH);
  CHECK(s == NULL);
  free(a);
  return 0;
}

/* Nobody new: it has ended at once on every rank. */
static void case_none(cohort_comm *c) {
  unsigned char b[64] = {0};
  cohort_iov iov = {b, sizeof b};
  cohort_stream *s = NULL;
  CHECK_EQ_INT(cohort_comm_state_stream_begin(c, &iov, 1, &s), 0);
  CHECK_EQ_INT(cohort_comm_state_stream_poll(s, NULL), 1);
  CHECK_EQ_INT(cohort_comm_state_stream_end(c, s), 0);
}

static int rank_main(int rank) {
  cohort_comm *c = create(rank);
  if (c == NULL) return 1;
  /* Nobody new yet: the first case; then rank 2 counts itself new. */
  case_none(c);
  case_pieces(c, rank);
  cohort_comm_destroy(c);
  return check_report();
}

/* The donor killed mid-stream: rank 0 streams 256 MiB at 1 MB/s; once the receiver has bytes the
 * parent kills it. */
static int kill_main(int rank) {
  cohort_comm *c = create(rank);
  if (c == NULL) return 1;
  size_t n = (size_t)256 << 20;
  unsigned char *a = malloc(n);
  if (a == NULL) return 1;
  memset(a, rank == 0 ? 0x5a : 0, n);
  if (rank == NRANKS - 1) cohort_comm_mark_new(c);
  cohort_iov iov = {a, n};
  cohort_stream *s = NULL;
  CHECK_EQ_INT(cohort_comm_state_stream_begin(c, &iov, 1, &s), 0);
  if (s == NULL) return 1;
  if (rank != NRANKS - 1) {
    for (int i = 0; i < 120000; i++) usleep(1000); /* the donor is killed; rank 1 waits too */
    return 0;
  }
  int st = 0;
  size_t got = 0;
  int64_t t0 = base_now_ms();
  for (int i = 0; i < 60000 && (st = cohort_comm_state_stream_poll(s, &got)) == 0; i++) {
    if (got > 0) atomic_store(&g_sh->phase[rank], 1);
    usleep(1000);
  }
  CHECK(st < 0);
  CHECK(st == COHORT_EPEER);
  CHECK(base_now_ms() - t0 < 60000);
  CHECK(got > 0 && got < n);
  CHECK_EQ_INT(cohort_comm_state_stream_end(c, s), st);
  CHECK_EQ_INT(cohort_comm_is_new(c, rank), 1);
  free(a);
  cohort_comm_abort(c);
  cohort_comm_destroy(c);
  return check_report();
}

static pid_t fork_rank(int rank, int (*fn)(int)) {
  pid_t pid = fork();
  if (pid == 0) _exit(fn(rank));
  return pid;
}

static int exit_ok(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void run_case(const char *name, store_fork *sf, int kill_donor) {
  snprintf(g_job, sizeof g_job, "tstream-%s-%d", name, (int)getpid());
  (void)sf;
  pid_t pid[NRANKS];
  for (int r = 0; r < NRANKS; r++) pid[r] = fork_rank(r, kill_donor ? kill_main : rank_main);
  if (!kill_donor) {
    for (int r = 0; r < NRANKS; r++) CHECK(exit_ok(pid[r]));
    return;
  }
  for (int i = 0; i < 60000 && !atomic_load(&g_sh->phase[NRANKS - 1]); i++) usleep(1000);
  CHECK_EQ_INT(atomic_load(&g_sh->phase[NRANKS - 1]), 1);
  kill(pid[0], SIGKILL);
  waitpid(pid[0], NULL, 0);
  CHECK(exit_ok(pid[NRANKS - 1]));
  kill(pid[1], SIGKILL);
  waitpid(pid[1], NULL, 0);
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2 || (strcmp(argv[1], "tcp") != 0 && strcmp(argv[1], "shm") != 0)) {
    fprintf(stderr, "usage: test_stream tcp|shm\n");
    return 2;
  }
  g_tport = strcmp(argv[1], "tcp") == 0 ? COHORT_TRANSPORT_TCP : COHORT_TRANSPORT_SHM;
  g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_sh == MAP_FAILED) return 1;
  store_server_opts so = {.bind_host = "127.0.0.1"};
  store_fork sf;
  if (store_fork_start(&so, 1, &sf) != 0) return 1;
  snprintf(g_store, sizeof g_store, "127.0.0.1:%d", sf.port);
  /* 8 MiB at 4 MB/s: about 2 s during which the ranks keep allreducing. */
  setenv("COHORT_STREAM_RATE", "4000000", 1);
  run_case("pieces", &sf, 0);
  printf("allreduces completed while the stream ran: %lld\n",
         (long long)atomic_load(&g_sh->during));
  CHECK(atomic_load(&g_sh->during) >= NRANKS);
  setenv("COHORT_STREAM_RATE", "1000000", 1);
  run_case("kill", &sf, 1);
  store_fork_stop(&sf);
  return check_report();
}

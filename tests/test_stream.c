/*
 * test_stream.c - the state streamed to new ranks in the background
 * (cohort_comm_state_stream_begin/poll/end, src/coll/stream.c) with real
 * forked ranks over a store of the test's own; no agent (a rank counts itself
 * new with cohort_comm_mark_new).
 *
 *   test_stream T    (T: tcp, shm: the communicator's transport; the stream
 *                    has connections of its own either way)
 *     - every rank not new is a donor and sends its share of the bytes: the
 *       donors here hold different bytes (the API wants the same state on
 *       every donor), so the receiver shows that each byte came from the donor
 *       whose share holds it, while every rank's main thread keeps allreducing
 *       (the stream made slow with COHORT_STREAM_RATE: the allreduces complete
 *       during it); each donor's poll counts its share, a receiver's every
 *       byte; the receivers are no longer new afterwards;
 *     - 2 donors and shares that end inside pieces, empty pieces, an empty
 *       share (1 byte over 2 donors), no bytes at all; 1 donor and 2 new ranks;
 *     - the same with COHORT_STREAM_COPY: each donor's bytes outside its share
 *       are poison from the start and all of them once wait_copy returned
 *       (which gives the copy's size: the share's), so a byte read outside
 *       the share, or from the pieces instead of the copy, shows at the
 *       receiver; without the flag a donor's wait_copy is refused;
 *     - pieces of other sizes: COHORT_EMISMATCH on every rank;
 *     - no new rank: it has ended at once;
 *     - COHORT_STREAM_IDLE: while the donors have a collective in flight
 *       (an allreduce the receiver joins a second later) they send at their
 *       floor rate only; all of it arrives once it is done;
 *     - either donor killed mid-stream: the receiver's poll gives COHORT_EPEER
 *       (not a hang, not the timeout) and end returns it; the other donor's
 *       stream fails too.
 */
#include <errno.h>
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
  atomic_llong held_back;   /* the idle case: bytes in while the donors' collective was in flight */
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

/* The byte donor rank r holds at offset i of the pieces' concatenation. */
static unsigned char held(size_t i, int r) {
  return (unsigned char)(pattern(i) + 17 * r);
}

/* Share j of d donors of `bytes` (docs/collectives.md): its first byte. */
static size_t share_at(size_t bytes, int j, int d) {
  size_t q = bytes / (size_t)d, rem = bytes % (size_t)d;
  return (size_t)j * q + ((size_t)j < rem ? (size_t)j : rem);
}

/* The donor that sends byte i: the j-th rank not in newmask, share j holding i. */
static int sender(size_t i, size_t bytes, unsigned newmask) {
  int d = 0, donor[NRANKS];
  for (int r = 0; r < NRANKS; r++)
    if (!(newmask >> r & 1)) donor[d++] = r;
  for (int j = 0; j < d; j++)
    if (i < share_at(bytes, j + 1, d)) return donor[j];
  return -1;
}

/* A byte no receiver may get from donor `rank` at offset i: never held(i, rank). */
static unsigned char poison(size_t i, int rank) {
  return (unsigned char)(held(i, rank) ^ 0xa5);
}

/* Fills the pieces: zeros on a new rank; held(., rank) on a donor, poison outside [lo, hi) when
 * `outside` (a donor that reads beyond its share sends poison). */
static void fill(cohort_iov *iov, int n, int newcomer, int rank, int outside, size_t lo,
                 size_t hi) {
  for (size_t i = 0, off = 0; i < (size_t)n; i++)
    for (size_t k = 0; k < iov[i].len; k++, off++)
      ((unsigned char *)iov[i].base)[k] = newcomer                             ? 0
                                          : outside && (off < lo || off >= hi) ? poison(off, rank)
                                                                               : held(off, rank);
}

/* A donor begun with COHORT_STREAM_COPY: once wait_copy says its share is copied (the copy's size
 * that share's, no more), every byte of its pieces turns to poison, so that a byte sent from them
 * rather than from the copy shows at the receiver. Without the flag wait_copy is refused. */
static void after_begin(cohort_stream *s, cohort_iov *iov, int n, int rank, unsigned flags,
                        size_t share) {
  size_t copied = 1;
  int rc = cohort_comm_state_stream_wait_copy(s, &copied);
  if (!(flags & COHORT_STREAM_COPY)) {
    CHECK_EQ_INT(rc, share > 0 ? -EINVAL : 0);
    return;
  }
  CHECK_EQ_INT(rc, 0);
  CHECK_EQ_INT(copied, share);
  for (size_t i = 0, off = 0; i < (size_t)n; i++)
    for (size_t k = 0; k < iov[i].len; k++, off++)
      ((unsigned char *)iov[i].base)[k] = poison(off, rank);
}

/* One stream: the ranks in newmask are new; pieces of the given sizes (a size of 0 has a NULL
 * base when odd-numbered). Each donor holds held(., rank) (with COHORT_STREAM_COPY only in its
 * share: poison outside it, and everywhere once copied); each receiver ends with the sender's. */
static void stream_case(cohort_comm *c, int rank, unsigned newmask, const size_t *len, int n,
                        unsigned flags) {
  int newcomer = newmask >> rank & 1, d = 0, j = -1;
  for (int r = 0; r < NRANKS; r++) {
    if (newmask >> r & 1) continue;
    if (r == rank) j = d;
    d++;
  }
  cohort_iov iov[8];
  size_t bytes = 0;
  for (int i = 0; i < n; i++) {
    iov[i].len = len[i];
    iov[i].base = len[i] > 0 || i % 2 == 0 ? malloc(len[i] > 0 ? len[i] : 1) : NULL;
    bytes += len[i];
  }
  size_t lo = newcomer ? 0 : share_at(bytes, j, d), hi = newcomer ? 0 : share_at(bytes, j + 1, d);
  fill(iov, n, newcomer, rank, (flags & COHORT_STREAM_COPY) != 0, lo, hi);
  if (newcomer) CHECK_EQ_INT(cohort_comm_mark_new(c), 0);
  cohort_stream *s = NULL;
  CHECK_EQ_INT(cohort_comm_state_stream_begin_flags(c, iov, n, flags, &s), 0);
  if (s == NULL) return;
  if (!newcomer) after_begin(s, iov, n, rank, flags, hi - lo);
  CHECK_EQ_INT(run_during(c, s), 1);
  size_t moved = 0;
  CHECK_EQ_INT(cohort_comm_state_stream_poll(s, &moved), 1);
  CHECK_EQ_INT(moved, newcomer ? bytes : hi - lo);
  CHECK_EQ_INT(cohort_comm_state_stream_end(c, s), 0);
  size_t bad = 0, off = 0;
  for (int i = 0; i < n; i++) {
    for (size_t k = 0; k < len[i]; k++, off++)
      bad += ((unsigned char *)iov[i].base)[k] != (newcomer ? held(off, sender(off, bytes, newmask))
                                                   : flags & COHORT_STREAM_COPY ? poison(off, rank)
                                                                                : held(off, rank));
    free(iov[i].base);
  }
  CHECK_EQ_INT(bad, 0);
  CHECK_EQ_INT(cohort_comm_is_new(c, rank), 0);
}

static void case_pieces(cohort_comm *c, int rank, unsigned flags) {
  size_t big[3] = {999, 0, BIG}; /* 2 donors: the shares meet inside the big piece */
  stream_case(c, rank, 1u << 2, big, 3, flags);
  size_t odd[6] = {0, 7, 0, 3, 1, 0}; /* 11 bytes: 6 + 5, share 0 ends inside the 7 */
  stream_case(c, rank, 1u << 0, odd, 6, flags);
  size_t one = 1; /* 1 byte over 2 donors: the second's share is empty */
  stream_case(c, rank, 1u << 1, &one, 1, flags);
  size_t none[2] = {0, 0};
  stream_case(c, rank, 1u << 2, none, 2, flags);
  size_t two[3] = {12345, 0, ((size_t)1 << 20) + 3}; /* 1 donor, 2 new ranks */
  stream_case(c, rank, 1u << 1 | 1u << 2, two, 3, flags);
  /* Pieces of other sizes, the same total: refused on every rank. */
  unsigned char *a = malloc(BIG);
  int newcomer = rank == NRANKS - 1;
  if (newcomer) CHECK_EQ_INT(cohort_comm_mark_new(c), 0);
  cohort_iov skew[2] = {{a, BIG / 2 + (newcomer ? 8 : 0)}, {a + BIG / 2 + (newcomer ? 8 : 0), 0}};
  skew[1].len = BIG - skew[0].len;
  cohort_stream *s = NULL;
  CHECK_EQ_INT(cohort_comm_state_stream_begin(c, skew, 2, &s), COHORT_EMISMATCH);
  CHECK(s == NULL);
  free(a);
}

/* Nobody new: it has ended at once on every rank. */
static void case_none(cohort_comm *c) {
  unsigned char b[64] = {0};
  cohort_iov iov = {b, sizeof b};
  cohort_stream *s = NULL;
  CHECK_EQ_INT(cohort_comm_state_stream_begin(c, &iov, 1, &s), 0);
  CHECK_EQ_INT(cohort_comm_state_stream_poll(s, NULL), 1);
  CHECK_EQ_INT(cohort_comm_state_stream_wait_copy(s, NULL), 0); /* nothing is read */
  CHECK_EQ_INT(cohort_comm_state_stream_end(c, s), 0);
}

static int rank_main(int rank) {
  cohort_comm *c = create(rank);
  if (c == NULL) return 1;
  /* Nobody new yet: the first case; then the ranks each case names count themselves new. */
  case_none(c);
  case_pieces(c, rank, 0);
  case_pieces(c, rank, COHORT_STREAM_COPY);
  cohort_comm_destroy(c);
  return check_report();
}

/* A donor killed mid-stream: ranks 0 and 1 stream 256 MiB at 1 MB/s each; once the receiver has
 * bytes the parent kills g_victim. The receiver's stream fails with COHORT_EPEER, and then the
 * other donor's (the receiver shut its connections down). */
static int g_victim;

static int kill_main(int rank) {
  cohort_comm *c = create(rank);
  if (c == NULL) return 1;
  size_t n = (size_t)256 << 20;
  unsigned char *a = malloc(n);
  if (a == NULL) return 1;
  memset(a, rank == NRANKS - 1 ? 0 : 0x5a, n);
  if (rank == NRANKS - 1) cohort_comm_mark_new(c);
  cohort_iov iov = {a, n};
  cohort_stream *s = NULL;
  CHECK_EQ_INT(cohort_comm_state_stream_begin(c, &iov, 1, &s), 0);
  if (s == NULL) return 1;
  if (rank == g_victim) {
    for (int i = 0; i < 120000; i++) usleep(1000); /* killed meanwhile */
    return 0;
  }
  int st = 0;
  size_t got = 0;
  for (int i = 0; i < 60000 && (st = cohort_comm_state_stream_poll(s, &got)) == 0; i++) {
    if (rank == NRANKS - 1 && got > 0) atomic_store(&g_sh->phase[rank], 1);
    usleep(1000);
  }
  CHECK(st < 0);
  CHECK(st == COHORT_EPEER);
  /* The receiver had bytes; the other donor may have been cut off within its first slice. */
  CHECK(rank == NRANKS - 1 ? got > 0 && got < n : got < n / 2);
  CHECK_EQ_INT(cohort_comm_state_stream_end(c, s), st);
  CHECK_EQ_INT(cohort_comm_is_new(c, rank), rank == NRANKS - 1);
  free(a);
  cohort_comm_abort(c);
  cohort_comm_destroy(c);
  return check_report();
}

/* COHORT_STREAM_IDLE (a floor of 16 kB/s): 8 MiB from 2 donors, while each donor has an
 * allreduce in flight that the receiver joins only after a second. Meanwhile the donors send at
 * their floor: the receiver has at most 2 x (16 kB + a 256 KiB slice) of the 8 MiB then (the
 * check allows 10 times that), and all of it once the collective is done. */
static int idle_main(int rank) {
  cohort_comm *c = create(rank);
  if (c == NULL) return 1;
  int newcomer = rank == NRANKS - 1;
  unsigned char *a = malloc(BIG);
  if (a == NULL) return 1;
  for (size_t i = 0; i < BIG; i++) a[i] = newcomer ? 0 : held(i, 0);
  if (newcomer) CHECK_EQ_INT(cohort_comm_mark_new(c), 0);
  cohort_iov iov = {a, BIG};
  cohort_stream *s = NULL;
  CHECK_EQ_INT(cohort_comm_state_stream_begin(c, &iov, 1, &s), 0);
  if (s == NULL) return 1;
  int32_t v = 1;
  cohort_request *req = NULL;
  if (newcomer) {
    usleep(1000000);
    size_t got = 0;
    CHECK_EQ_INT(cohort_comm_state_stream_poll(s, &got), 0);
    atomic_store(&g_sh->held_back, (long long)got);
    CHECK(got < 10 * 2 * (16384 + (256 << 10)));
  }
  CHECK_EQ_INT(cohort_iallreduce(c, &v, &v, 1, COHORT_I32, COHORT_SUM, &req), 0);
  CHECK_EQ_INT(cohort_request_wait(req), 0);
  CHECK_EQ_INT(v, NRANKS);
  CHECK_EQ_INT(run_during(c, s), 1);
  CHECK_EQ_INT(cohort_comm_state_stream_end(c, s), 0);
  size_t bad = 0;
  for (size_t i = 0; i < BIG; i++) bad += a[i] != held(i, 0);
  CHECK_EQ_INT(bad, 0);
  free(a);
  cohort_comm_destroy(c);
  return check_report();
}

static pid_t fork_rank(int rank, int (*fn)(int)) {
  pid_t pid = fork();
  if (pid == 0) {
    check_passed_count = check_failed_count = 0; /* the rank's own checks, not the parent's */
    _exit(fn(rank));
  }
  return pid;
}

static int exit_ok(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) return 1;
  fprintf(stderr, "pid %d: %s %d\n", (int)pid, WIFSIGNALED(status) ? "signal" : "exit",
          WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  return 0;
}

/* victim -1: every rank runs rank_main; -2: idle_main; else kill_main, and the parent kills the
 * victim once the receiver has bytes. */
static void run_case(const char *name, int victim) {
  snprintf(g_job, sizeof g_job, "tstream-%s-%d", name, (int)getpid());
  g_victim = victim;
  atomic_store(&g_sh->phase[NRANKS - 1], 0);
  pid_t pid[NRANKS];
  for (int r = 0; r < NRANKS; r++)
    pid[r] = fork_rank(r, victim == -2 ? idle_main : victim < 0 ? rank_main : kill_main);
  if (victim >= 0) {
    for (int i = 0; i < 60000 && !atomic_load(&g_sh->phase[NRANKS - 1]); i++) usleep(1000);
    CHECK_EQ_INT(atomic_load(&g_sh->phase[NRANKS - 1]), 1);
    kill(pid[victim], SIGKILL);
    waitpid(pid[victim], NULL, 0);
  }
  for (int r = 0; r < NRANKS; r++)
    if (r != victim) CHECK(exit_ok(pid[r]));
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
  /* 8 MiB from 2 donors at 4 MB/s each: about 1 s during which the ranks keep allreducing. */
  setenv("COHORT_STREAM_RATE", "4000000", 1);
  run_case("pieces", -1);
  printf("allreduces completed while the stream ran: %lld\n",
         (long long)atomic_load(&g_sh->during));
  CHECK(atomic_load(&g_sh->during) >= NRANKS);
  unsetenv("COHORT_STREAM_RATE");
  setenv("COHORT_STREAM_IDLE", "16384", 1);
  run_case("idle", -2);
  printf("bytes in while the donors' collective was in flight: %lld of %zu\n",
         (long long)atomic_load(&g_sh->held_back), BIG);
  unsetenv("COHORT_STREAM_IDLE");
  setenv("COHORT_STREAM_RATE", "1000000", 1);
  run_case("kill1", 1); /* not the lowest donor */
  run_case("kill0", 0);
  store_fork_stop(&sf);
  return check_report();
}

/*
 * state_transfer.c - how fast cohort_comm_state_transfer hands a survivor's
 * state to newcomers, beside the same bytes through cohort_broadcast (the
 * same chain over every rank) and beside memcpy of them in one process (the
 * memory bound of the one-host case). Not a test.
 *
 * usage: bench_state_transfer [MIB [REPS]]   (64 MiB, 5 reps)
 * Forks 1 donor + K newcomers (K = 1, 2, 3) on a loopback store, over TCP
 * and over shared memory; every rep the newcomers mark themselves new, the
 * donor fills the buffer with a pattern of the rep, the newcomers check
 * every byte. Prints the median of the reps per row and the ratios; a row
 * whose bytes arrived wrong, or whose ranks failed, prints "fail" and the
 * program exits 1.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "cohort/cohort.h"
#include "store_fork.h"

#define MAX_REPS 32

typedef struct result {
  _Atomic int bad;           /* a wrong byte or a failed call somewhere */
  double xfer_us[MAX_REPS];  /* rank 1's state transfer */
  double bcast_us[MAX_REPS]; /* rank 1's broadcast of the same bytes */
} result;

static result *g_res;
static size_t g_bytes;
static int g_reps;

static unsigned char pat(size_t i, int rep) {
  return (unsigned char)((i * 131u + (unsigned)rep * 17u) % 251u);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One rep of both: the state transfer, then the broadcast; rank 1 times them. */
static int rep(cohort_comm *c, unsigned char *buf, int r) {
  int me = cohort_comm_rank(c), rc;
  for (int k = 0; k < 2; k++) {
    if (me == 0)
      for (size_t i = 0; i < g_bytes; i++) buf[i] = pat(i, 2 * r + k);
    else
      memset(buf, 0, g_bytes);
    if (k == 0 && me > 0) cohort_comm_mark_new(c);
    if ((rc = cohort_barrier(c)) != 0) return rc;
    int64_t t0 = base_now_us();
    rc = k == 0 ? cohort_comm_state_transfer(c, buf, g_bytes)
                : cohort_broadcast(c, buf, g_bytes, COHORT_U8, 0);
    double us = (double)(base_now_us() - t0);
    if (rc != 0) return rc;
    if (me == 1) (k == 0 ? g_res->xfer_us : g_res->bcast_us)[r] = us;
    for (size_t i = 0; me > 0 && i < g_bytes; i++)
      if (buf[i] != pat(i, 2 * r + k)) return -1;
  }
  return 0;
}

static int rank_main(int rank, int world, int port, cohort_transport t) {
  char addr[64], job[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  snprintf(job, sizeof job, "bxfer-%d", (int)getppid());
  cohort_comm_config cfg = {.rank = rank,
                            .size = world,
                            .store_addr = addr,
                            .job_id = job,
                            .timeout_ms = 60000,
                            .transport = t};
  cohort_comm *c = NULL;
  int rc = cohort_comm_create(&cfg, &c);
  unsigned char *buf = malloc(g_bytes);
  for (int r = 0; rc == 0 && buf != NULL && r < g_reps; r++) rc = rep(c, buf, r);
  if (rc != 0 || buf == NULL) atomic_store(&g_res->bad, 1);
  free(buf);
  cohort_comm_destroy(c);
  return rc != 0;
}

static int run_row(int world, cohort_transport t) {
  store_fork sf;
  store_server_opts so = {.bind_host = "127.0.0.1"};
  if (store_fork_start(&so, 1, &sf) != 0) return -1;
  memset(g_res, 0, sizeof *g_res);
  pid_t pids[8];
  for (int r = 0; r < world; r++) {
    fflush(NULL);
    pids[r] = fork();
    if (pids[r] == 0) _exit(rank_main(r, world, sf.port, t));
  }
  int bad = 0;
  for (int r = 0; r < world; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  store_fork_stop(&sf);
  return bad || atomic_load(&g_res->bad) ? -1 : 0;
}

/* memcpy of the bytes in this process, median of the reps (the one-host memory bound). */
static double memcpy_us(void) {
  unsigned char *a = malloc(g_bytes), *b = malloc(g_bytes);
  double us[MAX_REPS];
  memset(a, 1, g_bytes);
  memset(b, 2, g_bytes);
  for (int r = 0; r < g_reps; r++) {
    int64_t t0 = base_now_us();
    memcpy(b, a, g_bytes);
    us[r] = (double)(base_now_us() - t0);
    a[r] ^= b[g_bytes - 1 - (size_t)r]; /* keep the copies */
  }
  free(a);
  free(b);
  return median(us, g_reps);
}

int main(int argc, char **argv) {
  int mib = argc > 1 ? atoi(argv[1]) : 64;
  g_reps = argc > 2 ? atoi(argv[2]) : 5;
  if (mib < 1 || mib > 4096 || g_reps < 1 || g_reps > MAX_REPS) {
    fprintf(stderr, "usage: bench_state_transfer [MIB (1-4096) [REPS (1-%d)]]\n", MAX_REPS);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  unsetenv("COHORT_CONTROL_FD");
  unsetenv("COHORT_NEWCOMER");
  g_bytes = (size_t)mib << 20;
  g_res = mmap(NULL, sizeof *g_res, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_res == MAP_FAILED) return 1;
  double mc = memcpy_us();
  printf("state transfer of %d MiB, median of %d reps (rank 1's time), memcpy %.2f GB/s\n", mib,
         g_reps, (double)g_bytes / mc / 1e3);
  printf("%-10s %10s %14s %14s %14s %12s\n", "transport", "newcomers", "transfer GB/s",
         "broadcast GB/s", "xfer/bcast", "xfer/memcpy");
  int failed = 0;
  const cohort_transport ts[] = {COHORT_TRANSPORT_TCP, COHORT_TRANSPORT_SHM};
  for (int ti = 0; ti < 2; ti++) {
    for (int k = 1; k <= 3; k++) {
      const char *tn = ti == 0 ? "tcp" : "shm";
      if (run_row(k + 1, ts[ti]) != 0) {
        printf("%-10s %10d %14s\n", tn, k, "fail");
        failed = 1;
        continue;
      }
      double x = median(g_res->xfer_us, g_reps), b = median(g_res->bcast_us, g_reps);
      printf("%-10s %10d %14.2f %14.2f %14.2f %12.2f\n", tn, k, (double)g_bytes / x / 1e3,
             (double)g_bytes / b / 1e3, b / x, mc / x);
      fflush(stdout);
    }
  }
  return failed;
}

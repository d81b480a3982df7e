/*
 * bench_store.c - the rendezvous store against PyTorch's TCPStore.
 *
 * Workloads, each run REPS times and reported as the median:
 *   ping/set/get/add: OPS sequential round trips of one client (64-byte
 *     values), as microseconds per operation;
 *   rendezvous N: N processes, forked beforehand and released together,
 *     each connect, add to a counter, set their own key, wait for all N keys
 *     and get them all (what a job start does), as milliseconds from the
 *     release to the last exit.
 * Both servers run as a thread of the benchmarking process. The peer is run
 * by bench/store_torch.py through /usr/bin/python3 (COHORT_BENCH_PYTHON
 * overrides), so its per-operation figures include the Python call overhead.
 *
 * usage: bench_store [REPS [OPS]]   (defaults 5 and 5000)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "store/store.h"

#ifndef BENCH_STORE_TORCH_SCRIPT
#define BENCH_STORE_TORCH_SCRIPT "bench/store_torch.py"
#endif

static const int rdzv_sizes[] = {8, 32};

enum { W_PING, W_SET, W_GET, W_ADD, W_FIXED };
#define NWORK (W_FIXED + (int)(sizeof rdzv_sizes / sizeof rdzv_sizes[0]))

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int one_op(store_client *c, int w, int i) {
  static const char value[64] = "x";
  char key[16];
  snprintf(key, sizeof key, "k%d", i % 100);
  int64_t dl = base_deadline_in(60000);
  switch (w) {
  case W_PING:
    return store_ping(c, dl);
  case W_SET:
    return store_set(c, key, value, sizeof value, dl);
  case W_GET: {
    void *v = NULL;
    size_t n;
    int rc = store_get(c, key, &v, &n, dl);
    free(v);
    return rc;
  }
  default:
    return store_add(c, "ctr", 1, NULL, dl);
  }
}

/*
 * n processes, forked beforehand and released together through a pipe:
 * connect, add, set own key, wait for all, get all. Returns the seconds from
 * the release to the last exit (forking is not timed), or -1.
 */
static double rendezvous(int port, int n, int round) {
  char prefix[32];
  snprintf(prefix, sizeof prefix, "r%d/", round);
  int go[2];
  if (pipe(go) != 0) return -1;
  pid_t *pids = calloc((size_t)n, sizeof *pids);
  for (int rank = 0; rank < n; rank++) {
    pids[rank] = fork();
    if (pids[rank] == 0) {
      close(go[1]);
      char b;
      if (read(go[0], &b, 1) != 1) _exit(1);
      char(*keys)[48] = calloc((size_t)n, sizeof *keys);
      const char **kp = calloc((size_t)n, sizeof *kp);
      for (int i = 0; i < n; i++) {
        snprintf(keys[i], sizeof keys[i], "%s%d", prefix, i);
        kp[i] = keys[i];
      }
      int64_t dl = base_deadline_in(60000);
      store_client *c = NULL;
      char ctr[48], value[64] = "x";
      snprintf(ctr, sizeof ctr, "%sarrived", prefix);
      int rc = store_client_connect("127.0.0.1", port, NULL, dl, &c, NULL, 0);
      if (rc == 0) rc = store_add(c, ctr, 1, NULL, dl);
      if (rc == 0) rc = store_set(c, kp[rank], value, sizeof value, dl);
      if (rc == 0) rc = store_wait(c, kp, (size_t)n, dl);
      for (int i = 0; i < n && rc == 0; i++) {
        void *v = NULL;
        size_t len;
        rc = store_get(c, kp[i], &v, &len, dl);
        free(v);
      }
      store_client_close(c);
      _exit(rc == 0 ? 0 : 1);
    }
  }
  close(go[0]);
  int64_t t0 = base_now_us();
  char *release = malloc((size_t)n);
  memset(release, 'g', (size_t)n);
  ssize_t w = write(go[1], release, (size_t)n);
  free(release);
  int ok = w == n;
  for (int rank = 0; rank < n; rank++) {
    int st = 0;
    if (pids[rank] < 0 || waitpid(pids[rank], &st, 0) != pids[rank] || !WIFEXITED(st) ||
        WEXITSTATUS(st) != 0)
      ok = 0;
  }
  double took = (double)(base_now_us() - t0) / 1e6;
  close(go[1]);
  free(pids);
  return ok ? took : -1;
}

/* Runs the peer script; fills out[] (seconds per rep median) or returns -1. */
static int run_torch(int reps, int ops, double out[NWORK]) {
  int port = 0;
  if (base_free_port("127.0.0.1", &port) != 0) return -1;
  const char *py = getenv("COHORT_BENCH_PYTHON");
  if (py == NULL) py = "/usr/bin/python3";
  char cmd[1024];
  int len = snprintf(cmd, sizeof cmd, "'%s' '%s' %d %d %d", py, BENCH_STORE_TORCH_SCRIPT, port,
                     reps, ops);
  for (size_t i = 0; i < sizeof rdzv_sizes / sizeof rdzv_sizes[0]; i++)
    len += snprintf(cmd + len, sizeof cmd - (size_t)len, " %d", rdzv_sizes[i]);
  FILE *p = popen(cmd, "r");
  if (p == NULL) return -1;
  char line[256];
  int got = 0;
  while (fgets(line, sizeof line, p) != NULL) {
    char name[32];
    double secs;
    int n;
    if (sscanf(line, "%31s %lf %d", name, &secs, &n) != 3) continue;
    int w = -1;
    if (strcmp(name, "ping") == 0)
      w = W_PING;
    else if (strcmp(name, "set") == 0)
      w = W_SET;
    else if (strcmp(name, "get") == 0)
      w = W_GET;
    else if (strcmp(name, "add") == 0)
      w = W_ADD;
    for (size_t i = 0; i < sizeof rdzv_sizes / sizeof rdzv_sizes[0]; i++) {
      char want[16];
      snprintf(want, sizeof want, "rdzv%d", rdzv_sizes[i]);
      if (strcmp(name, want) == 0) w = W_FIXED + (int)i;
    }
    if (w < 0) continue;
    out[w] = secs / n;
    got++;
  }
  int st = pclose(p);
  return (got == NWORK && st == 0) ? 0 : -1;
}

int main(int argc, char **argv) {
  int reps = 5, ops = 5000;
  if ((argc > 1 && base_parse_int(argv[1], 1, 100, &reps) != 0) ||
      (argc > 2 && base_parse_int(argv[2], 1, 10000000, &ops) != 0) || argc > 3) {
    fprintf(stderr, "usage: bench_store [REPS (1..100) [OPS]]\n");
    return 2;
  }
  store_server_opts so = {.bind_host = "127.0.0.1"};
  store_server *srv = NULL;
  int rc = store_server_start(&so, &srv);
  if (rc != 0) {
    fprintf(stderr, "bench_store: cannot start a store: %s\n", cohort_strerror(rc));
    return 1;
  }
  int port = store_server_port(srv);
  store_client *c = NULL;
  char err[256];
  rc = store_client_connect("127.0.0.1", port, NULL, base_deadline_in(10000), &c, err, sizeof err);
  if (rc != 0) {
    fprintf(stderr, "bench_store: %s\n", err);
    store_server_stop(srv);
    return 1;
  }
  double mine[NWORK];
  double *t = calloc((size_t)reps, sizeof *t);
  for (int i = 0; i < 100; i++) one_op(c, W_SET, i); /* the keys the gets read */
  for (int w = 0; w < W_FIXED; w++) {
    for (int r = 0; r < reps; r++) {
      int64_t t0 = base_now_us();
      for (int i = 0; i < ops; i++) {
        if (one_op(c, w, i) != 0) {
          fprintf(stderr, "bench_store: operation failed\n");
          return 1;
        }
      }
      t[r] = (double)(base_now_us() - t0) / 1e6;
    }
    mine[w] = median(t, reps) / ops;
  }
  int round = 0;
  for (int w = W_FIXED; w < NWORK; w++) {
    for (int r = 0; r < reps; r++) {
      t[r] = rendezvous(port, rdzv_sizes[w - W_FIXED], ++round);
      if (t[r] < 0) {
        fprintf(stderr, "bench_store: a rendezvous process failed\n");
        return 1;
      }
    }
    mine[w] = median(t, reps);
  }
  free(t);
  store_client_close(c);
  store_server_stop(srv);

  double peer[NWORK];
  int have_peer = run_torch(reps, ops, peer) == 0;
  printf("# rendezvous store, loopback, median of %d reps (%d ops each for the round trips)\n",
         reps, ops);
  printf("# peer: PyTorch TCPStore via its Python binding%s\n",
         have_peer ? "" : " (not available: torch missing or failed)");
  printf("%-16s %14s %16s %12s\n", "workload", "cohort", "torch TCPStore", "torch/cohort");
  static const char *const names[] = {"ping (us/op)", "set 64B (us/op)", "get 64B (us/op)",
                                      "add (us/op)"};
  for (int w = 0; w < NWORK; w++) {
    char name[32];
    double scale = w < W_FIXED ? 1e6 : 1e3;
    if (w < W_FIXED)
      snprintf(name, sizeof name, "%s", names[w]);
    else
      snprintf(name, sizeof name, "rdzv %d (ms)", rdzv_sizes[w - W_FIXED]);
    if (have_peer)
      printf("%-16s %14.1f %16.1f %11.2fx\n", name, mine[w] * scale, peer[w] * scale,
             peer[w] / mine[w]);
    else
      printf("%-16s %14.1f %16s %12s\n", name, mine[w] * scale, "-", "-");
  }
  return 0;
}

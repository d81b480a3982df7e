/*
 * cma_pattern.c - what one rank of the 2-rank direct allreduce on private
 * buffers costs, piece by piece, beside the memory bound's work for the same
 * bytes, in one process on one core.
 *
 * A child process holds the peer's buffer (half a message, in place: its send
 * is its recv). Each round, in chunks: read the peer's chunk into a scratch
 * buffer (process_vm_readv, the algorithm's coll_get), add it to this
 * process's own chunk in place (coll_reduce), write the result back into the
 * peer's chunk (process_vm_writev, coll_put). Then the bound's per-core work:
 * one pass over two other half-message buffers, a[i] = b[i] = a[i] + b[i]
 * (bench/collectives/mem_bound.c with 2 ranks). Every buffer is faulted in
 * before timing; HUGE = 1 advises them all for transparent huge pages
 * (MADV_HUGEPAGE), 0 forbids them (MADV_NOHUGEPAGE), so the kernel pins the
 * peer's memory 4 KiB at a time.
 *
 * usage: cma_pattern HALF_BYTES CHUNK_BYTES HUGE ROUNDS
 * prints "get G red R put P total T bound B ratio B/T" (microseconds per
 * round), or nothing and exit 1 when a copy or a sum is wrong.
 */
#define _GNU_SOURCE /* process_vm_readv, process_vm_writev */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HUGE_BYTES (2u << 20)

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* bytes of zeroed, 2 MiB-aligned memory, advised for huge pages or against them. */
static float *buffer(size_t bytes, int huge) {
  char *p =
      mmap(NULL, bytes + HUGE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  p = (char *)(((uintptr_t)p + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
  madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  memset(p, 0, bytes);
  return (float *)p;
}

static void add(float *d, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = a[i] + b[i];
}

/* One chunk moved by process_vm_readv/writev; 0 when all bytes moved. */
static int cma(pid_t pid, int write, void *local, void *remote, size_t len) {
  struct iovec l = {local, len}, r = {remote, len};
  ssize_t n =
      write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
  return n == (ssize_t)len ? 0 : -1;
}

typedef struct times {
  double get, red, put, bound;
} times;

/* One round over the peer's buffer at `peer` (in process pid); t accumulates. */
static int round_once(pid_t pid, float *peer, float *own, float *scratch, float *a, float *b,
                      size_t half, size_t chunk, times *t) {
  for (size_t o = 0; o < half; o += chunk) {
    size_t k = half - o < chunk ? half - o : chunk;
    double t0 = now_us();
    if (cma(pid, 0, scratch, (char *)peer + o, k) != 0) return -1;
    double t1 = now_us();
    add((float *)((char *)own + o), (float *)((char *)own + o), scratch, k / sizeof(float));
    double t2 = now_us();
    if (cma(pid, 1, (char *)own + o, (char *)peer + o, k) != 0) return -1;
    t->get += t1 - t0;
    t->red += t2 - t1;
    t->put += now_us() - t2;
  }
  double t3 = now_us();
  for (size_t i = 0; i < half / sizeof(float); i++) {
    float s = a[i] + b[i];
    a[i] = s;
    b[i] = s;
  }
  t->bound += now_us() - t3;
  return 0;
}

/* The peer: its buffer, its address sent up the pipe, then it waits to be told to exit. */
static void peer_main(size_t half, int huge, int up, int down) {
  float *buf = buffer(half, huge);
  if (buf == NULL || write(up, &buf, sizeof buf) != (ssize_t)sizeof buf) _exit(1);
  char x;
  _exit(read(down, &x, 1) < 0);
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: cma_pattern HALF_BYTES CHUNK_BYTES HUGE ROUNDS\n");
    return 2;
  }
  size_t half = strtoull(argv[1], NULL, 10), chunk = strtoull(argv[2], NULL, 10);
  int huge = atoi(argv[3]), rounds = atoi(argv[4]);
  if (half < 4096 || half % 4096 || chunk < 4096 || chunk % 4096 || rounds < 1) return 2;
  int up[2], down[2];
  if (pipe(up) != 0 || pipe(down) != 0) return 2;
  pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) peer_main(half, huge, up[1], down[0]);
  float *peer = NULL, *own = buffer(half, huge), *a = buffer(half, huge), *b = buffer(half, huge);
  float *scratch = buffer(chunk, 0);
  int rc =
      read(up[0], &peer, sizeof peer) == (ssize_t)sizeof peer && own && a && b && scratch ? 0 : 1;
  times t = {0};
  /* One untimed round; then every element holds 0 + 0: the sums are checked after the rounds with
   * ones written into both sides first. */
  if (rc == 0) rc = round_once(pid, peer, own, scratch, a, b, half, chunk, &t) != 0;
  for (size_t i = 0; rc == 0 && i < half / sizeof(float); i++) own[i] = 1.0f;
  t = (times){0};
  for (int r = 0; rc == 0 && r < rounds; r++)
    rc = round_once(pid, peer, own, scratch, a, b, half, chunk, &t) != 0;
  /* own: 1 + 0, then doubled every round after the first; the peer got the same: read it back. */
  float want = (float)(1u << (rounds - 1 < 20 ? rounds - 1 : 20));
  for (size_t o = 0; rc == 0 && o < half; o += chunk) {
    size_t k = half - o < chunk ? half - o : chunk;
    rc = cma(pid, 0, scratch, (char *)peer + o, k) != 0;
    for (size_t i = 0; rc == 0 && i < k / sizeof(float); i++)
      if (scratch[i] != own[o / sizeof(float) + i] || (rounds <= 21 && scratch[i] != want)) rc = 1;
  }
  if (write(down[1], "x", 1) != 1) rc = 1;
  waitpid(pid, NULL, 0);
  if (rc != 0) {
    fprintf(stderr, "cma_pattern: a copy or a sum was wrong\n");
    return 1;
  }
  double tot = t.get + t.red + t.put;
  printf("get %.1f red %.1f put %.1f total %.1f bound %.1f ratio %.3f\n", t.get / rounds,
         t.red / rounds, t.put / rounds, tot / rounds, t.bound / rounds, t.bound / tot);
  return 0;
}

/*
 * test_coll.c - libcohort's collectives, with real processes.
 *
 * The parent hosts a store_server on loopback and forks one process per
 * rank; every rank checks its results against a serial reference computed
 * from the same deterministic inputs. Inputs are small integers so every
 * reduction is exact in every type (including f16/bf16), whatever the order.
 *
 *   test_coll unit      reference matrix for world sizes 1,2,3,4,5,8 (all
 *                       types, ops, collectives, in/out of place, counts 0,
 *                       1, odd, not divisible, MiB), both algorithm regimes,
 *                       TCP and shared memory forced, async overlap, abort,
 *                       mismatch, timeout, /dev/shm hygiene.
 *   test_coll failure   kill -9 of a rank during a large allreduce (shm and
 *                       TCP): the others fail within a short deadline.
 *   test_coll rank      one rank from the environment (netns script).
 */
#include <dirent.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "collbench/reference.h"
#include "check.h"
#include "coll/coll.h"
#include "cohort/cohort.h"
#include "store/store.h"
#include "store_fork.h"

static char g_ready[96]; /* created by rank 0 of rk_failure once collectives run */
static char g_store[64];
static int g_job;
static int g_shared; /* check_one's buffers come from cohort_mem_alloc */

/* ---- typed values: the inputs and serial reference `cohort bench` checks with ---- */

static void put(cohort_dtype dt, void *buf, size_t i, double v) {
  collbench_put(dt, buf, i, v);
}

static double input(cohort_redop op, cohort_dtype dt, int r, size_t i) {
  return collbench_input(op, dt, r, i);
}

static void reference(cohort_redop op, cohort_dtype dt, int n, size_t i, void *out, size_t j) {
  collbench_reference(op, dt, n, i, out, j);
}

/* Counts elements of got[0..n) that differ from want (bytewise per element). */
static size_t diff(const void *got, const void *want, size_t n, size_t es) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    if (memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0) bad++;
  return bad;
}

/* ---- one collective against the reference ---- */

static int verbose_fail(const char *what, int n, int r, cohort_dtype dt, cohort_redop op,
                        size_t count, int inplace, size_t bad, int rc) {
  fprintf(stderr, "rank %d/%d: %s %s %s count=%zu %s: %zu wrong, rc=%d\n", r, n, what,
          coll_dtype_name(dt), coll_redop_name(op), count, inplace ? "in-place" : "out-of-place",
          bad, rc);
  return 1;
}

static int check_one(cohort_comm *c, int kind, cohort_dtype dt, cohort_redop op, size_t count,
                     int inplace, int root) {
  int n = cohort_comm_size(c), r = cohort_comm_rank(c), rc = 0;
  size_t es = cohort_dtype_size(dt);
  size_t total =
      (kind == COLL_REDUCE_SCATTER || kind == COLL_ALLGATHER) ? count * (size_t)n : count;
  char *in = NULL, *out = NULL, *want = malloc(total * es + 8);
  if (g_shared) {
    if (cohort_mem_alloc(c, total * es + 8, (void **)&in) != 0 ||
        cohort_mem_alloc(c, total * es + 8, (void **)&out) != 0)
      return verbose_fail("cohort_mem_alloc", n, r, dt, op, count, inplace, 0, -1);
  } else {
    in = malloc(total * es + 8);
    out = malloc(total * es + 8);
  }
  memset(out, 0xa5, total * es + 8);
  size_t bad = 0, nres = 0;
  const char *name = coll_kind_name(kind);
  switch (kind) {
  case COLL_ALLREDUCE:
  case COLL_REDUCE:
    for (size_t i = 0; i < count; i++) {
      put(dt, in, i, input(op, dt, r, i));
      reference(op, dt, n, i, want, i);
    }
    if (inplace) memcpy(out, in, count * es);
    if (kind == COLL_ALLREDUCE)
      rc = cohort_allreduce(c, inplace ? out : in, out, count, dt, op);
    else
      rc = cohort_reduce(c, inplace && r == root ? out : in, r == root ? out : NULL, count, dt, op,
                         root);
    nres = kind == COLL_REDUCE && r != root ? 0 : count;
    bad = diff(out, want, nres, es);
    break;
  case COLL_REDUCE_SCATTER:
    for (size_t i = 0; i < total; i++) put(dt, in, i, input(op, dt, r, i));
    for (size_t j = 0; j < count; j++) reference(op, dt, n, (size_t)r * count + j, want, j);
    if (inplace) {
      memcpy(out, in, total * es);
      rc = cohort_reduce_scatter(c, out, out, count, dt, op);
      bad = diff(out + (size_t)r * count * es, want, count, es);
    } else {
      rc = cohort_reduce_scatter(c, in, out, count, dt, op);
      bad = diff(out, want, count, es);
      /* Nothing past the result may be touched. */
      if (((unsigned char *)out)[count * es] != 0xa5) bad++;
    }
    break;
  case COLL_ALLGATHER:
    for (size_t j = 0; j < count; j++) put(dt, in, j, input(op, dt, r, j));
    for (int b = 0; b < n; b++)
      for (size_t j = 0; j < count; j++) put(dt, want, (size_t)b * count + j, input(op, dt, b, j));
    if (inplace) {
      memcpy(out + (size_t)r * count * es, in, count * es);
      rc = cohort_allgather(c, out + (size_t)r * count * es, out, count, dt);
    } else {
      rc = cohort_allgather(c, in, out, count, dt);
    }
    bad = diff(out, want, total, es);
    break;
  case COLL_BROADCAST:
    for (size_t j = 0; j < count; j++) {
      put(dt, want, j, input(op, dt, root, j));
      if (r == root) put(dt, out, j, input(op, dt, root, j));
    }
    rc = cohort_broadcast(c, out, count, dt, root);
    bad = diff(out, want, count, es);
    break;
  default:
    break;
  }
  if (g_shared) {
    if (cohort_mem_free(c, out) != 0 || cohort_mem_free(c, in) != 0) bad++;
  } else {
    free(in);
    free(out);
  }
  free(want);
  if (rc != 0 || bad != 0) return verbose_fail(name, n, r, dt, op, count, inplace, bad, rc);
  return 0;
}

/* Every collective, type and operator for the given counts. Returns failures. */
static int matrix(cohort_comm *c, const size_t *counts, int ncounts) {
  int n = cohort_comm_size(c), fails = 0, it = 0;
  for (int ci = 0; ci < ncounts; ci++) {
    for (int dt = 0; dt < COHORT_DTYPE_COUNT; dt++) {
      for (int inplace = 0; inplace < 2; inplace++) {
        for (int op = 0; op < COHORT_REDOP_COUNT; op++) {
          int root = (it++) % n;
          fails += check_one(c, COLL_ALLREDUCE, dt, op, counts[ci], inplace, root);
          fails += check_one(c, COLL_REDUCE_SCATTER, dt, op, counts[ci], inplace, root);
          fails += check_one(c, COLL_REDUCE, dt, op, counts[ci], inplace, root);
        }
        fails += check_one(c, COLL_ALLGATHER, dt, COHORT_SUM, counts[ci], inplace, it % n);
        fails += check_one(c, COLL_BROADCAST, dt, COHORT_SUM, counts[ci], inplace, (it + 1) % n);
      }
      if (fails > 5) return fails;
    }
  }
  if (cohort_barrier(c) != 0) fails++;
  return fails;
}

/* ---- process harness ---- */

typedef int (*rank_fn)(cohort_comm *c, void *arg);

typedef struct world_opts {
  int n;
  cohort_transport transport;
  int timeout_ms;
  const char *threshold; /* COHORT_ALGO_THRESHOLD or NULL */
  const char *slice;     /* COHORT_SLICE or NULL */
  int cma;               /* COHORT_SHM_CMA=1 */
  int hosts;             /* > 0: rank r acts as host r % hosts (COHORT_HOST_SALT) */
  int flat;              /* COHORT_HIER=0 */
  int shared;            /* buffers from cohort_mem_alloc: 1 single copy on, 2 off */
  int direct_off;        /* COHORT_SINGLE_COPY=0 on ordinary buffers */
  unsigned refuse;       /* bit r: rank r may not call process_vm_readv/writev (seccomp) */
  int refuse_write_only; /* ... only process_vm_writev */
  int collapse_off;      /* COHORT_SHM_COLLAPSE=0 */
  int expect_create_fail;
} world_opts;

/* A sandbox without cross-memory attach (as container profiles without process_vm_readv/writev):
 * the calls fail with EPERM in this process from now on. */
static int refuse_cma(int write_only) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_writev, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, write_only ? SYS_process_vm_writev : SYS_process_vm_readv,
               1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
  };
  struct sock_fprog prog = {.len = (unsigned short)(sizeof f / sizeof f[0]), .filter = f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0) {
    perror("seccomp");
    return -1;
  }
  return 0;
}

static void job_name(char *out, size_t len) {
  snprintf(out, len, "tcoll-%d-%d", (int)getpid(), g_job);
}

static int child_main(const world_opts *o, int rank, rank_fn fn, void *arg, const char *job) {
  if (o->threshold)
    setenv("COHORT_ALGO_THRESHOLD", o->threshold, 1);
  else
    unsetenv("COHORT_ALGO_THRESHOLD");
  if (o->slice)
    setenv("COHORT_SLICE", o->slice, 1);
  else
    unsetenv("COHORT_SLICE");
  char salt[16];
  snprintf(salt, sizeof salt, "h%d", o->hosts > 0 ? rank % o->hosts : 0);
  setenv("COHORT_HOST_SALT", salt, 1);
  if (o->flat)
    setenv("COHORT_HIER", "0", 1);
  else
    unsetenv("COHORT_HIER");
  if (o->cma)
    setenv("COHORT_SHM_CMA", "1", 1);
  else
    unsetenv("COHORT_SHM_CMA");
  if (o->shared == 2 || o->direct_off)
    setenv("COHORT_SINGLE_COPY", "0", 1);
  else
    unsetenv("COHORT_SINGLE_COPY");
  if (o->collapse_off)
    setenv("COHORT_SHM_COLLAPSE", "0", 1);
  else
    unsetenv("COHORT_SHM_COLLAPSE");
  g_shared = o->shared != 0;
  if ((o->refuse >> rank) & 1u && refuse_cma(o->refuse_write_only) != 0) return 1;
  cohort_comm_config cfg = {.rank = rank,
                            .size = o->n,
                            .store_addr = g_store,
                            .job_id = job,
                            .timeout_ms = o->timeout_ms ? o->timeout_ms : 20000,
                            .transport = o->transport};
  cohort_comm *c = NULL;
  int rc = cohort_comm_create(&cfg, &c);
  if (rc != 0) {
    if (o->expect_create_fail) return 0;
    fprintf(stderr, "rank %d: create failed: %s\n", rank, cohort_strerror(rc));
    return 1;
  }
  if (o->expect_create_fail) {
    cohort_comm_destroy(c);
    return 1;
  }
  /* Once every rank has returned from create (a barrier later), the name is gone. */
  if (o->n > 1 && cohort_barrier(c) != 0) {
    fprintf(stderr, "rank %d: first barrier failed: %s\n", rank, cohort_comm_error_message(c));
    cohort_comm_destroy(c);
    return 1;
  }
  /* Several emulated hosts with several ranks on one: the hierarchical allreduce is on. */
  int want_hier = o->hosts > 1 && o->hosts < o->n && !o->flat;
  int want_rs = want_hier && o->n % o->hosts == 0;
  if (c->hier != want_hier || (o->hosts > 0 && c->leaders.n != o->hosts) ||
      (c->cross.ranks != NULL) != want_rs) {
    fprintf(stderr, "rank %d: hier %d over %d hosts, expected %d over %d\n", rank, c->hier,
            c->leaders.n, want_hier, o->hosts);
    cohort_comm_destroy(c);
    return 1;
  }
  char prefix[128];
  snprintf(prefix, sizeof prefix, "cohort-%s-", job);
  DIR *d = opendir("/dev/shm");
  int left = 0;
  for (struct dirent *e; d && (e = readdir(d)) != NULL;)
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) left++;
  if (d) closedir(d);
  if (left) {
    fprintf(stderr, "rank %d: %d segment(s) still named in /dev/shm after create\n", rank, left);
    cohort_comm_destroy(c);
    return 1;
  }
  /* Shared buffers are named until all ranks mapped them: none before every rank looked. */
  if (o->shared && cohort_barrier(c) != 0) {
    cohort_comm_destroy(c);
    return 1;
  }
  int fails = fn(c, arg);
  cohort_comm_destroy(c);
  return fails ? 1 : 0;
}

/*
 * Forks o->n ranks running fn; returns how many exited non-zero (or were
 * killed). kill_rank >= 0: that rank gets SIGKILL after kill_after_ms.
 * *elapsed_ms receives the time until the last survivor exited.
 */
static int run_world_ex(const world_opts *o, rank_fn fn, void *arg, int kill_rank,
                        int kill_after_ms, int64_t *elapsed_after_kill) {
  char job[64];
  g_job++;
  job_name(job, sizeof job);
  pid_t pids[16];
  for (int r = 0; r < o->n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(child_main(o, r, fn, arg, job));
  }
  int failed = 0, alive = o->n;
  int64_t start = base_now_ms(), killed_at = -1, deadline = start + 240000;
  int done[16] = {0};
  while (alive > 0) {
    /* Kill once the ranks are inside their allreduce loop (rank 0 marks it), not earlier. */
    if (kill_rank >= 0 && killed_at < 0 && access(g_ready, F_OK) == 0 &&
        base_now_ms() - start >= kill_after_ms) {
      kill(pids[kill_rank], SIGKILL);
      killed_at = base_now_ms();
    }
    int st, reaped = 0;
    for (int r = 0; r < o->n; r++) {
      if (done[r] || waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
      done[r] = 1;
      alive--;
      reaped = 1;
      if (r != kill_rank && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
        fprintf(stderr, "rank %d of %d: %s %d\n", r, o->n,
                WIFSIGNALED(st) ? "killed by signal" : "exit status",
                WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        failed++;
      }
    }
    if (reaped) continue;
    if (base_now_ms() > deadline) {
      fprintf(stderr, "world of %d ranks hung; killing it\n", o->n);
      for (int r = 0; r < o->n; r++)
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], &st, 0);
        }
      return o->n;
    }
    base_sleep_ms(5);
  }
  if (elapsed_after_kill) *elapsed_after_kill = killed_at >= 0 ? base_now_ms() - killed_at : -1;
  return failed;
}

static int run_world(const world_opts *o, rank_fn fn, void *arg) {
  return run_world_ex(o, fn, arg, -1, 0, NULL);
}

/* ---- rank programs ---- */

static int rk_matrix(cohort_comm *c, void *arg) {
  int big = arg != NULL;
  int n = cohort_comm_size(c);
  size_t counts[] = {0, 1, 7, (size_t)(3 * n + 1), 1531};
  int fails = matrix(c, counts, 5);
  if (big) {
    /* Several MiB through the ring and chains. */
    fails += check_one(c, COLL_ALLREDUCE, COHORT_F32, COHORT_SUM, (3u << 20) / 4 + 3, 0, 0);
    fails += check_one(c, COLL_ALLREDUCE, COHORT_BF16, COHORT_AVG, (1u << 20) + 1, 1, 0);
    fails +=
        check_one(c, COLL_REDUCE_SCATTER, COHORT_F32, COHORT_MAX, (1u << 20) / 4 / n + 5, 0, 0);
    fails += check_one(c, COLL_ALLGATHER, COHORT_I32, COHORT_SUM, (1u << 20) / 4 / n + 1, 0, 0);
    fails += check_one(c, COLL_BROADCAST, COHORT_F64, COHORT_SUM, (2u << 20) / 8 + 1, 1, n - 1);
    fails += check_one(c, COLL_REDUCE, COHORT_I64, COHORT_SUM, (2u << 20) / 8 + 1, 0, n / 2);
  }
  return fails;
}

/* Every collective, type and operator on buffers from cohort_mem_alloc; arg != NULL: the
 * single-copy allreduce must have run (on), else never (COHORT_SINGLE_COPY=0). */
static int rk_shared(cohort_comm *c, void *arg) {
  int fails = rk_matrix(c, (void *)1);
  /* Bad arguments are refused on every rank alike, before any agreement. */
  void *p = &fails;
  if (cohort_mem_alloc(c, 0, &p) != -EINVAL || p != NULL) fails++;
  if (cohort_mem_free(c, &fails) != -EINVAL) fails++;
  /* More than /dev/shm holds: an error on every rank (the pages are reserved, so it is not a
   * SIGBUS later), and the communicator goes on working. */
  if (c->shm != NULL) {
    int rc = cohort_mem_alloc(c, (size_t)1 << 42, &p);
    if (rc == 0 || p != NULL) {
      fprintf(stderr, "rank %d: a 4 TiB cohort_mem_alloc returned %d\n", cohort_comm_rank(c), rc);
      fails++;
    }
  }
  int on = arg != NULL;
  if ((c->single_copy_ops > 0) != on) {
    fprintf(stderr, "rank %d: %llu single-copy allreduces, expected %s\n", cohort_comm_rank(c),
            (unsigned long long)c->single_copy_ops, on ? "some" : "none");
    fails++;
  }
  /* Freed buffers leave the path: a malloc'd buffer's allreduce goes through the rings. */
  uint64_t before = c->single_copy_ops;
  g_shared = 0;
  fails += check_one(c, COLL_ALLREDUCE, COHORT_F32, COHORT_SUM, (1u << 20) + 3, 0, 0);
  if (c->single_copy_ops != before) fails++;
  return fails;
}

/* Every collective, type and operator on ordinary buffers; arg != NULL: the direct allreduce must
 * have reached the peers' buffers through one-sided access (process_vm_readv/writev, which root
 * always may use; another user only where Yama and the sandbox allow), else never. */
static int rk_private(cohort_comm *c, void *arg) {
  int fails = rk_matrix(c, (void *)1);
  int on = arg != NULL && (geteuid() == 0 || (c->shm != NULL && coll_shm_hdr_cma(c->shm)));
  if ((c->one_sided_ops > 0) != on || c->single_copy_ops != 0) {
    fprintf(stderr, "rank %d: %llu one-sided and %llu single-copy allreduces, expected %s\n",
            cohort_comm_rank(c), (unsigned long long)c->one_sided_ops,
            (unsigned long long)c->single_copy_ops, on ? "some and none" : "none");
    fails++;
  }
  return fails;
}

/* Kilobytes of [p, p + len) on transparent huge pages (AnonHugePages of the mappings holding it,
 * which must lie inside it), or -1. */
static long huge_kb(const void *p, size_t len) {
  FILE *f = fopen("/proc/self/smaps", "re");
  if (f == NULL) return -1;
  char line[512];
  unsigned long lo = 0, hi = 0;
  long kb = 0, total = 0;
  int in = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
      in = lo < (uintptr_t)p + len && hi > (uintptr_t)p;
    else if (in && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1)
      total += kb;
  }
  fclose(f);
  return total;
}

/* The transparent huge page mode ("always", "madvise", "never") in *mode; 0, or -1 unknown. */
static int thp_mode(char *mode, size_t len) {
  char line[128] = "";
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "re");
  if (f == NULL) return -1;
  char *got = fgets(line, sizeof line, f);
  fclose(f);
  char *a = got ? strchr(line, '[') : NULL, *b = a ? strchr(a, ']') : NULL;
  if (b == NULL) return -1;
  snprintf(mode, len, "%.*s", (int)(b - a - 1), a + 1);
  return 0;
}

/* An ordinary buffer of three whole 2 MiB pieces on 4 KiB pages: arg != NULL: after a second
 * direct allreduce through process_vm_readv/writev it is on huge pages (MADV_COLLAPSE, so the
 * peers pin it 2 MiB at a time; not after the first: a buffer used once is left alone), else
 * (COHORT_SHM_COLLAPSE=0) it stays on 4 KiB pages. The sums are right
 * either way. Where the kernel has no MADV_COLLAPSE or huge pages are off, or back every large
 * buffer ("always"), the page size is not asserted (said on stderr). */
static int rk_collapse(cohort_comm *c, void *arg) {
  const size_t piece = 2u << 20, cnt = 3 * piece / sizeof(float);
  int r = cohort_comm_rank(c), n = cohort_comm_size(c), fails = 0;
  float *buf = aligned_alloc(piece, 3 * piece);
  if (buf == NULL) return 1;
  for (size_t i = 0; i < cnt; i++) buf[i] = (float)((size_t)r + i % 3);
  long before = huge_kb(buf, 3 * piece), once = -1;
  for (int k = 0; k < 2 && fails == 0; k++) {
    if (cohort_allreduce(c, buf, buf, cnt, COHORT_F32, COHORT_SUM) != 0) fails++;
    if (k == 0) once = huge_kb(buf, 3 * piece);
    for (size_t i = 0; i < cnt && fails == 0; i++) {
      float want = (float)(n * (n - 1) / 2) + (float)(n * (int)(i % 3));
      if (k == 1) want *= (float)n;
      if (buf[i] != want) fails++;
    }
  }
  long after = huge_kb(buf, 3 * piece);
  char mode[16] = "";
  int known = thp_mode(mode, sizeof mode) == 0 && strcmp(mode, "madvise") == 0;
  if (known && madvise(buf, piece, 25 /* MADV_COLLAPSE */) != 0 && errno == EINVAL) known = 0;
  if (!known)
    fprintf(stderr, "rank %d: huge pages not checked (mode %s, MADV_COLLAPSE: %s)\n", r, mode,
            strerror(errno));
  else if (before != 0 || once != 0 || after != (arg != NULL ? 3 * (long)piece / 1024 : 0)) {
    fprintf(
        stderr,
        "rank %d: %ld kB of the buffer on huge pages before, %ld after one allreduce, %ld after "
        "two; expected 0, 0, %s\n",
        r, before, once, after, arg != NULL ? "all" : "0");
    fails++;
  }
  if (c->one_sided_ops == 0 && (geteuid() == 0 || coll_shm_hdr_cma(c->shm))) fails++;
  free(buf);
  return fails;
}

static int rk_async(cohort_comm *c, void *arg) {
  (void)arg;
  int n = cohort_comm_size(c), r = cohort_comm_rank(c), fails = 0;
  enum { NB = 3, CNT = 300000 };
  float *buf[NB];
  cohort_request *req[NB];
  for (int b = 0; b < NB; b++) {
    buf[b] = malloc(CNT * sizeof(float));
    for (size_t i = 0; i < CNT; i++) buf[b][i] = (float)((r + b + (int)i) % 5);
    if (cohort_iallreduce(c, buf[b], buf[b], CNT, COHORT_F32, COHORT_SUM, &req[b]) != 0) fails++;
  }
  /* Compute while the requests progress; they must finish without any wait() call. */
  volatile double acc = 0;
  int64_t end = base_now_ms() + 20000;
  int done = 0;
  while (!done && base_now_ms() < end) {
    for (int k = 0; k < 200000; k++) acc += sqrt((double)k);
    if (cohort_request_test(req[NB - 1], &done) != 0) fails++;
  }
  if (!done) {
    fprintf(stderr, "rank %d: async allreduce made no progress while computing\n", r);
    fails++;
  }
  for (int b = 0; b < NB; b++) {
    if (cohort_request_wait(req[b]) != 0) fails++;
    for (size_t i = 0; i < CNT; i++) {
      float want = 0;
      for (int q = 0; q < n; q++) want += (float)((q + b + (int)i) % 5);
      if (buf[b][i] != want) {
        fails++;
        break;
      }
    }
    free(buf[b]);
  }
  /* Blocking calls queue behind async ones and keep their order. */
  int32_t x = r, y = 0;
  cohort_request *q1;
  if (cohort_iallreduce(c, &x, &x, 1, COHORT_I32, COHORT_SUM, &q1) != 0) fails++;
  if (cohort_allreduce(c, &x, &y, 1, COHORT_I32, COHORT_MAX) != 0) fails++;
  if (cohort_request_wait(q1) != 0) fails++;
  if (x != n * (n - 1) / 2 || y != n * (n - 1) / 2) fails++;
  return fails;
}

/* ---- compressed reductions (a 16-bit wire type for an f32 buffer) ---- */

/* Small integers: exact in bf16 and f16, and so are their sums over a few ranks. */
static float wire_exact_in(int r, size_t i) {
  return (float)((int)((r * 7 + i * 3) % 9) - 4);
}

/* Fractions that bf16 and f16 round: the result cannot be exact by accident. One in eight is
 * an exact tie, halfway between two neighbours (257 x 2^k for bf16's 8 bits, 2049 x 2^k for
 * f16's 11), which rounds to the even one, down: rounding ties away from zero shows. */
static float wire_frac_in(int r, size_t i) {
  uint32_t h = (uint32_t)(r + 1) * 2654435761u ^ (uint32_t)i * 40503u;
  h ^= h >> 13;
  float sign = h & 1u ? -1.0f : 1.0f;
  if (i % 16 == 5) return sign * ldexpf(257.0f, -8 - (int)(h % 3));
  if (i % 16 == 13) return sign * ldexpf(2049.0f, -11 - (int)(h % 3));
  return (float)(h % 20001) / 10000.0f - 1.0f + 1.0f / 3.0f;
}

/* Runs one compressed collective (kind, in place or not, blocking or not) and returns the f32
 * result of this rank (count elements; an allreduce's whole vector, a reduce-scatter's block). */
static int wire_run(cohort_comm *c, int kind, int inplace, int async, cohort_dtype wire,
                    float (*in)(int, size_t), size_t count, float *out) {
  int n = cohort_comm_size(c), r = cohort_comm_rank(c);
  size_t nin = kind == COLL_REDUCE_SCATTER ? count * (size_t)n : count;
  float *send = malloc((nin + 1) * sizeof(float)), *recv = malloc((nin + 1) * sizeof(float));
  for (size_t i = 0; i < nin; i++) send[i] = in(r, i);
  float *dst = inplace ? send : recv;
  cohort_request *req = NULL;
  int rc;
  if (kind == COLL_ALLREDUCE)
    rc = async ? cohort_iallreduce_wire(c, send, dst, count, COHORT_F32, wire, COHORT_SUM, &req)
               : cohort_allreduce_wire(c, send, dst, count, COHORT_F32, wire, COHORT_SUM);
  else
    rc = async
             ? cohort_ireduce_scatter_wire(c, send, dst, count, COHORT_F32, wire, COHORT_SUM, &req)
             : cohort_reduce_scatter_wire(c, send, dst, count, COHORT_F32, wire, COHORT_SUM);
  if (rc == 0 && async) rc = cohort_request_wait(req);
  const float *res = dst;
  if (kind == COLL_REDUCE_SCATTER && inplace) res = send + (size_t)r * count;
  if (rc == 0 && count > 0) memcpy(out, res, count * sizeof(float));
  free(send);
  free(recv);
  return rc;
}

/* Every rank of the world past this point (at most 30 s), told through the store rather than the
 * communicator: a refusal aborts the communicator, so a rank about to be refused waits until its
 * peers have finished every collective before (after a barrier, one may still be receiving the
 * barrier's last message when another's refusal aborts it). */
static int all_done(cohort_comm *c, const char *what) {
  int n = cohort_comm_size(c), r = cohort_comm_rank(c);
  store_client *sc = NULL;
  char err[256], key[16][96];
  const char *keys[16];
  int rc = store_client_connect("127.0.0.1", atoi(strchr(g_store, ':') + 1), NULL,
                                base_deadline_in(30000), &sc, err, sizeof err);
  for (int q = 0; q < n && q < 16; q++) {
    snprintf(key[q], sizeof key[q], "done/%d/%d/%s/%d", (int)getppid(), g_job, what, q);
    keys[q] = key[q];
  }
  if (rc == 0) rc = store_set(sc, keys[r], "1", 1, base_deadline_in(30000));
  if (rc == 0) rc = store_wait(sc, keys, (size_t)n, base_deadline_in(30000));
  store_client_close(sc);
  if (rc != 0) fprintf(stderr, "rank %d: waiting for the others: %s\n", r, cohort_strerror(rc));
  return rc;
}

/* Every kind, placement and mode against the f32 sum: exact for exact inputs; for fractions
 * within (n + 1) roundings of the wire type (2^-8 relative for bf16, 2^-11 for f16) of the sum
 * of magnitudes, and not all exact (the values did travel in 16 bits). */
static int rk_wire(cohort_comm *c, void *arg) {
  (void)arg;
  int n = cohort_comm_size(c), r = cohort_comm_rank(c), fails = 0;
  size_t counts[] = {0, 1, 1531, 70001};
  cohort_dtype wires[] = {COHORT_BF16, COHORT_F16};
  float *got = malloc(70001 * sizeof(float));
  for (int w = 0; w < 2; w++)
    for (int mode = 0; mode < 8; mode++)
      for (size_t ci = 0; ci < BASE_ARRAY_LEN(counts); ci++) {
        int kind = mode & 4 ? COLL_REDUCE_SCATTER : COLL_ALLREDUCE;
        size_t count = kind == COLL_REDUCE_SCATTER ? counts[ci] / (size_t)n + 1 : counts[ci];
        size_t base = kind == COLL_REDUCE_SCATTER ? (size_t)r * count : 0;
        double eps = wires[w] == COHORT_BF16 ? 1.0 / 256 : 1.0 / 2048;
        for (int frac = 0; frac < 2; frac++) {
          float (*in)(int, size_t) = frac ? wire_frac_in : wire_exact_in;
          int rc = wire_run(c, kind, mode & 1, mode & 2, wires[w], in, count, got);
          if (rc != 0) {
            fprintf(stderr, "rank %d: wire mode %d count %zu: %s: %s\n", r, mode, count,
                    cohort_strerror(rc), cohort_comm_error_message(c));
            fails++;
            continue;
          }
          size_t bad = 0, inexact = 0;
          for (size_t i = 0; i < count; i++) {
            double want = 0, mag = 0;
            for (int q = 0; q < n; q++) {
              want += in(q, base + i);
              mag += fabs(in(q, base + i));
            }
            double err = fabs((double)got[i] - want);
            if (err > 0) inexact++;
            if (frac ? err > (n + 1) * eps * mag : err != 0) bad++;
          }
          if (bad || (frac && count >= 1531 && inexact == 0)) {
            fprintf(stderr, "rank %d: wire %s mode %d count %zu %s: %zu wrong, %zu inexact\n", r,
                    wires[w] == COHORT_BF16 ? "bf16" : "f16", mode, count,
                    frac ? "fractions" : "integers", bad, inexact);
            fails++;
          }
        }
      }
  free(got);
  /* Only an f32 buffer and a 16-bit wire type: anything else is refused on every rank. */
  if (all_done(c, "wire") != 0) fails++;
  double d = 1;
  if (cohort_allreduce_wire(c, &d, &d, 1, COHORT_F64, COHORT_BF16, COHORT_SUM) != -EINVAL) {
    fprintf(stderr, "rank %d: an f64 buffer with a bf16 wire was not refused\n", r);
    fails++;
  }
  return fails;
}

/* x rounded to the wire type and widened back, by the reference's arithmetic, not the library's
 * converters under test. */
static float wire_round(cohort_dtype wire, float x) {
  return (float)collbench_round(wire, x);
}

/* The compressed allgather, in place and not, blocking and not: every rank holds every block
 * rounded to the wire type (its own too), and fractions did round. */
static int rk_wire_gather(cohort_comm *c, void *arg) {
  (void)arg;
  int n = cohort_comm_size(c), r = cohort_comm_rank(c), fails = 0;
  size_t counts[] = {0, 1, 1531, 30001};
  cohort_dtype wires[] = {COHORT_BF16, COHORT_F16};
  float *all = malloc((30001 * (size_t)n + 1) * sizeof(float));
  float *mine = malloc(30001 * sizeof(float));
  for (int w = 0; w < 2; w++)
    for (int mode = 0; mode < 4; mode++)
      for (size_t ci = 0; ci < BASE_ARRAY_LEN(counts); ci++) {
        size_t count = counts[ci];
        float *send = mode & 1 ? all + (size_t)r * count : mine;
        for (size_t i = 0; i < count; i++) send[i] = wire_frac_in(r, i);
        cohort_request *req = NULL;
        int rc = mode & 2 ? cohort_iallgather_wire(c, send, all, count, COHORT_F32, wires[w], &req)
                          : cohort_allgather_wire(c, send, all, count, COHORT_F32, wires[w]);
        if (rc == 0) rc = cohort_request_wait(req);
        size_t bad = 0, rounded = 0;
        for (int q = 0; q < n && rc == 0; q++)
          for (size_t i = 0; i < count; i++) {
            float x = wire_frac_in(q, i), got = all[(size_t)q * count + i];
            if (got != wire_round(wires[w], x)) bad++;
            if (got != x) rounded++;
          }
        if (rc != 0 || bad || (count >= 1531 && rounded == 0)) {
          fprintf(stderr, "rank %d: allgather wire %d mode %d count %zu: rc %d, %zu wrong\n", r,
                  (int)wires[w], mode, count, rc, bad);
          fails++;
        }
      }
  free(all);
  free(mine);
  return fails;
}

/* Fractions, ties and what rounding treats apart: NaNs (a signalling one made quiet), infinities,
 * -0, subnormals, and finite values that round to infinity in bf16 (FLT_MAX) or in f16. */
static float wire_odd_in(int r, size_t i) {
  uint32_t snan = 0x7f800001u;
  float f;
  switch ((i * 5 + (size_t)r) % 41) {
  case 3:
    memcpy(&f, &snan, sizeof f);
    return f;
  case 7:
    return r % 2 ? INFINITY : -INFINITY;
  case 11:
    return -0.0f;
  case 17:
    return (float)r * 1e-40f + 1e-41f;
  case 19:
    return FLT_MAX;
  case 23:
    return 65520.0f;
  default:
    return wire_frac_in(r, i) * (float)(1 + i % 5);
  }
}

/* One compressed collective of `kind` (in place or not) on wire_odd_in's inputs; out gets its
 * result: the allreduce's vector, the reduce-scatter's block, the allgather's n blocks. */
static int wire_way(cohort_comm *c, int kind, int inplace, cohort_dtype wire, size_t count,
                    float *out) {
  int n = cohort_comm_size(c), r = cohort_comm_rank(c);
  size_t nin = kind == COLL_REDUCE_SCATTER ? count * (size_t)n : count;
  size_t nout = kind == COLL_ALLGATHER ? count * (size_t)n : count;
  float *send = malloc((nin + nout + 1) * sizeof(float)), *recv = send + nin;
  float *src = kind == COLL_ALLGATHER && inplace ? recv + (size_t)r * count : send;
  for (size_t i = 0; i < nin; i++) src[i] = wire_odd_in(r, i);
  float *dst = inplace && kind != COLL_ALLGATHER ? send : recv;
  int rc;
  if (kind == COLL_ALLREDUCE)
    rc = cohort_allreduce_wire(c, src, dst, count, COHORT_F32, wire, COHORT_SUM);
  else if (kind == COLL_REDUCE_SCATTER)
    rc = cohort_reduce_scatter_wire(c, src, dst, count, COHORT_F32, wire, COHORT_SUM);
  else
    rc = cohort_allgather_wire(c, src, dst, count, COHORT_F32, wire);
  const float *res = kind == COLL_REDUCE_SCATTER && inplace ? send + (size_t)r * count : dst;
  if (rc == 0) memcpy(out, res, nout * sizeof(float));
  free(send);
  return rc;
}

/* The ring's compressed operations convert at the engine's transfers (rounded as they are sent,
 * widened and summed as they arrive) and give the bits of the same operations through a whole
 * 16-bit copy, NaNs, infinities and ties included. arg: whether the allreduce takes the ring. */
static int rk_wire_edges(cohort_comm *c, void *arg) {
  int ring_allreduce = *(const int *)arg;
  int n = cohort_comm_size(c), r = cohort_comm_rank(c), fails = 0;
  size_t counts[] = {1, 7, 1531, 70001};
  cohort_dtype wires[] = {COHORT_BF16, COHORT_F16};
  int kinds[] = {COLL_ALLREDUCE, COLL_REDUCE_SCATTER, COLL_ALLGATHER};
  size_t most = 70001 * (size_t)n;
  float *got[2] = {malloc(most * sizeof(float)), malloc(most * sizeof(float))};
  for (int w = 0; w < 2; w++)
    for (int k = 0; k < 3; k++)
      for (int inplace = 0; inplace < 2; inplace++)
        for (size_t ci = 0; ci < BASE_ARRAY_LEN(counts); ci++) {
          size_t count = counts[ci], nout = kinds[k] == COLL_ALLGATHER ? count * (size_t)n : count;
          int rc = 0;
          uint64_t edges = 0;
          for (int way = 0; way < 2 && rc == 0; way++) {
            c->wire_copy = way == 0;
            uint64_t before = c->wire_edge_ops;
            rc = wire_way(c, kinds[k], inplace, wires[w], count, got[way]);
            edges = c->wire_edge_ops - before;
          }
          c->wire_copy = 0;
          int want_edges = kinds[k] != COLL_ALLREDUCE || ring_allreduce;
          if (rc != 0 || memcmp(got[0], got[1], nout * sizeof(float)) != 0 ||
              (edges > 0) != want_edges) {
            fprintf(stderr,
                    "rank %d: wire %s kind %d in place %d count %zu: rc %d, %s, converted at "
                    "the transfers %s\n",
                    r, wires[w] == COHORT_BF16 ? "bf16" : "f16", kinds[k], inplace, count, rc,
                    memcmp(got[0], got[1], nout * sizeof(float)) ? "bits differ" : "same bits",
                    edges ? "yes" : "no");
            fails++;
          }
        }
  free(got[0]);
  free(got[1]);
  return fails;
}

/* Four compressed operations: an allreduce in place, an allgather of part of its result, a
 * reduce-scatter and an allreduce of other buffers. */
static int wire_sequence(cohort_comm *c, int queued, float *x, float *ag, float *y, float *z,
                         size_t count) {
  int n = cohort_comm_size(c), r = cohort_comm_rank(c);
  for (size_t i = 0; i < count * (size_t)n; i++) {
    x[i] = wire_frac_in(r, i);
    y[i] = wire_frac_in(r + 7, i);
    z[i] = wire_frac_in(r + 13, i);
  }
  cohort_request *req[4] = {NULL, NULL, NULL, NULL};
  int rc = queued ? cohort_iallreduce_wire(c, x, x, count * (size_t)n, COHORT_F32, COHORT_BF16,
                                           COHORT_SUM, &req[0])
                  : cohort_allreduce_wire(c, x, x, count * (size_t)n, COHORT_F32, COHORT_BF16,
                                          COHORT_SUM);
  if (rc == 0)
    rc = queued ? cohort_iallgather_wire(c, x + count, ag, count, COHORT_F32, COHORT_BF16, &req[1])
                : cohort_allgather_wire(c, x + count, ag, count, COHORT_F32, COHORT_BF16);
  if (rc == 0)
    rc = queued ? cohort_ireduce_scatter_wire(c, y, y, count, COHORT_F32, COHORT_F16, COHORT_SUM,
                                              &req[2])
                : cohort_reduce_scatter_wire(c, y, y, count, COHORT_F32, COHORT_F16, COHORT_SUM);
  if (rc == 0)
    rc = queued
             ? cohort_iallreduce_wire(c, z, z, count, COHORT_F32, COHORT_BF16, COHORT_MAX, &req[3])
             : cohort_allreduce_wire(c, z, z, count, COHORT_F32, COHORT_BF16, COHORT_MAX);
  for (int i = 0; i < 4; i++) {
    int w = cohort_request_wait(req[i]);
    if (rc == 0) rc = w;
  }
  return rc;
}

/* Queued compressed operations that go through the wire-type copy (here all of them: the ring's
 * convert at the transfers otherwise) have their input rounded while the one before them waits on
 * the link (on some rank here), and give the bits of the same operations called one at a time,
 * the allgather that reads the allreduce's result included (it is not read ahead). */
static int rk_wire_queue(cohort_comm *c, void *arg) {
  (void)arg;
  int n = cohort_comm_size(c), r = cohort_comm_rank(c), fails = 0;
  c->wire_copy = 1;
  const size_t count = 300001; /* over a slice of the rounding ahead */
  size_t all = count * (size_t)n;
  float *buf[2][4];
  for (int k = 0; k < 2; k++)
    for (int j = 0; j < 4; j++) buf[k][j] = malloc(all * sizeof(float));
  uint64_t before = c->prepared_ops;
  for (int k = 0; k < 2; k++)
    if (wire_sequence(c, k, buf[k][0], buf[k][1], buf[k][2], buf[k][3], count) != 0) fails++;
  const size_t len[4] = {all, all, count, count};
  for (int j = 0; j < 4 && fails == 0; j++)
    if (memcmp(buf[0][j], buf[1][j], len[j] * sizeof(float)) != 0) {
      fprintf(stderr, "rank %d: queued operation %d differs from the same called alone\n", r, j);
      fails++;
    }
  /* Whether a rank's transfers ever waited while the next operation was queued depends on timing;
   * over the ranks some did. */
  int64_t prepared = (int64_t)(c->prepared_ops - before);
  if (cohort_allreduce(c, &prepared, &prepared, 1, COHORT_I64, COHORT_SUM) != 0 || prepared == 0) {
    fprintf(stderr, "rank %d: no queued operation found its input rounded ahead\n", r);
    fails++;
  }
  for (int k = 0; k < 2; k++)
    for (int j = 0; j < 4; j++) free(buf[k][j]);
  c->wire_copy = 0;
  return fails;
}

/* Rank 1 calls the plain f32 allreduce where rank 0 calls the compressed one: both fail. */
static int rk_wire_mismatch(cohort_comm *c, void *arg) {
  (void)arg;
  float x[64] = {0};
  int rc = cohort_comm_rank(c) == 0
               ? cohort_allreduce_wire(c, x, x, 64, COHORT_F32, COHORT_BF16, COHORT_SUM)
               : cohort_allreduce(c, x, x, 64, COHORT_F32, COHORT_SUM);
  return rc == COHORT_EMISMATCH || rc == COHORT_EPEER ? 0 : 1;
}

/* Rank 1 calls a different collective; every rank must fail, none hang. */
typedef struct mm_arg {
  int variant;
} mm_arg;

static int rk_mismatch(cohort_comm *c, void *arg) {
  mm_arg *a = arg;
  int r = cohort_comm_rank(c), n = cohort_comm_size(c), rc;
  float buf[64] = {0};
  int64_t t0 = base_now_ms();
  if (r == 1) {
    switch (a->variant) {
    case 0:
      rc = cohort_allreduce(c, buf, buf, 10, COHORT_F32, COHORT_SUM);
      break;
    case 1:
      rc = cohort_allreduce(c, buf, buf, 11, COHORT_I32, COHORT_SUM);
      break;
    case 2:
      rc = cohort_broadcast(c, buf, 11, COHORT_F32, 1);
      break;
    default: {
      float *big = calloc(1 << 20, sizeof(float));
      rc = cohort_allreduce(c, big, big, 1 << 20, COHORT_F32, COHORT_SUM);
      free(big);
    }
    }
  } else {
    rc = cohort_allreduce(c, buf, buf, 11, COHORT_F32, COHORT_SUM);
  }
  int fails = 0;
  /* A broadcast root only sends: it learns of the mismatch at its next call. */
  int only_sends = r == 1 && a->variant == 2;
  if (only_sends && rc == 0) rc = cohort_barrier(c);
  const char *msg = cohort_comm_error_message(c);
  if (rc == 0 || msg[0] == '\0' || strstr(msg, "rank ") == NULL) fails++;
  if (n == 2 && !only_sends && rc != COHORT_EMISMATCH) fails++;
  if (n == 2 && !only_sends && strstr(msg, r == 0 ? "rank 1" : "rank 0") == NULL) fails++;
  if (base_now_ms() - t0 > 10000) fails++; /* well inside the 30 s deadline */
  if (cohort_barrier(c) != COHORT_EABORTED) fails++;
  if (fails)
    fprintf(stderr, "rank %d: mismatch variant %d: rc=%d msg='%s'\n", r, a->variant, rc, msg);
  return fails;
}

static int rk_timeout(cohort_comm *c, void *arg) {
  (void)arg;
  int r = cohort_comm_rank(c);
  float x = 1;
  if (r == 1) {
    base_sleep_ms(6000); /* never calls: rank 0 must time out */
    return 0;
  }
  /* Created with the default timeout (a busy machine may take longer than 500 ms to connect). */
  if (cohort_comm_set_timeout(c, 500) != 0) return 1;
  int64_t t0 = base_now_ms();
  int rc = cohort_allreduce(c, &x, &x, 1, COHORT_F32, COHORT_SUM);
  int64_t dt = base_now_ms() - t0;
  int fails = 0;
  /* Its 500 ms timeout, not rank 1's exit after 6 s: a bound of ten times the timeout. */
  if (rc != -ETIMEDOUT || dt < 450 || dt > 5000) fails++;
  if (strstr(cohort_comm_error_message(c), "rank 1") == NULL) fails++;
  if (fails)
    fprintf(stderr, "timeout: rc=%d after %lld ms: %s\n", rc, (long long)dt,
            cohort_comm_error_message(c));
  return fails;
}

static int rk_abort(cohort_comm *c, void *arg) {
  (void)arg;
  int r = cohort_comm_rank(c), fails = 0;
  float x = 1;
  if (cohort_allreduce(c, &x, &x, 1, COHORT_F32, COHORT_SUM) != 0) fails++;
  if (r == 0) {
    cohort_comm_abort(c);
    cohort_comm_abort(c);
    if (cohort_allreduce(c, &x, &x, 1, COHORT_F32, COHORT_SUM) != COHORT_EABORTED) fails++;
    if (strstr(cohort_comm_error_message(c), "cohort_comm_abort") == NULL) fails++;
  } else {
    int rc = cohort_allreduce(c, &x, &x, 1, COHORT_F32, COHORT_SUM);
    if (rc == 0 || cohort_comm_error_message(c)[0] == '\0') fails++;
  }
  return fails;
}

static int rk_failure(cohort_comm *c, void *arg) {
  (void)arg;
  int r = cohort_comm_rank(c);
  size_t cnt = 4u << 20; /* 16 MiB of f32 */
  float *buf = NULL;
  if (g_shared) {
    if (cohort_mem_alloc(c, cnt * sizeof(float), (void **)&buf) != 0) return 1;
  } else {
    buf = calloc(cnt, sizeof(float));
  }
  int rc = 0;
  for (int it = 0; it < 100000 && rc == 0; it++) {
    rc = cohort_allreduce(c, buf, buf, cnt, COHORT_F32, COHORT_SUM);
    if (it == 2 && r == 0) {
      FILE *f = fopen(g_ready, "w");
      if (f) fclose(f);
    }
  }
  if (!g_shared) free(buf); /* a shared one is unmapped by the destroy */
  int fails = 0;
  if (g_shared && c->single_copy_ops == 0) fails++;
  /* Ordinary buffers on one host: the peer died while the others read and wrote its memory. */
  if (!g_shared && c->shm != NULL && geteuid() == 0 && c->one_sided_ops == 0) fails++;
  const char *msg = cohort_comm_error_message(c);
  if (rc == 0 || strstr(msg, "rank ") == NULL) fails++;
  if (cohort_allreduce(c, NULL, NULL, 0, COHORT_F32, COHORT_SUM) != COHORT_EABORTED) fails++;
  fprintf(stderr, "rank %d after the kill: rc=%d (%s): %s\n", r, rc, cohort_strerror(rc), msg);
  return fails;
}

/* ---- unit checks of the kernels ---- */

/* bf16 rounding written the plain way (branch on NaN), as the reference of the vectorised one. */
static uint16_t ref_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu)) return (uint16_t)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

static float bits_f32(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

/* The bf16 conversion and sum kernels against ref_bf16: infinities, overflow, NaNs (kept, made
 * quiet), every bf16 value as an operand of the sum, and random f32 bit patterns rounded. */
static void test_bf16_kernels(void) {
  CHECK_EQ_INT(coll_f32_to_bf16(bits_f32(0x7f800000u)), 0x7f80);
  CHECK_EQ_INT(coll_f32_to_bf16(bits_f32(0xff800000u)), 0xff80);
  CHECK_EQ_INT(coll_f32_to_bf16(3.4028235e38f), 0x7f80); /* the largest float rounds to inf */
  CHECK_EQ_INT(coll_f32_to_bf16(bits_f32(0x7f800001u)), 0x7fc0);
  CHECK_EQ_INT(coll_f32_to_bf16(bits_f32(0xffffffffu)), 0xffff);
  enum { N = 65536 };
  uint16_t *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *z = malloc(N * sizeof *z);
  float *f = malloc(N * sizeof *f);
  uint64_t st = 12345;
  for (uint32_t i = 0; i < N; i++) {
    x[i] = (uint16_t)i;
    y[i] = (uint16_t)(i * 40503u + 7u);
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    f[i] = bits_f32((uint32_t)(st >> 32));
  }
  coll_reduce(COHORT_BF16, COHORT_SUM, z, x, y, N);
  size_t bad = 0;
  for (uint32_t i = 0; i < N; i++)
    if (z[i] != ref_bf16(coll_bf16_to_f32(x[i]) + coll_bf16_to_f32(y[i]))) bad++;
  CHECK_EQ_INT(bad, 0);
  /* Off by one at both ends, so the vector loops' unaligned starts and scalar tails run too. */
  memset(z, 0, N * sizeof *z);
  coll_to_wire(COHORT_BF16, z + 1, f + 1, N - 4);
  bad = z[0] != 0 || z[N - 3] != 0;
  for (uint32_t i = 1; i < N - 3; i++)
    if (z[i] != ref_bf16(f[i])) bad++;
  CHECK_EQ_INT(bad, 0);
  coll_from_wire(COHORT_BF16, f + 1, x + 1, N - 4);
  bad = 0;
  for (uint32_t i = 1; i < N - 3; i++)
    if (memcmp(&f[i], &(uint32_t){(uint32_t)x[i] << 16}, sizeof f[i]) != 0) bad++;
  CHECK_EQ_INT(bad, 0);
  free(x), free(y), free(z), free(f);
}

static uint32_t f32_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return x;
}

/* Every bf16 pattern as the top half of a float, with the low halves that decide the rounding:
 * exact (0), just above and below a tie, the ties themselves (0x8000, to the odd and the even
 * neighbour), the largest carry; so subnormals, zeros, infinities, the carry into infinity, and
 * signalling and quiet NaNs of either sign all appear, in the vector loops and their tails. */
static const uint16_t sweep_lo[] = {0x0000, 0x0001, 0x4000, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff};
#define SWEEP_N (65536u * (uint32_t)BASE_ARRAY_LEN(sweep_lo))

static float sweep_f32(uint32_t i) {
  return bits_f32((i / (uint32_t)BASE_ARRAY_LEN(sweep_lo)) << 16 |
                  sweep_lo[i % BASE_ARRAY_LEN(sweep_lo)]);
}

/* The wire kernels the engine runs (whichever version the loader picked for this CPU) against
 * ref_bf16, bit for bit, over the sweep: rounding, the rounding that reports a change (piece by
 * piece), and the receiving sum (local rounded, plus a wire value, rounded, widened), in place
 * and not. A vectorised version that flushes subnormals (VCVTNEPS2BF16 does) or rounds a tie
 * the wrong way fails here. */
static void test_wire_kernel_sweep(void) {
  const uint32_t n = SWEEP_N, piece = 8192;
  float *f = malloc(n * sizeof *f), *g = malloc(n * sizeof *g), *h = malloc(n * sizeof *h);
  uint16_t *w = malloc(n * sizeof *w), *in = malloc(n * sizeof *in);
  for (uint32_t i = 0; i < n; i++) {
    f[i] = sweep_f32(i);
    in[i] = (uint16_t)(i * 40503u + 7u);
  }
  size_t bad = 0, flags = 0;
  coll_to_wire(COHORT_BF16, w + 1, f + 1, n - 2);
  for (uint32_t i = 1; i < n - 1; i++)
    if (w[i] != ref_bf16(f[i])) bad++;
  CHECK_EQ_INT(bad, 0);
  /* Each piece's flag: 1 exactly when some element is not its rounded value widened back. */
  for (uint32_t lo = 0; lo < n; lo += piece) {
    int want = 0;
    for (uint32_t i = lo; i < lo + piece; i++)
      want |= f32_bits(f[i]) != (uint32_t)ref_bf16(f[i]) << 16;
    memset(w, 0, piece * sizeof *w);
    if (coll_to_wire_changes(COHORT_BF16, w, f + lo, piece) != want) bad++;
    for (uint32_t i = lo; i < lo + piece; i++) bad += w[i - lo] != ref_bf16(f[i]);
    flags += (size_t)want;
  }
  CHECK_EQ_INT(bad, 0);
  CHECK(flags > 0);
  /* Already wire values: no change reported, whichever single element (first, in the middle,
   * in the tail) is then made to need rounding. */
  for (uint32_t i = 0; i < n; i++) g[i] = coll_bf16_to_f32(ref_bf16(f[i]));
  CHECK_EQ_INT(coll_to_wire_changes(COHORT_BF16, w, g + 3, n - 7), 0);
  uint32_t at[] = {3, 4, 17, 64, 1000, n / 2 + 5, n - 5};
  for (size_t k = 0; k < BASE_ARRAY_LEN(at); k++) {
    float keep = g[at[k]];
    g[at[k]] = bits_f32(f32_bits(keep) | 1u);
    bad += coll_to_wire_changes(COHORT_BF16, w, g + 3, n - 7) != 1;
    g[at[k]] = bits_f32(0x7f800001u); /* a signalling NaN: made quiet, a change */
    bad += coll_to_wire_changes(COHORT_BF16, w, g + 3, n - 7) != 1;
    g[at[k]] = keep;
  }
  CHECK_EQ_INT(bad, 0);
  /* The receiving sum, into another buffer and in place. */
  coll_sum_from_wire(COHORT_BF16, h + 1, f + 1, in + 1, n - 2);
  memcpy(g, f, n * sizeof *g);
  coll_sum_from_wire(COHORT_BF16, g + 1, g + 1, in + 1, n - 2);
  for (uint32_t i = 1; i < n - 1; i++) {
    float a = coll_bf16_to_f32(ref_bf16(f[i])), b = coll_bf16_to_f32(in[i]);
    uint32_t want = (uint32_t)ref_bf16(a + b) << 16, also = want;
    if (isnan(a) && isnan(b)) { /* two NaNs: either, made quiet (the compiler orders the sum) */
      want = (uint32_t)(in[i] | 0x40u) << 16;
      also = (f32_bits(a) | 0x400000u) & 0xffff0000u;
    }
    bad += f32_bits(h[i]) != want && f32_bits(h[i]) != also;
    bad += f32_bits(g[i]) != want && f32_bits(g[i]) != also;
  }
  CHECK_EQ_INT(bad, 0);
  free(f), free(g), free(h), free(w), free(in);
}

/* The 16-bit pattern collbench_put stores for v. */
static uint16_t ref_bits(cohort_dtype dt, double v) {
  uint16_t h;
  collbench_put(dt, &h, 0, v);
  return h;
}

/* The value of a finite f16 pattern, by arithmetic (not the library's widening). */
static double f16_value(uint32_t h) {
  int e = (int)((h >> 10) & 0x1fu);
  double m = (double)(h & 0x3ffu);
  double v = e == 0 ? ldexp(m, -24) : ldexp(1024.0 + m, e - 25);
  return h & 0x8000u ? -v : v;
}

/* Counts x (and its float neighbours) where the library's rounding to dt differs from the
 * reference's; prints the first when none were found before (`before`). */
static size_t round_mismatches(cohort_dtype dt, float x, size_t before) {
  size_t bad = 0;
  float xs[3] = {nextafterf(x, -INFINITY), x, nextafterf(x, INFINITY)};
  for (int k = 0; k < 3; k++) {
    uint16_t got = dt == COHORT_BF16 ? coll_f32_to_bf16(xs[k]) : coll_f32_to_f16(xs[k]);
    uint16_t want = ref_bits(dt, xs[k]);
    if (got != want && before + bad++ == 0)
      fprintf(stderr, "%s(%a): library 0x%04x, reference 0x%04x\n",
              dt == COHORT_BF16 ? "bf16" : "f16", (double)xs[k], got, want);
  }
  return bad;
}

/* The reference's rounding (src/collbench/reference.c, which the collectives' checks and `cohort
 * bench` use) against values worked out by hand, then the library's converters against it at
 * every value of both 16-bit formats, every midpoint between neighbours (the ties) and the
 * floats on either side of each: a rounding bug in the converters fails here and in the
 * collectives, not only against ref_bf16. */
static void test_reference_rounding(void) {
  CHECK_EQ_INT(ref_bits(COHORT_F16, 1.0), 0x3c00);
  CHECK_EQ_INT(ref_bits(COHORT_F16, -2.0), 0xc000);
  CHECK_EQ_INT(ref_bits(COHORT_F16, 65504.0), 0x7bff);
  CHECK_EQ_INT(ref_bits(COHORT_F16, 65520.0), 0x7c00); /* rounds to inf */
  CHECK_EQ_INT(ref_bits(COHORT_F16, 0.1f), 0x2e66);
  CHECK_EQ_INT(ref_bits(COHORT_F16, 0x1p-24), 0x0001);     /* smallest subnormal */
  CHECK_EQ_INT(ref_bits(COHORT_F16, 0x1p-25), 0x0000);     /* tie to even: 0 */
  CHECK_EQ_INT(ref_bits(COHORT_F16, 0x3p-25), 0x0002);     /* tie to even: 2 x 2^-24 */
  CHECK_EQ_INT(ref_bits(COHORT_F16, 0x1.ffep-15), 0x0400); /* subnormal rounds up to normal */
  CHECK_EQ_INT(ref_bits(COHORT_F16, 2049.0), 0x6800);      /* tie to even: 2048 */
  CHECK_EQ_INT(ref_bits(COHORT_F16, 2051.0), 0x6802);      /* tie to even: 2052 */
  CHECK_EQ_INT(ref_bits(COHORT_F16, -1.0 / 3.0), 0xb555);
  CHECK_EQ_INT(ref_bits(COHORT_BF16, 1.0), 0x3f80);
  CHECK_EQ_INT(ref_bits(COHORT_BF16, -3.0), 0xc040);
  CHECK_EQ_INT(ref_bits(COHORT_BF16, 257.0), 0x4380); /* tie to even: 256 */
  CHECK_EQ_INT(ref_bits(COHORT_BF16, 259.0), 0x4382); /* tie to even: 260 */
  CHECK_EQ_INT(ref_bits(COHORT_BF16, 1.0 / 3.0), 0x3eab);
  CHECK_EQ_INT(ref_bits(COHORT_BF16, 0x1p-133), 0x0001);     /* smallest subnormal */
  CHECK_EQ_INT(ref_bits(COHORT_BF16, 0x1p-134), 0x0000);     /* tie to even: 0 */
  CHECK_EQ_INT(ref_bits(COHORT_BF16, 3.4028235e38), 0x7f80); /* the largest float: inf */
  CHECK_EQ_INT(ref_bits(COHORT_BF16, -0x1.fep127), 0xff7f);  /* the largest bf16 */
  size_t bad = 0;
  for (uint32_t h = 0; h < 0x7f80; h++) /* bf16: the pattern is the float's top half */
    for (uint32_t sign = 0; sign < 2; sign++) {
      uint32_t top = sign << 31 | h << 16;
      bad += round_mismatches(COHORT_BF16, bits_f32(top), bad);
      bad += round_mismatches(COHORT_BF16, bits_f32(top | 0x8000u), bad);
    }
  for (uint32_t h = 0; h < 0x7c00; h++)
    for (uint32_t sign = 0; sign < 2; sign++) {
      uint32_t s = sign << 15 | h;
      bad += round_mismatches(COHORT_F16, (float)f16_value(s), bad);
      if (h < 0x7bff)
        bad += round_mismatches(COHORT_F16, (float)((f16_value(s) + f16_value(s + 1)) / 2), bad);
    }
  CHECK_EQ_INT(bad, 0);
}

static void test_conversions(void) {
  CHECK_EQ_INT(coll_f32_to_f16(1.0f), 0x3c00);
  CHECK_EQ_INT(coll_f32_to_f16(-2.0f), 0xc000);
  CHECK_EQ_INT(coll_f32_to_f16(65504.0f), 0x7bff);
  CHECK_EQ_INT(coll_f32_to_f16(65520.0f), 0x7c00); /* rounds to inf */
  CHECK_EQ_INT(coll_f32_to_f16(0.1f), 0x2e66);
  CHECK_EQ_INT(coll_f32_to_f16(5.9604645e-08f), 0x0001); /* smallest subnormal */
  CHECK_EQ_INT(coll_f32_to_f16(2049.0f), 0x6800);        /* tie to even: 2048 */
  CHECK_EQ_INT(coll_f32_to_f16(2051.0f), 0x6802);        /* tie to even: 2052 */
  CHECK(coll_f16_to_f32(0x3555) > 0.333f && coll_f16_to_f32(0x3555) < 0.3334f);
  CHECK(coll_f16_to_f32(0x0001) == 5.9604645e-08f);
  for (uint32_t h = 0; h < 0x7c00; h++)
    CHECK_EQ_INT(coll_f32_to_f16(coll_f16_to_f32((uint16_t)h)), h);
  CHECK_EQ_INT(coll_f32_to_bf16(1.0f), 0x3f80);
  CHECK_EQ_INT(coll_f32_to_bf16(257.0f), 0x4380); /* tie to even: 256 */
  CHECK_EQ_INT(coll_f32_to_bf16(259.0f), 0x4382); /* tie to even: 260 */
  CHECK(coll_bf16_to_f32(0xc040) == -3.0f);
  test_bf16_kernels();
  test_wire_kernel_sweep();
  test_reference_rounding();
  uint16_t a[3] = {coll_f32_to_f16(1.5f), coll_f32_to_f16(-4), coll_f32_to_f16(7)};
  uint16_t b[3] = {coll_f32_to_f16(2.5f), coll_f32_to_f16(3), coll_f32_to_f16(-7)};
  coll_reduce(COHORT_F16, COHORT_SUM, a, a, b, 3);
  CHECK(coll_f16_to_f32(a[0]) == 4.0f && coll_f16_to_f32(a[1]) == -1.0f && a[2] == 0);
  int32_t ia[2] = {7, -9}, ib[2] = {3, 4};
  coll_reduce(COHORT_I32, COHORT_MIN, ia, ia, ib, 2);
  CHECK(ia[0] == 3 && ia[1] == -9);
  coll_reduce_finish(COHORT_I32, COHORT_AVG, ia, 2, 2);
  CHECK(ia[0] == 1 && ia[1] == -4);
  CHECK_EQ_INT(cohort_dtype_size(COHORT_BF16), 2);
  CHECK_EQ_INT(cohort_dtype_size((cohort_dtype)99), 0);
}

/* The two-rank kernel against the general path (reduce, then finish by division), bit for bit:
 * random floats over the whole exponent range, so some averages are subnormal; in place and
 * into separate buffers; divisors it must leave to the general path. */
static void test_reduce_pair(void) {
  enum { N = 4099 };
  static float a[N], b[N], d0[N], d1[N], want[N];
  static double da[N], db[N], dwant[N];
  uint32_t s = 12345;
  for (int i = 0; i < N; i++) {
    uint32_t u[2];
    for (int k = 0; k < 2; k++) {
      s = s * 1664525u + 1013904223u;
      u[k] = (s & 0x807fffffu) | ((s >> 7) % 255u) << 23; /* finite, any exponent */
    }
    memcpy(&a[i], &u[0], 4);
    memcpy(&b[i], &u[1], 4);
    da[i] = (double)a[i] * 1e-300;
    db[i] = (double)b[i];
  }
  for (int fin = 0; fin <= 4; fin += 2) {
    cohort_redop op = fin ? COHORT_AVG : COHORT_SUM;
    coll_reduce(COHORT_F32, op, want, a, b, N);
    coll_reduce_finish(COHORT_F32, op, want, N, fin);
    CHECK_EQ_INT(coll_reduce_pair(COHORT_F32, op, d0, d1, a, b, N, fin), 1);
    CHECK(memcmp(d0, want, sizeof want) == 0 && memcmp(d1, want, sizeof want) == 0);
    coll_reduce(COHORT_F64, op, dwant, da, db, N);
    coll_reduce_finish(COHORT_F64, op, dwant, N, fin);
    static double dd0[N], dd1[N];
    memcpy(dd0, da, sizeof da);
    memcpy(dd1, db, sizeof db);
    CHECK_EQ_INT(coll_reduce_pair(COHORT_F64, op, dd0, dd1, dd0, dd1, N, fin), 1); /* in place */
    CHECK(memcmp(dd0, dwant, sizeof dwant) == 0 && memcmp(dd1, dwant, sizeof dwant) == 0);
  }
  memset(d0, 0, sizeof d0);
  CHECK_EQ_INT(coll_reduce_pair(COHORT_F32, COHORT_AVG, d0, d1, a, b, N, 3), 0);
  CHECK_EQ_INT(coll_reduce_pair(COHORT_F32, COHORT_MAX, d0, d1, a, b, N, 0), 0);
  CHECK_EQ_INT(coll_reduce_pair(COHORT_BF16, COHORT_SUM, d0, d1, a, b, N / 2, 0), 0);
  CHECK_EQ_INT(coll_reduce_pair(COHORT_I32, COHORT_SUM, d0, d1, a, b, N, 0), 0);
  CHECK(d0[0] == 0.0f && d0[N - 1] == 0.0f); /* refused: nothing written */
}

/* A peer whose stream ends inside an element (killed mid-send): the staged remainder is handed
 * out, and once the reader takes nothing more of it the end is reported, not the same bytes
 * again (the engine would spin on them until its deadline). */
static void test_tcp_partial_eof(void) {
  int sv[2];
  CHECK_EQ_INT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  int fds[2] = {-1, sv[0]};
  coll_tcp *t = NULL;
  CHECK_EQ_INT(coll_tcp_create(0, 2, fds, 4096, &t), 0);
  const char six[6] = {1, 2, 3, 4, 5, 6};
  CHECK_EQ_INT((int)write(sv[1], six, sizeof six), 6);
  close(sv[1]);
  const void *data = NULL;
  long n = coll_tcp_ops.peek(t, 1, &data);
  for (int i = 0; i < 4 && n == 0; i++) n = coll_tcp_ops.peek(t, 1, &data);
  CHECK_EQ_INT((int)n, 6);
  coll_tcp_ops.consume(t, 1, 4); /* one f32 taken, two bytes of the next left */
  int ended = 0;
  for (int i = 0; i < 4 && !ended; i++) {
    n = coll_tcp_ops.peek(t, 1, &data);
    if (n == COHORT_EPEER)
      ended = 1;
    else
      CHECK_EQ_INT((int)n, 2);
  }
  CHECK(ended);
  coll_tcp_destroy(t);
}

static void test_api_errors(void) {
  cohort_comm *c = (cohort_comm *)1;
  cohort_comm_config cfg = {.rank = 2, .size = 2, .store_addr = g_store, .job_id = "x"};
  CHECK_EQ_INT(cohort_comm_create(&cfg, &c), -EINVAL);
  CHECK(c == NULL);
  CHECK_EQ_INT(cohort_allreduce(NULL, NULL, NULL, 0, COHORT_F32, COHORT_SUM), -EINVAL);
  CHECK_EQ_INT(cohort_request_wait(NULL), 0);
  cohort_comm_destroy(NULL);
  cohort_comm_abort(NULL);
  unsetenv("RANK");
  CHECK_EQ_INT(cohort_comm_create_from_env(&c), COHORT_ENOENV);
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("COHORT_STORE", g_store, 1);
  setenv("COHORT_JOB_ID", "j", 1);
  cohort_comm_config e;
  CHECK_EQ_INT(cohort_comm_config_from_env(&e), COHORT_ENOENV); /* rank >= size */
  setenv("RANK", "1", 1);
  setenv("COHORT_TRANSPORT", "carrier-pigeon", 1);
  CHECK_EQ_INT(cohort_comm_config_from_env(&e), COHORT_ENOENV);
  setenv("COHORT_TRANSPORT", "shm", 1);
  setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
  setenv("COHORT_TIMEOUT_MS", "1500", 1);
  CHECK_EQ_INT(cohort_comm_config_from_env(&e), 0);
  CHECK(e.rank == 1 && e.size == 2 && e.restart == 2 && e.timeout_ms == 1500 &&
        e.transport == COHORT_TRANSPORT_SHM);
  unsetenv("COHORT_TRANSPORT");
  unsetenv("COHORT_TIMEOUT_MS");
  /* A world of one needs no store at all and still checks arguments. */
  cohort_comm_config one = {.rank = 0, .size = 1, .store_addr = "127.0.0.1:1", .job_id = "solo"};
  CHECK_EQ_INT(cohort_comm_create(&one, &c), 0);
  float x[3] = {1, 2, 3}, y[3];
  CHECK_EQ_INT(cohort_allreduce(c, x, y, 3, COHORT_F32, COHORT_AVG), 0);
  CHECK(y[0] == 1 && y[2] == 3);
  CHECK_EQ_INT(cohort_broadcast(c, x, 3, COHORT_F32, 1), -EINVAL); /* bad root */
  CHECK_EQ_INT(cohort_allreduce(c, x, y, 3, COHORT_F32, COHORT_SUM), COHORT_EABORTED);
  CHECK(strstr(cohort_comm_error_message(c), "invalid") != NULL);
  cohort_comm_destroy(c);
}

/*
 * A peer that writes its last bytes into the shared-memory ring and exits
 * before the receiver has read them: the receiver must still get them. Rank 1
 * waits in a broadcast and is stopped; rank 0 sends 256 KiB (less than a ring)
 * and exits; rank 1 continues, finds rank 0's connection closed, and must read
 * what rank 0 left instead of failing with "lost the connection".
 */
static void test_early_exit(void) {
  char job[64], go[160], ready[176];
  g_job++;
  job_name(job, sizeof job);
  snprintf(go, sizeof go, "/tmp/cohort-test-coll-go-%d", (int)getpid());
  snprintf(ready, sizeof ready, "%s.ready", go);
  unlink(go);
  unlink(ready);
  enum { N = 64 * 1024 };
  pid_t p[2];
  for (int r = 0; r < 2; r++) {
    p[r] = fork();
    if (p[r] != 0) continue;
    cohort_comm_config cfg = {
        .rank = r, .size = 2, .store_addr = g_store, .job_id = job, .timeout_ms = 20000};
    cohort_comm *c = NULL;
    if (cohort_comm_create(&cfg, &c) != 0) _exit(3);
    float *buf = calloc(N, sizeof(float));
    if (buf == NULL) _exit(3);
    if (r == 0) {
      for (int i = 0; i < N; i++) buf[i] = (float)i;
      for (int i = 0; i < 20000 && access(go, F_OK) != 0; i++) base_sleep_ms(1);
      int rc = cohort_broadcast(c, buf, N, COHORT_F32, 0);
      cohort_comm_destroy(c);
      _exit(rc == 0 ? 0 : 1);
    }
    FILE *rf = fopen(ready, "w"); /* both ranks are connected */
    if (rf) fclose(rf);
    int rc = cohort_broadcast(c, buf, N, COHORT_F32, 0);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += buf[i] != (float)i;
    if (rc != 0) fprintf(stderr, "early exit: rank 1: %s\n", cohort_comm_error_message(c));
    cohort_comm_destroy(c);
    _exit(rc == 0 && bad == 0 ? 0 : 1);
  }
  /* Once rank 1 has its communicator (rank 0 has one then too), and a moment
   * for it to wait in the broadcast: stopped before, rank 0 would wait for it. */
  for (int i = 0; i < 20000 && access(ready, F_OK) != 0; i++) base_sleep_ms(1);
  base_sleep_ms(300);
  kill(p[1], SIGSTOP);
  FILE *f = fopen(go, "w");
  if (f) fclose(f);
  int st0 = -1, st1 = -1;
  for (int i = 0; i < 20000 && waitpid(p[0], &st0, WNOHANG) != p[0]; i++) base_sleep_ms(1);
  base_sleep_ms(200);
  kill(p[1], SIGCONT);
  for (int i = 0; i < 20000 && waitpid(p[1], &st1, WNOHANG) != p[1]; i++) base_sleep_ms(1);
  for (int r = 0; r < 2; r++) kill(p[r], SIGKILL); /* no-ops unless something hung */
  waitpid(p[0], NULL, WNOHANG);
  waitpid(p[1], NULL, WNOHANG);
  unlink(go);
  unlink(ready);
  CHECK(WIFEXITED(st0) && WEXITSTATUS(st0) == 0);
  CHECK(WIFEXITED(st1) && WEXITSTATUS(st1) == 0);
}

static int shm_leftovers(void) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "cohort-tcoll-%d-", (int)getpid());
  DIR *d = opendir("/dev/shm");
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d)) != NULL;)
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
  if (d) closedir(d);
  return n;
}

/*
 * The store runs in a process of its own, forked before this process has any
 * thread: forking rank processes from a multithreaded parent can leave a
 * lock (the sanitizers' allocator) held forever in the child.
 */
static store_fork g_store_server;

static int start_store(void) {
  store_server_opts o = {.bind_host = "127.0.0.1"};
  if (store_fork_start(&o, 0, &g_store_server) != 0) return -1;
  snprintf(g_store, sizeof g_store, "127.0.0.1:%d", g_store_server.port);
  return 0;
}

static int unit(void) {
  test_conversions();
  test_reduce_pair();
  test_tcp_partial_eof();
  test_api_errors();
  int sizes[] = {1, 2, 3, 4, 5, 8};
  for (size_t i = 0; i < BASE_ARRAY_LEN(sizes); i++) {
    int n = sizes[i];
    int64_t t0 = base_now_ms();
    world_opts o = {.n = n};
    CHECK_EQ_INT(run_world(&o, rk_matrix, n <= 5 ? (void *)1 : NULL), 0);
    /* Ring, chains and slicing for every type and operator: no latency algorithms, tiny slices. */
    world_opts ring = {.n = n, .threshold = "0", .slice = "4096"};
    CHECK_EQ_INT(run_world(&ring, rk_matrix, n == 8 ? (void *)1 : NULL), 0);
    fprintf(stderr, "world %d: %lld ms\n", n, (long long)(base_now_ms() - t0));
  }
  world_opts tcp = {.n = 3, .transport = COHORT_TRANSPORT_TCP};
  CHECK_EQ_INT(run_world(&tcp, rk_matrix, (void *)1), 0);
  world_opts tcp_ring = {
      .n = 4, .transport = COHORT_TRANSPORT_TCP, .threshold = "0", .slice = "4096"};
  CHECK_EQ_INT(run_world(&tcp_ring, rk_matrix, NULL), 0);
  /* Hierarchical allreduce: ranks 0,2,4 on one emulated host, 1,3 on another (TCP between
   * them over loopback), every size through it (threshold 0, small slices), then defaults. */
  world_opts hier = {.n = 5, .hosts = 2, .threshold = "0", .slice = "4096"};
  CHECK_EQ_INT(run_world(&hier, rk_matrix, (void *)1), 0);
  world_opts hier3 = {.n = 4, .hosts = 3};
  CHECK_EQ_INT(run_world(&hier3, rk_matrix, (void *)1), 0);
  /* Hosts of equal size (0,2 and 1,3): the reduce-scatter form. */
  world_opts hier_rs = {.n = 4, .hosts = 2, .threshold = "0", .slice = "4096"};
  CHECK_EQ_INT(run_world(&hier_rs, rk_matrix, (void *)1), 0);
  world_opts hier_rs2 = {.n = 4, .hosts = 2};
  CHECK_EQ_INT(run_world(&hier_rs2, rk_matrix, (void *)1), 0);
  world_opts flat = {.n = 4, .hosts = 2, .flat = 1, .threshold = "0"};
  CHECK_EQ_INT(run_world(&flat, rk_matrix, NULL), 0);
  world_opts shm = {.n = 3, .transport = COHORT_TRANSPORT_SHM};
  CHECK_EQ_INT(run_world(&shm, rk_matrix, (void *)1), 0);
  /* Single-copy transfers of large payloads (process_vm_readv). */
  world_opts cma = {.n = 3, .cma = 1};
  CHECK_EQ_INT(run_world(&cma, rk_matrix, (void *)1), 0);
  world_opts cma_ring = {.n = 4, .cma = 1, .threshold = "0", .slice = "65536"};
  CHECK_EQ_INT(run_world(&cma_ring, rk_matrix, (void *)1), 0);
  /* The single-copy allreduce between shared buffers, forced on (every size: threshold 0) and
   * off, 2, 3 and 4 ranks, against the serial reference; then at the default threshold. */
  for (int n = 2; n <= 4; n++) {
    world_opts sc_on = {.n = n, .shared = 1, .threshold = "0"};
    CHECK_EQ_INT(run_world(&sc_on, rk_shared, (void *)1), 0);
  }
  world_opts sc_slice = {.n = 3, .shared = 1, .threshold = "0", .slice = "4096"};
  CHECK_EQ_INT(run_world(&sc_slice, rk_shared, (void *)1), 0);
  world_opts sc_def = {.n = 3, .shared = 1};
  CHECK_EQ_INT(run_world(&sc_def, rk_shared, (void *)1), 0);
  world_opts sc_off = {.n = 3, .shared = 2, .threshold = "0"};
  CHECK_EQ_INT(run_world(&sc_off, rk_shared, NULL), 0);
  /* Over TCP the buffers are ordinary memory and the path is off. */
  world_opts sc_tcp = {.n = 2, .shared = 1, .transport = COHORT_TRANSPORT_TCP};
  CHECK_EQ_INT(run_world(&sc_tcp, rk_shared, NULL), 0);
  /* The direct allreduce on ordinary buffers through one-sided access: every size (threshold 0),
   * many chunks (4 KiB slices), the defaults; off when turned off, over TCP, across hosts. */
  world_opts os2 = {.n = 2, .threshold = "0"};
  CHECK_EQ_INT(run_world(&os2, rk_private, (void *)1), 0);
  world_opts os3 = {.n = 3, .threshold = "0", .slice = "4096"};
  CHECK_EQ_INT(run_world(&os3, rk_private, (void *)1), 0);
  world_opts os4 = {.n = 4};
  CHECK_EQ_INT(run_world(&os4, rk_private, (void *)1), 0);
  world_opts oc = {.n = 2};
  CHECK_EQ_INT(run_world(&oc, rk_collapse, (void *)1), 0);
  world_opts oc_off = {.n = 2, .collapse_off = 1};
  CHECK_EQ_INT(run_world(&oc_off, rk_collapse, NULL), 0);
  world_opts os_off = {.n = 3, .direct_off = 1, .threshold = "0"};
  CHECK_EQ_INT(run_world(&os_off, rk_private, NULL), 0);
  world_opts os_tcp = {.n = 2, .transport = COHORT_TRANSPORT_TCP, .threshold = "0"};
  CHECK_EQ_INT(run_world(&os_tcp, rk_private, NULL), 0);
  world_opts os_hier = {.n = 4, .hosts = 2};
  CHECK_EQ_INT(run_world(&os_hier, rk_private, NULL), 0);
  /* Cross-memory attach refused (a sandbox's seccomp profile): the rings run, no error. By every
   * rank; by one rank that is not the one creating the segment (it may be read, but it may not
   * read); process_vm_writev alone refused. */
  world_opts os_refused = {.n = 3, .threshold = "0", .refuse = 7};
  CHECK_EQ_INT(run_world(&os_refused, rk_private, NULL), 0);
  world_opts os_refused1 = {.n = 3, .threshold = "0", .refuse = 4};
  CHECK_EQ_INT(run_world(&os_refused1, rk_private, NULL), 0);
  world_opts os_nowrite = {.n = 2, .threshold = "0", .refuse = 3, .refuse_write_only = 1};
  CHECK_EQ_INT(run_world(&os_nowrite, rk_private, NULL), 0);
  world_opts as = {.n = 3};
  CHECK_EQ_INT(run_world(&as, rk_async, NULL), 0);
  /* Compressed reductions over shared memory, TCP rings and the hierarchy. */
  world_opts wshm = {.n = 3};
  CHECK_EQ_INT(run_world(&wshm, rk_wire, NULL), 0);
  CHECK_EQ_INT(run_world(&wshm, rk_wire_gather, NULL), 0);
  world_opts wtcp = {.n = 4, .transport = COHORT_TRANSPORT_TCP, .threshold = "0"};
  CHECK_EQ_INT(run_world(&wtcp, rk_wire, NULL), 0);
  CHECK_EQ_INT(run_world(&wtcp, rk_wire_gather, NULL), 0);
  int ring = 1, no_ring = 0;
  CHECK_EQ_INT(run_world(&wtcp, rk_wire_edges, &ring), 0);
  world_opts wtcp2 = {.n = 2, .transport = COHORT_TRANSPORT_TCP, .threshold = "0"};
  CHECK_EQ_INT(run_world(&wtcp2, rk_wire_edges, &ring), 0);
  CHECK_EQ_INT(run_world(&wshm, rk_wire_edges, &no_ring), 0);
  CHECK_EQ_INT(run_world(&wtcp, rk_wire_queue, NULL), 0);
  world_opts whier = {.n = 4, .hosts = 2};
  CHECK_EQ_INT(run_world(&whier, rk_wire, NULL), 0);
  world_opts wmm = {.n = 2, .timeout_ms = 30000};
  CHECK_EQ_INT(run_world(&wmm, rk_wire_mismatch, NULL), 0);
  world_opts asc = {.n = 2, .cma = 1};
  CHECK_EQ_INT(run_world(&asc, rk_async, NULL), 0);
  world_opts ast = {.n = 2, .transport = COHORT_TRANSPORT_TCP};
  CHECK_EQ_INT(run_world(&ast, rk_async, NULL), 0);
  for (int v = 0; v < 4; v++) {
    mm_arg a = {v};
    world_opts m2 = {.n = 2, .timeout_ms = 30000};
    CHECK_EQ_INT(run_world(&m2, rk_mismatch, &a), 0);
    world_opts m4 = {.n = 4,
                     .timeout_ms = 30000,
                     .transport = v % 2 ? COHORT_TRANSPORT_TCP : COHORT_TRANSPORT_AUTO};
    CHECK_EQ_INT(run_world(&m4, rk_mismatch, &a), 0);
  }
  world_opts to = {.n = 2};
  CHECK_EQ_INT(run_world(&to, rk_timeout, NULL), 0);
  world_opts tot = {.n = 2, .transport = COHORT_TRANSPORT_TCP};
  CHECK_EQ_INT(run_world(&tot, rk_timeout, NULL), 0);
  world_opts ab = {.n = 3};
  CHECK_EQ_INT(run_world(&ab, rk_abort, NULL), 0);
  test_early_exit();
  CHECK_EQ_INT(shm_leftovers(), 0);
  return 0;
}

static int failure(void) {
  /* Shared memory, TCP, and shared memory with the single-copy allreduce (a peer killed while the
   * others read and write its buffer). */
  cohort_transport ts[] = {COHORT_TRANSPORT_SHM, COHORT_TRANSPORT_TCP, COHORT_TRANSPORT_SHM};
  const char *names[] = {"shm", "tcp", "shm single copy"};
  for (int i = 0; i < 3; i++) {
    world_opts o = {.n = 4, .timeout_ms = 8000, .transport = ts[i], .shared = i == 2};
    int64_t after = -1;
    snprintf(g_ready, sizeof g_ready, "/tmp/tcoll-%d-%d.ready", (int)getpid(), i);
    unlink(g_ready);
    CHECK_EQ_INT(run_world_ex(&o, rk_failure, NULL, 2, 300, &after), 0);
    unlink(g_ready);
    fprintf(stderr, "%s: survivors returned %lld ms after the kill\n", names[i], (long long)after);
    /* The survivors noticed the death itself, not the 8 s deadline. */
    CHECK(after >= 0 && after < 3000);
  }
  CHECK_EQ_INT(shm_leftovers(), 0);
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "unit";
  signal(SIGPIPE, SIG_IGN);
  if (strcmp(mode, "rank") == 0) {
    /* One rank of an externally launched job (tests/test_coll_netns.sh). */
    cohort_comm *c;
    int rc = cohort_comm_create_from_env(&c);
    if (rc != 0) {
      fprintf(stderr, "create: %s\n", cohort_strerror(rc));
      return 1;
    }
    int fails = rk_matrix(c, (void *)1);
    fails += rk_async(c, NULL);
    cohort_comm_destroy(c);
    printf("rank done: %d failures\n", fails);
    return fails ? 1 : 0;
  }
  if (start_store() != 0) {
    fprintf(stderr, "cannot start the store server\n");
    return 1;
  }
  if (strcmp(mode, "unit") == 0)
    unit();
  else if (strcmp(mode, "failure") == 0)
    failure();
  else {
    fprintf(stderr, "usage: test_coll [unit|failure|rank]\n");
    return 2;
  }
  store_fork_stop(&g_store_server);
  return check_report();
}

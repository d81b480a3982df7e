/* collbench.c - the collective benchmark and its local ranks (see collbench.h). */
#include "collbench/collbench.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "collbench/reference.h"
#include "store/store.h"

struct collbench {
  cohort_comm *comm;
  collbench_opts o;
  char *send, *recv, *want;
  size_t bytes; /* capacity of each buffer */
};

const char *collbench_op_name(collbench_op op) {
  static const char *const names[COLLBENCH_NOPS] = {"allreduce", "reduce_scatter", "allgather",
                                                    "broadcast", "reduce"};
  return (unsigned)op < COLLBENCH_NOPS ? names[op] : "?";
}

/* Huge pages are 2 MiB on x86-64 and on arm64 with 4 KiB base pages. */
#define COLLBENCH_HUGE_BYTES (2u << 20)

/* One buffer of b->bytes, zeroed: ordinary memory, the same advised for huge pages (before the
 * zeroing faults it in), or shared with the host's ranks. */
static int buf_alloc(collbench *b, char **out) {
  if (b->o.mem == COLLBENCH_MEM_SHARED) {
    int rc = cohort_mem_alloc(b->comm, b->bytes, (void **)out);
    if (rc == 0) memset(*out, 0, b->bytes);
    return rc;
  }
  if (b->o.mem == COLLBENCH_MEM_PRIVATE) {
    *out = calloc(1, b->bytes);
    return *out == NULL ? -ENOMEM : 0;
  }
  size_t len = (b->bytes + COLLBENCH_HUGE_BYTES - 1) / COLLBENCH_HUGE_BYTES * COLLBENCH_HUGE_BYTES;
  *out = aligned_alloc(COLLBENCH_HUGE_BYTES, len);
  if (*out == NULL) return -ENOMEM;
  if (madvise(*out, len, MADV_HUGEPAGE) != 0) {
    int rc = -errno;
    free(*out);
    *out = NULL;
    return rc;
  }
  memset(*out, 0, len);
  return 0;
}

static void buf_free(collbench *b, char *p) {
  if (p != NULL && b->o.mem == COLLBENCH_MEM_SHARED)
    cohort_mem_free(b->comm, p);
  else
    free(p);
}

int collbench_create(cohort_comm *c, const collbench_opts *o, collbench **out) {
  int n = cohort_comm_size(c);
  if (o->root >= n) return -EINVAL;
  collbench *b = calloc(1, sizeof *b);
  if (b == NULL) return -ENOMEM;
  b->comm = c;
  b->o = *o;
  b->bytes = (size_t)o->maxb + cohort_dtype_size(o->dtype) * (size_t)n + 64;
  int rc = buf_alloc(b, &b->send);
  if (rc == 0) rc = buf_alloc(b, &b->recv);
  b->want = malloc(b->bytes);
  if (rc == 0 && b->want == NULL) rc = -ENOMEM;
  if (rc != 0) {
    collbench_destroy(b);
    return rc;
  }
  *out = b;
  return 0;
}

void collbench_destroy(collbench *b) {
  if (b == NULL) return;
  buf_free(b, b->send);
  buf_free(b, b->recv);
  free(b->want);
  free(b);
}

/* Runs one collective; inplace selects the in-place form. count as nccl-tests (total). */
static int run_op(collbench *b, collbench_op op, size_t count, int inplace) {
  cohort_comm *c = b->comm;
  const collbench_opts *o = &b->o;
  int n = cohort_comm_size(c), r = cohort_comm_rank(c);
  size_t es = cohort_dtype_size(o->dtype), per = count / (size_t)n;
  switch (op) {
  case COLLBENCH_ALLREDUCE:
    return cohort_allreduce(c, inplace ? b->recv : b->send, b->recv, count, o->dtype, o->redop);
  case COLLBENCH_REDUCE_SCATTER:
    return cohort_reduce_scatter(c, inplace ? b->recv : b->send, b->recv, per, o->dtype, o->redop);
  case COLLBENCH_ALLGATHER:
    return cohort_allgather(c, inplace ? b->recv + (size_t)r * per * es : b->send, b->recv, per,
                            o->dtype);
  case COLLBENCH_BROADCAST:
    return cohort_broadcast(c, b->recv, count, o->dtype, o->root);
  case COLLBENCH_REDUCE:
    return cohort_reduce(c, inplace ? b->recv : b->send, b->recv, count, o->dtype, o->redop,
                         o->root);
  default:
    return -EINVAL;
  }
}

/* Fills this rank's input (and, in place, the receive buffer) for a checked run. */
static void fill_inputs(collbench *b, collbench_op op, cohort_redop rop, size_t count,
                        int inplace) {
  const collbench_opts *o = &b->o;
  int n = cohort_comm_size(b->comm), r = cohort_comm_rank(b->comm);
  size_t es = cohort_dtype_size(o->dtype), per = count / (size_t)n;
  memset(b->recv, 0xa5, count * es);
  size_t nin = op == COLLBENCH_ALLGATHER ? per : count;
  for (size_t i = 0; i < nin; i++)
    collbench_put(o->dtype, b->send, i, collbench_input(rop, o->dtype, r, i));
  if (op == COLLBENCH_BROADCAST) {
    if (r == o->root) memcpy(b->recv, b->send, count * es);
  } else if (inplace) {
    if (op == COLLBENCH_ALLGATHER)
      memcpy(b->recv + (size_t)r * per * es, b->send, per * es);
    else
      memcpy(b->recv, b->send, count * es);
  }
}

/* Writes what this rank must hold after op into b->want; returns how many elements. */
static size_t expected(collbench *b, collbench_op op, cohort_redop rop, size_t count) {
  const collbench_opts *o = &b->o;
  int n = cohort_comm_size(b->comm), r = cohort_comm_rank(b->comm);
  size_t per = count / (size_t)n;
  switch (op) {
  case COLLBENCH_ALLREDUCE:
    for (size_t i = 0; i < count; i++) collbench_reference(rop, o->dtype, n, i, b->want, i);
    return count;
  case COLLBENCH_REDUCE_SCATTER:
    for (size_t j = 0; j < per; j++)
      collbench_reference(rop, o->dtype, n, (size_t)r * per + j, b->want, j);
    return per;
  case COLLBENCH_ALLGATHER:
    for (int q = 0; q < n; q++)
      for (size_t j = 0; j < per; j++)
        collbench_put(o->dtype, b->want, (size_t)q * per + j, collbench_input(rop, o->dtype, q, j));
    return per * (size_t)n;
  case COLLBENCH_BROADCAST:
    for (size_t i = 0; i < count; i++)
      collbench_put(o->dtype, b->want, i, collbench_input(rop, o->dtype, o->root, i));
    return count;
  case COLLBENCH_REDUCE:
    if (r != o->root) return 0;
    for (size_t i = 0; i < count; i++) collbench_reference(rop, o->dtype, n, i, b->want, i);
    return count;
  default:
    return 0;
  }
}

/* Fills inputs, runs once, compares with the reference; returns wrong elements (or < 0). */
static int64_t checked_run(collbench *b, collbench_op op, size_t count, int inplace) {
  int r = cohort_comm_rank(b->comm), n = cohort_comm_size(b->comm);
  size_t es = cohort_dtype_size(b->o.dtype), per = count / (size_t)n;
  cohort_redop rop =
      op == COLLBENCH_ALLGATHER || op == COLLBENCH_BROADCAST ? COHORT_SUM : b->o.redop;
  fill_inputs(b, op, rop, count, inplace);
  int rc = run_op(b, op, count, inplace);
  if (rc != 0) return rc;
  const char *got = b->recv;
  if (op == COLLBENCH_REDUCE_SCATTER && inplace) got = b->recv + (size_t)r * per * es;
  size_t nres = expected(b, op, rop, count);
  int64_t wrong = 0;
  for (size_t i = 0; i < nres; i++)
    if (memcmp(got + i * es, b->want + i * es, es) != 0) wrong++;
  return wrong;
}

/* Mean time per iteration in us of the slowest rank (warm-up first). */
static int timed(collbench *b, collbench_op op, size_t count, int inplace, double *us) {
  for (int i = 0; i < b->o.warmup; i++) {
    int rc = run_op(b, op, count, inplace);
    if (rc != 0) return rc;
  }
  int rc = cohort_barrier(b->comm);
  if (rc != 0) return rc;
  int64_t t0 = base_now_us();
  for (int i = 0; i < b->o.iters; i++) {
    rc = run_op(b, op, count, inplace);
    if (rc != 0) return rc;
  }
  double t = (double)(base_now_us() - t0) / b->o.iters;
  return cohort_allreduce(b->comm, &t, us, 1, COHORT_F64, COHORT_MAX);
}

/* The bus bandwidth factor of nccl-tests: what each rank moves relative to the size. */
static double bus_factor(collbench_op op, int n) {
  if (op == COLLBENCH_ALLREDUCE) return 2.0 * (n - 1) / n;
  if (op == COLLBENCH_ALLGATHER || op == COLLBENCH_REDUCE_SCATTER) return (double)(n - 1) / n;
  return 1.0;
}

/* One form (out of place or in place) of one row. */
static int measure(collbench *b, collbench_row *row, int inplace) {
  int64_t w = 0;
  double us = 0;
  int rc = timed(b, row->op, row->count, inplace, &us);
  if (rc == 0 && b->o.check) {
    w = checked_run(b, row->op, row->count, inplace);
    if (w < 0) rc = (int)w;
  }
  if (rc == 0) rc = cohort_allreduce(b->comm, &w, &row->wrong[inplace], 1, COHORT_I64, COHORT_SUM);
  if (rc != 0) return rc;
  if (!b->o.check) row->wrong[inplace] = -1;
  row->has[inplace] = 1;
  row->us[inplace] = us;
  row->algbw[inplace] = us > 0 ? (double)row->bytes / us / 1e3 : 0;
  row->busbw[inplace] = row->algbw[inplace] * bus_factor(row->op, cohort_comm_size(b->comm));
  return 0;
}

int collbench_op_run(collbench *b, collbench_op op, collbench_row_fn fn, void *ctx,
                     size_t *failed_bytes) {
  int n = cohort_comm_size(b->comm);
  size_t es = cohort_dtype_size(b->o.dtype);
  int per_rank = op == COLLBENCH_ALLGATHER || op == COLLBENCH_REDUCE_SCATTER;
  for (uint64_t size = b->o.minb; size <= b->o.maxb; size = size * b->o.factor) {
    collbench_row row = {.op = op, .count = (size_t)(size / es)};
    if (per_rank) row.count = row.count / (size_t)n * (size_t)n;
    row.bytes = row.count * es;
    row.reduces =
        op == COLLBENCH_ALLREDUCE || op == COLLBENCH_REDUCE_SCATTER || op == COLLBENCH_REDUCE;
    row.rooted = op == COLLBENCH_BROADCAST || op == COLLBENCH_REDUCE;
    /* broadcast has one buffer: it is in place by definition. */
    for (int inplace = op == COLLBENCH_BROADCAST; inplace < 2; inplace++) {
      int rc = measure(b, &row, inplace);
      if (rc != 0) {
        *failed_bytes = row.bytes;
        return rc;
      }
    }
    fn(&row, ctx);
    if (size > UINT64_MAX / b->o.factor) break;
  }
  return 0;
}

/* In the child: the environment of rank r of n, then rank_main. Never returns. */
static void rank_child(int r, int n, const char *store, const char *job, const char *transport,
                       int (*rank_main)(void *arg), void *arg) {
  char num[16];
  snprintf(num, sizeof num, "%d", r);
  setenv("RANK", num, 1);
  setenv("LOCAL_RANK", num, 1);
  snprintf(num, sizeof num, "%d", n);
  setenv("WORLD_SIZE", num, 1);
  setenv("LOCAL_WORLD_SIZE", num, 1);
  setenv("COHORT_STORE", store, 1);
  setenv("COHORT_JOB_ID", job, 1);
  unsetenv("COHORT_TOKEN");
  if (transport != NULL) setenv("COHORT_TRANSPORT", transport, 1);
  int status = rank_main(arg);
  fflush(NULL); /* _exit() does not flush what rank_main printed */
  _exit(status);
}

/* Waits for the n children in pids (0: not started); returns the highest exit status. */
static int wait_ranks(const pid_t *pids, int n) {
  int status = 0;
  for (int r = 0; r < n; r++) {
    int st;
    if (pids[r] <= 0 || waitpid(pids[r], &st, 0) < 0) continue;
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    if (code > status) status = code;
  }
  return status;
}

/* In the child: wait for the store's port on fd (EOF: the parent could not start it). */
static void rank_child_wait(int fd, int r, int n, const char *transport,
                            int (*rank_main)(void *arg), void *arg) {
  int port = 0;
  ssize_t got;
  do got = read(fd, &port, sizeof port);
  while (got < 0 && errno == EINTR);
  if (got != (ssize_t)sizeof port) _exit(1);
  char store[64], job[64];
  snprintf(store, sizeof store, "127.0.0.1:%d", port);
  snprintf(job, sizeof job, "bench-%d", (int)getppid());
  rank_child(r, n, store, job, transport, rank_main, arg);
}

/* The ranks are forked before the store's thread starts: a child of a process
 * with threads may inherit a lock another thread held (ASan's allocator did,
 * and the rank hung in its first allocation of that size). Each child reads
 * the port from a pipe once the store is up; the parent writes it n times. */
int collbench_fork_ranks(int n, const char *transport, int (*rank_main)(void *arg), void *arg) {
  pid_t *pids = calloc((size_t)n, sizeof *pids);
  int fds[2];
  if (pids == NULL) return -ENOMEM;
  if (pipe2(fds, O_CLOEXEC) != 0) {
    free(pids);
    return -errno;
  }
  fflush(NULL); /* nothing buffered is written twice by the children */
  int err = 0;
  for (int r = 0; r < n && err == 0; r++) {
    pids[r] = fork();
    if (pids[r] < 0) err = -errno;
    if (pids[r] == 0) {
      close(fds[1]);
      rank_child_wait(fds[0], r, n, transport, rank_main, arg);
    }
  }
  close(fds[0]);
  store_server *srv = NULL;
  store_server_opts so = {.bind_host = "127.0.0.1"};
  if (err == 0) err = store_server_start(&so, &srv);
  int port = err == 0 ? store_server_port(srv) : 0;
  for (int r = 0; r < n && err == 0; r++)
    if (write(fds[1], &port, sizeof port) != (ssize_t)sizeof port) err = -errno;
  close(fds[1]); /* children still waiting read EOF and exit */
  int status = wait_ranks(pids, n);
  free(pids);
  store_server_stop(srv);
  return err != 0 ? err : status;
}

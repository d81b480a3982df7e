/*
 * cmd_bench.c - `cohort bench`: an nccl-tests style bandwidth table of
 * libcohort's collectives, with every result checked against a serial
 * reference.
 *
 * Runs either as one rank of a job started by `cohort run` (the environment
 * names rank, world size and store) or, with --nproc N, forks N ranks on
 * this machine around an in-process store server. Rank 0 prints the table.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "coll/coll.h"
#include "cohort/cohort.h"
#include "store/store.h"
#include "tools/cohort/cmd.h"

enum { B_ALLREDUCE, B_REDUCE_SCATTER, B_ALLGATHER, B_BROADCAST, B_REDUCE, B_NOPS };
static const char *op_names[B_NOPS] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                       "reduce"};

typedef struct bench_opts {
  int ops[B_NOPS], nops;
  uint64_t minb, maxb;
  uint64_t factor;
  cohort_dtype dtype;
  cohort_redop redop;
  int iters, warmup, root, check;
  int nproc;
  const char *transport;
} bench_opts;

static void usage(FILE *f) {
  fprintf(f, "usage: cohort bench [options]\n"
             "\n"
             "Bus bandwidth of libcohort's collectives, like nccl-tests. Runs as one rank of\n"
             "a job under `cohort run`, or with --nproc N forks N ranks on this machine.\n"
             "\n"
             "  --op NAME        allreduce|reduce_scatter|allgather|broadcast|reduce|all\n"
             "                   (default allreduce)\n"
             "  -b, --minbytes   smallest size (default 8; K/M/G suffixes)\n"
             "  -e, --maxbytes   largest size (default 32M)\n"
             "  -f, --stepfactor multiply the size by this between rows (default 2)\n"
             "  -d, --datatype   float|double|half|bfloat16|int32|int64|uint8 (default float)\n"
             "  -o, --op_type    sum|prod|min|max|avg (default sum)\n"
             "  -r, --root       root of broadcast and reduce (default 0)\n"
             "  -n, --iters      timed iterations per size (default 20)\n"
             "  -w, --warmup_iters  untimed iterations first (default 5)\n"
             "  -c, --check      0 skips the correctness check (default 1)\n"
             "  --nproc N        fork N local ranks with an in-process store\n"
             "  --transport T    auto|tcp|shm for --nproc (sets COHORT_TRANSPORT)\n"
             "  -h, --help       this text\n"
             "\n"
             "Sizes are total bytes as in nccl-tests (allgather: the gathered output,\n"
             "reduce_scatter: the input). time is the slowest rank's mean per iteration;\n"
             "algbw = size/time; busbw = algbw * 2(n-1)/n (allreduce), (n-1)/n (allgather,\n"
             "reduce_scatter), 1 (broadcast, reduce). #wrong counts elements that differ\n"
             "from the serial reference in a separate checked run, summed over ranks.\n"
             "Exit status: 0 all correct, 1 wrong results or a failed collective, 2 usage.\n");
}

static int parse_dtype(const char *s, cohort_dtype *out) {
  static const struct {
    const char *name;
    cohort_dtype dt;
  } t[] = {{"float", COHORT_F32},     {"float32", COHORT_F32}, {"f32", COHORT_F32},
           {"double", COHORT_F64},    {"float64", COHORT_F64}, {"f64", COHORT_F64},
           {"half", COHORT_F16},      {"float16", COHORT_F16}, {"f16", COHORT_F16},
           {"bfloat16", COHORT_BF16}, {"bf16", COHORT_BF16},   {"int32", COHORT_I32},
           {"int", COHORT_I32},       {"i32", COHORT_I32},     {"int64", COHORT_I64},
           {"i64", COHORT_I64},       {"uint8", COHORT_U8},    {"u8", COHORT_U8}};
  for (size_t i = 0; i < BASE_ARRAY_LEN(t); i++)
    if (strcmp(s, t[i].name) == 0) {
      *out = t[i].dt;
      return 0;
    }
  return -EINVAL;
}

static int parse_redop(const char *s, cohort_redop *out) {
  for (int i = 0; i < COHORT_REDOP_COUNT; i++)
    if (strcmp(s, coll_redop_name((cohort_redop)i)) == 0) {
      *out = (cohort_redop)i;
      return 0;
    }
  return -EINVAL;
}

/* ---- inputs and the serial reference ---- */

static void put(cohort_dtype dt, void *buf, size_t i, double v) {
  switch (dt) {
  case COHORT_F32:
    ((float *)buf)[i] = (float)v;
    break;
  case COHORT_F64:
    ((double *)buf)[i] = v;
    break;
  case COHORT_F16:
    ((uint16_t *)buf)[i] = coll_f32_to_f16((float)v);
    break;
  case COHORT_BF16:
    ((uint16_t *)buf)[i] = coll_f32_to_bf16((float)v);
    break;
  case COHORT_I32:
    ((int32_t *)buf)[i] = (int32_t)v;
    break;
  case COHORT_I64:
    ((int64_t *)buf)[i] = (int64_t)v;
    break;
  case COHORT_U8:
    ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v;
    break;
  default:
    break;
  }
}

/* Small integers, so any reduction order is exact in every type. */
static double input(cohort_redop op, cohort_dtype dt, int r, size_t i) {
  size_t h = (size_t)r * 7919u + i * 104729u;
  switch (op) {
  case COHORT_PROD:
    return (h % 3 == 0 && dt != COHORT_U8) ? -1 : 1;
  case COHORT_MIN:
  case COHORT_MAX:
    return dt == COHORT_U8 ? (double)(h % 101) : (double)(h % 101) - 50;
  default:
    return dt == COHORT_U8 ? (double)(h % 7) : (double)(h % 7) - 3;
  }
}

static void reference(cohort_redop op, cohort_dtype dt, int n, size_t i, void *out, size_t j) {
  double acc = input(op, dt, 0, i);
  for (int r = 1; r < n; r++) {
    double v = input(op, dt, r, i);
    if (op == COHORT_PROD)
      acc *= v;
    else if (op == COHORT_MIN)
      acc = v < acc ? v : acc;
    else if (op == COHORT_MAX)
      acc = v > acc ? v : acc;
    else
      acc += v;
  }
  if (dt == COHORT_U8) acc = (double)((uint64_t)(int64_t)acc & 0xffu);
  if (op != COHORT_AVG) {
    put(dt, out, j, acc);
    return;
  }
  switch (dt) {
  case COHORT_F32:
    ((float *)out)[j] = (float)acc / (float)n;
    break;
  case COHORT_F64:
    ((double *)out)[j] = acc / (double)n;
    break;
  case COHORT_F16:
    ((uint16_t *)out)[j] = coll_f32_to_f16((float)acc / (float)n);
    break;
  case COHORT_BF16:
    ((uint16_t *)out)[j] = coll_f32_to_bf16((float)acc / (float)n);
    break;
  case COHORT_I32:
    ((int32_t *)out)[j] = (int32_t)acc / n;
    break;
  case COHORT_I64:
    ((int64_t *)out)[j] = (int64_t)acc / n;
    break;
  case COHORT_U8:
    ((uint8_t *)out)[j] = (uint8_t)((uint8_t)acc / n);
    break;
  default:
    break;
  }
}

/* ---- one rank ---- */

typedef struct bufs {
  char *send, *recv, *want;
  size_t bytes; /* capacity of each */
} bufs;

/* Runs one collective; inplace selects the in-place form. count as nccl-tests (total). */
static int run_op(cohort_comm *c, int op, const bench_opts *o, bufs *b, size_t count, int inplace) {
  int n = cohort_comm_size(c), r = cohort_comm_rank(c);
  size_t es = cohort_dtype_size(o->dtype), per = count / (size_t)n;
  switch (op) {
  case B_ALLREDUCE:
    return cohort_allreduce(c, inplace ? b->recv : b->send, b->recv, count, o->dtype, o->redop);
  case B_REDUCE_SCATTER:
    return cohort_reduce_scatter(c, inplace ? b->recv : b->send, b->recv, per, o->dtype, o->redop);
  case B_ALLGATHER:
    return cohort_allgather(c, inplace ? b->recv + (size_t)r * per * es : b->send, b->recv, per,
                            o->dtype);
  case B_BROADCAST:
    return cohort_broadcast(c, b->recv, count, o->dtype, o->root);
  case B_REDUCE:
    return cohort_reduce(c, inplace ? b->recv : b->send, b->recv, count, o->dtype, o->redop,
                         o->root);
  default:
    return -EINVAL;
  }
}

/* Fills inputs, runs once, compares with the reference; returns wrong elements (or < 0). */
static int64_t checked_run(cohort_comm *c, int op, const bench_opts *o, bufs *b, size_t count,
                           int inplace) {
  int n = cohort_comm_size(c), r = cohort_comm_rank(c);
  size_t es = cohort_dtype_size(o->dtype), per = count / (size_t)n;
  cohort_redop rop = op == B_ALLGATHER || op == B_BROADCAST ? COHORT_SUM : o->redop;
  memset(b->recv, 0xa5, count * es);
  size_t nin = op == B_ALLGATHER ? per : count;
  for (size_t i = 0; i < nin; i++) put(o->dtype, b->send, i, input(rop, o->dtype, r, i));
  if (op == B_BROADCAST) {
    if (r == o->root) memcpy(b->recv, b->send, count * es);
  } else if (inplace) {
    if (op == B_ALLGATHER)
      memcpy(b->recv + (size_t)r * per * es, b->send, per * es);
    else
      memcpy(b->recv, b->send, count * es);
  }
  int rc = run_op(c, op, o, b, count, inplace);
  if (rc != 0) return rc;
  const char *got = b->recv;
  size_t nres = 0;
  switch (op) {
  case B_ALLREDUCE:
    for (size_t i = 0; i < count; i++) reference(rop, o->dtype, n, i, b->want, i);
    nres = count;
    break;
  case B_REDUCE_SCATTER:
    for (size_t j = 0; j < per; j++) reference(rop, o->dtype, n, (size_t)r * per + j, b->want, j);
    if (inplace) got = b->recv + (size_t)r * per * es;
    nres = per;
    break;
  case B_ALLGATHER:
    for (int q = 0; q < n; q++)
      for (size_t j = 0; j < per; j++)
        put(o->dtype, b->want, (size_t)q * per + j, input(rop, o->dtype, q, j));
    nres = per * (size_t)n;
    break;
  case B_BROADCAST:
    for (size_t i = 0; i < count; i++) put(o->dtype, b->want, i, input(rop, o->dtype, o->root, i));
    nres = count;
    break;
  case B_REDUCE:
    if (r == o->root)
      for (size_t i = 0; i < count; i++) reference(rop, o->dtype, n, i, b->want, i);
    nres = r == o->root ? count : 0;
    break;
  default:
    break;
  }
  int64_t wrong = 0;
  for (size_t i = 0; i < nres; i++)
    if (memcmp(got + i * es, b->want + i * es, es) != 0) wrong++;
  return wrong;
}

/* Mean time per iteration in us on this rank (warmup first). */
static int timed(cohort_comm *c, int op, const bench_opts *o, bufs *b, size_t count, int inplace,
                 double *us) {
  for (int i = 0; i < o->warmup; i++) {
    int rc = run_op(c, op, o, b, count, inplace);
    if (rc != 0) return rc;
  }
  int rc = cohort_barrier(c);
  if (rc != 0) return rc;
  int64_t t0 = base_now_us();
  for (int i = 0; i < o->iters; i++) {
    rc = run_op(c, op, o, b, count, inplace);
    if (rc != 0) return rc;
  }
  double t = (double)(base_now_us() - t0) / o->iters;
  /* The slowest rank defines the collective's time. */
  rc = cohort_allreduce(c, &t, us, 1, COHORT_F64, COHORT_MAX);
  return rc;
}

static int bench_op(cohort_comm *c, int op, const bench_opts *o, bufs *b, int64_t *total_wrong,
                    double *bw_sum, int *bw_rows) {
  int n = cohort_comm_size(c), r = cohort_comm_rank(c);
  size_t es = cohort_dtype_size(o->dtype);
  int per_rank = op == B_ALLGATHER || op == B_REDUCE_SCATTER;
  double factor = op == B_ALLREDUCE ? 2.0 * (n - 1) / n : per_rank ? (double)(n - 1) / n : 1.0;
  int reduces = op == B_ALLREDUCE || op == B_REDUCE_SCATTER || op == B_REDUCE;
  int rooted = op == B_BROADCAST || op == B_REDUCE;
  if (r == 0) {
    printf("#\n# %s\n#\n", op_names[op]);
    printf("# %64s %30s\n", "out-of-place", "in-place");
    printf("# %10s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "size", "count", "type",
           "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf("# %10s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "(B)", "(elements)", "", "",
           "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }
  for (uint64_t size = o->minb; size <= o->maxb; size = size * o->factor) {
    size_t count = (size_t)(size / es);
    if (per_rank) count = count / (size_t)n * (size_t)n;
    size_t bytes = count * es;
    char res[2][64];
    int64_t wrong[2] = {0, 0};
    for (int inplace = 0; inplace < 2; inplace++) {
      double us = 0;
      /* broadcast has one buffer: it is in place by definition, no out-of-place column. */
      if (op == B_BROADCAST && !inplace) {
        snprintf(res[0], sizeof res[0], "%9s %7s %7s %6s", "n/a", "n/a", "n/a", "n/a");
        continue;
      }
      int rc = timed(c, op, o, b, count, inplace, &us);
      int64_t w = 0;
      if (rc == 0 && o->check) {
        w = checked_run(c, op, o, b, count, inplace);
        if (w < 0) rc = (int)w;
      }
      if (rc == 0) rc = cohort_allreduce(c, &w, &wrong[inplace], 1, COHORT_I64, COHORT_SUM);
      if (rc != 0) {
        if (r == 0) fflush(stdout);
        fprintf(stderr, "cohort bench: rank %d: %s of %zu bytes failed: %s: %s\n", r, op_names[op],
                bytes, cohort_strerror(rc), cohort_comm_error_message(c));
        return rc;
      }
      double algbw = us > 0 ? (double)bytes / us / 1e3 : 0;
      *bw_sum += algbw * factor;
      (*bw_rows)++;
      *total_wrong += wrong[inplace];
      if (o->check)
        snprintf(res[inplace], sizeof res[inplace], "%9.2f %7.2f %7.2f %6lld", us, algbw,
                 algbw * factor, (long long)wrong[inplace]);
      else
        snprintf(res[inplace], sizeof res[inplace], "%9.2f %7.2f %7.2f %6s", us, algbw,
                 algbw * factor, "N/A");
    }
    if (r == 0) {
      printf("  %10zu %12zu %8s %6s %6d %s %s\n", bytes, count, coll_dtype_name(o->dtype),
             reduces ? coll_redop_name(o->redop) : "none", rooted ? o->root : -1, res[0], res[1]);
      fflush(stdout);
    }
    if (size > UINT64_MAX / o->factor) break;
  }
  return 0;
}

static int rank_main(const bench_opts *o) {
  cohort_comm *c = NULL;
  int rc = cohort_comm_create_from_env(&c);
  if (rc != 0) {
    fprintf(stderr, "cohort bench: cannot create the communicator: %s\n", cohort_strerror(rc));
    return 1;
  }
  int n = cohort_comm_size(c), r = cohort_comm_rank(c);
  if (o->root >= n) {
    if (r == 0) fprintf(stderr, "cohort bench: --root %d but only %d ranks\n", o->root, n);
    cohort_comm_destroy(c);
    return 2;
  }
  size_t es = cohort_dtype_size(o->dtype);
  bufs b = {0};
  b.bytes = (size_t)o->maxb + es * (size_t)n + 64;
  b.send = malloc(b.bytes);
  b.recv = malloc(b.bytes);
  b.want = malloc(b.bytes);
  if (b.send == NULL || b.recv == NULL || b.want == NULL) {
    fprintf(stderr, "cohort bench: rank %d: out of memory for %zu-byte buffers\n", r, b.bytes);
    rc = 1;
    goto out;
  }
  memset(b.send, 0, b.bytes);
  memset(b.recv, 0, b.bytes);
  if (r == 0) {
    const char *tr = getenv("COHORT_TRANSPORT");
    printf("# cohort bench: %d ranks, transport %s, %d iters, %d warmup, check %s\n", n,
           tr ? tr : "auto", o->iters, o->warmup, o->check ? "on" : "off");
  }
  int64_t wrong = 0;
  double bw_sum = 0;
  int bw_rows = 0;
  for (int i = 0; i < o->nops && rc == 0; i++)
    rc = bench_op(c, o->ops[i], o, &b, &wrong, &bw_sum, &bw_rows);
  if (r == 0 && rc == 0) {
    printf("# Out of bounds values : %lld %s\n", (long long)wrong, wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g\n#\n", bw_rows ? bw_sum / bw_rows : 0.0);
  }
  if (rc == 0 && wrong)
    rc = 1;
  else if (rc != 0)
    rc = 1;
out:
  free(b.send);
  free(b.recv);
  free(b.want);
  cohort_comm_destroy(c);
  return rc;
}

/* --nproc: an in-process store and N forked ranks. */
static int local_main(const bench_opts *o) {
  store_server *srv = NULL;
  store_server_opts so = {.bind_host = "127.0.0.1"};
  int rc = store_server_start(&so, &srv);
  if (rc != 0) {
    fprintf(stderr, "cohort bench: cannot start a local store: %s\n", cohort_strerror(rc));
    return 1;
  }
  char addr[64], job[64], num[16];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", store_server_port(srv));
  snprintf(job, sizeof job, "bench-%d", (int)getpid());
  fflush(stdout);
  pid_t *pids = calloc((size_t)o->nproc, sizeof *pids);
  if (pids == NULL) {
    store_server_stop(srv);
    return 1;
  }
  int status = 0;
  for (int r = 0; r < o->nproc; r++) {
    pid_t p = fork();
    if (p < 0) {
      fprintf(stderr, "cohort bench: fork: %s\n", strerror(errno));
      status = 1;
      break;
    }
    if (p == 0) {
      snprintf(num, sizeof num, "%d", r);
      setenv("RANK", num, 1);
      setenv("LOCAL_RANK", num, 1);
      snprintf(num, sizeof num, "%d", o->nproc);
      setenv("WORLD_SIZE", num, 1);
      setenv("LOCAL_WORLD_SIZE", num, 1);
      setenv("COHORT_STORE", addr, 1);
      setenv("COHORT_JOB_ID", job, 1);
      unsetenv("COHORT_TOKEN");
      if (o->transport) setenv("COHORT_TRANSPORT", o->transport, 1);
      _exit(rank_main(o));
    }
    pids[r] = p;
  }
  for (int r = 0; r < o->nproc; r++) {
    if (pids[r] <= 0) continue;
    int st;
    if (waitpid(pids[r], &st, 0) < 0) continue;
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    if (code > status) status = code;
  }
  free(pids);
  store_server_stop(srv);
  return status;
}

int cmd_bench(int argc, char **argv) {
  bench_opts o = {.minb = 8,
                  .maxb = 32u << 20,
                  .factor = 2,
                  .dtype = COHORT_F32,
                  .redop = COHORT_SUM,
                  .iters = 20,
                  .warmup = 5,
                  .check = 1};
  o.ops[0] = B_ALLREDUCE;
  o.nops = 1;
  static const struct option lo[] = {{"op", required_argument, NULL, 'O'},
                                     {"minbytes", required_argument, NULL, 'b'},
                                     {"maxbytes", required_argument, NULL, 'e'},
                                     {"stepfactor", required_argument, NULL, 'f'},
                                     {"datatype", required_argument, NULL, 'd'},
                                     {"op_type", required_argument, NULL, 'o'},
                                     {"root", required_argument, NULL, 'r'},
                                     {"iters", required_argument, NULL, 'n'},
                                     {"warmup_iters", required_argument, NULL, 'w'},
                                     {"check", required_argument, NULL, 'c'},
                                     {"nproc", required_argument, NULL, 'N'},
                                     {"transport", required_argument, NULL, 'T'},
                                     {"help", no_argument, NULL, 'h'},
                                     {NULL, 0, NULL, 0}};
  optind = 1;
  opterr = 0;
  int ch;
  while ((ch = getopt_long(argc, argv, ":b:e:f:d:o:r:n:w:c:h", lo, NULL)) != -1) {
    int bad = 0;
    switch (ch) {
    case 'O':
      if (strcmp(optarg, "all") == 0) {
        for (int i = 0; i < B_NOPS; i++) o.ops[i] = i;
        o.nops = B_NOPS;
      } else {
        bad = 1;
        for (int i = 0; i < B_NOPS; i++)
          if (strcmp(optarg, op_names[i]) == 0) {
            o.ops[0] = i;
            o.nops = 1;
            bad = 0;
          }
      }
      break;
    case 'b':
      bad = base_parse_size(optarg, &o.minb) != 0 || o.minb == 0;
      break;
    case 'e':
      bad = base_parse_size(optarg, &o.maxb) != 0 || o.maxb > (8ull << 30);
      break;
    case 'f': {
      int f;
      bad = base_parse_int(optarg, 2, 1024, &f) != 0;
      o.factor = (uint64_t)f;
      break;
    }
    case 'd':
      bad = parse_dtype(optarg, &o.dtype) != 0;
      break;
    case 'o':
      bad = parse_redop(optarg, &o.redop) != 0;
      break;
    case 'r':
      bad = base_parse_int(optarg, 0, 1 << 20, &o.root) != 0;
      break;
    case 'n':
      bad = base_parse_int(optarg, 1, 1000000, &o.iters) != 0;
      break;
    case 'w':
      bad = base_parse_int(optarg, 0, 1000000, &o.warmup) != 0;
      break;
    case 'c':
      bad = base_parse_int(optarg, 0, 1, &o.check) != 0;
      break;
    case 'N':
      bad = base_parse_int(optarg, 1, 256, &o.nproc) != 0;
      break;
    case 'T':
      bad = strcmp(optarg, "auto") != 0 && strcmp(optarg, "tcp") != 0 && strcmp(optarg, "shm") != 0;
      o.transport = optarg;
      break;
    case 'h':
      usage(stdout);
      return 0;
    case ':':
      fprintf(stderr, "cohort bench: option %s needs a value; see --help\n", argv[optind - 1]);
      return 2;
    default:
      fprintf(stderr, "cohort bench: unknown option '%s'; see --help\n", argv[optind - 1]);
      return 2;
    }
    if (bad) {
      fprintf(stderr, "cohort bench: bad value '%s' for %s; see --help\n", optarg,
              argv[optind - 1]);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "cohort bench: unexpected argument '%s'; see --help\n", argv[optind]);
    return 2;
  }
  if (o.minb > o.maxb) {
    fprintf(stderr, "cohort bench: -b %llu is larger than -e %llu\n", (unsigned long long)o.minb,
            (unsigned long long)o.maxb);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (o.nproc > 0) return local_main(&o);
  if (getenv("RANK") == NULL || getenv("COHORT_STORE") == NULL) {
    fprintf(stderr, "cohort bench: not started by `cohort run` (RANK/COHORT_STORE unset); use "
                    "--nproc N to run N ranks here\n");
    return 2;
  }
  return rank_main(&o);
}

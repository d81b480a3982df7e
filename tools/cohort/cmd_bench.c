/*
 * cmd_bench.c - `cohort bench`: argument parsing and the table of
 * src/collbench's results, as nccl-tests prints it.
 *
 * Runs either as one rank of a job started by `cohort run` (the environment
 * names rank, world size and store) or, with --nproc N, forks N ranks on
 * this machine around an in-process store server. Rank 0 prints the table.
 */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "collbench/collbench.h"
#include "cohort/cohort.h"
#include "tools/cli.h"
#include "tools/cohort/cmd.h"

static const char bench_usage[] =
    "usage: cohort bench [options]\n"
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
    "  --mem KIND       private|huge|shared: the buffers are ordinary memory, as a\n"
    "                   program's own (default private), the same advised for\n"
    "                   transparent huge pages (madvise MADV_HUGEPAGE), or from\n"
    "                   cohort_mem_alloc, which the ranks of a host reach directly\n"
    "                   (single copy); a one-host allreduce moves private buffers'\n"
    "                   2 MiB pieces onto huge pages itself (COHORT_SHM_COLLAPSE=0:\n"
    "                   it leaves them on 4 KiB pages)\n"
    "  -h, --help       this text\n"
    "\n"
    "Sizes are total bytes as in nccl-tests (allgather: the gathered output,\n"
    "reduce_scatter: the input). time is the slowest rank's mean per iteration;\n"
    "algbw = size/time; busbw = algbw * 2(n-1)/n (allreduce), (n-1)/n (allgather,\n"
    "reduce_scatter), 1 (broadcast, reduce). #wrong counts elements that differ\n"
    "from the serial reference in a separate checked run, summed over ranks.\n"
    "Exit status: 0 all correct, 1 wrong results or a failed collective, 2 usage.\n";

static const char prog[] = "cohort bench";

typedef struct bench_args {
  collbench_opts o;
  collbench_op ops[COLLBENCH_NOPS];
  int nops;
  int factor, dtype, redop;
  int nproc;             /* > 0: fork this many local ranks */
  const char *transport; /* for --nproc: COHORT_TRANSPORT */
} bench_args;

#define AT(FIELD, CTYPE) CLI_AT(bench_args, FIELD, CTYPE)

static int set_op(void *settings, const char *v) {
  bench_args *a = settings;
  a->nops = 0;
  for (int i = 0; i < COLLBENCH_NOPS; i++)
    if (strcmp(v, "all") == 0 || strcmp(v, collbench_op_name((collbench_op)i)) == 0)
      a->ops[a->nops++] = (collbench_op)i;
  return a->nops > 0 ? 0 : -1;
}

static int set_transport(void *settings, const char *v) {
  if (strcmp(v, "auto") != 0 && strcmp(v, "tcp") != 0 && strcmp(v, "shm") != 0) return -1;
  ((bench_args *)settings)->transport = v;
  return 0;
}

/* The first name of each value is the one the table prints. */
static const cli_choice dtypes[] = {{"float", COHORT_F32},
                                    {"float32", COHORT_F32},
                                    {"f32", COHORT_F32},
                                    {"double", COHORT_F64},
                                    {"float64", COHORT_F64},
                                    {"f64", COHORT_F64},
                                    {"half", COHORT_F16},
                                    {"float16", COHORT_F16},
                                    {"f16", COHORT_F16},
                                    {"bfloat16", COHORT_BF16},
                                    {"bf16", COHORT_BF16},
                                    {"int32", COHORT_I32},
                                    {"int", COHORT_I32},
                                    {"i32", COHORT_I32},
                                    {"int64", COHORT_I64},
                                    {"i64", COHORT_I64},
                                    {"uint8", COHORT_U8},
                                    {"u8", COHORT_U8},
                                    {NULL, 0}};
static const cli_choice mems[] = {{"private", COLLBENCH_MEM_PRIVATE},
                                  {"huge", COLLBENCH_MEM_HUGE},
                                  {"shared", COLLBENCH_MEM_SHARED},
                                  {NULL, 0}};
static const cli_choice redops[] = {{"sum", COHORT_SUM}, {"prod", COHORT_PROD}, {"min", COHORT_MIN},
                                    {"max", COHORT_MAX}, {"avg", COHORT_AVG},   {NULL, 0}};

static const cli_opt bench_opts_table[] = {
    {"--help", 'h', .kind = CLI_HELP_OPT},
    {"--op", 0, CLI_CUSTOM, .fn = set_op,
     .what = "allreduce, reduce_scatter, allgather, broadcast, reduce or all"},
    {"--minbytes", 'b', CLI_SIZE, .at = AT(o.minb, uint64_t), .min = 1, .max = INT64_MAX,
     .what = "a size of at least 1 (K/M/G suffixes)"},
    {"--maxbytes", 'e', CLI_SIZE, .at = AT(o.maxb, uint64_t), .min = 0, .max = 8LL << 30,
     .what = "a size of at most 8G"},
    {"--stepfactor", 'f', CLI_INT, .at = AT(factor, int), .min = 2, .max = 1024},
    {"--datatype", 'd', CLI_CHOICE, .at = AT(dtype, int), .choices = dtypes},
    {"--op_type", 'o', CLI_CHOICE, .at = AT(redop, int), .choices = redops},
    {"--root", 'r', CLI_INT, .at = AT(o.root, int), .min = 0, .max = 1 << 20},
    {"--iters", 'n', CLI_INT, .at = AT(o.iters, int), .min = 1, .max = 1000000},
    {"--warmup_iters", 'w', CLI_INT, .at = AT(o.warmup, int), .min = 0, .max = 1000000},
    {"--check", 'c', CLI_INT, .at = AT(o.check, int), .min = 0, .max = 1},
    {"--nproc", 0, CLI_INT, .at = AT(nproc, int), .min = 1, .max = 256},
    {"--transport", 0, CLI_CUSTOM, .fn = set_transport, .what = "auto, tcp or shm"},
    {"--mem", 0, CLI_CHOICE, .at = AT(o.mem, int), .choices = mems},
};

static const cli_cmd bench_cmd = {
    prog, bench_usage, bench_opts_table, BASE_ARRAY_LEN(bench_opts_table), CLI_NO_OPERANDS, 1};

static const char *choice_name(const cli_choice *c, int value) {
  for (; c->name != NULL; c++)
    if (c->value == value) return c->name;
  return "?";
}

/* What rank 0 prints and sums up while the rows come. */
typedef struct table {
  const bench_args *a;
  int rank;
  int64_t wrong;
  double busbw_sum;
  int busbw_rows;
} table;

static void print_header(collbench_op op) {
  printf("#\n# %s\n#\n", collbench_op_name(op));
  printf("# %64s %30s\n", "out-of-place", "in-place");
  printf("# %10s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "size", "count", "type",
         "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  printf("# %10s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "(B)", "(elements)", "", "",
         "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

static void print_row(const collbench_row *row, void *ctx) {
  table *t = ctx;
  char res[2][64];
  for (int k = 0; k < 2; k++) {
    if (!row->has[k]) {
      snprintf(res[k], sizeof res[k], "%9s %7s %7s %6s", "n/a", "n/a", "n/a", "n/a");
      continue;
    }
    t->busbw_sum += row->busbw[k];
    t->busbw_rows++;
    char wrong[24] = "N/A";
    if (row->wrong[k] >= 0) {
      t->wrong += row->wrong[k];
      snprintf(wrong, sizeof wrong, "%lld", (long long)row->wrong[k]);
    }
    snprintf(res[k], sizeof res[k], "%9.2f %7.2f %7.2f %6s", row->us[k], row->algbw[k],
             row->busbw[k], wrong);
  }
  if (t->rank != 0) return;
  printf("  %10zu %12zu %8s %6s %6d %s %s\n", row->bytes, row->count,
         choice_name(dtypes, (int)t->a->o.dtype),
         row->reduces ? choice_name(redops, (int)t->a->o.redop) : "none",
         row->rooted ? t->a->o.root : -1, res[0], res[1]);
  fflush(stdout);
}

/* Every chosen collective on communicator c; returns the exit status. */
static int run_ops(cohort_comm *c, const bench_args *a) {
  int n = cohort_comm_size(c), r = cohort_comm_rank(c);
  collbench *b = NULL;
  int rc = collbench_create(c, &a->o, &b);
  if (rc == -EINVAL) {
    if (r == 0) fprintf(stderr, "%s: --root %d but only %d ranks\n", prog, a->o.root, n);
    return CLI_USAGE;
  }
  if (rc != 0)
    return cli_error(prog, 1, "rank %d: cannot allocate the %s buffers: %s", r,
                     choice_name(mems, a->o.mem), cohort_strerror(rc));
  if (r == 0) {
    const char *tr = getenv("COHORT_TRANSPORT");
    printf("# cohort bench: %d ranks, transport %s, memory %s, %d iters, %d warmup, check %s\n", n,
           tr ? tr : "auto", choice_name(mems, a->o.mem), a->o.iters, a->o.warmup,
           a->o.check ? "on" : "off");
  }
  table t = {.a = a, .rank = r};
  for (int i = 0; i < a->nops && rc == 0; i++) {
    if (r == 0) print_header(a->ops[i]);
    size_t bytes = 0;
    rc = collbench_op_run(b, a->ops[i], print_row, &t, &bytes);
    if (rc != 0) {
      fflush(stdout);
      fprintf(stderr, "%s: rank %d: %s of %zu bytes failed: %s: %s\n", prog, r,
              collbench_op_name(a->ops[i]), bytes, cohort_strerror(rc),
              cohort_comm_error_message(c));
    }
  }
  collbench_destroy(b);
  if (r == 0 && rc == 0) {
    printf("# Out of bounds values : %lld %s\n", (long long)t.wrong, t.wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g\n#\n", t.busbw_rows ? t.busbw_sum / t.busbw_rows : 0.0);
  }
  return rc != 0 || t.wrong != 0 ? 1 : 0;
}

/* One rank: the communicator from the environment, then the table. */
static int rank_main(void *arg) {
  cohort_comm *c = NULL;
  int rc = cohort_comm_create_from_env(&c);
  if (rc != 0) return cli_error(prog, 1, "cannot create the communicator: %s", cohort_strerror(rc));
  int status = run_ops(c, arg);
  cohort_comm_destroy(c);
  return status;
}

int cmd_bench(int argc, char **argv) {
  bench_args a = {
      .o = {.minb = 8, .maxb = 32u << 20, .iters = 20, .warmup = 5, .check = 1},
      .ops = {COLLBENCH_ALLREDUCE},
      .nops = 1,
      .factor = 2,
      .dtype = COHORT_F32,
      .redop = COHORT_SUM,
  };
  cli_args none;
  int rc = cli_parse(&bench_cmd, argc, argv, &a, &none);
  if (rc != CLI_OK) return rc == CLI_HELP ? 0 : rc;
  a.o.factor = (uint64_t)a.factor;
  a.o.dtype = (cohort_dtype)a.dtype;
  a.o.redop = (cohort_redop)a.redop;
  if (a.o.minb > a.o.maxb)
    return cli_usage_error(prog, "-b %llu is larger than -e %llu", (unsigned long long)a.o.minb,
                           (unsigned long long)a.o.maxb);
  signal(SIGPIPE, SIG_IGN);
  if (a.nproc > 0) {
    rc = collbench_fork_ranks(a.nproc, a.transport, rank_main, &a);
    if (rc < 0) return cli_error(prog, 1, "cannot start the local ranks: %s", cohort_strerror(rc));
    return rc;
  }
  if (getenv("RANK") == NULL || getenv("COHORT_STORE") == NULL)
    return cli_usage_error(prog, "not started by `cohort run` (RANK/COHORT_STORE unset); use "
                                 "--nproc N to run N ranks here");
  return rank_main(&a);
}

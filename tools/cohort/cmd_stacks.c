/* cmd_stacks.c - `cohort stacks`: every rank's stack, grouped by where the ranks are. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/stacks.h"
#include "base/base.h"
#include "rdzv/join.h"
#include "tools/cohort/cmd.h"
#include "tools/cohort/cmd_stacks.h"
#include "tools/cohort/job.h"

static const char prog[] = "cohort stacks";

#define POLL_MS 200
#define STACKS_DEFAULT_TIMEOUT_MS 15000

static const char stacks_usage[] =
    "usage: cohort stacks [options]\n"
    "\n"
    "Asks every node of a running job for its ranks' stacks (Python tracebacks\n"
    "through cohort's start-up hook, else native ones from eu-stack or gdb)\n"
    "without stopping the job, and prints them grouped by where the ranks are:\n"
    "one line per place first, then each rank's stack.\n"
    "\n" JOB_ARGS_USAGE(
        "15") "  -h, --help           this help\n"
              "\n"
              "Exit status: 0 every node answered, 1 no such job or a node did not answer\n"
              "within the timeout (what came is printed), 2 usage error.\n";

typedef struct stacks_args {
  job_args job;
} stacks_args;

static const cli_opt stacks_cli_opts[] = {
    {"--help", 'h', .kind = CLI_HELP_OPT},
    JOB_ARGS_ROWS(stacks_args, job),
};

static const cli_cmd stacks_cmd = {
    prog, stacks_usage, stacks_cli_opts, BASE_ARRAY_LEN(stacks_cli_opts), CLI_NO_OPERANDS, 1};

/* One rank's answer, with where it is. */
typedef struct rank_stack {
  int node;
  const char *host;
  const char *kind;
  stacks_dump dump; /* text borrowed from the answers */
  stacks_verdict v;
} rank_stack;

/*
 * Reads the nodes' answers to request req until every node's is there or
 * the deadline: answers[k] is node k's (NULL when missing). Returns how
 * many nodes answered.
 */
static int read_answers(job_conn *jc, int nnodes, int64_t req, json_t **answers) {
  char(*keyv)[STORE_KEY_MAX] = calloc((size_t)nnodes, sizeof *keyv);
  const char **keys = calloc((size_t)nnodes, sizeof *keys);
  void **vals = calloc((size_t)nnodes, sizeof *vals);
  size_t *lens = calloc((size_t)nnodes, sizeof *lens);
  int got = 0;
  if (keyv == NULL || keys == NULL || vals == NULL || lens == NULL) goto out;
  for (int k = 0; k < nnodes; k++) {
    agent_jobctl_key(keyv[k], sizeof keyv[k], jc->where.job_id, "stacks", k);
    keys[k] = keyv[k];
  }
  for (;;) {
    if (store_get_many(jc->client, keys, (size_t)nnodes, vals, lens, jc->deadline_ms) != 0) break;
    for (int k = 0; k < nnodes; k++) {
      json_t *a = vals[k] != NULL ? json_loadb(vals[k], lens[k], 0, NULL) : NULL;
      free(vals[k]);
      vals[k] = NULL;
      if (answers[k] != NULL || a == NULL ||
          json_integer_value(json_object_get(a, "request")) < req) {
        json_decref(a);
        continue;
      }
      answers[k] = a;
      got++;
    }
    if (got == nnodes || base_deadline_left(jc->deadline_ms) < POLL_MS) break;
    base_sleep_ms(POLL_MS);
  }
out:
  free(keyv);
  free(keys);
  free(vals);
  free(lens);
  return got;
}

/* The answers' ranks as one list (texts borrowed); *n their count. */
static rank_stack *collect_ranks(json_t *const *answers, int nnodes, int *n) {
  size_t total = 0, i;
  json_t *r;
  for (int k = 0; k < nnodes; k++) total += json_array_size(json_object_get(answers[k], "ranks"));
  rank_stack *rs = calloc(total > 0 ? total : 1, sizeof *rs);
  *n = 0;
  if (rs == NULL) return NULL;
  for (int k = 0; k < nnodes; k++) {
    json_array_foreach(json_object_get(answers[k], "ranks"), i, r) {
      rank_stack *x = &rs[(*n)++];
      const char *kind = json_string_value(json_object_get(r, "kind"));
      const char *text = json_string_value(json_object_get(r, "text"));
      x->node = k;
      x->host = json_string_value(json_object_get(answers[k], "host"));
      x->kind = kind != NULL ? kind : "none";
      x->dump.rank = (int)json_integer_value(json_object_get(r, "rank"));
      x->dump.pid = (pid_t)json_integer_value(json_object_get(r, "pid"));
      x->dump.kind = strcmp(x->kind, "python") == 0   ? STACKS_PYTHON
                     : strcmp(x->kind, "native") == 0 ? STACKS_NATIVE
                     : strcmp(x->kind, "proc") == 0   ? STACKS_PROC_STATE
                                                      : STACKS_NONE;
      x->dump.text = (char *)(text != NULL ? text : "");
      agent_stacks_classify(&x->dump, &x->v);
    }
  }
  return rs;
}

/* By place, then rank: the ranks of one place print together. */
static int by_place(const void *a, const void *b) {
  const rank_stack *x = a, *y = b;
  int c = strcmp(x->v.where, y->v.where);
  return c != 0 ? c : (x->dump.rank > y->dump.rank) - (x->dump.rank < y->dump.rank);
}

static void print_stacks(rank_stack *rs, int n) {
  stacks_verdict *v = calloc((size_t)(n > 0 ? n : 1), sizeof *v);
  char *groups = malloc(65536);
  if (v != NULL && groups != NULL) {
    for (int i = 0; i < n; i++) v[i] = rs[i].v;
    agent_stacks_group_lines(v, n, -1, groups, 65536);
    printf("%s\n", groups);
  }
  free(v);
  free(groups);
  qsort(rs, (size_t)n, sizeof *rs, by_place);
  for (int i = 0; i < n; i++) {
    const rank_stack *x = &rs[i];
    printf("\n== rank %d, node %d (%s), pid %d, %s stack: %s ==\n%s", x->dump.rank, x->node,
           x->host != NULL ? x->host : "?", (int)x->dump.pid, x->kind, x->v.where, x->dump.text);
    size_t len = strlen(x->dump.text);
    if (len == 0 || x->dump.text[len - 1] != '\n') printf("\n");
  }
}

void stacks_print_answers(json_t *const *answers, int nnodes) {
  int n = 0;
  rank_stack *rs = collect_ranks(answers, nnodes, &n);
  if (rs != NULL) print_stacks(rs, n);
  free(rs);
  fflush(stdout);
}

/* Asks for the stacks and prints the answers; the exit status. */
static int ask(job_conn *jc) {
  int round = 0, nnodes = 0;
  if (job_round(prog, jc, &round, &nnodes) != 0) return 1;
  if (nnodes < 1 || nnodes > RDZV_MAX_NODES) return cli_error(prog, 1, "bad node count %d", nnodes);
  char key[STORE_KEY_MAX];
  agent_jobctl_key(key, sizeof key, jc->where.job_id, "stacks", -1);
  int64_t req = 0;
  int rc = store_add(jc->client, key, 1, &req, jc->deadline_ms);
  if (rc != 0) return cli_error(prog, 1, "cannot ask for the stacks: %s", cohort_strerror(rc));
  json_t **answers = calloc((size_t)nnodes, sizeof *answers);
  if (answers == NULL) return cli_error(prog, 1, "out of memory");
  read_answers(jc, nnodes, req, answers);
  stacks_print_answers(answers, nnodes);
  int status = 0;
  for (int k = 0; k < nnodes; k++) {
    if (answers[k] == NULL) {
      fprintf(stderr, "cohort stacks: node %d did not answer within the timeout\n", k);
      status = 1;
    }
    json_decref(answers[k]);
  }
  free(answers);
  return status;
}

int cmd_stacks(int argc, char **argv) {
  stacks_args a = {.job.timeout_ms = STACKS_DEFAULT_TIMEOUT_MS};
  cli_args rest;
  int rc = cli_parse(&stacks_cmd, argc, argv, &a, &rest);
  if (rc != CLI_OK) return rc == CLI_HELP ? 0 : rc;
  job_conn jc;
  if ((rc = job_connect(prog, &a.job, &jc)) != 0) return rc;
  rc = ask(&jc);
  job_close(&jc);
  return rc;
}

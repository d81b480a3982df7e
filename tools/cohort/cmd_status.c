/* cmd_status.c - `cohort status`: the nodes and ranks of a running job. */
#include "tools/cohort/cmd_status.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/snapshot.h"
#include "base/base.h"
#include "rdzv/join.h"
#include "tools/cohort/cmd.h"
#include "tools/cohort/job.h"

static const char prog[] = "cohort status";

#define WATCH_DEFAULT_MS 2000

static const char status_usage[] =
    "usage: cohort status [--json] [--watch [SEC]] [options]\n"
    "\n"
    "Shows a running job: per node its host, agent pid, round, restarts and the\n"
    "age of its snapshot (with --on-failure reform: its re-forms, the last's\n"
    "members before and after, duration and steps lost); per rank its pid,\n"
    "state, uptime, time since its last output, progress step and age\n"
    "(--hang-timeout), CPU % and RSS; then the job\n"
    "line (nodes joined of expected, round, the root cause when failing). '<'\n"
    "marks the running rank furthest behind (lowest step, else silent longest).\n"
    "\n"
    "  --json               one JSON document (docs/status.schema.json)\n"
    "  --watch [SEC]        redraw every SEC seconds (default 2) until "
    "interrupted\n" JOB_ARGS_USAGE(
        "5") "  -h, --help           this help\n"
             "\n"
             "Exit status: 0 shown, 1 no such job (or its store unreachable, or the token\n"
             "refused), 2 usage error.\n";

typedef struct status_args {
  job_args job;
  int json;
  int watch;
} status_args;

static const cli_opt status_opts[] = {
    {"--help", 'h', .kind = CLI_HELP_OPT},
    {"--json", 0, CLI_FLAG, .at = CLI_AT(status_args, json, int)},
    {"--watch", 0, CLI_FLAG, .at = CLI_AT(status_args, watch, int)},
    JOB_ARGS_ROWS(status_args, job),
};

static const cli_cmd status_cmd = {
    prog, status_usage, status_opts, BASE_ARRAY_LEN(status_opts), CLI_ANYWHERE, 1};

/* ---- the job document ---- */

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* An integer member, 0 when absent; clamped to +-2^53 so that sums of two cannot overflow
 * whatever a snapshot holds. */
static int64_t int_of(const json_t *o, const char *k) {
  const int64_t lim = (int64_t)1 << 53;
  int64_t v = (int64_t)json_integer_value(json_object_get(o, k));
  return v > lim ? lim : v < -lim ? -lim : v;
}

/* A string member, "" when absent. */
static const char *str_of(const json_t *o, const char *k) {
  const char *s = json_string_value(json_object_get(o, k));
  return s != NULL ? s : "";
}

/* Reads every node's snapshot: an array by node rank, null for a node not there. */
static json_t *read_nodes(job_conn *jc, const json_t *n0) {
  int64_t n = int_of(n0, "nnodes");
  if (n < 1 || n > RDZV_MAX_NODES) n = 1;
  char(*keyv)[STORE_KEY_MAX] = calloc((size_t)n, sizeof *keyv);
  const char **keys = calloc((size_t)n, sizeof *keys);
  void **vals = calloc((size_t)n, sizeof *vals);
  size_t *lens = calloc((size_t)n, sizeof *lens);
  json_t *nodes = NULL;
  if (keyv && keys && vals && lens) {
    for (int64_t k = 0; k < n; k++) {
      agent_jobctl_key(keyv[k], sizeof keyv[k], jc->where.job_id, "status", (int)k);
      keys[k] = keyv[k];
    }
    if (store_get_many(jc->client, keys, (size_t)n, vals, lens, jc->deadline_ms) == 0) {
      nodes = json_array();
      for (int64_t k = 0; k < n; k++) {
        json_t *s = job_parse_snapshot(vals[k], lens[k]);
        json_array_append_new(nodes, s != NULL ? s : json_null());
        free(vals[k]);
      }
    }
  }
  free(keyv);
  free(keys);
  free(vals);
  free(lens);
  return nodes;
}

/* How far behind a running rank is: by heartbeat step when ranks beat one
 * (the lowest step, then the oldest beat), else by silence (counting its
 * snapshot's age). Larger is further behind. */
static void lag_of(const json_t *node, const json_t *r, int64_t *step_key, int64_t *silent) {
  json_t *step = json_object_get(r, "step");
  *step_key = step != NULL ? -int_of(r, "step") : -((int64_t)1 << 54);
  json_t *beat = json_object_get(r, "beat_age_ms");
  json_t *out = json_object_get(r, "silent_ms");
  const char *k = beat != NULL ? "beat_age_ms" : out != NULL ? "silent_ms" : "uptime_ms";
  *silent = int_of(r, k) + int_of(node, "age_ms");
}

/* The running rank furthest behind, or -1. */
static int64_t furthest_behind(const json_t *nodes) {
  int64_t best = -1, worst_step = 0, worst_silent = 0;
  size_t i, k;
  json_t *node, *r;
  json_array_foreach(nodes, i, node) {
    if (!json_is_object(node)) continue;
    json_array_foreach(json_object_get(node, "ranks"), k, r) {
      if (strcmp(str_of(r, "state"), "running") != 0) continue;
      int64_t st, si;
      lag_of(node, r, &st, &si);
      if (best < 0 || st > worst_step || (st == worst_step && si > worst_silent)) {
        worst_step = st;
        worst_silent = si;
        best = int_of(r, "rank");
      }
    }
  }
  return best;
}

/* The job's state from its nodes: stopping, failing, finished, running or starting. */
static const char *job_state(const json_t *nodes, const char **cause) {
  int all_ok = 1, any_running = 0;
  size_t i, k;
  json_t *node, *r;
  *cause = NULL;
  json_array_foreach(nodes, i, node) {
    if (!json_is_object(node)) {
      all_ok = 0;
      continue;
    }
    const char *f = json_string_value(json_object_get(node, "failure"));
    if (f != NULL && *cause == NULL) *cause = f;
    json_array_foreach(json_object_get(node, "ranks"), k, r) {
      const char *st = str_of(r, "state");
      if (strcmp(st, "running") == 0) any_running = 1;
      if (strcmp(st, "exited") != 0 || int_of(r, "code") != 0) all_ok = 0;
    }
  }
  if (*cause != NULL)
    return strncmp(*cause, JOBCTL_STOPPED_BY, strlen(JOBCTL_STOPPED_BY)) == 0 ? "stopping"
                                                                              : "failing";
  if (all_ok) return "finished";
  return any_running ? "running" : "starting";
}

/* The document of --json (docs/status.schema.json) from the job's store; NULL after one line
 * on stderr. */
json_t *status_document(const char *job, const char *addr, const json_t *n0, json_t *nodes,
                        int64_t now) {
  int64_t round = int_of(n0, "round"), joined = 0;
  size_t i;
  json_t *node;
  json_array_foreach(nodes, i, node) {
    if (!json_is_object(node)) continue;
    int64_t age = now - int_of(node, "time_ms");
    json_object_set_new(node, "age_ms", json_integer(age > 0 ? age : 0));
    joined += int_of(node, "round") == round;
  }
  const char *cause = NULL;
  const char *state = job_state(nodes, &cause);
  json_t *doc = json_object();
  json_object_set_new(doc, "job", json_string(job));
  json_object_set_new(doc, "store", json_string(addr));
  json_object_set_new(doc, "round", json_integer(round));
  json_object_set_new(doc, "nodes_joined", json_integer(joined));
  json_object_set_new(doc, "nnodes", json_integer(int_of(n0, "nnodes")));
  json_object_set_new(doc, "nnodes_min", json_integer(int_of(n0, "nnodes_min")));
  json_object_set_new(doc, "nnodes_max", json_integer(int_of(n0, "nnodes_max")));
  json_object_set_new(doc, "world_size", json_integer(int_of(n0, "world_size")));
  json_object_set_new(doc, "state", json_string(state));
  json_object_set_new(doc, "root_cause", cause ? json_string(cause) : json_null());
  int64_t behind = furthest_behind(nodes);
  json_object_set_new(doc, "furthest_behind", behind >= 0 ? json_integer(behind) : json_null());
  json_object_set_new(doc, "nodes", nodes);
  return doc;
}

static json_t *job_document(job_conn *jc) {
  json_t *n0 = job_read_node0(prog, jc);
  if (n0 == NULL) return NULL;
  json_t *nodes = read_nodes(jc, n0);
  json_t *doc = NULL;
  if (nodes == NULL)
    cli_error(prog, 1, "reading the nodes' status at %s failed", jc->addr);
  else
    doc = status_document(jc->where.job_id, jc->addr, n0, nodes, wall_ms());
  json_decref(n0);
  return doc;
}

/* ---- the table ---- */

/* A duration in ms as "12.3s", "4m05s" or "2h03m"; "-" when absent. */
static void fmt_age(const json_t *v, int64_t extra, char *out, size_t len) {
  if (v == NULL) {
    base_strlcpy(out, "-", len);
    return;
  }
  const int64_t lim = (int64_t)1 << 53;
  int64_t ms = (int64_t)json_integer_value(v);
  ms = (ms > lim ? lim : ms < -lim ? -lim : ms) + extra;
  if (ms < 60000)
    snprintf(out, len, "%.1fs", (double)ms / 1000.0);
  else if (ms < 3600000)
    snprintf(out, len, "%dm%02ds", (int)(ms / 60000), (int)(ms / 1000 % 60));
  else
    snprintf(out, len, "%dh%02dm", (int)(ms / 3600000), (int)(ms / 60000 % 60));
}

static void fmt_bytes(const json_t *v, char *out, size_t len) {
  if (v == NULL) {
    base_strlcpy(out, "-", len);
    return;
  }
  double b = (double)json_integer_value(v);
  const char *unit = "KMGT";
  b /= 1024.0;
  int u = 0;
  while (b >= 1024.0 && u < 3) {
    b /= 1024.0;
    u++;
  }
  snprintf(out, len, "%.1f%c", b, unit[u]);
}

static void print_rank(FILE *f, const json_t *r, int64_t age, int64_t behind) {
  char state[32], up[16], silent[16], cpu[16], rss[16], step[24], beat[16];
  const char *st = str_of(r, "state");
  if (strcmp(st, "exited") == 0)
    snprintf(state, sizeof state, "exited %d", (int)int_of(r, "code"));
  else if (strcmp(st, "killed") == 0)
    snprintf(state, sizeof state, "killed %d", (int)int_of(r, "signal"));
  else
    base_strlcpy(state, st, sizeof state);
  int running = strcmp(st, "running") == 0;
  fmt_age(json_object_get(r, "uptime_ms"), running ? age : 0, up, sizeof up);
  fmt_age(json_object_get(r, "silent_ms"), running ? age : 0, silent, sizeof silent);
  json_t *c = json_object_get(r, "cpu_percent");
  if (c != NULL)
    snprintf(cpu, sizeof cpu, "%.1f", json_number_value(c));
  else
    base_strlcpy(cpu, "-", sizeof cpu);
  fmt_bytes(json_object_get(r, "rss_bytes"), rss, sizeof rss);
  fmt_age(json_object_get(r, "beat_age_ms"), running ? age : 0, beat, sizeof beat);
  if (json_object_get(r, "step") != NULL)
    snprintf(step, sizeof step, "%lld", (long long)int_of(r, "step"));
  else
    base_strlcpy(step, "-", sizeof step);
  int64_t rank = int_of(r, "rank");
  fprintf(f, "  %5lld %5lld %8lld  %-11s %8s %8s %8s %8s %6s %8s%s\n", (long long)rank,
          (long long)int_of(r, "local_rank"), (long long)int_of(r, "pid"), state, up, silent, step,
          beat, cpu, rss, rank == behind ? " <" : "");
}

/* --on-failure reform: "   re-forms N, the last: ..." under the node's line. */
static void print_reform(FILE *f, const json_t *node) {
  const json_t *l = json_object_get(node, "last_reform");
  if (json_object_get(node, "reforms") == NULL) return;
  fprintf(f, "   re-forms %lld", (long long)int_of(node, "reforms"));
  if (json_is_object(l)) {
    const json_t *d = json_object_get(l, "duration_ms"), *s = json_object_get(l, "steps_lost");
    char took[32] = "forming", lost[32] = "?";
    if (json_is_integer(d))
      snprintf(took, sizeof took, "%.2f s", (double)json_integer_value(d) / 1000);
    if (json_is_integer(s)) snprintf(lost, sizeof lost, "%lld", (long long)json_integer_value(s));
    fprintf(f, ", the last: round %lld, nodes %lld -> %lld, world %lld -> %lld, %s, steps lost %s",
            (long long)int_of(l, "round"), (long long)int_of(l, "nodes_before"),
            (long long)int_of(l, "nodes_after"), (long long)int_of(l, "world_before"),
            (long long)int_of(l, "world_after"), took, lost);
  }
  fprintf(f, "\n");
}

static void print_table(FILE *f, const json_t *doc) {
  int64_t behind = json_is_integer(json_object_get(doc, "furthest_behind"))
                       ? int_of(doc, "furthest_behind")
                       : -1;
  size_t i, k;
  json_t *node, *r;
  json_array_foreach(json_object_get(doc, "nodes"), i, node) {
    if (!json_is_object(node)) {
      fprintf(f, "node %zu: no status published\n", i);
      continue;
    }
    char age[16];
    fmt_age(json_object_get(node, "age_ms"), 0, age, sizeof age);
    fprintf(f, "node %lld  host %s  agent %lld  round %lld  restarts %lld  (%s ago)\n",
            (long long)int_of(node, "node"), str_of(node, "host"),
            (long long)int_of(node, "agent_pid"), (long long)int_of(node, "round"),
            (long long)int_of(node, "restarts"), age);
    print_reform(f, node);
    fprintf(f, "   RANK LOCAL      PID  STATE         UPTIME   SILENT     STEP     BEAT   CPU%%    "
               "  RSS\n");
    int64_t a = int_of(node, "age_ms");
    json_array_foreach(json_object_get(node, "ranks"), k, r) print_rank(f, r, a, behind);
  }
  int64_t lo = int_of(doc, "nnodes_min"), hi = int_of(doc, "nnodes_max");
  char expected[80];
  if (lo == hi || lo <= 0)
    snprintf(expected, sizeof expected, "%lld", (long long)int_of(doc, "nnodes"));
  else
    snprintf(expected, sizeof expected, "%lld (elastic %lld:%lld)",
             (long long)int_of(doc, "nnodes"), (long long)lo, (long long)hi);
  fprintf(f, "job %s: %lld of %s nodes joined, round %lld, %s", str_of(doc, "job"),
          (long long)int_of(doc, "nodes_joined"), expected, (long long)int_of(doc, "round"),
          str_of(doc, "state"));
  const char *cause = json_string_value(json_object_get(doc, "root_cause"));
  if (cause != NULL) fprintf(f, ": %s", cause);
  fprintf(f, "\n");
}

/* One frame as a string, so that a redraw is one write. */
char *status_render(const json_t *doc, int as_json) {
  if (as_json) return json_dumps(doc, JSON_INDENT(2));
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (f == NULL) return NULL;
  print_table(f, doc);
  fclose(f);
  return buf;
}

static int show_once(job_conn *jc, int as_json, int clear) {
  json_t *doc = job_document(jc);
  if (doc == NULL) return 1;
  char *text = status_render(doc, as_json);
  json_decref(doc);
  if (text == NULL) return cli_error(prog, 1, "out of memory");
  /* Home, the frame, then clear what an older, longer frame left below. */
  int ok = printf("%s%s%s", clear ? "\033[H" : "", text, clear ? "\033[J" : "") >= 0 &&
           (as_json && !clear ? printf("\n") >= 0 : 1) && fflush(stdout) == 0;
  free(text);
  return ok ? 0 : cli_error(prog, 1, "writing the status failed");
}

static int parse_interval(const cli_args *rest, int64_t *ms) {
  *ms = WATCH_DEFAULT_MS;
  if (rest->argc == 0) return CLI_OK;
  if (rest->argc > 1 || base_parse_seconds(rest->argv[0], 3600, ms) != 0 || *ms < 100)
    return cli_usage_error(prog, "--watch takes SEC, seconds from 0.1 to 3600");
  return CLI_OK;
}

int cmd_status(int argc, char **argv) {
  status_args a = {.job.timeout_ms = JOB_ARGS_DEFAULT_TIMEOUT_MS};
  cli_args rest;
  int rc = cli_parse(&status_cmd, argc, argv, &a, &rest);
  if (rc != CLI_OK) return rc == CLI_HELP ? 0 : rc;
  int64_t interval = 0;
  if (rest.argc > 0 && !a.watch)
    return cli_usage_error(prog, "unexpected argument '%s'", rest.argv[0]);
  if ((rc = parse_interval(&rest, &interval)) != CLI_OK) return rc;
  job_conn jc;
  rc = job_connect(prog, &a.job, &jc);
  if (rc != 0) return rc;
  if (!a.watch) {
    rc = show_once(&jc, a.json, 0);
  } else {
    printf("\033[H\033[2J");
    /* Until interrupted; each frame has the --timeout of its reads. */
    for (;;) {
      jc.deadline_ms = base_deadline_in(a.job.timeout_ms);
      if ((rc = show_once(&jc, a.json, 1)) != 0) break;
      base_sleep_ms(interval);
    }
  }
  job_close(&jc);
  return rc;
}

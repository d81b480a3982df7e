/* cmd_stop.c - `cohort stop`: ends a running job on every node. */
#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/watch.h"
#include "base/base.h"
#include "rdzv/join.h"
#include "tools/cohort/cmd.h"
#include "tools/cohort/job.h"

static const char prog[] = "cohort stop";

/* Between two tries while the job is between rounds. */
#define RETRY_MS 200

static const char stop_usage[] =
    "usage: cohort stop [--reason TEXT] [options]\n"
    "\n"
    "Stops a running job on every node through its fail-together path: each\n"
    "agent stops its workers (SIGTERM, then SIGKILL after its --grace), prints\n"
    "'stopped by USER@HOST: TEXT' as the root cause, tries no restart and\n"
    "exits with status 4.\n"
    "\n"
    "  --reason TEXT        why, for every node's report (default: none given)\n" JOB_ARGS_USAGE(
        "5") "  -h, --help           this help\n"
             "\n"
             "Exit status: 0 every node of the job acknowledged the stop (it was\n"
             "published, or the job was already being stopped), 1 no such job, it is\n"
             "ending for another reason, or a node did not acknowledge the stop within\n"
             "the timeout, 2 usage error.\n";

typedef struct stop_args {
  job_args job;
  const char *reason;
} stop_args;

static const cli_opt stop_opts[] = {
    {"--help", 'h', .kind = CLI_HELP_OPT},
    {"--reason", 0, CLI_STR, .at = CLI_AT(stop_args, reason, const char *), .what = "a text",
     .flags = CLI_NONEMPTY},
    JOB_ARGS_ROWS(stop_args, job),
};

static const cli_cmd stop_cmd = {
    prog, stop_usage, stop_opts, BASE_ARRAY_LEN(stop_opts), CLI_NO_OPERANDS, 1};

/* "stopped by USER@HOST: TEXT", the root cause every node prints. */
static void stop_text(const char *reason, char *out, size_t len) {
  const struct passwd *pw = getpwuid(getuid());
  const char *user = pw != NULL ? pw->pw_name : getenv("USER");
  char host[BASE_HOST_MAX] = "";
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0')
    base_strlcpy(host, "?", sizeof host);
  snprintf(out, len, "%s%s@%s: %s", JOBCTL_STOPPED_BY, user != NULL ? user : "?", host,
           reason != NULL ? reason : "no reason given");
}

/*
 * Publishes text as round's failure unless the round already has one.
 * Returns 0 (published, or a stop was already there: *current says which),
 * 1 when the round ended otherwise, or a negative error.
 */
static int publish_stop(job_conn *jc, int round, const char *text, char *current, size_t len) {
  char key[STORE_KEY_MAX];
  rdzv_key(key, sizeof key, jc->where.job_id, round, "fail");
  void *cur = NULL;
  size_t curlen = 0;
  int rc = store_cas(jc->client, key, NULL, 0, text, strlen(text), &cur, &curlen, jc->deadline_ms);
  if (rc == 0) {
    size_t n = cur == NULL ? 0 : (curlen < len - 1 ? curlen : len - 1);
    if (n > 0) memcpy(current, cur, n);
    current[n] = '\0';
  }
  free(cur);
  if (rc != 0) return rc;
  return strncmp(current, JOBCTL_STOPPED_BY, strlen(JOBCTL_STOPPED_BY)) == 0 ? 0 : 1;
}

/* The ack keys of round's nnodes nodes, and last the key that says they were read. */
static const char **ack_keys(job_conn *jc, int round, int nnodes) {
  const char **keys = calloc((size_t)nnodes + 1, sizeof *keys + STORE_KEY_MAX);
  char *text = keys != NULL ? (char *)(keys + nnodes + 1) : NULL;
  for (int k = 0; keys != NULL && k <= nnodes; k++) {
    keys[k] = text + (size_t)k * STORE_KEY_MAX;
    agent_jobctl_stop_ack_key(text + (size_t)k * STORE_KEY_MAX, STORE_KEY_MAX, jc->where.job_id,
                              round, k < nnodes ? k : -1);
  }
  return keys;
}

/* The first node whose key is absent (nnodes: none), or a negative error. */
static int first_unacked(job_conn *jc, const char **keys, int nnodes) {
  int k = 0, rc = 0;
  for (; rc == 0 && k < nnodes; k++) {
    void *val = NULL;
    size_t len = 0;
    rc = store_get(jc->client, keys[k], &val, &len, base_deadline_in(2000));
    free(val);
  }
  return rc == -ENOENT ? k - 1 : rc != 0 ? rc : nnodes;
}

/* Waits until every node acknowledged round's stop: 0, or 1 after one line. */
static int wait_acks(job_conn *jc, int round, int nnodes, const char *text) {
  if (nnodes < 1 || nnodes > RDZV_MAX_NODES) nnodes = 1;
  const char **keys = ack_keys(jc, round, nnodes);
  int rc = keys != NULL ? store_wait(jc->client, keys, (size_t)nnodes, jc->deadline_ms) : -ENOMEM;
  if (rc == 0) {
    store_set(jc->client, keys[nnodes], "1", 1, base_deadline_in(2000));
    fprintf(stderr, "cohort stop: job %s (round %d): %s\n", jc->where.job_id, round, text);
  } else {
    int k = rc == -ETIMEDOUT ? first_unacked(jc, keys, nnodes) : rc;
    if (k >= 0 && k < nnodes)
      cli_error(prog, 1,
                "job %s (round %d): the stop is published, but node %d has not acknowledged it "
                "(its agent is stopped, busy or gone)",
                jc->where.job_id, round, k);
    else
      cli_error(prog, 1,
                "job %s (round %d): the stop is published, but its store stopped "
                "answering: %s",
                jc->where.job_id, round, cohort_strerror(k < 0 ? k : rc));
  }
  free(keys);
  return rc == 0 ? 0 : 1;
}

int cmd_stop(int argc, char **argv) {
  stop_args a = {.job.timeout_ms = JOB_ARGS_DEFAULT_TIMEOUT_MS};
  cli_args rest;
  int rc = cli_parse(&stop_cmd, argc, argv, &a, &rest);
  if (rc != CLI_OK) return rc == CLI_HELP ? 0 : rc;
  job_conn jc;
  if ((rc = job_connect(prog, &a.job, &jc)) != 0) return rc;
  char text[WATCH_REPORT_MAX], current[WATCH_REPORT_MAX] = "";
  stop_text(a.reason, text, sizeof text);
  int round = -1, nnodes = 1, status = 1;
  /* A round that already ended otherwise (a failure with restarts left, a
   * node joining) is followed by another: try that one, until the timeout. */
  for (;;) {
    if (job_round(prog, &jc, &round, &nnodes) != 0) break;
    rc = publish_stop(&jc, round, text, current, sizeof current);
    if (rc == 0) {
      status = wait_acks(&jc, round, nnodes, current);
      break;
    }
    /* etcd: -ENOENT, node 0's agent left between the two reads (the stop lives under its
     * lease); a next round may have another node 0. */
    if (rc < 0 && rc != -ENOENT) {
      cli_error(prog, 1, "cannot publish the stop at %s: %s", jc.addr, cohort_strerror(rc));
      break;
    }
    if (base_deadline_left(jc.deadline_ms) < RETRY_MS) {
      cli_error(prog, 1, "job %s is already ending (round %d): %s", jc.where.job_id, round,
                rc == -ENOENT ? "node 0's agent is gone" : current);
      break;
    }
    base_sleep_ms(RETRY_MS);
  }
  job_close(&jc);
  return status;
}

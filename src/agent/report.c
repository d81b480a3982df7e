/* report.c - composing and printing the failure report. */
#include "agent/report.h"
#include "agent/launcher.h"

#include <fcntl.h>
#include <stdlib.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/dirs.h"
#include "base/base.h"

static void tail_lines(const worker *w, char *out, size_t outlen) {
  size_t off = 0;
  out[0] = '\0';
  if (w->tail_count == 0) return;
  off += (size_t)snprintf(out, outlen, "last lines of rank %d:", w->rank);
  int start = (w->tail_next - w->tail_count + AGENT_TAIL_LINES) % AGENT_TAIL_LINES;
  for (int k = 0; k < w->tail_count && off < outlen; k++)
    off += (size_t)snprintf(out + off, outlen - off, "\n  | %s",
                            w->tail[(start + k) % AGENT_TAIL_LINES]);
}

/* "node N (host): " across nodes, "" on one. */
static void node_prefix(const job *j, char *out, size_t outlen) {
  out[0] = '\0';
  if (j->cl.multinode) snprintf(out, outlen, "node %d (%s): ", j->cl.plan.my_index, j->cl.hostname);
}

void agent_report_worker_failure(job *j, int index) {
  worker *f = &j->workers[index];
  /* The worker has exited: what it printed last is already in the pipes. */
  agent_worker_stream_read(f, &f->out);
  agent_worker_stream_read(f, &f->err);
  char how[128], tail[WATCH_REPORT_MAX / 2];
  agent_worker_describe_status(f->status, how, sizeof how);
  tail_lines(f, tail, sizeof tail);
  char where[BASE_HOST_MAX + 32];
  node_prefix(j, where, sizeof where);
  char exc[1024] = "", path[256];
  agent_job_error_file(j, f->rank, path, sizeof path);
  if (path[0] != '\0') {
    char msg[900];
    if (agent_error_file_message(path, msg, sizeof msg) == 0)
      snprintf(exc, sizeof exc, "\nexception: %s", msg);
  }
  snprintf(j->report, sizeof j->report, "%srank %d (local rank %d, pid %d) %s%s%s%s", where,
           f->rank, f->local_rank, (int)f->pid, how, exc, tail[0] ? "\n" : "", tail);
}

void agent_report_outcome(job *j, attempt_outcome o) {
  char where[BASE_HOST_MAX + 32];
  node_prefix(j, where, sizeof where);
  const char *sn = sigabbrev_np(j->stop_signal);
  if (o == ATTEMPT_EXEC_ERROR)
    snprintf(j->report, sizeof j->report, "%scannot execute '%s': %s", where, j->cfg->argv[0],
             strerror(j->exec_errno));
  else if (o == ATTEMPT_SIGNALED && agent_launcher_lost())
    snprintf(j->report, sizeof j->report, "%slost the connection to the launcher", where);
  else if (o == ATTEMPT_SIGNALED)
    snprintf(j->report, sizeof j->report, "%scohort run was stopped by SIG%s", where,
             sn ? sn : "?");
  else
    snprintf(j->report, sizeof j->report, "%sinternal error of the agent", where);
}

void agent_report_cause(const job *j, char *out, size_t outlen) {
  if (!j->remote_failed && j->first_failed >= 0) {
    snprintf(out, outlen, "rank %d failed", j->workers[j->first_failed].rank);
    return;
  }
  const char *nl = strchr(j->report, '\n');
  size_t n = nl ? (size_t)(nl - j->report) : strlen(j->report);
  snprintf(out, outlen, "%.*s", (int)n, j->report);
}

/* The root cause: the same text on every node (`cohort stop`'s says itself who stopped it). */
static void print_cause(const job *j, attempt_outcome o, FILE *f) {
  const char *p = j->report;
  int first = 1;
  while (*p) {
    const char *nl = strchr(p, '\n');
    int n = nl ? (int)(nl - p) : (int)strlen(p);
    int plain = o == ATTEMPT_STOPPED || o == ATTEMPT_HUNG; /* the report says what happened */
    fprintf(f, "cohort: %s%.*s\n", first && !plain ? "job failed: " : "", n, p);
    first = 0;
    p += n;
    if (*p == '\n') p++;
  }
}

/* Whether a worker the agent signalled died of another signal than the one it sent (a crash
 * or an outside SIGKILL that came first): a failure of its own, not the agent's stop. */
static int stopped_otherwise(const worker *w) {
  return WIFSIGNALED(w->status) && WTERMSIG(w->status) != w->stopped_by;
}

/* What this node did about it: one line per worker that did not just succeed. */
static void print_workers(const job *j) {
  char node[32] = "", cause[256];
  if (j->cl.multinode) snprintf(node, sizeof node, "node %d: ", j->cl.plan.my_index);
  agent_report_cause(j, cause, sizeof cause);
  for (int i = 0; i < j->nworkers; i++) {
    const worker *w = &j->workers[i];
    if (i == j->first_failed || w->pid <= 0) continue;
    char st[128];
    agent_worker_describe_status(w->status, st, sizeof st);
    if (w->was_frozen)
      fprintf(
          stderr,
          "cohort: %srank %d: was stopped (SIGSTOP or traced) when the job failed: a hung worker\n",
          node, w->rank);
    const char *sn = w->stopped_by != 0 ? sigabbrev_np(w->stopped_by) : NULL;
    if (w->stopped_by != 0 && !stopped_otherwise(w)) {
      fprintf(stderr, "cohort: %srank %d: stopped by cohort (SIG%s) after %s; %s\n", node, w->rank,
              sn ? sn : "?", cause, st);
    } else if (w->stopped_by != 0) {
      fprintf(stderr, "cohort: %srank %d: also %s, not by cohort's SIG%s\n", node, w->rank, st,
              sn ? sn : "?");
    } else if (!agent_worker_succeeded(w)) {
      fprintf(stderr, "cohort: %srank %d: also %s\n", node, w->rank, st);
    }
  }
}

/*
 * The root cause into the container's termination message file, which
 * Kubernetes shows in `kubectl describe pod`; only where the file exists (the
 * kubelet mounts it): the agent creates nothing.
 */
static void write_termination_log(const job *j, attempt_outcome o) {
  const char *path = j->cfg->termination_log;
  if (path == NULL || j->report[0] == '\0') return;
  int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return;
  FILE *f = fdopen(fd, "w");
  if (f == NULL) {
    close(fd);
    return;
  }
  if (j->cl.multinode) fprintf(f, "cohort: node %d (%s)\n", j->cl.plan.my_index, j->cl.hostname);
  print_cause(j, o, f);
  if (fclose(f) != 0) base_log(BASE_LOG_WARN, "cannot write the termination message to %s", path);
}

void agent_report_print(const job *j, attempt_outcome o) {
  if (!j->cl.multinode && o != ATTEMPT_FAILED && o != ATTEMPT_HUNG) {
    /* The agent's own end on one node: one line says it all. */
    fprintf(stderr, "cohort: %s\n", j->report);
  } else {
    print_cause(j, o, stderr);
    agent_reform_print_losses(j, stderr);
    print_workers(j);
  }
  fflush(stderr);
  write_termination_log(j, o);
}

/* How long a node waits for the other nodes' stacks before reporting with what it has. */
#define HANG_GATHER_MS 20000

void agent_report_gather_hang(job *j) {
  char dir[4096];
  hang_node at = {.node = j->cl.plan.my_index, .host = j->cl.hostname};
  const char *sd = agent_dirs_stacks(j->cfg, j->restart, dir, sizeof dir);
  char *mine = j->hang.prog != NULL ? agent_hang_local(&j->hang, j->workers, &at, sd) : NULL;
  int n = j->cl.multinode ? j->cl.plan.nnodes : 1;
  char **texts = calloc((size_t)n, sizeof *texts);
  char report[WATCH_REPORT_MAX];
  if (texts != NULL &&
      agent_cluster_gather(&j->cl, j->round, "hang", mine ? mine : "{\"ranks\":[]}", HANG_GATHER_MS,
                           texts) > 0 &&
      agent_hang_report_all(texts, n, sd, report, sizeof report) == 0)
    base_strlcpy(j->report, report, sizeof j->report);
  for (int k = 0; texts != NULL && k < n; k++) free(texts[k]);
  free(texts);
  free(mine);
}

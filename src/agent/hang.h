/*
 * hang.h - `cohort run --hang-timeout`: noticing a rank that makes no
 * progress, and what the hung job's stacks say.
 *
 * Progress is a rank's output lines, or its progress file once it writes it
 * (progress.h). A rank silent for the timeout makes the job hung: the agent
 * collects the stacks of its ranks (stacks.h: Python tracebacks through the
 * start-up hook this module puts on the workers' PYTHONPATH, else a native
 * backtrace), names the rank to blame and fails the job with that report.
 * The same collection serves a dump on demand (SIGQUIT), which stops
 * nothing.
 *
 * Files live in the job's directory `dir`, emptied after each attempt:
 * progress-<local rank> (the progress files), py-<local rank>.txt (the Python dumps)
 * and sitecustomize.py (the hook; dir goes first on PYTHONPATH).
 *
 * Thread safety: none; the agent's loop owns it.
 */
#ifndef COHORT_AGENT_HANG_H
#define COHORT_AGENT_HANG_H

#include <stddef.h>
#include <stdint.h>

#include "agent/progress.h"
#include "agent/worker.h"

/* The first line of a hang's failure report, on every node. */
#define HANG_REPORT_PREFIX "job hung: "

/* Whether a failure report is a hang's. */
int agent_hang_is_report(const char *report);

typedef struct hang {
  int64_t timeout_ms; /* 0: no hang detection */
  int64_t start_ms;   /* the limit before a rank's first line or beat (imports, loading) */
  char dir[128];      /* the progress and dump files, and the hook (first on PYTHONPATH) */
  int n;              /* local ranks */
  progress *prog;     /* n of them, NULL while off */
} hang;

/*
 * Turns the progress files on for n local ranks with files under dir
 * (which exists): a rank is hung after timeout_ms without progress, or
 * start_ms before its first line or beat; timeout_ms 0: no hang detection,
 * the beats' step times alone (--straggler-factor). 0 or -errno.
 */
int agent_hang_setup(hang *h, int64_t timeout_ms, int64_t start_ms, const char *dir, int n);
void agent_hang_free(hang *h);

/* The progress file and Python dump file of local rank i. */
void agent_hang_paths(const hang *h, int i, char *hb, size_t hblen, char *py, size_t pylen);

/* A new attempt: the hook and fresh progress files, each worker's progress attached. */
int agent_hang_begin(hang *h, worker *w, int64_t now);

/* Local rank i's progress afresh, for a new process in its slot (a re-form's newcomer: the
 * start-up limit applies to it again). 0 or -errno. */
int agent_hang_begin_rank(hang *h, worker *w, int i, int64_t now);

/*
 * The index of a running rank silent for the timeout, or -1; *next_ms: the
 * time until a check is worth doing again. Bad progress files are reported
 * in one line each.
 */
int agent_hang_check(hang *h, const worker *w, int64_t now, int *next_ms);

/* A pause in which the ranks could not make progress is over (a re-form): each rank's silence
 * counts from now. */
void agent_hang_resume(hang *h, int64_t now);

/* Where this node is, for the report. */
typedef struct hang_node {
  int node;
  const char *host;
} hang_node;

/*
 * Several nodes: this node's part of the report, as text for the others
 * (malloc'ed JSON: each running rank's verdict, place and silence; the
 * stacks written to stacks_dir), NULL when nothing could be taken; and the
 * report made from every node's part (the same text on every node given the
 * same parts in node order). Returns 0, or -1 when no part had a rank.
 */
char *agent_hang_local(hang *h, const worker *w, const hang_node *at, const char *stacks_dir);
int agent_hang_report_all(char *const *texts, int ntexts, const char *stacks_dir, char *out,
                          size_t outlen);

/*
 * The ranks' stacks on demand (SIGQUIT): to the console, and to stacks_dir
 * when given, grouped by where the ranks are. The workers go on.
 */
void agent_hang_dump(hang *h, const worker *w, const hang_node *at, const char *stacks_dir);

#endif

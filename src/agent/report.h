/*
 * report.h - the failure report: the root cause (the same text on every
 * node, composed by the node where it happened) and then what this node
 * did about it, one line per worker.
 *
 * Main thread only.
 */
#ifndef COHORT_AGENT_REPORT_H
#define COHORT_AGENT_REPORT_H

#include <stddef.h>

#include "agent/internal.h"

/* The root cause of worker `index`'s failure, into j->report: how it ended,
 * the exception of its error file, its last lines. */
void agent_report_worker_failure(job *j, int index);

/* A failure that is not a worker's (outcome EXEC_ERROR, SIGNALED or
 * INTERNAL), into j->report; prefixed with this node across nodes. */
void agent_report_outcome(job *j, attempt_outcome o);

/* The short form of the cause for the "stopped by cohort after ..." lines:
 * "rank N failed" for a failure here, else the report's first line. */
void agent_report_cause(const job *j, char *out, size_t outlen);

/* Prints the report of a failed attempt to stderr. */
void agent_report_print(const job *j, attempt_outcome o);

/*
 * The job is hung: this node's ranks' stacks are taken and exchanged with
 * every node's (J/<round>/hang/<node>), and the report, the same on every
 * node, blames the rank that is not waiting in a collective wherever it is.
 * Main thread; waits up to HANG_GATHER_MS.
 */
void agent_report_gather_hang(job *j);

#endif

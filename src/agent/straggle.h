/*
 * straggle.h - `cohort run --straggler-factor`: a rank whose steps are
 * persistently slower than the others', reported on node 0.
 *
 * Each rank's step time is the median of its last steps, from the step
 * numbers it writes to its progress file (progress.h: agent_progress_step_ms).
 * Every node publishes them in its status snapshot (snapshot.c: step_ms);
 * node 0 reads every node's snapshot every STRAGGLE_PERIOD_MS and compares
 * the ranks (agent_progress_stragglers: above factor times the median of the
 * others). A rank is reported once per episode, in one line with its node,
 * host and factor; it never stops the job.
 *
 * Main thread only.
 */
#ifndef COHORT_AGENT_STRAGGLE_H
#define COHORT_AGENT_STRAGGLE_H

#include <stdint.h>

#define STRAGGLE_PERIOD_MS 2000

typedef struct straggle {
  int n;           /* ranks tracked (the world size of the round) */
  int *flagged;    /* per rank: in a straggling episode now */
  int64_t next_ms; /* when to compare again */
} straggle;

struct job;

/* Node 0, when due: reads the snapshots, prints the new stragglers.
 * Returns the milliseconds until the next comparison (-1: none, off or not node 0). */
int agent_straggle_tick(struct job *j, int64_t now);

void agent_straggle_free(straggle *s);

#endif

/*
 * remote_stacks.h - `cohort stacks` on the agent's side: when the job's
 * request counter (J/stacks, jobctl.h) has moved past the last request this
 * agent answered, it collects its running ranks' stacks (stacks.h, within
 * REMOTE_STACKS_MS) and writes them as one JSON value to J/stacks/<node>.
 * The workers are not stopped. Checked once per heartbeat period.
 *
 * Main thread only.
 */
#ifndef COHORT_AGENT_REMOTE_STACKS_H
#define COHORT_AGENT_REMOTE_STACKS_H

#include <stdint.h>

/* How long the collection of one request may take on a node. */
#define REMOTE_STACKS_MS 5000
/* The most one node's answer holds, so that it fits a store value. */
#define REMOTE_STACKS_BYTES (768u * 1024u)

/* The loop's memory between two checks. */
typedef struct remote_stacks {
  int64_t seen;    /* the last request answered */
  int64_t next_ms; /* when to check the request counter again */
} remote_stacks;

struct job;

/* Answers a pending request, if any, when a check is due (now: base_now_ms()).
 * Returns the milliseconds until the next check. */
int agent_remote_stacks_tick(struct job *j, int64_t now);

#endif

/*
 * spawn.h - starting this node's workers for an attempt, and one new
 * process for a lost local rank when the job re-forms (reform.h): the
 * worker's log files, environment (env.h), CPUs and control channel.
 *
 * Main thread only.
 */
#ifndef COHORT_AGENT_SPAWN_H
#define COHORT_AGENT_SPAWN_H

#include "agent/internal.h"

/* Spawns this node's workers; ATTEMPT_OK, or why not all could start (the
 * caller stops those that did). */
attempt_outcome agent_spawn_all(job *j);

/*
 * A new process for local rank i, whose worker is gone, into the running
 * round with COHORT_NEWCOMER=1 (its output, log file rank<R>.round<N>.log
 * and control channel its own). 0 or -errno.
 */
int agent_spawn_newcomer(job *j, int i);

#endif

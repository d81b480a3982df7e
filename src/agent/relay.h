/*
 * relay.h - the workers' output relayed by a thread of its own while the
 * agent's loop waits elsewhere: the join of a re-form round (reform.c)
 * blocks the loop for up to the heartbeat timeout, and the survivors'
 * output must keep flowing meanwhile.
 *
 * While the relay runs, only its thread touches the workers' streams (and
 * what agent_worker_stream_read updates: the tail, the progress of a line);
 * the main thread must not, until agent_relay_stop returns.
 */
#ifndef COHORT_AGENT_RELAY_H
#define COHORT_AGENT_RELAY_H

#include <pthread.h>

#include "agent/worker.h"

typedef struct relay {
  worker *w; /* n of them */
  int n;
  int stop[2]; /* the pipe that ends the thread */
  pthread_t thread;
  int on; /* the thread runs */
} relay;

/* Starts relaying the n workers' output. 0, or -errno (then nothing runs: the output waits). */
int agent_relay_start(relay *r, worker *w, int n);

/* Ends the thread (what it has read is relayed); the loop owns the streams again. */
void agent_relay_stop(relay *r);

#endif

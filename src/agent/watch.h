/*
 * watch.h - the cross-node watcher of a multi-node attempt.
 *
 * A thread with its own store connection that (1) waits on the round's
 * "fail" key, so a failure published by any node reaches this one at once,
 * (2) bumps this node's heartbeat counter, and (3) watches the other nodes'
 * counters: a node whose counter stops moving for the heartbeat timeout (and
 * that has not finished) is declared lost, and that verdict is published as
 * the failure. Losing the built-in store means node 0 is lost; with etcd,
 * whose members are not the nodes, every node also watches node 0's
 * key, and losing etcd is a failure of its own. With etcd the heartbeat
 * key is put once under the agent's lease, which says the node is alive:
 * a key that goes (its lease expired) is a lost node.
 *
 * When something happens the thread writes one byte (WATCH_NOTIFY_BYTE) to
 * notify_fd; agent_watch_failure() then returns the report text.
 */
#ifndef COHORT_AGENT_WATCH_H
#define COHORT_AGENT_WATCH_H

#include <stddef.h>
#include <stdint.h>

#include "rdzv/backend.h"

#define WATCH_NOTIFY_BYTE 0xF0
#define WATCH_REPORT_MAX 8192

typedef struct agent_watch agent_watch;

typedef struct watch_opts {
  rdzv_backend *backend; /* where the round's keys are (the watcher connects its own) */
  const char *job_id;
  int round;
  int my_node;
  int nnodes;
  const char *const *hostnames; /* nnodes names, for the reports */
  int64_t heartbeat_ms;         /* period of this node's heartbeat */
  int64_t lost_after_ms;        /* a silent node is lost after this */
  int notify_fd;
} watch_opts;

int agent_watch_start(const watch_opts *o, agent_watch **out);
/* 1 and the report in buf when a failure was seen, else 0. Thread-safe. */
int agent_watch_failure(agent_watch *w, char *buf, size_t len);
/* 1 when that failure is the store's silence (writing to it is in vain). Thread-safe. */
int agent_watch_store_lost(agent_watch *w);
void agent_watch_stop(agent_watch *w);

/* Publishes report as the round's failure unless another node was first;
 * either way `winner` receives the report that counts. */
int agent_watch_publish_failure(rdzv_backend *backend, const char *job_id, int round,
                                const char *report, char *winner, size_t winner_len);

#endif

/*
 * join.h - joining a rendezvous round over the store and planning ranks.
 *
 * Every agent of a job joins round R of job J by registering a node record
 * under "J/R/"; the hosting agent (node 0) waits for the nodes (MIN of
 * MIN:MAX, then a last-call window for more up to MAX), decides the node
 * ranks (claimed ranks kept, the others given in join order) and publishes
 * the plan; every other agent reads its place from it: the plan's head and
 * the one page that holds its line, never the whole plan.
 *
 * Keys under "J/R/": joined (counter), node/<seq> (record, seq = join
 * order from 1), plan/<p> (the lines of the nodes with seq in
 * p * RDZV_PLAN_PAGE + 1 .. (p + 1) * RDZV_PLAN_PAGE, written first), plan
 * (the head: node count, master, port, world size, node 0's line).
 */
#ifndef COHORT_RDZV_JOIN_H
#define COHORT_RDZV_JOIN_H

#include <stddef.h>
#include <stdint.h>

#include "base/net.h"
#include "store/store.h"

/* At most this many nodes a job, and processes a node. */
#define RDZV_MAX_NODES 16384
#define RDZV_MAX_NPROC 1024
/* Nodes a page of the plan (a page stays far under a value's 1 MiB whatever the names). */
#define RDZV_PLAN_PAGE 64

typedef struct rdzv_node {
  int node_rank;
  int nproc;
  int rank_offset;              /* global rank of its local rank 0 */
  char host[BASE_HOST_MAX];     /* its address as seen toward node 0 */
  char hostname[BASE_HOST_MAX]; /* gethostname() */
  uint64_t uid;
} rdzv_node;

typedef struct rdzv_plan {
  int nnodes;
  int world_size;
  int my_index; /* index of this agent in nodes[] (its node rank) */
  char master_addr[BASE_HOST_MAX];
  int master_port;
  int store_port; /* the workers' store on node 0 when no node hosts the rendezvous (etcd), 0 */
  int restart;    /* a re-form round that a node cannot take part in: restart everyone */
  /*
   * nnodes entries, by node rank (malloc'ed). Node 0, which planned, knows
   * every node; another knows node 0 and itself (the others' node_rank -1).
   */
  rdzv_node *nodes;
} rdzv_plan;

typedef struct rdzv_join_opts {
  const char *job_id;
  int round;
  int is_host;      /* this agent hosts the store: it is node 0 */
  int claimed_rank; /* -1: none */
  int nproc;
  int nnodes_min, nnodes_max;
  int first_plans;         /* no node hosts (etcd): the first to join plans and is node 0 */
  int store_port;          /* first_plans: the port of this node's store for the workers,
                              published in the plan when this node plans (0: none) */
  int64_t last_call_ms;    /* extra wait for more nodes once MIN joined */
  const char *my_host;     /* this node's address toward node 0 */
  const char *master_host; /* node 0's address as this node reaches it, or NULL */
  int64_t deadline_ms;     /* absolute */
  /*
   * A re-form round (--on-failure reform) when expect > 0: the planner plans
   * as soon as expect nodes joined, or after settle_ms with those there when
   * at least nnodes_min (no last call); ranks follow prev_rank (this node's
   * rank in the last round, -1 for a new node: after the others, in join
   * order), claims are ignored; with first_plans the caller's is_host says
   * who plans. cannot_reform: the plan says restart (rdzv_plan.restart).
   * expect_back (> 0): how many of the expected nodes were members before
   * (prev_rank >= 0, counted as they join): until they are all back, nodes
   * new to the job (a replacement) do not fill the round, which then waits
   * for the members up to settle_ms; 0: every node counts alike.
   */
  int expect;
  int expect_back;
  int64_t settle_ms;
  int prev_rank;
  int cannot_reform;
} rdzv_join_opts;

/*
 * Joins the round and fills *plan. Returns 0, -ETIMEDOUT when not enough
 * nodes came before the deadline, -EINVAL with errbuf when the plan is
 * impossible (two nodes claim one rank, a rank out of range), -EAGAIN
 * with errbuf when the round was planned without this node (plan->nnodes
 * says how many it has): a later round may take it (rdzv_latest_round), or
 * an elastic job with room may re-form with it (RDZV_GROW_PREFIX).
 */
int rdzv_join(store_client *c, const rdzv_join_opts *o, rdzv_plan *plan, char *errbuf,
              size_t errlen);

/*
 * A node that comes late to a running elastic job publishes, as the round's
 * failure, a report starting with this: every node stops its workers and
 * the job re-forms in the next round with the newcomer, without counting a
 * restart (as torchrun's membership changes do not).
 */
#define RDZV_GROW_PREFIX "grow: "

/*
 * Counts this node as pending in re-form round `round` ("J/R/pending"): it
 * comes later (a replacement whose workers are still starting), so the
 * round's planner need not wait for the node it replaces; it joins a later
 * round. 0 or a negative error.
 */
int rdzv_mark_pending(store_client *c, const char *job_id, int round, int64_t deadline_ms);

/*
 * Waits until a node has joined round `round` (its join count exists), until
 * deadline_ms at most: 0, or -ETIMEDOUT. With etcd the first node to join a
 * round plans it and is node 0; a newcomer to a re-form round waits so that
 * a member plans it and the newcomers come last (docs/reform.md).
 */
int rdzv_wait_first_joined(store_client *c, const char *job_id, int round, int64_t deadline_ms);

/* The last round node 0 planned (the job's "J/latest"), or -ENOENT before any. */
int rdzv_latest_round(store_client *c, const char *job_id, int64_t deadline_ms);

void rdzv_plan_free(rdzv_plan *plan);

/*
 * The wire forms rdzv_join() uses, for programs that speak the protocol
 * without it (bench/scale's swarm of simulated nodes):
 * rdzv_record_format() writes the node record a joining agent stores under
 * "J/R/node/<seq>" (one line, at most 1024 bytes); rdzv_plan_parse() reads
 * the plan's head published under "J/R/plan" and the page of the node's
 * seq, "J/R/plan/<(seq - 1) / RDZV_PLAN_PAGE>" (NULL: none), and finds the
 * node with my_uid, in the head when it is node 0, else in the page (a plan
 * as a node other than node 0 has it, see rdzv_plan.nodes). Errors: -EINVAL
 * with errbuf for an error plan, -ESRCH with plan->nnodes set for a node
 * left out, -EPROTO when malformed.
 */
void rdzv_record_format(char *out, size_t outlen, uint64_t uid, const rdzv_join_opts *o,
                        const char *hostname);
int rdzv_plan_parse(const char *head, const char *page, uint64_t my_uid, rdzv_plan *plan,
                    char *errbuf, size_t errlen);

/* Key "J/R/<suffix>" into out. */
void rdzv_key(char *out, size_t outlen, const char *job_id, int round, const char *suffix);

/*
 * Pure planning step, separated for tests: given n records in join order,
 * assigns node ranks. Returns 0 or -EINVAL with a reason.
 */
int rdzv_assign_ranks(rdzv_node *nodes, const int *claimed, int n, int host_index, char *errbuf,
                      size_t errlen);

#endif

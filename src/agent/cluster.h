/*
 * cluster.h - the agent's view of the other nodes: finding or hosting the
 * store, the job's id and token, joining a round, watching the other nodes,
 * publishing a failure, and the done/exit keys that end a job together.
 *
 * A job on this node alone is the one-node case of the same calls (no
 * rendezvous, no watcher, nothing to publish), so the agent's loop has one
 * path. Everything the loop needs from the others goes through here: a
 * rendezvous backend other than the built-in store (etcd), job status
 * snapshots and `cohort stop` belong behind these calls too.
 *
 * Main thread only (the watcher runs its own thread, see watch.h).
 * Functions print their one-line errors to stderr.
 */
#ifndef COHORT_AGENT_CLUSTER_H
#define COHORT_AGENT_CLUSTER_H

#include <stddef.h>

#include "agent/agent.h"
#include "agent/watch.h"
#include "base/base.h"
#include "base/net.h"
#include "doctor/doctor.h"
#include "rdzv/backend.h"
#include "rdzv/join.h"
#include "store/store.h"

typedef struct cluster {
  int multinode;            /* 0: this node alone */
  store_server *store;      /* the store hosted here (node 0, or alone; with etcd every node's,
                               for its workers when it is node 0), else NULL */
  int etcd;                 /* the rendezvous is in etcd: no node hosts it */
  rdzv_backend *backend;    /* where the rendezvous keys are (multi-node) */
  int store_lost;           /* the store stopped answering: the way out writes nothing to it */
  int stop_acked;           /* a stop acknowledged: the store's host waits for `cohort stop` */
  int all_done;             /* the last round waited for ended with every node done */
  store_client *client;     /* the main thread's connection (multi-node) */
  rdzv_publisher *pub;      /* announces the store until the first round is joined */
  agent_watch *watch;       /* this round's watcher (multi-node) */
  const char **watch_names; /* the hostnames the watcher reports with */
  rdzv_opts ropts;          /* discovery options as used, for publishing */
  /* The node counts and this node's rank: the flags', else discovery's. */
  int nnodes_min, nnodes_max, node_rank;
  char token[STORE_TOKEN_MAX + 1]; /* "" for a multi-node job started without one */
  char run_id[RDZV_JOB_ID_MAX + 1];
  char hostname[BASE_HOST_MAX];
  char
      store_host[BASE_HOST_MAX]; /* the store (etcd: its first endpoint) as this agent reaches it */
  int store_port;
  int workers_port;                   /* etcd: this node's store for its workers, if it is node 0 */
  char store_env[BASE_HOST_MAX + 16]; /* COHORT_STORE for the workers */
  char iface[64];                     /* interface toward node 0, "" unknown */
  rdzv_plan plan;                     /* this round's nodes and ranks */
  unsigned char
      *lost; /* plan.nnodes flags: node k is known lost (it leaves no exit key), or NULL */
  /* The next join is a re-form round (rdzv_join_opts) when reform_expect > 0; reform_back of
   * the nodes expected were members before. */
  int reform_expect, reform_back, reform_prev, reform_cannot;
  int newcomer; /* this node came late to a running job (the grow path) */
  /* --on-failure reform: a late node may start its workers ahead of the round that takes it
   * in (ahead_ok); ahead: 1 while they start (the join waits for their hellos), 2 once they
   * said hello; ahead_noted: this node said whether its workers can be started ahead. */
  int ahead_ok, ahead, ahead_noted;
  char local_file[4400]; /* one node: where `cohort status` finds the job (jobctl.h), "" none */
} cluster;

/*
 * Decides one node or several, starts (or finds) the store, announces it
 * and connects. Returns 0 or a negative error (AGENT_TOKEN_REFUSED: no
 * token where one is required; COHORT_EAUTH: the store refused the token;
 * -ETIMEDOUT, -ECONNREFUSED...: the store never answered), after one line.
 */
int agent_cluster_open(cluster *c, const agent_config *cfg);

/* The job's token, or NULL for a multi-node job started without one. */
const char *agent_cluster_token(const cluster *c);

/*
 * Joins round *round and fills c->plan (one node: a plan of its own). A
 * node late to a running elastic job with room asks it to re-form and
 * joins the next round: *round says which it joined. With ahead_ok, a late
 * node whose job's workers can be started ahead (agent_cluster_note_ahead)
 * returns -EINPROGRESS instead, ahead set to 1 (and, for a full job, counted
 * pending in the survivors' re-form round *round, so that they go on
 * without waiting for it): the caller starts its workers, and once they all
 * said hello sets ahead to 2 and calls again; the job then re-forms with
 * this node (RDZV_GROW_PREFIX).
 */
int agent_cluster_join(cluster *c, const agent_config *cfg, int *round);

/* Says once, for the whole job, whether this node's workers can be started ahead (yes: every
 * one said hello with await_form=1); a late node starts its own ahead only when some node said
 * yes and none said no. */
void agent_cluster_note_ahead(cluster *c, int yes);

/*
 * Node K of the round when report names a lost node (the watcher's "node K
 * (HOST) lost: ...", the guard's "node K (HOST): its agent died ..."), with
 * "(HOST)" into host (NULL: not wanted); else -1.
 */
int agent_cluster_lost_node(const char *report, char *host, size_t hostlen);

/* The node that report names lost (agent_cluster_lost_node) leaves the round without a word:
 * the way out does not wait for its exit key. Until the next join. */
void agent_cluster_note_lost(cluster *c, const char *report);

/* Says that a worker of round finished (exited 0): a peer that finds its connection closed
 * then knows it for no loss. */
void agent_cluster_note_finished(cluster *c, int round);

/* Whether a node of round finished or went, waiting for the word at most wait_ms:
 * AGENT_LEFT_FINISHED (a worker of it finished: agent_cluster_note_finished), AGENT_LEFT_GONE (an
 * agent's connection to the built-in store ended unasked: its node killed whole, or cut off), 0
 * neither (and alone). */
enum { AGENT_LEFT_FINISHED = 1, AGENT_LEFT_GONE = 2 };
int agent_cluster_left(cluster *c, int round, int64_t wait_ms);

/* Whether the job's program takes part in re-forms: some node's workers all said hello (it or
 * another node said so through agent_cluster_note_ahead). One store read; 0 when unknown. */
int agent_cluster_job_spoke(cluster *c);

/* Multi-node: publishes this node's network summary and warns when node 0's differs. */
void agent_cluster_compare_network(cluster *c, int round, const doctor_result *net);

/* Starts watching the other nodes for this round; notify_fd as in watch_opts. */
int agent_cluster_watch(cluster *c, const agent_config *cfg, int round, int notify_fd);
/* 1 and the report when another node failed (or was lost) this round. */
int agent_cluster_failure(cluster *c, char *report, size_t len);
void agent_cluster_unwatch(cluster *c);

/*
 * Publishes report as the round's failure unless another node was first;
 * either way winner receives the report that counts (one node: report).
 */
void agent_cluster_publish_failure(cluster *c, int round, const char *report, char *winner,
                                   size_t winner_len);

/*
 * After local success: says this node is done and waits until every node
 * is, or a failure (report filled) or a stop signal (*stop_signal set).
 * Returns 0 when all are done, -1 otherwise.
 */
int agent_cluster_wait_done(cluster *c, int round, char *report, size_t len, int *stop_signal);

/*
 * Writes this node's status snapshot (snapshot.h) to its key, waiting a
 * short while at most (the loop must not stall).
 */
void agent_cluster_publish_status(cluster *c, const char *json);

/*
 * `cohort stacks`: the job's request counter (0 when none was made), and
 * this node's answer written to its key. -ENOTCONN without a connection.
 */
int agent_cluster_stacks_requested(cluster *c, int64_t *req);
void agent_cluster_publish_stacks(cluster *c, const char *json);

/* Whether a round's report is `cohort stop`'s ("stopped by USER@HOST: TEXT"). */
int agent_cluster_stopped(const char *report);
/* Tells `cohort stop` that this node is stopping for it (agent_jobctl_stop_ack_key). */
void agent_cluster_ack_stop(cluster *c, int round);

/*
 * Every node's status snapshot (J/status/<node>): texts[k] (plan.nnodes of
 * them) node k's, malloc'ed and NUL-terminated, or NULL. 0, or -errno when the store did not
 * answer within STATUS_WRITE_MS.
 */
int agent_cluster_read_status(cluster *c, char **texts);

/*
 * Every node's answer to one question of the round: publishes mine under
 * J/<round>/<what>/<node> and gathers the others' (all of them, or those
 * there by timeout_ms). texts[k] (plan.nnodes of them) receives node k's,
 * malloc'ed, or NULL. Returns how many were found (one node: mine).
 */
int agent_cluster_gather(cluster *c, int round, const char *what, const char *mine,
                         int64_t timeout_ms, char **texts);

/*
 * Says goodbye; node 0 keeps the store up until everyone has read the end.
 * With etcd after a round every node finished, nobody waits: the round's
 * "alldone" outlives the node that wrote it (on a lease of its own), and
 * the last node to leave removes it.
 */
void agent_cluster_leave(cluster *c, int round);

void agent_cluster_close(cluster *c);

#endif

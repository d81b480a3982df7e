/*
 * reform.h - `cohort run --on-failure reform`: the agent's side of
 * re-forming a job without stopping its survivors (docs/reform.md).
 *
 * Every worker gets a control channel (control.h). On a loss (a local
 * worker that ends on its own, another node's failure or loss through the
 * watcher, a node asking to join through the grow key), when every worker
 * here said hello and at least MIN nodes remain, the agent sends `reshape`
 * to its workers, joins the next rendezvous round as a re-form round (its
 * plan keeps the survivors' order and completes as soon as the survivors
 * and any waiting newcomers joined), sends each survivor `form` with its
 * new rank, and starts a fresh process (COHORT_NEWCOMER=1) for a lost local
 * rank. The re-form is done when every local worker said `formed`.
 *
 * A worker that has not said hello yet is still starting (PyTorch's import
 * takes seconds) when its program is known to take part: it is a
 * replacement of one that took part, or a worker of the same job said hello
 * (on this node, in this or an earlier attempt, or on another node: the
 * store's ahead keys). It takes part, and a loss hands it `reshape` and
 * `form` on its channel, which it reads once it speaks; the re-form then
 * waits for its `formed` (bounded by --reform-timeout). A worker not yet
 * said hello while no worker of the job ever did, or one whose channel
 * closed without hello, takes no part.
 *
 * When it cannot (a worker takes no part, the store's node is lost with
 * the built-in store, fewer than MIN nodes, a rank slot or a node lost
 * for the REFORM_SLOT_LOSSES-th time, the deadline passed), the job fails together
 * as with `restart`, the report naming every loss in order.
 *
 * Main thread only: the state is job.rf (internal.h).
 */
#ifndef COHORT_AGENT_REFORM_H
#define COHORT_AGENT_REFORM_H

#include <stdint.h>
#include <stdio.h>

/* A local rank slot whose worker is lost this many times restarts the job; a node (by its
 * host name) lost this many times fails it. */
#define REFORM_SLOT_LOSSES 3
/* The losses the report names (the first ones, then a count). */
#define REFORM_LOSSES_MAX 16

/* One local rank's control channel and what its worker said. */
typedef struct reform_slot {
  int fd;         /* the agent's end, -1 none */
  int hello;      /* it takes part in re-forms */
  int formed;     /* it said `formed` for the current re-form */
  int64_t step;   /* the step of its last `ready`/`formed`, -1 unknown */
  int losses;     /* how often its worker was lost */
  int warned;     /* a bad or unknown message was logged (once per worker) */
  int await_form; /* its hello said it can be started ahead of its membership */
  int heir;       /* started in a re-form in place of a worker that took part: it takes part
                     while its hello is still to come (it is starting) and its channel is open */
} reform_slot;

/* One re-form, as `cohort status` and the metrics show it. */
typedef struct reform_record {
  int round; /* the round it formed */
  int nodes_before, nodes_after;
  int world_before, world_after;
  int64_t detected_ms; /* base_now_ms() when the loss was seen */
  int64_t duration_ms; /* loss seen -> every local worker `formed`; -1 while forming */
  int64_t steps_lost;  /* steps this node's ranks had done that the new membership lacks,
                          -1 unknown */
} reform_record;

typedef struct reform {
  reform_slot *slot; /* nworkers of them, NULL off */
  int forming;       /* `form` sent, waiting for `formed` */
  int admitting;     /* ... by workers started ahead (a late node's first membership) */
  int unneeded;      /* the job finished while this late node was admitted: its workers stopped,
                        the attempt ends well */
  int64_t finish_check_ms; /* admitting: when the round's "finished" is next looked for */
  int64_t deadline_ms;
  int64_t step_before; /* the highest step seen before the loss, -1 unknown */
  int count;           /* re-forms completed */
  int broken_rank;     /* a worker saw membership `round` break before any agent said so, -1 */
  int broken_asks;     /* ... and asked for the next (`ready`), not only said so (`broken`) */
  int spoke;           /* the job's program takes part: a worker of it said hello (any attempt,
                          here or, as the store says, on another node) */
  reform_record last;  /* the latest (count > 0 or forming) */
  int nlosses;
  char losses[REFORM_LOSSES_MAX][256];
} reform;

struct job;
struct pollfd;

/* Allocates the slots (cfg->reform only). 0 or -ENOMEM. */
int agent_reform_init(struct job *j);
void agent_reform_free(struct job *j);

/*
 * Local rank i's channel, before its spawn: *child receives the worker's end
 * (COHORT_CONTROL_FD; the caller closes it after the spawn), -1 without
 * --on-failure reform. 0 or -errno.
 */
int agent_reform_channel(struct job *j, int i, int *child);

/*
 * The rank whose collectives found the membership broken before any agent
 * announced a loss (`broken`, or `ready` unasked), once; -1 none. The loop
 * re-forms at once instead of waiting for the lost node's heartbeat
 * timeout (a node killed whole closes its connections at once). *asks: 1
 * when it said `ready` (it waits for the next membership), 0 for `broken`.
 */
int agent_reform_take_broken(struct job *j, int *asks);

/*
 * The report's line naming every loss this agent saw, in order, when there were several and
 * the report's root cause does not name them already (a rank slot lost again and again).
 */
void agent_reform_print_losses(const struct job *j, FILE *f);

/* Closes every channel (the attempt is over). */
void agent_reform_close(struct job *j);

/* The channels to poll into pfd (room for nworkers); returns how many. */
int agent_reform_pollfds(const struct job *j, struct pollfd *pfd);
/* Reads what the n descriptors agent_reform_pollfds gave have. */
void agent_reform_serve(struct job *j, const struct pollfd *pfd, int n);

/*
 * A loss: local worker `index` ended on its own (-1: another node's report,
 * in j->report; `cohort stop` and hangs are no losses). Returns 1 when the
 * job is re-forming without stopping the survivors; 0 when the caller goes
 * on as with restart (a worker takes no part: one line said why); -1 when
 * the job fails together with j->report (which names every loss).
 */
int agent_reform_on_loss(struct job *j, int index);

/*
 * A late node whose workers were started ahead (cluster.ahead 1): whether
 * every one of them said hello (then agent_reform_admit is due).
 */
int agent_reform_ahead_ready(const struct job *j);

/*
 * Joins the job now that the workers started ahead are ready (the join
 * blocks, the output relayed) and sends each its `form`; done when each said
 * `formed`. 0, or -1 with j->report (this node fails alone: it was no member).
 */
int agent_reform_admit(struct job *j);

/* The re-form's deadline; returns the ms until it (-1 none). */
int agent_reform_tick(struct job *j, int64_t now);

#endif

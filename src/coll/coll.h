/*
 * coll.h - internals of libcohort's collectives: the communicator.
 *
 * Three layers, each knowing only the one below, each with its header:
 *
 *   algorithms (algo.c,   ring, recursive doubling, trees, chains; they call
 *   coll_run_op below)    coll_sendrecv() and friends with peer ranks and
 *                         byte ranges, and know nothing of transports.
 *   engine (engine.c,     frames every message with a header describing the
 *   engine.h)             collective (mismatch detection), drives several
 *                         transfers at once through the transports, reduces
 *                         as bytes arrive, enforces the deadline, aborts.
 *   transports            an ops table (coll_tport_ops): non-blocking send,
 *   (tcp.c, shm.c,        receive and peek of a byte stream to a peer rank,
 *   tport.h)              and a blocking wait with a timeout.
 *
 * Beneath them all the reduction kernels (reduce.h) and the 16-bit float
 * conversions (convert.h).
 *
 * comm.c holds the public API and the progress thread that executes queued
 * operations in order; bootstrap.c connects the ranks through the rendezvous
 * store, sets the transports up and derives the host groups.
 * reform.c re-forms a communicator in place after a membership change
 * (the agent's control channel: control.c, control.h) and hands state to
 * new ranks; stream.c streams it to them in the background.
 */
#ifndef COHORT_COLL_COLL_H
#define COHORT_COLL_COLL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"
#include "coll/control.h"
#include "coll/convert.h"
#include "coll/engine.h"
#include "coll/reduce.h"
#include "coll/tport.h"

/* ---- shared buffers (shmbuf.c): cohort_mem_alloc ---- */

/* One cohort_mem_alloc allocation: this rank's mapping and every local rank's (peer[me] = base). */
typedef struct coll_buf {
  char *base;
  size_t bytes, map_bytes;
  char **peer; /* [local.n] */
} coll_buf;

/* The allocation holding [p, p + len) and p's offset in it: its index, or -1. */
int coll_buf_find(cohort_comm *c, const void *p, size_t len, size_t *off);
/* 1 when there are allocations and every local rank maps them all (so an algorithm may read and
 * write the peers' buffers directly). */
int coll_bufs_shared(const cohort_comm *c);
/* Unmaps every allocation (cohort_comm_destroy), those of ended memberships too. */
void coll_buf_release_all(cohort_comm *c);
/* The membership ends (cohort_comm_reform): the peers' mappings of every allocation are unmapped;
 * this rank's own stay, as private memory that cohort_mem_free releases alone. */
void coll_buf_orphan_all(cohort_comm *c);
/* Backs the whole 2 MiB pieces of an ordinary buffer [p, p + len) with transparent huge pages
 * (MADV_COLLAPSE), once per piece, so that the peers' process_vm_readv/writev pin it 2 MiB at a
 * time instead of 4 KiB. Best effort: nothing changes where the kernel refuses. */
void coll_buf_collapse(cohort_comm *c, const void *p, size_t len);

/* ---- the communicator ---- */

struct cohort_request {
  cohort_comm *comm;
  coll_op op;
  int done;
  int result;
  struct cohort_request *next;
};

/* Ranks an algorithm runs over: n members, my index me (-1 when not one), ranks[i] the world rank
 * of member i (NULL: the identity). */
typedef struct coll_group {
  int n, me;
  int *ranks;
} coll_group;

struct cohort_comm {
  int rank, size;
  coll_group world;   /* every rank */
  coll_group local;   /* the ranks of this host (shared memory), ascending */
  coll_group leaders; /* the lowest rank of every host, ascending */
  coll_group cross;   /* every host's rank with my local index (ranks NULL unless all hosts have
                         as many ranks) */
  int hier; /* large allreduce runs hierarchically (several hosts, several ranks on one) */
  int timeout_ms;
  size_t algo_threshold; /* bytes: below, latency algorithms; at or above, ring/chain */
  size_t slice_bytes;    /* pipelining unit of chains and sliced rings */
  size_t staging_bytes;  /* TCP receive staging per peer */
  coll_tcp *tcp;
  coll_shm *shm;
  coll_engine eng; /* its transports (bootstrap.c), idle work and failure state */
  uint32_t seq;    /* collectives executed so far */
  void *scratch;   /* 2 * slice_bytes (bounded staging of algorithms) */
  size_t scratch_bytes;
  /* The wire-type copy of compressed reductions (execute_wire), kept between them: as large as
   * the largest one so far (half its f32 bytes); a fresh one per call cost its page faults on
   * every call, time in which the link sat idle. */
  uint16_t *wire_buf;
  size_t wire_cap; /* elements */
  /* The next queued compressed operation's input, rounded into a second such buffer while the one
   * before it waits on the link (prepare_next, the engine's idle work): `prep_done` elements of
   * prep_op's input. The two buffers swap when prep_op runs. */
  uint16_t *prep_buf;
  size_t prep_cap;
  const coll_op *prep_op;
  size_t prep_done;
  const coll_op *cur_op; /* the operation executing (its output is not read ahead) */
  uint64_t prepared_ops; /* compressed operations that found their input rounded (for tests) */
  /* Tests: 1 sends every compressed operation through the wire-type copy (execute_wire), as
   * before the engine converted at its transfers (coll_wire_at_edges), to compare the two. */
  int wire_copy;
  uint64_t wire_edge_ops; /* compressed operations converted at the transfers (for tests) */
  /* Shared buffers (cohort_mem_alloc), the same list on every rank; index -1 entries are freed. */
  coll_buf *bufs;
  int nbufs, live_bufs;
  /* COHORT_SINGLE_COPY: an allreduce of ranks all on one host reduces straight from the peers'
   * buffers (allreduce_direct), mapped when shared, else through one-sided access. */
  int single_copy;
  /* COHORT_SHM_COLLAPSE: the 2 MiB pieces of ordinary buffers collapsed into huge pages
   * (coll_buf_collapse), an open-addressing set of piece addresses; collapse 0: off. */
  int collapse;
  uintptr_t *collapsed;
  size_t ncollapsed;
  uint64_t single_copy_ops; /* allreduces that took the mapped path (for tests) */
  uint64_t one_sided_ops;   /* allreduces that took the one-sided path (for tests) */
  /* Allocations of ended memberships: this rank's own mappings, private now. */
  coll_buf *old_bufs;
  int nold_bufs;

  /* Re-forming (reform.c, control.c). The membership's number is the bootstrap's round. */
  coll_ctl ctl;           /* the agent's control channel (ctl.fd -1: none) */
  int epoch;              /* the membership's number */
  int live;               /* under ctl.mu: transports up, the control thread may fail them */
  atomic_int ended;       /* the highest membership number a reshape ended, -1 */
  int64_t step;           /* cohort_comm_set_step, for the agent */
  int self_new;           /* this rank has no state (COHORT_NEWCOMER, mark_new) */
  unsigned char *newbits; /* [size]: every rank's bit, from the bootstrap */
  int boot_k;      /* which of this process's communicators (the store keys' <n>); -1 until known */
  coll_group xfer; /* the state transfer's chain: the donor, then the new ranks */
  char host[256];  /* the address this rank listens on (the bootstrap's; stream.c listens there) */
  /* What the next bootstrap reuses (copies: the caller's configuration is gone by then). */
  char *job_id, *token;
  cohort_transport transport;
  /* A node's joining deferred (cohort_comm_defer_grow): the most it may wait (0: not deferred);
   * under ctl.mu the membership a deferred grow ended (-1: none; its limit is ctl's deadline). */
  int grow_defer_ms;
  int grow_epoch;
  /* cohort_comm_grow_break_for, under ctl.mu: until this base_now_ms() a grow is not deferred but
   * ends the membership at once (0: never). */
  int64_t grow_break_until_ms;
  atomic_int grow_pending; /* cohort_comm_grow_pending: 1 while grow_epoch >= 0 */

  /* Queue executed in order by the progress thread (or the caller when idle). inflight: the
   * collectives queued or executing (a state stream with COHORT_STREAM_IDLE reads it). */
  atomic_int inflight;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  cohort_request *head, *tail;
  int busy, stop;
  pthread_t thread;
  int thread_started;
};

/* Reads a size from the environment variable name into *out (unchanged when unset); COHORT_ENOENV
 * when it is not a size within [min, max]. */
int coll_env_size(const char *name, uint64_t min, uint64_t max, size_t *out);
/* Connects the ranks of c (rank, size, timeout and sizes set) through the store named in cfg and
 * sets up its transports and groups (bootstrap.c). */
int coll_bootstrap(cohort_comm *c, const cohort_comm_config *cfg);

/* Fails the operation in flight and every later one with COHORT_ERESHAPED: membership `epoch` (-1:
 * the current one) ended (reform.c; the control thread calls it under ctl.mu). */
void coll_reshape(cohort_comm *c, int epoch, const char *why);
/* Sets the re-forming state up at create: the membership's number, COHORT_NEWCOMER, and the control
 * channel (COHORT_CONTROL_FD: says hello, starts its thread). 0 or an error. */
int coll_reform_init(cohort_comm *c, const cohort_comm_config *cfg);
/* A communicator started ahead of its membership (COHORT_AWAIT_FORM_NOW): waits for the agent's
 * first form, connects it, answers formed. 0 or an error (the reason in the failure state). */
int coll_first_form(cohort_comm *c);
/* Connects the membership of cfg at create. With a control channel, one that ends while it
 * connects (the agent's reshape, a member lost) is answered `ready` and the next form's is
 * connected, as coll_first_form does. 0 or an error. */
int coll_first_connect(cohort_comm *c, const cohort_comm_config *cfg);
/* Runs a collective in order with the queued ones (blocking when req is NULL; comm.c). */
int coll_start(cohort_comm *c, coll_op *op, cohort_request **req);

/* ---- algorithms (algo.c): run one collective; 0 or an error ---- */
int coll_run_op(coll_ctx *x);
/* 1 when an f32 operation with a 16-bit wire type runs on its own buffers, converted at the
 * engine's transfers (the ring algorithms: every reduce-scatter and allgather, a large sum
 * allreduce that takes the ring), rather than on a whole 16-bit copy of them; then coll_run_op
 * takes it as it is. The same answer on every rank. */
int coll_wire_at_edges(cohort_comm *c, const coll_op *op);

/* A completed collective is progress: touches COHORT_PROGRESS's file, at most
 * every 200 ms (progress.c; cohort_progress() is the public call). */
void coll_progress_auto(void);

#endif

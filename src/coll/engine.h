/*
 * engine.h - the middle layer of the collectives (engine.c): transfers to and
 * from peer ranks through their transports' ops tables, each message framed
 * with a header that detects mismatched collectives, received bytes reduced
 * as they arrive, a deadline, and the first failure recorded and broadcast.
 *
 * The algorithms above call coll_send() and friends with a coll_ctx; the
 * communicator that owns the engine fills a coll_engine (which transport
 * reaches which peer, and an idle hook) and never reaches inside a transfer.
 */
#ifndef COHORT_COLL_ENGINE_H
#define COHORT_COLL_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"
#include "coll/tport.h"

enum coll_kind {
  COLL_ALLREDUCE = 1,
  COLL_REDUCE_SCATTER,
  COLL_ALLGATHER,
  COLL_BROADCAST,
  COLL_REDUCE,
  COLL_BARRIER,
  COLL_TRANSFER, /* cohort_comm_state_transfer's chain (reform.c) */
};

const char *coll_kind_name(int kind);

/* One collective call, as every rank describes it in its message headers. */
typedef struct coll_op {
  int kind;
  const void *send;
  void *recv;
  size_t count; /* allreduce/bcast/reduce: count; rs: recvcount; ag: sendcount */
  cohort_dtype dtype;
  cohort_dtype wire; /* the type on the wire: dtype, or a 16-bit type for an f32 buffer */
  cohort_redop op;
  int root;
  int timeout_ms;
} coll_op;

/*
 * The peer watch of a re-formable communicator (engine.c): while no collective is in flight, a
 * thread blocks in poll() on every peer's watch fd (hang-ups only, never data: it wakes for
 * nothing else) and fails the communicator with COHORT_EPEER the moment a peer is lost, so the
 * agent hears `broken` at once rather than at the program's next collective. A peer whose stream
 * ends with its destroy's goodbye left in good order and is not a loss. The thread reads a peer's
 * stream only while it holds `state` (WATCH_LOOK); the thread executing a collective holds it as
 * WATCH_OP (coll_op_begin, coll_op_end: two atomic operations, no system call).
 */
enum { WATCH_IDLE = 0, WATCH_OP, WATCH_LOOK };
typedef struct coll_watch {
  atomic_int state;
  atomic_int waiting; /* the watcher waits for the collective's end (coll_op_end wakes it) */
  atomic_int stop;
  int wake_fd; /* eventfd: stop, or the end of that collective */
  int size, started;
  unsigned char *left; /* [size] peers that said goodbye: no longer watched */
  pthread_t thread;
} coll_watch;

/* The engine of one communicator: its transports, its idle work and its failure state. */
typedef struct coll_engine {
  int rank;
  const coll_tport_ops **peer_ops; /* [size] transport of each peer */
  void **peer_t;                   /* [size] its instance */
  int ntports;                     /* the instances in use (for abort) */
  const coll_tport_ops *tport_ops[2];
  void *tport_t[2];
  /* Work for the executing thread while its transfers wait, instead of sleeping (NULL: none):
   * returns 1 when it did some (the transfers are looked at again at once), 0 when there is none.
   * Called only between steps of a transfer, on the thread that runs the collective. */
  int (*idle)(void *arg);
  void *idle_arg;
  /* A re-formable communicator's: a lost peer (COHORT_EPEER) fails it with COHORT_ERESHAPED, and
   * lost(lost_arg, why) is called once, on the thread that found it (no engine lock held). */
  int reshape_on_loss;
  void (*lost)(void *arg, const char *why);
  void *lost_arg;
  /* Failure state: the first error wins. */
  pthread_mutex_t err_mu;
  atomic_int failed;
  int err;
  char errmsg[512];
  coll_watch watch;
} coll_engine;

/* What one collective's transfers run under. `comm` is the algorithms' (the engine never looks
 * at it). */
typedef struct coll_ctx {
  coll_engine *eng;
  cohort_comm *comm;
  const coll_op *op;
  uint32_t seq;
  int64_t deadline_ms; /* 0 until the operation first has to wait */
  size_t es;           /* element size */
} coll_ctx;

int coll_send(coll_ctx *x, int peer, const void *buf, size_t len);
int coll_recv(coll_ctx *x, int peer, void *buf, size_t len);
/* dst = local op incoming (len bytes, whole elements); dst may equal local. */
int coll_recv_reduce(coll_ctx *x, int peer, const void *local, void *dst, size_t len);
int coll_sendrecv(coll_ctx *x, int speer, const void *sbuf, size_t slen, int rpeer, void *rbuf,
                  size_t rlen);
int coll_sendrecv_reduce(coll_ctx *x, int speer, const void *sbuf, size_t slen, int rpeer,
                         const void *local, void *dst, size_t rlen);
/* coll_sendrecv of an operation that travels in 16 bits (op->wire != op->dtype): the f32 values
 * sent, rounded to the wire type and widened back, are stored at `rounded` too as they are sent
 * (rounded may be sbuf, exactly: then only the pieces that change are written). */
int coll_sendrecv_rounded(coll_ctx *x, int speer, const void *sbuf, void *rounded, size_t slen,
                          int rpeer, void *rbuf, size_t rlen);

/* One-sided access to a peer's memory, when its transport has it (coll_one_sided): copies len
 * bytes from the peer's address raddr into dst, or from src to raddr, while the peer goes on with
 * its own work; the algorithm orders them with messages. 0 or an error (the communicator failed).
 */
int coll_one_sided(coll_ctx *x, int peer);
int coll_get(coll_ctx *x, int peer, void *dst, uint64_t raddr, size_t len);
int coll_put(coll_ctx *x, int peer, uint64_t raddr, const void *src, size_t len);

/* Records the first failure (formatted message) and aborts every transport. Returns err. */
int coll_fail(coll_engine *e, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* What an operation started after the failure returns: COHORT_ERESHAPED when the failure was the
 * membership's end, else COHORT_EABORTED. */
int coll_later_err(coll_engine *e);
/* Forgets the failure (a re-formed communicator is healthy again). */
void coll_reset_failure(coll_engine *e);
/* Shuts transports down so peers notice; idempotent. */
void coll_abort_transports(coll_engine *e, const char *why);
/* When a peer aborted the communicator through a transport: 1 and who and why. */
int coll_peer_aborted(coll_engine *e, int *rank, char *msg, size_t msglen);

/* Starts the peer watch over the membership's `size` ranks (transports set up). 0 or an error. */
int coll_watch_start(coll_engine *e, int size);
/* Stops it and joins its thread (before the transports go); idempotent. */
void coll_watch_stop(coll_engine *e);
/* Around every collective's execution: the watch leaves the peers' streams to it meanwhile. */
void coll_op_begin(coll_engine *e);
void coll_op_end(coll_engine *e);

#endif

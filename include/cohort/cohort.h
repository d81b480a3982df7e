/*
 * cohort.h - the public C API of libcohort.
 *
 * libcohort gives a data-parallel program collectives (allreduce,
 * reduce-scatter, allgather, broadcast, reduce, barrier) over TCP between
 * nodes and shared memory inside a node. A program started by `cohort run`
 * creates its communicator from the environment the agent sets; any other
 * launcher can fill a cohort_comm_config by hand.
 *
 * Conventions:
 *  - Functions return 0 on success or a negative error code: either a
 *    negated errno value (-ETIMEDOUT, -ECONNRESET, ...) or one of the
 *    COHORT_E* codes below. cohort_strerror() turns either into text.
 *  - Objects the library allocates are released with the matching
 *    *_destroy() function; destroy(NULL) is a no-op.
 *  - Every blocking call is bounded by the communicator's timeout. When a
 *    collective fails (a dead peer, a lost connection, ranks that called
 *    different collectives, a timeout) the communicator is aborted: the
 *    failing call and every later one return an error, and
 *    cohort_comm_error_message() names the peer and what happened.
 *  - A communicator is used by one application thread at a time. The
 *    library may run its own progress thread internally.
 */
#ifndef COHORT_COHORT_H
#define COHORT_COHORT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* COHORT_VERSION_MAJOR/_MINOR/_PATCH and COHORT_VERSION_STRING ("0.1.0"). */
#include "cohort/version.h"

#if defined(__GNUC__)
#define COHORT_API __attribute__((visibility("default")))
#else
#define COHORT_API
#endif

/* Error codes beyond errno. Negative, below any errno value. */
#define COHORT_EMISMATCH (-4001) /* ranks called different collectives */
#define COHORT_EABORTED (-4002)  /* the communicator was aborted earlier */
#define COHORT_EAUTH (-4003)     /* wrong or missing job token */
#define COHORT_EPEER (-4004)     /* a peer failed or closed its connection */
#define COHORT_EPROTO (-4005)    /* malformed bytes from a peer */
#define COHORT_ENOENV (-4006)    /* environment of `cohort run` missing or bad */
#define COHORT_ELIMIT (-4007)    /* a size or count limit was exceeded */
#define COHORT_ERESHAPED (-4008) /* the membership changed: call cohort_comm_reform */
#define COHORT_ENOSTATE (-4009)  /* no rank has state to hand on: load a checkpoint */

/* Text for an error code (static storage, never NULL). */
COHORT_API const char *cohort_strerror(int err);

/* The library's version, COHORT_VERSION_STRING when it was built. */
COHORT_API const char *cohort_version(void);

/*
 * Tells `cohort run --hang-timeout` (and --straggler-factor) this rank makes
 * progress: writes step (>= 0; a negative step only touches the file) to
 * the progress file the agent names in COHORT_PROGRESS. Every completed
 * collective reports progress too, so a program that calls collectives
 * needs this only where it computes for long without them. Returns 0 (also
 * when not run by such an agent) or -errno. Thread-safe.
 */
COHORT_API int cohort_progress(int64_t step);
/* The earlier name of cohort_progress(), kept so that programs written
 * for it build and run unchanged. */
COHORT_API int cohort_heartbeat(int64_t step);

typedef enum cohort_dtype {
  COHORT_F32 = 0,
  COHORT_F64,
  COHORT_F16,  /* IEEE half; reduced with f32 accumulation */
  COHORT_BF16, /* bfloat16; reduced with f32 accumulation */
  COHORT_I32,
  COHORT_I64,
  COHORT_U8,
  COHORT_DTYPE_COUNT
} cohort_dtype;

typedef enum cohort_redop {
  COHORT_SUM = 0,
  COHORT_PROD,
  COHORT_MIN,
  COHORT_MAX,
  COHORT_AVG, /* sum divided by the world size */
  COHORT_REDOP_COUNT
} cohort_redop;

/* Size in bytes of one element of a type, 0 for an invalid type. */
COHORT_API size_t cohort_dtype_size(cohort_dtype dtype);

typedef struct cohort_comm cohort_comm;
typedef struct cohort_request cohort_request;

/* Which transports a communicator may use between ranks on the same host. */
typedef enum cohort_transport {
  COHORT_TRANSPORT_AUTO = 0, /* shared memory on one host, TCP between hosts */
  COHORT_TRANSPORT_TCP,      /* TCP everywhere (for testing and comparison) */
  COHORT_TRANSPORT_SHM       /* shared memory required; error if not one host */
} cohort_transport;

typedef struct cohort_comm_config {
  int rank;               /* 0 .. size-1 */
  int size;               /* world size, >= 1 */
  const char *store_addr; /* "host:port" of the rendezvous store */
  const char *job_id;     /* keeps concurrent jobs on one store apart */
  const char *token;      /* shared secret of the job, or NULL */
  int timeout_ms;         /* default deadline of every operation; 0: 60000 */
  cohort_transport transport;
  int restart; /* restart round of the job (keeps rounds apart on one store) */
  /* Re-forms (docs/reform.md): whether this rank can be started ahead of its
   * membership, as a late node's workers are (COHORT_AWAIT_FORM=1): 0 (a
   * zero-initialised config) it cannot; COHORT_AWAIT_FORM_ABLE it can (its
   * hello says await_form=1); COHORT_AWAIT_FORM_NOW it was: rank, size,
   * store_addr, job_id and restart are unused, and cohort_comm_create waits
   * for the agent's first `form`, which gives them (a control channel is
   * needed). cohort_comm_config_from_env sets it. */
  int await_form;
} cohort_comm_config;

#define COHORT_AWAIT_FORM_ABLE 1
#define COHORT_AWAIT_FORM_NOW 2

/*
 * Fills cfg from the environment `cohort run` sets: RANK, WORLD_SIZE,
 * COHORT_STORE, COHORT_JOB_ID, COHORT_TOKEN, COHORT_ROUND (else
 * TORCHELASTIC_RESTART_COUNT) and
 * the optional COHORT_TIMEOUT_MS and COHORT_TRANSPORT (auto|tcp|shm).
 * A worker started ahead of its membership (COHORT_AWAIT_FORM=1 with
 * COHORT_CONTROL_FD) needs none of RANK, WORLD_SIZE, COHORT_STORE,
 * COHORT_JOB_ID and COHORT_ROUND: await_form is COHORT_AWAIT_FORM_NOW.
 * String fields point into the environment. Returns COHORT_ENOENV when a
 * variable is missing or malformed.
 */
COHORT_API int cohort_comm_config_from_env(cohort_comm_config *cfg);

/*
 * Creates a communicator: every rank of the job must call this. Blocks until
 * all ranks have connected or the timeout passes. On error *out is NULL.
 * Started ahead (cfg->await_form == COHORT_AWAIT_FORM_NOW): says hello, waits
 * for the agent's first `form` (COHORT_REFORM_TIMEOUT_MS), connects that
 * membership and answers `formed`; a membership that ends while it connects
 * is answered `ready` and the next one awaited. So is the membership of cfg
 * when there is a control channel (COHORT_CONTROL_FD) and it ends while
 * this rank connects it (the agent's `reshape`, a member lost): the
 * communicator returned is the next form's, cohort_comm_epoch says which.
 */
COHORT_API int cohort_comm_create(const cohort_comm_config *cfg, cohort_comm **out);

/* cohort_comm_config_from_env() followed by cohort_comm_create(). */
COHORT_API int cohort_comm_create_from_env(cohort_comm **out);

/* Releases everything the communicator holds. NULL is a no-op. */
COHORT_API void cohort_comm_destroy(cohort_comm *comm);

/*
 * Aborts the communicator: pending and later operations fail with
 * COHORT_EABORTED and peers see the connections close. Safe to call more than
 * once. Does not free the communicator.
 */
COHORT_API void cohort_comm_abort(cohort_comm *comm);

COHORT_API int cohort_comm_rank(const cohort_comm *comm);
COHORT_API int cohort_comm_size(const cohort_comm *comm);

/* Changes the default deadline of later operations (milliseconds, > 0). */
COHORT_API int cohort_comm_set_timeout(cohort_comm *comm, int timeout_ms);

/*
 * A one-line description of the error that aborted the communicator (naming
 * the peer rank where there is one), or "" when it is healthy. Valid until
 * the communicator is destroyed.
 */
COHORT_API const char *cohort_comm_error_message(const cohort_comm *comm);

/* 0 while the communicator is healthy, else the error that aborted it (COHORT_ERESHAPED once its
 * membership ended: a peer lost, or the agent's reshape). Cheap, from any thread: a long
 * computation between collectives can look whether to go on. */
COHORT_API int cohort_comm_failed(const cohort_comm *comm);

/*
 * Re-forming a communicator (`cohort run --on-failure reform`; docs/reform.md
 * and docs/collectives.md "Re-forming a communicator").
 *
 * Under that policy the agent gives each worker a control channel
 * (COHORT_CONTROL_FD); cohort_comm_create() then tells the agent this
 * process takes part ("hello"), and a thread of the communicator listens to
 * it. When the membership ends (a peer lost: its connection closed, its
 * process gone, or the agent's "reshape" message), the collective in flight,
 * every queued one and every later one return COHORT_ERESHAPED on every
 * survivor (promptly: never the operation timeout), and
 * cohort_comm_error_message() says why. Only one communicator of a process
 * owns the channel (the first created while it is set); others never
 * re-form.
 *
 * A program then calls cohort_comm_reform(), and continues with the new rank
 * and size. Survivors keep their relative order, newcomers come after them.
 */

/*
 * Leaves the ended membership and joins the next one, in place (the same
 * pointer). Called before the membership ended, it ends it (a peer's
 * collective still in flight then returns COHORT_ERESHAPED). Releases
 * everything of the old membership: requests still queued
 * complete with COHORT_ERESHAPED (wait on them as usual), connections, the
 * shared-memory segment and the peers' mappings of cohort_mem_alloc buffers
 * are closed or unmapped. A cohort_mem_alloc buffer of the old membership
 * stays valid as this process's private memory, its contents kept; it no
 * longer takes the single-copy path, and cohort_mem_free() releases it
 * without involving the peers (not collective). Allocate anew for the
 * single-copy path in the new membership.
 * Then tells the agent "ready", waits for the new membership ("form": rank,
 * size, store, job, round), connects it under its round, and tells the agent
 * "formed". Returns 0 with cohort_comm_rank/size/epoch the new ones;
 * COHORT_EABORTED when the agent stops the job or the channel closes (the
 * agent's reason in cohort_comm_error_message); COHORT_EPROTO for a malformed
 * control message; COHORT_ERESHAPED when the new membership ended while it
 * was being connected, or a member of it was lost or never came (within the
 * communicator's timeout): call it again; -ETIMEDOUT when no membership formed
 * within COHORT_REFORM_TIMEOUT_MS (default 600000); -ENOTSUP without a
 * control channel. Call it with no request of the communicator in use by
 * another thread.
 */
COHORT_API int cohort_comm_reform(cohort_comm *comm);

/*
 * Defers the end of a membership when a node joins (on: 1; 0: off, the
 * default). A reshape for a loss ends a membership at once (as above); the
 * agent's reshape for a node joining (grow=1 in docs/reform.md) ends a
 * membership whose members all live, so its collectives could go on. With
 * the deferral on, such a reshape does not fail the communicator: its
 * collectives complete as usual, cohort_comm_grow_pending() says 1, and the
 * program agrees with its peers on a step boundary (e.g. a flag in a
 * reduction every rank makes) and re-forms there, every rank after the same
 * collectives: a cohort_barrier() first (its result aside: a peer through it
 * may have closed its connections already), so that no rank closes a
 * connection a peer still needs, then cohort_comm_reform(). Bounded: a
 * communicator not
 * re-formed within COHORT_GROW_DEFER_MS (default 20000; 0: no deferral), or
 * within the limit the agent gives (defer_ms=, a third of
 * --reform-timeout) when that is lower, fails with COHORT_ERESHAPED as for
 * any reshape; so does a loss (a reshape without grow=1, a peer's
 * connection breaking) or the agent's stop while a grow is pending. Turned
 * off with a grow pending, the membership ends at once. Returns 0,
 * COHORT_ENOENV for a malformed COHORT_GROW_DEFER_MS, -ENOTSUP without a
 * control channel.
 */
COHORT_API int cohort_comm_defer_grow(cohort_comm *comm, int on);

/*
 * Breaks a step that has barely begun rather than defer a node's joining to
 * its end (with cohort_comm_defer_grow on). Called as each step begins with
 * the part of a step's time within which breaking it is the cheaper choice
 * (deferring saves the ranks the part of the step already done and costs
 * the newcomer the part still to do): a grow that comes within the next `ms`
 * milliseconds is not deferred but ends the membership at once, as a loss
 * does (the collective in flight returns COHORT_ERESHAPED, its message naming
 * this call; every peer's then fails too, so every rank drops the step); one
 * that comes later is deferred as before. A grow already pending (it came
 * after the last boundary's agreement) ends the membership now when ms > 0:
 * returns 1 then, so the program need not start the step. ms 0 (the default)
 * defers every grow; a re-form clears it. Returns 0 or 1, -EINVAL for ms < 0,
 * -ENOTSUP without a control channel.
 */
COHORT_API int cohort_comm_grow_break_for(cohort_comm *comm, int ms);

/* 1 while a node's joining is deferred (cohort_comm_defer_grow): re-form at the next boundary the
 * ranks agree on; else 0 (or -EINVAL). Cheap, from any thread. */
COHORT_API int cohort_comm_grow_pending(const cohort_comm *comm);

/* The number of the current membership: the agent's rendezvous round
 * (TORCHELASTIC_RESTART_COUNT at create, the form's epoch after a re-form). */
COHORT_API int cohort_comm_epoch(const cohort_comm *comm);

/*
 * 1 when `rank` of the current membership has no training state yet: a
 * process started with COHORT_NEWCOMER=1 (the agent's newcomers), or one that
 * called cohort_comm_mark_new(), until a cohort_comm_state_transfer()
 * completes; else 0 (or -EINVAL). Every rank knows every rank's bit.
 */
COHORT_API int cohort_comm_is_new(const cohort_comm *comm, int rank);

/* Counts this rank as new (it wants the state, e.g. it is behind the other
 * survivors) from the next cohort_comm_state_transfer() on. */
COHORT_API int cohort_comm_mark_new(cohort_comm *comm);

/* The last completed training step, reported in the "ready" and "formed"
 * messages to the agent (-1, the default: unknown). */
COHORT_API int cohort_comm_set_step(cohort_comm *comm, int64_t step);

/*
 * Hands training state to the new ranks. Collective over all ranks, each
 * passing the same `bytes` (else COHORT_EMISMATCH on all): the donor, the
 * lowest rank that is not new, sends `bytes` from buf to every new rank at
 * once along a pipelined chain (donor -> first new rank -> next ...; each
 * link carries the bytes once, at its rate); the new ranks receive into buf;
 * the other ranks only agree that it ended. On success every rank's new bit
 * clears. No new rank: returns 0 (after one small allgather that agrees on
 * the bits and the size). Every rank new: COHORT_ENOSTATE (load a
 * checkpoint). A rank lost during the transfer: COHORT_ERESHAPED on every
 * rank; after the next re-form the lowest surviving non-new rank donates.
 */
COHORT_API int cohort_comm_state_transfer(cohort_comm *comm, void *buf, size_t bytes);

/* One piece of the state for cohort_comm_state_transferv. */
typedef struct cohort_iov {
  void *base;
  size_t len;
} cohort_iov;

/*
 * cohort_comm_state_transfer of a state in n pieces, sent and received in
 * place (the model's own buffers: nothing packed into one buffer first).
 * Every rank passes pieces of the same sizes in the same order (else
 * COHORT_EMISMATCH on all; empty pieces do not count). A transfer that fails
 * part way leaves the new ranks' pieces partly written and their new bit
 * set, as cohort_comm_state_transfer does.
 */
COHORT_API int cohort_comm_state_transferv(cohort_comm *comm, const cohort_iov *iov, int n);

/*
 * The state streamed to the new ranks in the background, while the
 * communicator's collectives go on (docs/collectives.md "State in the
 * background"). Collective over all ranks (each passing pieces of the same
 * sizes in the same order, else COHORT_EMISMATCH on all): one allgather agrees
 * on the new bits, then every rank that is not new (a donor: all hold the same
 * state) sends its share of the pieces' bytes, a contiguous range of their
 * concatenation (donor j of d: the j-th d-th, in rank order), over a
 * connection of its own to each new rank, which receives from every donor at
 * once; a thread on each end moves the bytes: the donors' pieces must stay
 * unchanged (a snapshot) and the new ranks' untouched until the stream has
 * ended. Returns 0 with *out (also when there is no new rank: it has then
 * ended at once), COHORT_ENOSTATE when every rank is new, or an error (on
 * every rank). COHORT_STREAM_RATE (bytes per second) caps each donor's
 * sending of its share, to leave the link to the training.
 */
typedef struct cohort_stream cohort_stream;
COHORT_API int cohort_comm_state_stream_begin(cohort_comm *comm, const cohort_iov *iov, int n,
                                              cohort_stream **out);
/*
 * cohort_comm_state_stream_begin with flags. COHORT_STREAM_COPY: each donor's
 * thread first copies its share of the pieces, and only its share (B/d bytes
 * of B with d donors), into memory of the stream's own, and sends from that
 * copy: the donor's pieces must stay unchanged only until
 * cohort_comm_state_stream_wait_copy has returned, not until the stream has
 * ended, and no donor needs a snapshot of the whole state. Ignored on the new
 * ranks. Other bits: -EINVAL.
 */
#define COHORT_STREAM_COPY 1u
COHORT_API int cohort_comm_state_stream_begin_flags(cohort_comm *comm, const cohort_iov *iov, int n,
                                                    unsigned flags, cohort_stream **out);
/* A donor begun with COHORT_STREAM_COPY: blocks until its thread has copied its share (a fraction
 * of a second per GB), then returns 0 with *bytes (may be NULL) the copy's size, or the error that
 * ended the stream first; its pieces may change from then on. 0 (*bytes 0) at once on a rank that
 * does not donate or whose share is empty; -EINVAL on a donor begun without the flag. */
COHORT_API int cohort_comm_state_stream_wait_copy(cohort_stream *s, size_t *bytes);
/* Never blocks: 0 while the stream runs, 1 once it has ended well on this rank (a receiver: every
 * byte from every donor in; a donor: every receiver said so; all at once when nobody is new), else
 * the error that ended it (COHORT_EPEER: a process or connection at the other end is gone, any
 * donor's for a receiver; -ETIMEDOUT: no progress within the communicator's timeout). *bytes (may
 * be NULL): bytes moved so far (a receiver: from all donors; a donor: of its share). */
COHORT_API int cohort_comm_state_stream_poll(const cohort_stream *s, size_t *bytes);
/* Stops the stream if it still runs (-ECANCELED), waits for its thread, closes its connections and
 * frees it; returns 0 when it had ended well, else its error. A receiver whose stream ended well is
 * no longer new (cohort_comm_is_new on this rank; the others learn it from the caller's own
 * agreement, and the next membership's bootstrap). Not collective. */
COHORT_API int cohort_comm_state_stream_end(cohort_comm *comm, cohort_stream *s);

/*
 * Memory the ranks of one host share: a buffer from cohort_mem_alloc can be
 * read and written by the communicator's other ranks on this host, so a
 * large allreduce whose send and recv buffers all come from it (on every
 * rank, when all ranks share one host) reduces straight from the peers'
 * buffers into everyone's result, with no intermediate copy: each rank
 * reduces its 1/n of the elements and writes them to every rank's recv.
 * COHORT_SINGLE_COPY=0 turns that path off (the buffers still work with
 * every collective, through the ordinary algorithms). Collective: every rank
 * calls cohort_mem_alloc with the same bytes and cohort_mem_free on the
 * matching buffer, in the same order, with none of its requests pending;
 * the result is page-aligned and zero-filled, its pages reserved in
 * /dev/shm (-ENOSPC when it is too small). Without local peers it is ordinary memory. Returns 0
 * or an error (then on every rank, and *ptr is NULL). Free before destroying the communicator, or
 * the destroy frees it.
 */
COHORT_API int cohort_mem_alloc(cohort_comm *comm, size_t bytes, void **ptr);
COHORT_API int cohort_mem_free(cohort_comm *comm, void *ptr);

/*
 * Blocking collectives. `send == recv` means in place. Counts are in
 * elements; count 0 is valid and does nothing but still synchronises
 * arguments checks.
 *
 * allreduce:      recv[i] = op over ranks of send[i], i < count.
 * reduce_scatter: send holds size*recvcount elements; rank r receives the
 *                 reduction of block r in recv (recvcount elements).
 *                 In place: send == recv, the result lands in block r.
 * allgather:      send holds sendcount elements; recv holds size*sendcount,
 *                 block r from rank r. In place: send == recv + rank*sendcount.
 * broadcast:      buf of root is copied to buf of every rank.
 * reduce:         like allreduce but only root's recv is written; recv may be
 *                 NULL on other ranks.
 *
 * A large allreduce of ranks all on one host on ordinary buffers (not from
 * cohort_mem_alloc) moves each buffer's whole 2 MiB pieces onto transparent
 * huge pages, once, from the second allreduce on the same memory on
 * (madvise MADV_COLLAPSE; the pieces at its ends too where every page of
 * them is already in memory, so no memory is added): the peers then reach
 * it 2 MiB at a time. The contents stay as they were;
 * COHORT_SHM_COLLAPSE=0 leaves the pages alone, and nothing is done where
 * huge pages are "never".
 */
COHORT_API int cohort_allreduce(cohort_comm *comm, const void *send, void *recv, size_t count,
                                cohort_dtype dtype, cohort_redop op);
COHORT_API int cohort_reduce_scatter(cohort_comm *comm, const void *send, void *recv,
                                     size_t recvcount, cohort_dtype dtype, cohort_redop op);
COHORT_API int cohort_allgather(cohort_comm *comm, const void *send, void *recv, size_t sendcount,
                                cohort_dtype dtype);
COHORT_API int cohort_broadcast(cohort_comm *comm, void *buf, size_t count, cohort_dtype dtype,
                                int root);
COHORT_API int cohort_reduce(cohort_comm *comm, const void *send, void *recv, size_t count,
                             cohort_dtype dtype, cohort_redop op, int root);
COHORT_API int cohort_barrier(cohort_comm *comm);

/*
 * Asynchronous variants: start the operation and return at once with a
 * request; the library makes progress on its own while the caller computes.
 * Buffers must stay valid and untouched until the request completes.
 * Requests complete in the order they were started. Each request must be
 * finished with cohort_request_wait() (which also frees it).
 */
COHORT_API int cohort_iallreduce(cohort_comm *comm, const void *send, void *recv, size_t count,
                                 cohort_dtype dtype, cohort_redop op, cohort_request **req);
COHORT_API int cohort_ireduce_scatter(cohort_comm *comm, const void *send, void *recv,
                                      size_t recvcount, cohort_dtype dtype, cohort_redop op,
                                      cohort_request **req);
COHORT_API int cohort_iallgather(cohort_comm *comm, const void *send, void *recv, size_t sendcount,
                                 cohort_dtype dtype, cohort_request **req);
COHORT_API int cohort_ibroadcast(cohort_comm *comm, void *buf, size_t count, cohort_dtype dtype,
                                 int root, cohort_request **req);

/*
 * Compressed reductions: an allreduce or reduce-scatter of a COHORT_F32
 * buffer whose bytes travel as `wire`, COHORT_BF16 or COHORT_F16 (half the
 * bytes of the f32 collective). Each rank's input is rounded to the wire
 * type (to nearest even), every partial result is computed in f32 and
 * rounded to the wire type as it travels, and the result is widened back to
 * f32 in recv: values exactly representable in the wire type, with sums that
 * are too, come out exact; otherwise the error is that of the wire type's
 * rounding at each of the algorithm's steps (about 2^-8 relative per step
 * for bf16, 2^-11 for f16, whose range is also only +-65504). The
 * communicator keeps two buffers of the wire type, each as large as the largest such
 * operation so far (half of its f32 bytes), until it is destroyed: one for the operation
 * executing, one for the next queued one's input, rounded while the first waits on the link
 * (unless the first writes it). All ranks must call it with the
 * same wire type (a peer calling the f32 collective fails with COHORT_EMISMATCH). wire == dtype is
 * the plain collective; any other combination is -EINVAL. Semantics,
 * in-place use and ordering are those of the plain functions above.
 */
COHORT_API int cohort_allreduce_wire(cohort_comm *comm, const void *send, void *recv, size_t count,
                                     cohort_dtype dtype, cohort_dtype wire, cohort_redop op);
COHORT_API int cohort_iallreduce_wire(cohort_comm *comm, const void *send, void *recv, size_t count,
                                      cohort_dtype dtype, cohort_dtype wire, cohort_redop op,
                                      cohort_request **req);
COHORT_API int cohort_reduce_scatter_wire(cohort_comm *comm, const void *send, void *recv,
                                          size_t recvcount, cohort_dtype dtype, cohort_dtype wire,
                                          cohort_redop op);
COHORT_API int cohort_ireduce_scatter_wire(cohort_comm *comm, const void *send, void *recv,
                                           size_t recvcount, cohort_dtype dtype, cohort_dtype wire,
                                           cohort_redop op, cohort_request **req);
/* The allgather of an f32 buffer whose blocks travel as `wire`: every rank's block is rounded to
 * the wire type (its own in recv too), so all ranks receive the same values; blocks exact in the
 * wire type (a reduce-scatter_wire's results) arrive exact. Buffers and ordering as
 * cohort_allgather. */
COHORT_API int cohort_allgather_wire(cohort_comm *comm, const void *send, void *recv,
                                     size_t sendcount, cohort_dtype dtype, cohort_dtype wire);
COHORT_API int cohort_iallgather_wire(cohort_comm *comm, const void *send, void *recv,
                                      size_t sendcount, cohort_dtype dtype, cohort_dtype wire,
                                      cohort_request **req);

/* Sets *done to 1 when the request has finished (then wait returns at once). */
COHORT_API int cohort_request_test(cohort_request *req, int *done);

/* Waits for the request, frees it and returns its result. NULL returns 0. */
COHORT_API int cohort_request_wait(cohort_request *req);

#ifdef __cplusplus
}
#endif

#endif /* COHORT_COHORT_H */

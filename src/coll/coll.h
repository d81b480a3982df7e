/*
 * coll.h - internals of libcohort's collectives.
 *
 * Three layers, each knowing only the one below:
 *
 *   algorithms (algo.c)   ring, recursive doubling, trees, chains; they call
 *                         coll_sendrecv() and friends with peer ranks and
 *                         byte ranges, and know nothing of transports.
 *   engine (engine.c)     frames every message with a header describing the
 *                         collective (mismatch detection), drives several
 *                         transfers at once through the transports, reduces
 *                         as bytes arrive, enforces the deadline, aborts.
 *   transports            an ops table (coll_tport_ops): non-blocking send,
 *   (tcp.c, shm.c)        receive and peek of a byte stream to a peer rank,
 *                         and a blocking wait with a timeout.
 *
 * comm.c holds the public API and the progress thread that executes queued
 * operations in order; bootstrap.c connects the ranks through the rendezvous
 * store, sets the transports up and derives the host groups.
 */
#ifndef COHORT_COLL_COLL_H
#define COHORT_COLL_COLL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "cohort/cohort.h"

/* ---- reduction kernels (reduce.c) ---- */

/* dst[i] = a[i] op b[i] for n elements; dst may be a (exactly). AVG is SUM. */
void coll_reduce(cohort_dtype dt, cohort_redop op, void *dst, const void *a, const void *b,
                 size_t n);
/* Finishes AVG in place: buf[i] /= size (integer division for integer types). */
void coll_reduce_finish(cohort_dtype dt, cohort_redop op, void *buf, size_t n, int size);
/* The two-rank step of a float sum or average in one pass, each input read and each output
 * written once: d0[i] = d1[i] = a[i] + b[i], finished for an average over `fin` ranks when
 * fin > 0. d0 may be a and d1 may be b (exactly). Returns 0 (and touches nothing) for another
 * type or operation, or a divisor that is not a power of two: the caller takes the general path. */
int coll_reduce_pair(cohort_dtype dt, cohort_redop op, void *d0, void *d1, const void *a,
                     const void *b, size_t n, int fin);
float coll_f16_to_f32(uint16_t h);
uint16_t coll_f32_to_f16(float f);
float coll_bf16_to_f32(uint16_t h);
uint16_t coll_f32_to_bf16(float f);
/* f32 <-> a 16-bit wire type (COHORT_BF16 or COHORT_F16), rounding to nearest even. */
void coll_to_wire(cohort_dtype wire, uint16_t *dst, const float *src, size_t n);
void coll_from_wire(cohort_dtype wire, float *dst, const uint16_t *src, size_t n);
const char *coll_dtype_name(cohort_dtype dt);
const char *coll_redop_name(cohort_redop op);

/* A pause inside a spin-wait (lets the sibling hyperthread run, saves power). */
static inline void coll_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* ---- transports ---- */

/* Events a transfer waits for on one peer. */
#define COLL_WANT_SEND 1
#define COLL_WANT_RECV 2

/*
 * A transport is an ops table and an instance (the `void *t` every op takes);
 * the engine reaches each peer through the table the communicator chose for
 * it and never names a transport. A new transport is one file that fills such
 * a table, plus the lines of bootstrap.c that set it up and pick its peers.
 */
typedef struct coll_tport_ops {
  const char *name;
  /* Non-blocking: accepts up to the iov's bytes for peer; returns bytes taken (0 when full) or a
   * negative error. */
  long (*send)(void *t, int peer, const struct iovec *iov, int iovcnt);
  /* Non-blocking: copies up to len bytes from peer; returns bytes (0 when none) or an error. */
  long (*recv)(void *t, int peer, void *buf, size_t len);
  /* Non-blocking: *data points at readable bytes from peer, contiguous, 8-byte aligned when the
   * stream offset is; returns their number (0 when none) or an error. */
  long (*peek)(void *t, int peer, const void **data);
  /* Releases n bytes returned by peek. */
  void (*consume)(void *t, int peer, size_t n);
  /* Blocks until one of peers[i] may make progress on want[i], or timeout_ms passes. Returns 0
   * or an error; *bad_peer names the peer an error concerns. */
  int (*wait)(void *t, const int *peers, const int *want, int n, int timeout_ms, int *bad_peer);
  /* Liveness, for transports whose wait cannot see a peer die (NULL when wait reports it): 1 when
   * peer is gone, checked without waiting. */
  int (*peer_gone)(void *t, int peer);
  /* 1 when bytes from peer wait to be read (a peer that exited may have left some). */
  int (*pending)(void *t, int peer);
  /* Makes every waiter on this transport, here and at the peers, give up with `why` (rank: who
   * aborts). Idempotent; callable from any thread. */
  void (*abort)(void *t, int rank, const char *why);
  /* When a peer aborted through this transport: 1 and its rank and reason (NULL: never). */
  int (*aborted)(void *t, int *rank, char *msg, size_t msglen);
  /* Framing: a message (32-byte header and payload) is padded to a multiple of frame_align and
   * to at least frame_min bytes. */
  unsigned frame_align, frame_min;
  /* Messages up to this many bytes are received whole through one peek when they are (0: no). */
  unsigned peek_whole_max;
  /* 1 when progress shows up in memory rather than in the kernel: a waiter polls a few times
   * before its clocked wait, and in a wait that spans transports it is re-polled, not blocked on.
   */
  int polled;
} coll_tport_ops;

extern const coll_tport_ops coll_tcp_ops;
extern const coll_tport_ops coll_shm_ops;

typedef struct coll_tcp coll_tcp;
typedef struct coll_shm coll_shm;

/* 1 when the connection on fd saw a hang-up or an error (poll with no wait). */
int coll_fd_gone(int fd);

/* TCP: one connected socket per peer (fds[peer], -1 for self). Takes ownership of the fds. */
int coll_tcp_create(int rank, int size, int *fds, size_t staging, coll_tcp **out);
void coll_tcp_destroy(coll_tcp *t);
int coll_tcp_fd(coll_tcp *t, int peer);

/* How long a waiting shared-memory rank spins before it sleeps on its futex (microseconds);
 * COHORT_SHM_SPIN_US overrides it. */
#define COLL_SHM_SPIN_US 10

/*
 * Shared memory among the ranks of one host. `local` lists the world ranks
 * on this host (ascending), my index is `me`. The segment is created by
 * local[0] and opened by the others; see bootstrap.c for the handshake.
 */
typedef struct coll_shm_layout {
  int nlocal;
  size_t chan_bytes; /* ring size of one ordered pair, power of two */
} coll_shm_layout;
size_t coll_shm_segment_size(const coll_shm_layout *l);
int coll_shm_create(const char *name, int creator, const int *local, int nlocal, int me,
                    int world_size, size_t chan_bytes, coll_shm **out);
void coll_shm_destroy(coll_shm *s);
/* Shared memory says nothing when a peer dies; the TCP connection to it does. watch_fds[rank]
 * (world ranks, not owned) is polled for the peer_gone op. */
void coll_shm_watch(coll_shm *s, const int *watch_fds);
/* Lets same-user processes read this one (Yama); call before peers probe. */
void coll_shm_allow_pull(void);
/* 1 when process_vm_readv() can read every other local rank (all have mapped the segment). */
int coll_shm_probe_cma(coll_shm *s);
/* The host-wide decision, published by the creator in the segment. */
int coll_shm_hdr_cma(coll_shm *s);
void coll_shm_set_hdr_cma(coll_shm *s, int on);
/* Large payloads (>= 64 KiB) travel by address and one copy when on; else through the ring. */
void coll_shm_set_cma(coll_shm *s, int on);
int coll_shm_cma(coll_shm *s);
void coll_shm_set_spin(coll_shm *s, int us);
/* The segment's name (no longer in /dev/shm; names of shared buffers derive from it). */
const char *coll_shm_name(const coll_shm *s);
/* 1 when the shm transport reaches `peer`. */
int coll_shm_has(coll_shm *s, int peer);

/* ---- shared buffers (shmbuf.c): cohort_mem_alloc ---- */

/* One cohort_mem_alloc allocation: this rank's mapping and every local rank's (peer[me] = base). */
typedef struct coll_buf {
  char *base;
  size_t bytes, map_bytes;
  char **peer; /* [local.n] */
} coll_buf;

/* The allocation holding [p, p + len) and p's offset in it: its index, or -1. */
int coll_buf_find(cohort_comm *c, const void *p, size_t len, size_t *off);
/* Unmaps every allocation (cohort_comm_destroy). */
void coll_buf_release_all(cohort_comm *c);

/* ---- the communicator ---- */

enum coll_kind {
  COLL_ALLREDUCE = 1,
  COLL_REDUCE_SCATTER,
  COLL_ALLGATHER,
  COLL_BROADCAST,
  COLL_REDUCE,
  COLL_BARRIER,
};

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
  const coll_tport_ops **peer_ops; /* [size] transport of each peer */
  void **peer_t;                   /* [size] its instance */
  int ntports;                     /* the instances in use (for abort) */
  const coll_tport_ops *tport_ops[2];
  void *tport_t[2];
  uint32_t seq;  /* collectives executed so far */
  void *scratch; /* 2 * slice_bytes (bounded staging of algorithms) */
  size_t scratch_bytes;
  /* The wire-type copy of compressed reductions (execute_wire), kept between them: as large as
   * the largest one so far (half its f32 bytes); a fresh one per call cost its page faults on
   * every call, time in which the link sat idle. */
  uint16_t *wire_buf;
  size_t wire_cap; /* elements */
  /* The next queued compressed operation's input, rounded into a second such buffer while the one
   * before it waits on the link (coll_prepare_next): `prep_done` elements of prep_op's input. The
   * two buffers swap when prep_op runs. */
  uint16_t *prep_buf;
  size_t prep_cap;
  const coll_op *prep_op;
  size_t prep_done;
  const coll_op *cur_op; /* the operation executing (its output is not read ahead) */
  uint64_t prepared_ops; /* compressed operations that found their input rounded (for tests) */
  /* Shared buffers (cohort_mem_alloc), the same list on every rank; index -1 entries are freed. */
  coll_buf *bufs;
  int nbufs, live_bufs;
  int single_copy;          /* COHORT_SINGLE_COPY: allreduce straight between shared buffers */
  uint64_t single_copy_ops; /* allreduces that took that path (for tests) */

  /* Failure state: the first error wins. */
  pthread_mutex_t err_mu;
  atomic_int failed;
  int err;
  char errmsg[512];

  /* Queue executed in order by the progress thread (or the caller when idle). */
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

/* Records the first failure (formatted message) and aborts every transport. Returns err. */
int coll_fail(cohort_comm *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Work for the executing thread while its transfers wait: rounds a slice of the next queued
 * compressed operation's input to its wire type. Returns 1 if it did some, 0 if there is none. */
int coll_prepare_next(cohort_comm *c);
/* Shuts transports down so peers notice; idempotent. */
void coll_abort_transports(cohort_comm *c, const char *why);
/* When a peer aborted the communicator through a transport: 1 and who and why. */
int coll_peer_aborted(cohort_comm *c, int *rank, char *msg, size_t msglen);

/* ---- engine: what algorithms use ---- */

typedef struct coll_ctx {
  cohort_comm *comm;
  const coll_op *op;
  uint32_t seq;
  int64_t deadline_ms;
  size_t es; /* element size */
} coll_ctx;

int coll_send(coll_ctx *x, int peer, const void *buf, size_t len);
int coll_recv(coll_ctx *x, int peer, void *buf, size_t len);
/* dst = local op incoming (len bytes, whole elements); dst may equal local. */
int coll_recv_reduce(coll_ctx *x, int peer, const void *local, void *dst, size_t len);
int coll_sendrecv(coll_ctx *x, int speer, const void *sbuf, size_t slen, int rpeer, void *rbuf,
                  size_t rlen);
int coll_sendrecv_reduce(coll_ctx *x, int speer, const void *sbuf, size_t slen, int rpeer,
                         const void *local, void *dst, size_t rlen);

/* ---- algorithms (algo.c): run one collective; 0 or an error ---- */
int coll_run_op(coll_ctx *x);

const char *coll_kind_name(int kind);

/* A completed collective is progress: touches COHORT_HEARTBEAT's file, at most
 * every 200 ms (heartbeat.c; cohort_heartbeat() is the public beat). */
void coll_heartbeat_auto(void);

#endif

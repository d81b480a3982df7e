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
 * comm.c holds the public API, the bootstrap through the rendezvous store and
 * the progress thread that executes queued operations in order.
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
float coll_f16_to_f32(uint16_t h);
uint16_t coll_f32_to_f16(float f);
float coll_bf16_to_f32(uint16_t h);
uint16_t coll_f32_to_bf16(float f);
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
} coll_tport_ops;

extern const coll_tport_ops coll_tcp_ops;
extern const coll_tport_ops coll_shm_ops;

typedef struct coll_tcp coll_tcp;
typedef struct coll_shm coll_shm;

/* TCP: one connected socket per peer (fds[peer], -1 for self). Takes ownership of the fds. */
int coll_tcp_create(int rank, int size, int *fds, size_t staging, coll_tcp **out);
void coll_tcp_destroy(coll_tcp *t);
/* shutdown() of every connection: peers see EOF at once, blocked waits wake. */
void coll_tcp_shutdown(coll_tcp *t);
int coll_tcp_fd(coll_tcp *t, int peer);
/* 1 when the connection to peer saw a hang-up or error (poll with no wait). */
int coll_tcp_peer_gone(coll_tcp *t, int peer);

/*
 * Shared memory among the ranks of one host. `local` lists the world ranks
 * on this host (ascending), my index is `me`. The segment is created by
 * local[0] and opened by the others; see comm.c for the handshake.
 */
typedef struct coll_shm_layout {
  int nlocal;
  size_t chan_bytes; /* ring size of one ordered pair, power of two */
} coll_shm_layout;
size_t coll_shm_segment_size(const coll_shm_layout *l);
int coll_shm_create(const char *name, int creator, const int *local, int nlocal, int me,
                    int world_size, size_t chan_bytes, coll_shm **out);
void coll_shm_destroy(coll_shm *s);
/* Marks the host's segment aborted with a reason and wakes every local rank. */
void coll_shm_abort(coll_shm *s, int rank, const char *msg);
/* When some local rank aborted: returns 1 and copies who and why. */
int coll_shm_aborted(coll_shm *s, int *rank, char *msg, size_t msglen);
/* Wakes this rank's own waits (used by a local abort from another thread). */
void coll_shm_wake_self(coll_shm *s);
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
/* How long a waiting rank spins before it sleeps on its futex (microseconds). */
void coll_shm_set_spin(coll_shm *s, int us);
/* 1 when the shm transport reaches `peer`. */
int coll_shm_has(coll_shm *s, int peer);
/* 1 when bytes from `peer` wait to be read (in the ring, inline or by address). */
int coll_shm_readable(coll_shm *s, int peer);

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
  uint32_t seq;                    /* collectives executed so far */
  void *scratch;                   /* 2 * slice_bytes (bounded staging of algorithms) */
  size_t scratch_bytes;

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

/* Records the first failure (formatted message) and aborts every transport. Returns err. */
int coll_fail(cohort_comm *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Shuts transports down so peers notice; idempotent. */
void coll_abort_transports(cohort_comm *c, const char *why);

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

#endif

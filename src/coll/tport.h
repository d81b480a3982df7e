/*
 * tport.h - the lowest layer of the collectives, the transports (tcp.c,
 * shm.c): each an ops table that moves a byte stream to and from a peer
 * rank, which is all the engine sees of it, and the calls that create and
 * tune one (bootstrap.c).
 */
#ifndef COHORT_COLL_TPORT_H
#define COHORT_COLL_TPORT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* A pause inside a spin-wait (lets the sibling hyperthread run, saves power). */
static inline void coll_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

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
  /* The engine's peer watch (engine.c), while no collective is in flight: an fd whose hang-up
   * (POLLRDHUP, POLLHUP, POLLERR) means peer may be gone, or -1 (NULL: none at all). */
  int (*watch_fd)(void *t, int peer);
  /* After watch_fd hung up, with no collective in flight: 1 when peer left in good order (its
   * stream ends with the goodbye of its communicator's destroy, COLL_BYE), 0 when it was lost. */
  int (*said_bye)(void *t, int peer);
  /* Makes every waiter on this transport, here and at the peers, give up with `why` (rank: who
   * aborts). Idempotent; callable from any thread. */
  void (*abort)(void *t, int rank, const char *why);
  /* The next `bytes` sent to peer are one message, header and padded payload (NULL: not wanted).
   * TCP's abort writes its record into the stream only where it cannot complete a message. */
  void (*frame)(void *t, int peer, size_t bytes);
  /* When a peer aborted through this transport: 1 and its rank and reason (NULL: never). */
  int (*aborted)(void *t, int *rank, char *msg, size_t msglen);
  /* One-sided access to a peer's memory (NULL: none): 1 when get and put reach peer (the
   * instance's set-up decides, the same on every rank of a host). */
  int (*reaches)(void *t, int peer);
  /* Copies len bytes from the peer's address raddr into dst (get), or from src to raddr (put),
   * whole, without the peer taking part. Returns 0 or an error (COHORT_EPEER: it is gone). */
  int (*get)(void *t, int peer, void *dst, uint64_t raddr, size_t len);
  int (*put)(void *t, int peer, uint64_t raddr, const void *src, size_t len);
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

/* The last bytes a communicator's destroy sends on every TCP connection it still has (not after
 * an abort), so that a peer told of the hang-up while idle knows it from a crash. A peer inside a
 * collective reads them as a connection lost, as before. */
#define COLL_BYE                                                                                   \
  "\x7f"                                                                                           \
  "cohort:goodbye\n"
#define COLL_BYE_LEN 16
/* 1 when the stream on fd, after the nstaged bytes at staged that were already read from it,
 * ends with COLL_BYE (the peer hung up; looks at what is queued, reads nothing). */
int coll_fd_said_bye(int fd, const char *staged, size_t nstaged);

/*
 * What a TCP connection carries last when its rank aborts the communicator (tcp.c), so that the
 * peer's error names the reason as shared memory's segment does: COLL_ABORT_LEN bytes, this head,
 * "<rank> <why>" padded with NULs, and a tail of its own. Written between two messages, or inside
 * one with more than COLL_ABORT_LEN bytes left (the stream then ends before the message does),
 * never where its bytes would complete a message. A receiver that finds the head where a message
 * header belongs has lost the peer (engine.c).
 */
#define COLL_ABORT_LEN 448
#define COLL_ABORT_HEAD                                                                            \
  "\x7f"                                                                                           \
  "cohort:aborted\n"
#define COLL_ABORT_TAIL                                                                            \
  "\x7f"                                                                                           \
  "cohort:end-why\n"
#define COLL_ABORT_MARK_LEN 16
/* The abort record that the n bytes at s end with: 1 with its rank and reason (cut to msglen),
 * else 0. */
int coll_tcp_parse_abort(const char *s, size_t n, int *rank, char *msg, size_t msglen);

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
/* Lets this process's siblings (any: every same-user process) read and write it under Yama; call
 * before peers probe. */
void coll_shm_allow_pull(int any);
/* 1 when process_vm_readv() and _writev() reach every other local rank from this one (all have
 * mapped the segment). Every rank must probe: a sandbox may refuse one rank's calls only. */
int coll_shm_probe_cma(coll_shm *s);
/* The host-wide probe result (all ranks' probes), published by the creator in the segment: get
 * and put reach the local peers when it is 1. */
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

#endif

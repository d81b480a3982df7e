/*
 * shm.c - the shared-memory transport among the ranks of one host.
 *
 * One segment per host and communicator holds, for every ordered pair of
 * local ranks, a single-producer single-consumer byte ring (head and tail
 * counters on their own cache lines), plus one doorbell per rank. A rank
 * that cannot progress spins briefly, then announces it is sleeping and
 * sleeps on its doorbell futex; a producer or consumer that moves a counter
 * rings the other side's doorbell only when that side announced sleep. The
 * sequentially consistent store/load pairs on (counter, sleeping) make the
 * lost-wake-up race impossible: either the sleeper sees the new counter or
 * the waker sees the sleeper.
 *
 * Ring sizes are powers of two and every message is padded to 8 bytes, so
 * elements never straddle the wrap and peek hands out aligned pointers.
 *
 * One-sided access (get, put) is process_vm_readv/writev into the peer's
 * address space, offered when the probe at set-up found it working between
 * every pair of local ranks.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "cohort/cohort.h"
#include "coll/tport.h"

#define SHM_MAGIC 0x636f686f72747368ull /* "cohortsh" */
#define SHM_INL_WORDS 6
#define SHM_INL_BYTES (SHM_INL_WORDS * 8)
#define SHM_INL_BUSY (1ull << 63)
#define SHM_INL_OFF(v) ((v) & ((1ull << 56) - 1))
#define SHM_INL_LEN(v) (((v) >> 56) & 0x7fu)

typedef struct shm_hdr {
  _Atomic uint64_t magic;
  uint32_t nlocal;
  uint32_t pad;
  uint64_t chan_bytes;
  _Atomic int32_t abort_owner; /* -1, or the rank that writes abort_msg */
  _Atomic uint32_t abort_flag; /* 1 once abort_msg is complete */
  _Atomic uint32_t cma_ok;     /* 1: process_vm_readv/writev work between all local ranks */
  char abort_msg[400];
} shm_hdr;

typedef struct shm_bell {
  _Atomic uint32_t seq;
  _Atomic uint32_t sleeping;
  int32_t pid; /* for process_vm_readv */
  uint32_t pad0;
  uint64_t probe_addr; /* address of a known word, to test process_vm_readv/writev at setup */
  char pad[40];
} shm_bell;

/*
 * One ordered pair. A send of at most SHM_INL_BYTES that the ring takes whole
 * is also copied into the head's cache line, guarded like a seqlock: the
 * producer marks ihead busy, writes the words, then sets ihead to the stream
 * offset the copy ends at (with its length) before it moves head. A consumer
 * whose tail is where the copy starts takes the bytes from there when ihead
 * read before and after is the same and not busy; otherwise it reads the ring,
 * which holds the same bytes. So a small message costs the consumer one cache
 * line (head and data together) instead of two.
 *
 * Besides the ring, a rendezvous descriptor: a payload of
 * at least SHM_RDV_MIN bytes is not copied into the ring; the producer
 * publishes its address at stream position rdv_pos and waits; the consumer,
 * on reaching that position, pulls it straight from the producer's memory
 * (process_vm_readv, one copy instead of two) and clears rdv_active.
 */
typedef struct shm_ctrl {
  /* Line 1, the producer's: the consumer polls it, so a small message rides along with head. */
  _Atomic uint64_t head;  /* bytes written, by the producer */
  _Atomic uint64_t ihead; /* inline copy: stream offset it ends at | length << 56 | SHM_INL_BUSY */
  _Atomic uint64_t inl[SHM_INL_WORDS]; /* the bytes of the last small send */
  /* Line 2: rendezvous. */
  uint64_t rdv_pos;  /* ring position the remote payload is inserted at */
  uint64_t rdv_addr; /* its address in the producer */
  uint64_t rdv_len;  /* its length (a multiple of 8) */
  _Atomic uint32_t rdv_active;
  char pad1[36];
  /* Line 3, the consumer's. */
  _Atomic uint64_t tail; /* bytes consumed, by the consumer */
  char pad2[56];
} shm_ctrl;
_Static_assert(sizeof(shm_ctrl) == 192, "three cache lines per channel");

#define SHM_RDV_MIN (64u * 1024u)
#define SHM_STAGE (256u * 1024u)

/* This process's view of one peer's channels. */
typedef struct shm_peer {
  uint64_t inl[SHM_INL_WORDS]; /* the consumer's copy of the peer's inline bytes */
  /* The consumer's tail when last read: re-read only when the ring looks full. */
  uint64_t tail_seen;
  size_t tx_rdv;      /* bytes of our payload the peer is pulling now, 0 if none */
  uint64_t rx_pulled; /* bytes of the peer's current remote payload pulled so far */
  char *stage;        /* SHM_STAGE bytes for pulled data that will be reduced */
  size_t stage_pos, stage_len;
} shm_peer;

/* Peers read this word and write its value back at set-up (the process itself never writes it). */
#define SHM_PROBE_VALUE 0x70726f6265636d61ull /* "probecma" */
static volatile uint64_t shm_probe_word = SHM_PROBE_VALUE;

struct coll_shm {
  char *name; /* of the segment (unlinked once mapped); shared buffers' names derive from it */
  char *base;
  size_t size;
  int nlocal, me;
  int world_size;
  int *lidx; /* [world_size]: local index of a world rank, -1 when not on this host */
  size_t cap;
  int spin_us; /* busy-wait this long before sleeping on the doorbell */
  shm_hdr *hdr;
  shm_bell *bells;
  shm_ctrl *ctrl;
  char *data;
  shm_peer *peers; /* [nlocal] */
  int cma;
  int *watch; /* [nlocal]: fd whose hang-up means the peer is gone (not owned), -1 for me */
};

static size_t align_up(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}

static void layout(int nlocal, size_t cap, size_t *bells, size_t *ctrl, size_t *data,
                   size_t *total) {
  size_t n = (size_t)nlocal;
  *bells = align_up(sizeof(shm_hdr), 64);
  *ctrl = *bells + n * sizeof(shm_bell);
  *data = align_up(*ctrl + n * n * sizeof(shm_ctrl), 4096);
  *total = *data + n * n * cap;
}

size_t coll_shm_segment_size(const coll_shm_layout *l) {
  size_t b, c, d, t;
  layout(l->nlocal, l->chan_bytes, &b, &c, &d, &t);
  return t;
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
  return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static void ring_bell(shm_bell *b) {
  if (atomic_load(&b->sleeping)) {
    atomic_fetch_add(&b->seq, 1);
    futex(&b->seq, FUTEX_WAKE, 0x7fffffff, NULL);
  }
}

/* Opens (or creates, exclusively) the segment `name` of `total` bytes and maps it at s->base. */
static int shm_map(coll_shm *s, const char *name, int creator, size_t total) {
  int fd = shm_open(name, creator ? (O_RDWR | O_CREAT | O_EXCL) : O_RDWR, 0600);
  if (fd < 0) return -errno;
  int rc = 0;
  struct stat st;
  if (creator && ftruncate(fd, (off_t)total) != 0)
    rc = -errno;
  else if (fstat(fd, &st) != 0)
    rc = -errno;
  else if ((size_t)st.st_size != total)
    rc = COHORT_EPROTO;
  void *p = rc == 0 ? mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (rc == 0 && p == MAP_FAILED) rc = -errno;
  close(fd);
  if (rc != 0) return rc;
  s->base = p;
  s->size = total;
  return 0;
}

int coll_shm_create(const char *name, int creator, const int *local, int nlocal, int me,
                    int world_size, size_t chan_bytes, coll_shm **out) {
  *out = NULL;
  size_t boff, coff, doff, total;
  layout(nlocal, chan_bytes, &boff, &coff, &doff, &total);
  coll_shm *s = calloc(1, sizeof *s);
  if (s == NULL) return -ENOMEM;
  s->nlocal = nlocal;
  s->me = me;
  s->world_size = world_size;
  s->cap = chan_bytes;
  s->spin_us = COLL_SHM_SPIN_US;
  s->name = strdup(name);
  s->lidx = malloc((size_t)world_size * sizeof(int));
  s->peers = calloc((size_t)nlocal, sizeof *s->peers);
  s->watch = malloc((size_t)nlocal * sizeof *s->watch);
  int rc = s->lidx == NULL || s->peers == NULL || s->watch == NULL || s->name == NULL ? -ENOMEM : 0;
  if (rc == 0) {
    for (int i = 0; i < world_size; i++) s->lidx[i] = -1;
    for (int i = 0; i < nlocal; i++) {
      s->lidx[local[i]] = i;
      s->watch[i] = -1;
    }
    rc = shm_map(s, name, creator, total);
  }
  if (rc == 0) {
    s->hdr = (shm_hdr *)s->base;
    s->bells = (shm_bell *)(s->base + boff);
    s->ctrl = (shm_ctrl *)(s->base + coff);
    s->data = s->base + doff;
    if (creator) {
      /* ftruncate zero-filled everything; only the non-zero fields need setting. */
      s->hdr->nlocal = (uint32_t)nlocal;
      s->hdr->chan_bytes = chan_bytes;
      atomic_store(&s->hdr->abort_owner, -1);
      atomic_store(&s->hdr->magic, SHM_MAGIC);
    } else if (atomic_load(&s->hdr->magic) != SHM_MAGIC || s->hdr->nlocal != (uint32_t)nlocal ||
               s->hdr->chan_bytes != chan_bytes) {
      rc = COHORT_EPROTO;
    }
  }
  if (rc != 0) {
    coll_shm_destroy(s);
    return rc;
  }
  s->bells[me].pid = (int32_t)getpid();
  s->bells[me].probe_addr = (uint64_t)(uintptr_t)&shm_probe_word;
  *out = s;
  return 0;
}

void coll_shm_destroy(coll_shm *s) {
  if (s == NULL) return;
  if (s->base != NULL) munmap(s->base, s->size);
  for (int i = 0; s->peers != NULL && i < s->nlocal; i++) free(s->peers[i].stage);
  free(s->peers);
  free(s->watch);
  free(s->lidx);
  free(s->name);
  free(s);
}

const char *coll_shm_name(const coll_shm *s) {
  return s->name;
}

void coll_shm_watch(coll_shm *s, const int *watch_fds) {
  for (int r = 0; r < s->world_size; r++)
    if (s->lidx[r] >= 0 && s->lidx[r] != s->me) s->watch[s->lidx[r]] = watch_fds[r];
}

static long pull(coll_shm *s, int from, void *dst, uint64_t addr, size_t len) {
  struct iovec l = {.iov_base = dst, .iov_len = len};
  struct iovec r = {.iov_base = (void *)(uintptr_t)addr, .iov_len = len};
  ssize_t n = process_vm_readv((pid_t)s->bells[from].pid, &l, 1, &r, 1, 0);
  return n < 0 ? -errno : (long)n;
}

/* process_vm_readv or _writev of all len bytes between local and addr in local rank p. */
static int cma_whole(coll_shm *s, int p, int write, char *local, uint64_t addr, size_t len) {
  while (len > 0) {
    struct iovec l = {.iov_base = local, .iov_len = len};
    struct iovec r = {.iov_base = (void *)(uintptr_t)addr, .iov_len = len};
    pid_t pid = (pid_t)s->bells[p].pid;
    ssize_t n =
        write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == ESRCH ? COHORT_EPEER : -errno;
    if (n == 0) return -EFAULT;
    local += n;
    addr += (uint64_t)n;
    len -= (size_t)n;
  }
  return 0;
}

void coll_shm_allow_pull(int any) {
  /* Under Yama's ptrace_scope=1 a non-descendant may only read us once we allow it: the ranks of
   * one launcher (agent, torchrun, mpirun) are its children, so our parent and its descendants;
   * anyone of our user when asked for (and when there is no parent to name). */
  pid_t parent = getppid();
  prctl(PR_SET_PTRACER, any || parent <= 1 ? PR_SET_PTRACER_ANY : (unsigned long)parent, 0, 0, 0);
}

int coll_shm_probe_cma(coll_shm *s) {
  for (int i = 0; i < s->nlocal; i++) {
    if (i == s->me) continue;
    uint64_t w = 0;
    if (pull(s, i, &w, s->bells[i].probe_addr, sizeof w) != (long)sizeof w || w != SHM_PROBE_VALUE)
      return 0;
    /* Write the same value back: the direct allreduce puts results into the peers' buffers. */
    struct iovec l = {.iov_base = &w, .iov_len = sizeof w};
    struct iovec r = {.iov_base = (void *)(uintptr_t)s->bells[i].probe_addr, .iov_len = sizeof w};
    if (process_vm_writev((pid_t)s->bells[i].pid, &l, 1, &r, 1, 0) != (ssize_t)sizeof w) return 0;
  }
  return 1;
}

void coll_shm_set_cma(coll_shm *s, int on) {
  s->cma = on;
}

int coll_shm_cma(coll_shm *s) {
  return s != NULL && s->cma;
}

int coll_shm_hdr_cma(coll_shm *s) {
  return (int)atomic_load(&s->hdr->cma_ok);
}

void coll_shm_set_hdr_cma(coll_shm *s, int on) {
  atomic_store(&s->hdr->cma_ok, (uint32_t)on);
}

void coll_shm_set_spin(coll_shm *s, int us) {
  s->spin_us = us;
}

int coll_shm_has(coll_shm *s, int peer) {
  return s != NULL && peer >= 0 && peer < s->world_size && s->lidx[peer] >= 0;
}

/* Marks the host's segment aborted with a reason and wakes every local rank, this one included. */
static void shm_abort(void *sp, int rank, const char *msg) {
  coll_shm *s = sp;
  int32_t expect = -1;
  if (atomic_compare_exchange_strong(&s->hdr->abort_owner, &expect, rank)) {
    snprintf(s->hdr->abort_msg, sizeof s->hdr->abort_msg, "%s", msg);
    atomic_store(&s->hdr->abort_flag, 1);
  }
  for (int i = 0; i < s->nlocal; i++) {
    atomic_fetch_add(&s->bells[i].seq, 1);
    futex(&s->bells[i].seq, FUTEX_WAKE, 0x7fffffff, NULL);
  }
}

static int shm_aborted(void *sp, int *rank, char *msg, size_t msglen) {
  coll_shm *s = sp;
  if (atomic_load(&s->hdr->abort_flag) == 0) return 0;
  *rank = atomic_load(&s->hdr->abort_owner);
  snprintf(msg, msglen, "%s", s->hdr->abort_msg);
  return 1;
}

static int shm_reaches(void *sp, int peer) {
  coll_shm *s = sp;
  return coll_shm_has(s, peer) && coll_shm_hdr_cma(s);
}

static int shm_get(void *sp, int peer, void *dst, uint64_t raddr, size_t len) {
  coll_shm *s = sp;
  return cma_whole(s, s->lidx[peer], 0, dst, raddr, len);
}

static int shm_put(void *sp, int peer, uint64_t raddr, const void *src, size_t len) {
  coll_shm *s = sp;
  return cma_whole(s, s->lidx[peer], 1, (char *)src, raddr, len);
}

static shm_ctrl *chan(coll_shm *s, int from, int to) {
  return &s->ctrl[(size_t)from * (size_t)s->nlocal + (size_t)to];
}

static char *chan_data(coll_shm *s, int from, int to) {
  return s->data + ((size_t)from * (size_t)s->nlocal + (size_t)to) * s->cap;
}

static long shm_send(void *sp, int peer, const struct iovec *iov, int iovcnt) {
  coll_shm *s = sp;
  int to = s->lidx[peer];
  shm_ctrl *c = chan(s, s->me, to);
  shm_peer *pp = &s->peers[to];
  if (pp->tx_rdv > 0) {
    /* A payload handed over by address: done once the peer has pulled all of it. */
    if (atomic_load(&c->rdv_active)) return 0;
    size_t n = pp->tx_rdv;
    pp->tx_rdv = 0;
    return (long)n;
  }
  char *d = chan_data(s, s->me, to);
  uint64_t head = atomic_load_explicit(&c->head, memory_order_relaxed);
  size_t want = 0;
  for (int i = 0; i < iovcnt; i++) want += iov[i].iov_len;
  /* The tail's cache line is the consumer's: fetch it only when the cached value leaves too
   * little room (the common small message then costs no read of it). */
  if (s->cap - (size_t)(head - pp->tail_seen) < want)
    pp->tail_seen = atomic_load_explicit(&c->tail, memory_order_acquire);
  size_t room = s->cap - (size_t)(head - pp->tail_seen);
  size_t done = 0;
  for (int i = 0; i < iovcnt; i++) {
    const char *src = iov[i].iov_base;
    if (s->cma && iov[i].iov_len >= SHM_RDV_MIN) {
      if (done > 0) break; /* publish what is in the ring first */
      c->rdv_pos = head;
      c->rdv_addr = (uint64_t)(uintptr_t)src;
      c->rdv_len = iov[i].iov_len & ~(size_t)7u;
      pp->tx_rdv = c->rdv_len;
      atomic_store(&c->rdv_active, 1);
      ring_bell(&s->bells[to]);
      return 0;
    }
    if (room == 0) break;
    if (i == 0 && iovcnt == 1 && want <= SHM_INL_BYTES && want <= room) {
      /* Small and taken whole: the inline copy first (see shm_ctrl). */
      uint64_t w[SHM_INL_WORDS] = {0};
      memcpy(w, src, want);
      atomic_store_explicit(&c->ihead, SHM_INL_BUSY, memory_order_relaxed);
      atomic_thread_fence(memory_order_release);
      for (size_t k = 0; k < (want + 7) / 8; k++)
        atomic_store_explicit(&c->inl[k], w[k], memory_order_relaxed);
      atomic_store_explicit(&c->ihead, (head + want) | ((uint64_t)want << 56),
                            memory_order_release);
    }
    size_t len = iov[i].iov_len < room ? iov[i].iov_len : room;
    size_t pos = (size_t)(head + done) & (s->cap - 1);
    size_t first = s->cap - pos < len ? s->cap - pos : len;
    memcpy(d + pos, src, first);
    if (len > first) memcpy(d, src + first, len - first);
    done += len;
    room -= len;
    if (len < iov[i].iov_len) break;
  }
  if (done > 0) {
    atomic_store(&c->head, head + done);
    ring_bell(&s->bells[to]);
  }
  return (long)done;
}

/* 1 when the next bytes from `from` are a remote payload (the ring is drained up to it). */
static int at_remote(shm_ctrl *c) {
  if (!atomic_load(&c->rdv_active)) return 0;
  return atomic_load_explicit(&c->tail, memory_order_relaxed) == c->rdv_pos;
}

static void remote_done(coll_shm *s, int from, shm_ctrl *c) {
  shm_peer *pp = &s->peers[from];
  if (pp->rx_pulled == c->rdv_len && pp->stage_pos == pp->stage_len) {
    pp->rx_pulled = 0;
    pp->stage_pos = pp->stage_len = 0;
    atomic_store(&c->rdv_active, 0);
    ring_bell(&s->bells[from]);
  }
}

static long shm_peek(void *sp, int peer, const void **data) {
  coll_shm *s = sp;
  int from = s->lidx[peer];
  shm_ctrl *c = chan(s, from, s->me);
  if (at_remote(c)) {
    /* Pull the next piece into this process's staging buffer for the reduction. */
    shm_peer *pp = &s->peers[from];
    if (pp->stage_pos == pp->stage_len) {
      if (pp->stage == NULL && (pp->stage = malloc(SHM_STAGE)) == NULL) return -ENOMEM;
      size_t want = c->rdv_len - pp->rx_pulled < SHM_STAGE ? c->rdv_len - pp->rx_pulled : SHM_STAGE;
      long n = pull(s, from, pp->stage, c->rdv_addr + pp->rx_pulled, want);
      if (n < 0) return n;
      pp->stage_pos = 0;
      pp->stage_len = (size_t)n;
      pp->rx_pulled += (uint64_t)n;
    }
    *data = pp->stage + pp->stage_pos;
    return (long)(pp->stage_len - pp->stage_pos);
  }
  uint64_t head = atomic_load_explicit(&c->head, memory_order_acquire);
  uint64_t tail = atomic_load_explicit(&c->tail, memory_order_relaxed);
  if (head != tail) {
    uint64_t ih = atomic_load_explicit(&c->ihead, memory_order_acquire);
    uint64_t len = SHM_INL_LEN(ih), end = SHM_INL_OFF(ih);
    if (!(ih & SHM_INL_BUSY) && len > 0 && end - len == tail && end <= head) {
      shm_peer *pp = &s->peers[from];
      for (size_t k = 0; k < (len + 7) / 8; k++)
        pp->inl[k] = atomic_load_explicit(&c->inl[k], memory_order_relaxed);
      atomic_thread_fence(memory_order_acquire);
      if (atomic_load_explicit(&c->ihead, memory_order_relaxed) == ih) {
        *data = pp->inl;
        return (long)len;
      }
    }
  }
  size_t avail = (size_t)(head - tail);
  size_t pos = (size_t)tail & (s->cap - 1);
  if (avail > s->cap - pos) avail = s->cap - pos;
  *data = chan_data(s, from, s->me) + pos;
  return (long)avail;
}

static void shm_consume(void *sp, int peer, size_t n) {
  coll_shm *s = sp;
  int from = s->lidx[peer];
  shm_ctrl *c = chan(s, from, s->me);
  shm_peer *pp = &s->peers[from];
  if (pp->stage_len > 0) {
    pp->stage_pos += n;
    remote_done(s, from, c);
    return;
  }
  uint64_t tail = atomic_load_explicit(&c->tail, memory_order_relaxed);
  atomic_store(&c->tail, tail + n);
  ring_bell(&s->bells[from]);
}

static long shm_recv(void *sp, int peer, void *buf, size_t len) {
  coll_shm *s = sp;
  int from = s->lidx[peer];
  shm_ctrl *c = chan(s, from, s->me);
  shm_peer *pp = &s->peers[from];
  if (pp->stage_len == 0 && at_remote(c)) {
    /* Straight from the producer's memory into the destination: one copy. */
    size_t want = c->rdv_len - pp->rx_pulled < len ? c->rdv_len - pp->rx_pulled : len;
    long n = pull(s, from, buf, c->rdv_addr + pp->rx_pulled, want);
    if (n < 0) return n;
    pp->rx_pulled += (uint64_t)n;
    remote_done(s, from, c);
    return n;
  }
  size_t done = 0;
  /* At most two contiguous pieces (before and after the wrap), or what is staged. */
  for (int k = 0; k < 2 && done < len; k++) {
    const void *src;
    long n = shm_peek(sp, peer, &src);
    if (n <= 0) {
      if (n < 0 && done == 0) return n;
      break;
    }
    size_t m = (size_t)n < len - done ? (size_t)n : len - done;
    memcpy((char *)buf + done, src, m);
    shm_consume(sp, peer, m);
    done += m;
  }
  return (long)done;
}

/* 1 when bytes from local peer p wait to be read: in the ring, by address, or pulled. */
static int rx_ready(coll_shm *s, int p) {
  shm_ctrl *c = chan(s, p, s->me);
  return atomic_load(&c->head) != atomic_load(&c->tail) || at_remote(c) ||
         s->peers[p].stage_pos < s->peers[p].stage_len;
}

/* 1 when some listed transfer can progress now (or the host's segment is aborted). */
static int shm_ready(coll_shm *s, const int *peers, const int *want, int n) {
  if (atomic_load(&s->hdr->abort_flag)) return 1;
  for (int i = 0; i < n; i++) {
    int p = s->lidx[peers[i]];
    if (want[i] & COLL_WANT_SEND) {
      shm_ctrl *c = chan(s, s->me, p);
      if (s->peers[p].tx_rdv > 0) {
        if (!atomic_load(&c->rdv_active)) return 1;
      } else if (atomic_load(&c->head) - atomic_load(&c->tail) < s->cap) {
        return 1;
      }
    }
    if ((want[i] & COLL_WANT_RECV) && rx_ready(s, p)) return 1;
  }
  return 0;
}

static int shm_pending(void *sp, int peer) {
  coll_shm *s = sp;
  return coll_shm_has(s, peer) && rx_ready(s, s->lidx[peer]);
}

static int shm_peer_gone(void *sp, int peer) {
  coll_shm *s = sp;
  return coll_fd_gone(s->watch[s->lidx[peer]]);
}

/* The peer watch: the TCP connection to a local peer carries nothing after the set-up but the
 * goodbye, and closes when its process ends. */
static int shm_watch_fd(void *sp, int peer) {
  coll_shm *s = sp;
  return s->watch[s->lidx[peer]];
}

static int shm_said_bye(void *sp, int peer) {
  return coll_fd_said_bye(shm_watch_fd(sp, peer), NULL, 0);
}

static int shm_wait(void *sp, const int *peers, const int *want, int n, int timeout_ms,
                    int *bad_peer) {
  coll_shm *s = sp;
  (void)bad_peer;
  /* Spin briefly: a peer on another core usually answers within microseconds. No sched_yield():
   * on a loaded machine it hands the core to unrelated processes for whole time slices. */
  int64_t end = 0;
  for (int i = 0;; i++) {
    if (shm_ready(s, peers, want, n)) return 0;
    coll_cpu_relax();
    if ((i & 63) == 63) { /* the clock is read only once the peer is slow to answer */
      int64_t now = base_now_us();
      if (end == 0) end = now + s->spin_us;
      if (now >= end) break;
    }
  }
  shm_bell *me = &s->bells[s->me];
  atomic_store(&me->sleeping, 1);
  uint32_t seq = atomic_load(&me->seq);
  if (!shm_ready(s, peers, want, n) && timeout_ms > 0) {
    struct timespec ts = {.tv_sec = timeout_ms / 1000,
                          .tv_nsec = (long)(timeout_ms % 1000) * 1000000L};
    futex(&me->seq, FUTEX_WAIT, seq, &ts);
  }
  atomic_store(&me->sleeping, 0);
  return 0;
}

const coll_tport_ops coll_shm_ops = {
    .name = "shm",
    .send = shm_send,
    .recv = shm_recv,
    .peek = shm_peek,
    .consume = shm_consume,
    .wait = shm_wait,
    .peer_gone = shm_peer_gone,
    .pending = shm_pending,
    .watch_fd = shm_watch_fd,
    .said_bye = shm_said_bye,
    .abort = shm_abort,
    .aborted = shm_aborted,
    .reaches = shm_reaches,
    .get = shm_get,
    .put = shm_put,
    /* Whole cache lines per message; a small one is exactly as long as the inline copy (the
     * header and up to 16 bytes), so it travels with the ring's head. */
    .frame_align = 64,
    .frame_min = SHM_INL_BYTES,
    .peek_whole_max = 4096,
    .polled = 1,
};

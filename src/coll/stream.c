/* stream.c - the state streamed to new ranks in the background (cohort_comm_state_stream_begin,
 * docs/collectives.md "State in the background").
 *
 * The begin is collective: one allgather over the communicator agrees on every rank's new bit and
 * the pieces' layout; a second hands every rank the donors' addresses. Every rank that is not new
 * is a donor: it holds the same state, so each sends only its share, a contiguous byte range of
 * the pieces' concatenation (donor j of d: bytes [j*B/d, (j+1)*B/d), the remainder spread over the
 * first ones), and listens on a port of its own with a random cookie that only the communicator's
 * members learn. A thread on each donor accepts one connection per new rank and sends its share to
 * all of them, a slice at a time in turn; a thread on each new rank connects to every donor,
 * proves each cookie and receives the shares in parallel into its pieces; the last byte of each
 * share is answered with one byte, so that both ends know it arrived. A thread that fails shuts
 * its connections down, so that the other ends fail at once. The communicator itself is not used
 * by the threads: its collectives go on meanwhile. With COHORT_STREAM_COPY a donor's thread first
 * copies its share, and only its share, into memory of the stream's own and sends from there: the
 * caller's pieces are free once that copy is taken (cohort_comm_state_stream_wait_copy). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "coll/coll.h"

#define STREAM_SLICE ((size_t)1 << 20) /* bytes sent to one receiver before the next's turn */
#define STREAM_COOKIE 16
#define STREAM_IDLE_SLICE ((size_t)256 << 10) /* COHORT_STREAM_IDLE: a collective waits this */
#define STREAM_IDLE_SNDBUF (256 << 10)        /* at most, besides the socket's queue */
#define STREAM_COPY_SLICE ((size_t)64 << 20)  /* bytes copied between two looks at stop */

enum { ROLE_NONE, ROLE_DONOR, ROLE_RECEIVER };

/* What each donor tells every rank in the begin: where it listens (port <= 0: the error that kept
 * it from listening) and the cookie a receiver proves. */
typedef struct stream_card {
  int64_t port;
  unsigned char cookie[STREAM_COOKIE];
  char host[BASE_HOST_MAX];
} stream_card;

/* One connection: a donor's to one receiver, or a receiver's to one donor, with the share that
 * travels on it (offsets in the pieces' concatenation). */
typedef struct stream_peer {
  int fd;
  size_t at, end;   /* the next byte and the share's end */
  int64_t deadline; /* a receiver's: no progress from this donor by then is -ETIMEDOUT */
  stream_card card; /* a receiver's: where its donor listens */
} stream_peer;

struct cohort_stream {
  int role, rank;
  cohort_iov *iov;
  int n;
  size_t bytes;
  size_t lo, hi; /* the donor's share */
  /* COHORT_STREAM_COPY: a donor's copy of its share (bytes [lo, hi) at copy), once `copied`;
   * `ended` once its thread has returned. Both under mu, signalled on cv. */
  char *copy;
  size_t copy_len; /* the memory mapped for it */
  int copied, ended;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int lfd; /* the donor's listening socket */
  stream_peer *peer;
  int npeer, nwant; /* connections made, and wanted (a donor: the new ranks; a receiver: donors) */
  struct pollfd *pfd;
  stream_card card; /* the donor's own address and cookie */
  int timeout_ms;   /* at most this long without progress */
  size_t rate;      /* COHORT_STREAM_RATE: bytes per second each donor sends at most (0: any) */
  /* COHORT_STREAM_IDLE: a donor sends while its communicator has no collective in flight
   * (*inflight 0), and at least `floor` bytes per second whatever it has (0: off). */
  size_t floor;
  atomic_int *inflight;
  pthread_t thread;
  int started;
  atomic_int stop;
  atomic_int result;  /* 1 while it runs, then 0 or the error */
  atomic_size_t done; /* a receiver: bytes in from every donor; a donor: of its share, the
                         slowest receiver's */
};

/* Waits until fd is ready for ev: 0, -ETIMEDOUT after timeout_ms without it, -ECANCELED when the
 * stream was stopped. */
static int wait_fd(cohort_stream *s, int fd, short ev) {
  int64_t deadline = base_deadline_in(s->timeout_ms);
  for (;;) {
    if (atomic_load(&s->stop)) return -ECANCELED;
    struct pollfd p = {.fd = fd, .events = ev};
    int rc = poll(&p, 1, 100);
    if (rc > 0) return 0;
    if (rc < 0 && errno != EINTR) return -errno;
    if (base_now_ms() >= deadline) return -ETIMEDOUT;
  }
}

/* One send or receive without blocking: the bytes moved (0: none yet), or an error
 * (COHORT_EPEER: the other end closed). */
static ssize_t move_some(int fd, char *p, size_t len, int out) {
  ssize_t k = out ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, len, MSG_DONTWAIT);
  if (k == 0) return COHORT_EPEER;
  if (k < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
  if (k < 0) return errno == ECONNRESET || errno == EPIPE ? COHORT_EPEER : -errno;
  return k;
}

/* Moves len bytes on fd (send when out, else receive): 0 or an error (COHORT_EPEER: closed). */
static int move_bytes(cohort_stream *s, int fd, char *p, size_t len, int out) {
  while (len > 0) {
    int rc = wait_fd(s, fd, out ? POLLOUT : POLLIN);
    if (rc != 0) return rc;
    ssize_t k = move_some(fd, p, len, out);
    if (k < 0) return (int)k;
    p += k;
    len -= (size_t)k;
  }
  return 0;
}

/* The byte at offset off of the pieces' concatenation, and how many follow it in its piece. */
static char *locate(const cohort_stream *s, size_t off, size_t *avail) {
  for (int i = 0; i < s->n; i++) {
    if (off < s->iov[i].len) {
      *avail = s->iov[i].len - off;
      return (char *)s->iov[i].base + off;
    }
    off -= s->iov[i].len;
  }
  *avail = 0;
  return NULL;
}

/* The donor's byte at offset off (in its share), from its copy if it took one, and how many of
 * its share follow it there. */
static char *share_byte(const cohort_stream *s, size_t off, size_t *avail) {
  if (s->copy == NULL) {
    char *p = locate(s, off, avail);
    if (*avail > s->hi - off) *avail = s->hi - off;
    return p;
  }
  *avail = s->hi - off;
  return s->copy + (off - s->lo);
}

/* Sets one of the flags the caller waits on (copied, ended) and wakes it. */
static void stream_signal(cohort_stream *s, int *flag) {
  pthread_mutex_lock(&s->mu);
  *flag = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* COHORT_STREAM_COPY: the donor copies bytes [lo, hi) of the pieces, and no other, then says so;
 * the pieces are not read again. */
static int take_copy(cohort_stream *s) {
  if (s->copy == NULL) return 0;
  for (size_t off = s->lo; off < s->hi;) {
    if (atomic_load(&s->stop)) return -ECANCELED;
    size_t len = 0;
    const char *p = locate(s, off, &len);
    if (len > s->hi - off) len = s->hi - off;
    if (len > STREAM_COPY_SLICE) len = STREAM_COPY_SLICE;
    memcpy(s->copy + (off - s->lo), p, len);
    off += len;
  }
  stream_signal(s, &s->copied);
  return 0;
}

/* Holds the donor back to s->rate: sleeps until `sent` bytes are due since t0. */
static void pace(cohort_stream *s, int64_t t0, size_t sent) {
  if (s->rate == 0) return;
  int64_t due = t0 + (int64_t)((double)sent / (double)s->rate * 1e3);
  while (!atomic_load(&s->stop) && base_now_ms() < due) {
    int64_t left = due - base_now_ms();
    base_sleep_ms(left > 100 ? 100 : left);
  }
}

/* COHORT_STREAM_IDLE: holds the donor back while the communicator has a collective in flight,
 * unless it is behind its floor rate (`sent` bytes due since t0). */
static void yield_to_collectives(cohort_stream *s, int64_t t0, size_t sent) {
  if (s->floor == 0) return;
  int64_t due = t0 + (int64_t)((double)sent / (double)s->floor * 1e3);
  while (!atomic_load(&s->stop) && atomic_load(s->inflight) > 0 && base_now_ms() < due)
    base_sleep_ms(1);
}

/* The donor: accepts every receiver (its cookie checked), sends its share to each in turn, then
 * waits for their answers. */
static int donor_run(cohort_stream *s) {
  int crc = take_copy(s);
  if (crc != 0) return crc;
  while (s->npeer < s->nwant) {
    int rc = wait_fd(s, s->lfd, POLLIN);
    if (rc != 0) return rc;
    int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) continue;
    unsigned char got[STREAM_COOKIE];
    if (move_bytes(s, fd, (char *)got, sizeof got, 0) != 0 ||
        memcmp(got, s->card.cookie, sizeof got) != 0) {
      close(fd); /* not one of ours: the receivers' deadline bounds the wait */
      continue;
    }
    /* Yielding to the collectives: little queued in the kernel ahead of theirs. */
    if (s->floor > 0)
      (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &(int){STREAM_IDLE_SNDBUF}, sizeof(int));
    s->peer[s->npeer++] = (stream_peer){.fd = fd, .at = s->lo, .end = s->hi};
  }
  /* Paced: slices of a tenth of a second's bytes at most, so that the rate holds from the start
   * (a share sent from one copy is one run of bytes, not pieces). */
  size_t slice = STREAM_SLICE;
  if (s->rate > 0 && s->rate / 10 < slice) slice = s->rate / 10 > 4096 ? s->rate / 10 : 4096;
  if (s->floor > 0 && slice > STREAM_IDLE_SLICE) slice = STREAM_IDLE_SLICE;
  int64_t t0 = base_now_ms();
  for (size_t off = s->lo; off < s->hi;) {
    size_t len = 0;
    char *p = share_byte(s, off, &len);
    if (len > slice) len = slice;
    yield_to_collectives(s, t0, off - s->lo);
    for (int r = 0; r < s->npeer; r++) {
      int rc = move_bytes(s, s->peer[r].fd, p, len, 1);
      if (rc != 0) return rc;
    }
    off += len;
    atomic_store(&s->done, off - s->lo);
    pace(s, t0, off - s->lo);
  }
  for (int r = 0; r < s->npeer; r++) {
    char ack = 0;
    int rc = move_bytes(s, s->peer[r].fd, &ack, 1, 0);
    if (rc != 0) return rc;
  }
  return 0;
}

/* A receiver's step: one poll over the donors whose shares are not all in, a receive from each
 * that is ready, and the answer to each whose share it completed. Returns 0 or the error
 * (-ETIMEDOUT: a donor without progress for the timeout). */
static int receive_some(cohort_stream *s, size_t *got) {
  for (int k = 0; k < s->npeer; k++) {
    stream_peer *d = &s->peer[k];
    s->pfd[k] = (struct pollfd){.fd = d->at < d->end ? d->fd : -1, .events = POLLIN};
  }
  int rc = poll(s->pfd, (nfds_t)s->npeer, 100);
  if (rc < 0) return errno == EINTR ? 0 : -errno;
  int64_t now = base_now_ms();
  for (int k = 0; k < s->npeer; k++) {
    stream_peer *d = &s->peer[k];
    if (d->at >= d->end) continue;
    if (s->pfd[k].revents != 0) {
      size_t len = 0;
      char *p = locate(s, d->at, &len);
      ssize_t m = move_some(d->fd, p, len < d->end - d->at ? len : d->end - d->at, 0);
      if (m < 0) return (int)m;
      if (m > 0) d->deadline = base_deadline_in(s->timeout_ms);
      d->at += (size_t)m;
      *got += (size_t)m;
      if (d->at == d->end) {
        char ack = 1; /* this donor's share is in: it may end */
        int arc = move_bytes(s, d->fd, &ack, 1, 1);
        if (arc != 0) return arc;
        continue;
      }
    }
    if (now >= d->deadline) return -ETIMEDOUT;
  }
  return 0;
}

/* A receiver: connects to every donor and proves its cookie, receives every share, answers each
 * donor once its share is in. */
static int receiver_run(cohort_stream *s) {
  int rc = 0;
  for (; s->npeer < s->nwant && rc == 0; s->npeer++) {
    stream_peer *d = &s->peer[s->npeer];
    rc = base_tcp_connect(d->card.host, (int)d->card.port, base_deadline_in(s->timeout_ms), &d->fd);
    if (rc != 0) return rc == -ECONNREFUSED ? COHORT_EPEER : rc;
    rc = move_bytes(s, d->fd, (char *)d->card.cookie, STREAM_COOKIE, 1);
    char ack = 1; /* an empty share is in at once */
    if (rc == 0 && d->at == d->end) rc = move_bytes(s, d->fd, &ack, 1, 1);
    d->deadline = base_deadline_in(s->timeout_ms);
  }
  size_t got = 0;
  while (rc == 0 && got < s->bytes) {
    if (atomic_load(&s->stop)) return -ECANCELED;
    rc = receive_some(s, &got);
    atomic_store(&s->done, got);
  }
  return rc;
}

/* A failed end shuts its connections down: the other ends fail at once, not at their timeout. */
static void *stream_thread(void *arg) {
  cohort_stream *s = arg;
  int rc = s->role == ROLE_DONOR ? donor_run(s) : receiver_run(s);
  if (rc != 0) {
    for (int k = 0; k < s->nwant; k++)
      if (s->peer[k].fd >= 0) shutdown(s->peer[k].fd, SHUT_RDWR);
    base_log(BASE_LOG_WARN, "rank %d: the state stream %s failed: %s", s->rank,
             s->role == ROLE_DONOR ? "to the new ranks" : "from the donors", cohort_strerror(rc));
  }
  atomic_store(&s->result, rc);
  stream_signal(s, &s->ended);
  return NULL;
}

static void stream_free(cohort_stream *s) {
  if (s == NULL) return;
  if (s->started) {
    atomic_store(&s->stop, 1);
    pthread_join(s->thread, NULL);
  }
  for (int k = 0; k < s->nwant; k++)
    if (s->peer[k].fd >= 0) close(s->peer[k].fd);
  if (s->lfd >= 0) close(s->lfd);
  if (s->copy != NULL) munmap(s->copy, s->copy_len);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s->peer);
  free(s->pfd);
  free(s->iov);
  free(s);
}

/* The pieces' total and layout (FNV-1a over their lengths, as the blocking transfer). */
static uint64_t stream_layout(const cohort_iov *iov, int n, size_t *bytes) {
  uint64_t h = 1469598103934665603ull;
  *bytes = 0;
  for (int i = 0; i < n; i++) {
    *bytes += iov[i].len;
    for (int k = 0; k < 8 && iov[i].len > 0; k++)
      h = (h ^ ((uint64_t)iov[i].len >> (8 * k) & 0xff)) * 1099511628211ull;
  }
  return h;
}

/* Share j of d donors of `bytes`: its first byte (the end is share j+1's first). */
static size_t share_at(size_t bytes, int j, int d) {
  size_t q = bytes / (size_t)d, rem = bytes % (size_t)d;
  return (size_t)j * q + ((size_t)j < rem ? (size_t)j : rem);
}

/* A donor's own share, and with COHORT_STREAM_COPY the memory for its copy (untouched until the
 * thread copies into it). Returns 0 or -ENOMEM. */
static int own_share(cohort_comm *c, cohort_stream *s, int ndonor, int copy) {
  int j = 0;
  for (int i = 0; i < c->rank; i++) j += !c->newbits[i];
  s->lo = share_at(s->bytes, j, ndonor);
  s->hi = share_at(s->bytes, j + 1, ndonor);
  if (!copy || s->hi == s->lo) return 0;
  size_t len = s->hi - s->lo;
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -ENOMEM;
  (void)madvise(p, len, MADV_HUGEPAGE); /* advisory: half the first touches' cost where granted */
  s->copy = p;
  s->copy_len = len;
  return 0;
}

/* Every donor listens and the cards are allgathered: a receiver learns every donor's, in rank
 * order (donor j sends share j). Returns 0 with the role set, or an error (then on every rank). */
static int stream_cards(cohort_comm *c, cohort_stream *s, int ndonor, int copy) {
  stream_card *all = calloc((size_t)c->size, sizeof *all);
  if (all == NULL) return -ENOMEM;
  if (!c->self_new) {
    int port = 0, lrc = own_share(c, s, ndonor, copy);
    if (lrc == 0) lrc = base_tcp_listen(c->host, 0, s->nwant + 4, &s->lfd, &port);
    if (lrc == 0) lrc = base_random_bytes(s->card.cookie, sizeof s->card.cookie);
    s->card.port = lrc != 0 ? lrc : port;
    snprintf(s->card.host, sizeof s->card.host, "%s", c->host);
  }
  int rc = cohort_allgather(c, &s->card, all, sizeof s->card, COHORT_U8);
  for (int i = 0, j = 0; i < c->size && rc == 0; i++) {
    if (c->newbits[i]) continue;
    if (all[i].port <= 0) rc = all[i].port < 0 ? (int)all[i].port : COHORT_EPROTO;
    size_t at = share_at(s->bytes, j, ndonor), end = share_at(s->bytes, j + 1, ndonor);
    if (c->self_new) s->peer[j] = (stream_peer){.fd = -1, .at = at, .end = end, .card = all[i]};
    j++;
  }
  free(all);
  if (rc == 0 && c->self_new) s->nwant = ndonor;
  if (rc == 0) s->role = c->self_new ? ROLE_RECEIVER : ROLE_DONOR;
  return rc;
}

/* Agrees on the bits and the layout (an allgather), then on the donors' cards. Returns 0 with
 * s->role set (ROLE_NONE: nobody new), or an error (then on every rank). */
static int stream_agree(cohort_comm *c, cohort_stream *s, uint64_t layout, int copy) {
  int n = c->size, nrecv = 0;
  int64_t *all = malloc((size_t)n * 3 * sizeof *all);
  if (all == NULL) return -ENOMEM;
  int64_t mine[3] = {c->self_new, (int64_t)s->bytes, (int64_t)layout};
  int rc = cohort_allgather(c, mine, all, 3, COHORT_I64);
  for (int i = 0; i < n && rc == 0; i++) {
    if (all[3 * i + 1] != (int64_t)s->bytes || all[3 * i + 2] != (int64_t)layout)
      rc = COHORT_EMISMATCH;
    c->newbits[i] = all[3 * i] != 0;
    nrecv += all[3 * i] != 0;
  }
  free(all);
  if (rc == 0 && nrecv == n) rc = COHORT_ENOSTATE;
  if (rc != 0 || nrecv == 0) return rc; /* nothing to stream: no donor either */
  s->nwant = nrecv;                     /* a donor's; a receiver's is the donors' */
  return stream_cards(c, s, n - nrecv, copy);
}

COHORT_API int cohort_comm_state_stream_begin_flags(cohort_comm *c, const cohort_iov *iov, int n,
                                                    unsigned flags, cohort_stream **out) {
  if (out != NULL) *out = NULL;
  if (c == NULL || out == NULL || n < 0 || (iov == NULL && n > 0) || (flags & ~COHORT_STREAM_COPY))
    return -EINVAL;
  for (int i = 0; i < n; i++)
    if (iov[i].base == NULL && iov[i].len > 0) return -EINVAL;
  cohort_stream *s = calloc(1, sizeof *s);
  if (s == NULL) return -ENOMEM;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->lfd = -1;
  s->rank = c->rank;
  s->n = n;
  s->timeout_ms = c->timeout_ms;
  s->iov = malloc((size_t)(n > 0 ? n : 1) * sizeof *iov);
  s->peer = malloc((size_t)c->size * sizeof *s->peer);
  s->pfd = malloc((size_t)c->size * sizeof *s->pfd);
  atomic_init(&s->result, 0);
  int rc = s->iov == NULL || s->peer == NULL || s->pfd == NULL ? -ENOMEM : 0;
  for (int k = 0; k < c->size && s->peer != NULL; k++) s->peer[k] = (stream_peer){.fd = -1};
  if (rc == 0 && n > 0) memcpy(s->iov, iov, (size_t)n * sizeof *iov);
  if (rc == 0) rc = coll_env_size("COHORT_STREAM_RATE", 0, (size_t)1 << 40, &s->rate);
  if (rc == 0) rc = coll_env_size("COHORT_STREAM_IDLE", 0, (size_t)1 << 40, &s->floor);
  s->inflight = &c->inflight;
  uint64_t layout = stream_layout(iov, n, &s->bytes);
  if (rc == 0 && c->size == 1)
    rc = c->self_new ? COHORT_ENOSTATE : 0;
  else if (rc == 0)
    rc = stream_agree(c, s, layout, (flags & COHORT_STREAM_COPY) != 0);
  if (rc == 0 && s->role != ROLE_NONE) {
    atomic_store(&s->result, 1);
    rc = -pthread_create(&s->thread, NULL, stream_thread, s);
    s->started = rc == 0;
  }
  if (rc != 0) {
    stream_free(s);
    return rc;
  }
  *out = s;
  return 0;
}

COHORT_API int cohort_comm_state_stream_begin(cohort_comm *c, const cohort_iov *iov, int n,
                                              cohort_stream **out) {
  return cohort_comm_state_stream_begin_flags(c, iov, n, 0, out);
}

COHORT_API int cohort_comm_state_stream_wait_copy(cohort_stream *s, size_t *bytes) {
  if (bytes != NULL) *bytes = 0;
  if (s == NULL) return -EINVAL;
  if (s->role != ROLE_DONOR) return 0;                  /* nothing of the caller's is read */
  if (s->copy == NULL && s->hi > s->lo) return -EINVAL; /* read until the stream has ended */
  pthread_mutex_lock(&s->mu);
  while (s->copy != NULL && !s->copied && !s->ended) pthread_cond_wait(&s->cv, &s->mu);
  int rc = s->copy == NULL || s->copied ? 0 : atomic_load(&s->result);
  pthread_mutex_unlock(&s->mu);
  if (bytes != NULL && rc == 0) *bytes = s->copy_len;
  return rc;
}

COHORT_API int cohort_comm_state_stream_poll(const cohort_stream *s, size_t *bytes) {
  if (s == NULL) return -EINVAL;
  cohort_stream *m = (cohort_stream *)s; /* atomics only */
  if (bytes != NULL) *bytes = s->role == ROLE_NONE ? 0 : atomic_load(&m->done);
  int rc = atomic_load(&m->result);
  return rc == 1 ? 0 : rc == 0 ? 1 : rc;
}

COHORT_API int cohort_comm_state_stream_end(cohort_comm *c, cohort_stream *s) {
  if (s == NULL) return -EINVAL;
  int rc = atomic_load(&s->result);
  if (rc == 1) rc = -ECANCELED;
  /* A receiver's state is in: it is not new any more (the bootstrap of a later membership says
   * so; the other ranks learn it from the caller's own agreement). */
  if (rc == 0 && s->role == ROLE_RECEIVER && c != NULL) {
    c->self_new = 0;
    c->newbits[c->rank] = 0;
  }
  stream_free(s);
  return rc;
}

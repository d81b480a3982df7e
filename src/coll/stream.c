/* stream.c - the state streamed to new ranks in the background (cohort_comm_state_stream_begin,
 * docs/collectives.md "State in the background").
 *
 * The begin is collective: one allgather over the communicator agrees on every rank's new bit, the
 * pieces' layout and the donor's address (the lowest rank that is not new listens on a port of its
 * own, with a random cookie that only the communicator's members learn). Then a thread on the donor
 * accepts one connection per new rank and sends the pieces to all of them, a slice at a time in
 * turn; a thread on each new rank connects, proves the cookie and receives into its pieces; the
 * last byte answered with one byte, so that both ends know it arrived. The communicator itself is
 * not used by the threads: its collectives go on meanwhile. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "coll/coll.h"

#define STREAM_SLICE ((size_t)1 << 20) /* bytes sent to one receiver before the next's turn */
#define STREAM_COOKIE 16

enum { ROLE_NONE, ROLE_DONOR, ROLE_RECEIVER };

/* What the donor tells every rank in the begin: where it listens (port <= 0: the error that kept
 * it from listening) and the cookie a receiver proves. */
typedef struct stream_card {
  int64_t port;
  unsigned char cookie[STREAM_COOKIE];
  char host[BASE_HOST_MAX];
} stream_card;

struct cohort_stream {
  int role, rank;
  cohort_iov *iov;
  int n;
  size_t bytes;
  int lfd;  /* the donor's listening socket */
  int *fds; /* the donor's receivers, or the receiver's one connection */
  int nfds, nrecv;
  stream_card donor; /* its address and cookie */
  int timeout_ms;    /* at most this long without progress */
  size_t rate;       /* COHORT_STREAM_RATE: bytes per second the donor sends at most (0: any) */
  pthread_t thread;
  int started;
  atomic_int stop;
  atomic_int result;  /* 1 while it runs, then 0 or the error */
  atomic_size_t done; /* bytes every receiver has (the donor: the slowest's) */
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

/* Moves len bytes on fd (send when out, else receive): 0 or an error (COHORT_EPEER: closed). */
static int move_bytes(cohort_stream *s, int fd, char *p, size_t len, int out) {
  while (len > 0) {
    int rc = wait_fd(s, fd, out ? POLLOUT : POLLIN);
    if (rc != 0) return rc;
    ssize_t k =
        out ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, len, MSG_DONTWAIT);
    if (k == 0) return COHORT_EPEER;
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (k < 0) return errno == ECONNRESET || errno == EPIPE ? COHORT_EPEER : -errno;
    p += k;
    len -= (size_t)k;
  }
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

/* The donor: accepts every receiver (its cookie checked), sends the pieces to each in turn, then
 * waits for their answers. */
static int donor_run(cohort_stream *s) {
  while (s->nfds < s->nrecv) {
    int rc = wait_fd(s, s->lfd, POLLIN);
    if (rc != 0) return rc;
    int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) continue;
    unsigned char got[STREAM_COOKIE];
    if (move_bytes(s, fd, (char *)got, sizeof got, 0) != 0 ||
        memcmp(got, s->donor.cookie, sizeof got) != 0) {
      close(fd); /* not one of ours: the receivers' deadline bounds the wait */
      continue;
    }
    s->fds[s->nfds++] = fd;
  }
  int64_t t0 = base_now_ms();
  size_t sent = 0;
  for (int i = 0; i < s->n; i++) {
    for (size_t off = 0; off < s->iov[i].len; off += STREAM_SLICE) {
      size_t len = s->iov[i].len - off < STREAM_SLICE ? s->iov[i].len - off : STREAM_SLICE;
      for (int r = 0; r < s->nfds; r++) {
        int rc = move_bytes(s, s->fds[r], (char *)s->iov[i].base + off, len, 1);
        if (rc != 0) return rc;
      }
      sent += len;
      atomic_store(&s->done, sent);
      pace(s, t0, sent);
    }
  }
  for (int r = 0; r < s->nfds; r++) {
    char ack = 0;
    int rc = move_bytes(s, s->fds[r], &ack, 1, 0);
    if (rc != 0) return rc;
  }
  return 0;
}

/* A receiver: connects to the donor, proves the cookie, receives every piece, answers. */
static int receiver_run(cohort_stream *s) {
  int fd = -1;
  int rc =
      base_tcp_connect(s->donor.host, (int)s->donor.port, base_deadline_in(s->timeout_ms), &fd);
  if (rc != 0) return rc == -ECONNREFUSED ? COHORT_EPEER : rc;
  s->fds[0] = fd;
  s->nfds = 1;
  rc = move_bytes(s, fd, (char *)s->donor.cookie, STREAM_COOKIE, 1);
  size_t got = 0;
  for (int i = 0; i < s->n && rc == 0; i++) {
    for (size_t off = 0; off < s->iov[i].len && rc == 0; off += STREAM_SLICE) {
      size_t len = s->iov[i].len - off < STREAM_SLICE ? s->iov[i].len - off : STREAM_SLICE;
      rc = move_bytes(s, fd, (char *)s->iov[i].base + off, len, 0);
      got += rc == 0 ? len : 0;
      atomic_store(&s->done, got);
    }
  }
  char ack = 1;
  return rc == 0 ? move_bytes(s, fd, &ack, 1, 1) : rc;
}

static void *stream_thread(void *arg) {
  cohort_stream *s = arg;
  int rc = s->role == ROLE_DONOR ? donor_run(s) : receiver_run(s);
  if (rc != 0)
    base_log(BASE_LOG_WARN, "rank %d: the state stream %s failed: %s", s->rank,
             s->role == ROLE_DONOR ? "to the new ranks" : "from the donor", cohort_strerror(rc));
  atomic_store(&s->result, rc);
  return NULL;
}

static void stream_free(cohort_stream *s) {
  if (s == NULL) return;
  if (s->started) {
    atomic_store(&s->stop, 1);
    pthread_join(s->thread, NULL);
  }
  for (int i = 0; i < s->nfds; i++) close(s->fds[i]);
  if (s->lfd >= 0) close(s->lfd);
  free(s->fds);
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

/* Agrees on the bits and the layout (an allgather), then the donor, the lowest rank not new,
 * listens and hands its card to every rank (a broadcast). Returns 0 with s->role set, or an error
 * (then on every rank). */
static int stream_agree(cohort_comm *c, cohort_stream *s, uint64_t layout) {
  int n = c->size, first = -1;
  int64_t *all = malloc((size_t)n * 3 * sizeof *all);
  if (all == NULL) return -ENOMEM;
  int64_t mine[3] = {c->self_new, (int64_t)s->bytes, (int64_t)layout};
  int rc = cohort_allgather(c, mine, all, 3, COHORT_I64);
  for (int i = 0; i < n && rc == 0; i++) {
    if (all[3 * i + 1] != (int64_t)s->bytes || all[3 * i + 2] != (int64_t)layout)
      rc = COHORT_EMISMATCH;
    c->newbits[i] = all[3 * i] != 0;
    if (first < 0 && all[3 * i] == 0) first = i;
    s->nrecv += all[3 * i] != 0;
  }
  free(all);
  if (rc == 0 && first < 0) rc = COHORT_ENOSTATE;
  if (rc != 0 || s->nrecv == 0) return rc; /* nothing to stream: no donor either */
  stream_card *card = &s->donor;
  if (c->rank == first) {
    int port = 0, lrc = base_tcp_listen(c->host, 0, n + 4, &s->lfd, &port);
    if (lrc == 0) lrc = base_random_bytes(card->cookie, sizeof card->cookie);
    card->port = lrc != 0 ? lrc : port;
    snprintf(card->host, sizeof card->host, "%s", c->host);
  }
  rc = cohort_broadcast(c, card, sizeof *card, COHORT_U8, first);
  if (rc == 0 && card->port <= 0) rc = card->port < 0 ? (int)card->port : COHORT_EPROTO;
  if (rc == 0) s->role = c->self_new ? ROLE_RECEIVER : c->rank == first ? ROLE_DONOR : ROLE_NONE;
  return rc;
}

COHORT_API int cohort_comm_state_stream_begin(cohort_comm *c, const cohort_iov *iov, int n,
                                              cohort_stream **out) {
  if (out != NULL) *out = NULL;
  if (c == NULL || out == NULL || n < 0 || (iov == NULL && n > 0)) return -EINVAL;
  for (int i = 0; i < n; i++)
    if (iov[i].base == NULL && iov[i].len > 0) return -EINVAL;
  cohort_stream *s = calloc(1, sizeof *s);
  if (s == NULL) return -ENOMEM;
  s->lfd = -1;
  s->rank = c->rank;
  s->n = n;
  s->timeout_ms = c->timeout_ms;
  s->iov = malloc((size_t)(n > 0 ? n : 1) * sizeof *iov);
  s->fds = malloc((size_t)c->size * sizeof(int));
  atomic_init(&s->result, 0);
  int rc = s->iov == NULL || s->fds == NULL ? -ENOMEM : 0;
  if (rc == 0 && n > 0) memcpy(s->iov, iov, (size_t)n * sizeof *iov);
  if (rc == 0) rc = coll_env_size("COHORT_STREAM_RATE", 0, (size_t)1 << 40, &s->rate);
  uint64_t layout = stream_layout(iov, n, &s->bytes);
  if (rc == 0 && c->size == 1)
    rc = c->self_new ? COHORT_ENOSTATE : 0;
  else if (rc == 0)
    rc = stream_agree(c, s, layout);
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

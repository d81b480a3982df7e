/*
 * tcp.c - the TCP transport: one connected socket per peer, used
 * non-blockingly.
 *
 * Receives land in a fixed per-peer staging buffer (allocated on first use)
 * so that reductions can read whole elements of what has arrived while the
 * kernel keeps receiving the rest; large plain copies bypass staging and go
 * straight into the destination. The staging index of a byte is kept equal
 * to its stream offset modulo 8, so elements handed out by peek are aligned.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "cohort/cohort.h"
#include "coll/tport.h"

typedef struct tcp_peer {
  int fd;
  char *buf; /* staging, `cap` bytes */
  size_t rpos, wpos;
  uint64_t rx_off; /* stream offset of buf[rpos] */
  size_t eof_have; /* after the peer's end of stream: what staging held at the last peek */
} tcp_peer;

struct coll_tcp {
  int rank, size;
  size_t cap;
  tcp_peer *peers;
};

int coll_tcp_create(int rank, int size, int *fds, size_t staging, coll_tcp **out) {
  coll_tcp *t = calloc(1, sizeof *t);
  if (t == NULL) return -ENOMEM;
  t->peers = calloc((size_t)size, sizeof *t->peers);
  if (t->peers == NULL) {
    free(t);
    return -ENOMEM;
  }
  t->rank = rank;
  t->size = size;
  t->cap = staging < 4096 ? 4096 : staging;
  for (int i = 0; i < size; i++) {
    t->peers[i].fd = fds[i];
    fds[i] = -1;
    if (t->peers[i].fd >= 0) base_set_nonblock(t->peers[i].fd, 1);
  }
  *out = t;
  return 0;
}

void coll_tcp_destroy(coll_tcp *t) {
  if (t == NULL) return;
  for (int i = 0; i < t->size; i++) {
    /* The goodbye: fails (EPIPE) after an abort shut the connection down, as it should. */
    if (t->peers[i].fd >= 0)
      (void)!send(t->peers[i].fd, COLL_BYE, COLL_BYE_LEN, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (t->peers[i].fd >= 0) close(t->peers[i].fd);
    free(t->peers[i].buf);
  }
  free(t->peers);
  free(t);
}

/* shutdown() of every connection: peers see EOF at once, blocked waits wake. */
static void tcp_abort(void *tp, int rank, const char *why) {
  coll_tcp *t = tp;
  (void)rank;
  (void)why; /* a TCP peer learns only that the connection ended; shm carries the reason */
  for (int i = 0; i < t->size; i++)
    if (t->peers[i].fd >= 0) shutdown(t->peers[i].fd, SHUT_RDWR);
}

int coll_tcp_fd(coll_tcp *t, int peer) {
  return t->peers[peer].fd;
}

int coll_fd_gone(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  if (p.fd < 0) return 1;
  if (poll(&p, 1, 0) <= 0) return 0;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* The bytes queued on fd are looked at only up to this many (a hung-up peer's stream that long
 * ends with no goodbye as far as the watch is concerned: a lost peer). */
#define BYE_PEEK_MAX (64u << 20)

int coll_fd_said_bye(int fd, const char *staged, size_t nstaged) {
  int q = 0;
  if (fd < 0 || ioctl(fd, FIONREAD, &q) != 0 || q < 0 || (unsigned)q > BYE_PEEK_MAX) return 0;
  size_t queued = (size_t)q;
  if (nstaged + queued < COLL_BYE_LEN) return 0;
  /* The stream's last COLL_BYE_LEN bytes: the staged tail, then the queue's (peeked whole: a
   * queue's tail cannot be peeked alone). */
  char *buf = malloc(queued + COLL_BYE_LEN);
  if (buf == NULL) return 0;
  size_t from_stage = queued >= COLL_BYE_LEN ? 0 : COLL_BYE_LEN - queued;
  if (from_stage > 0) /* staged is NULL when nothing is */
    memcpy(buf, staged + nstaged - from_stage, from_stage);
  ssize_t n = queued > 0 ? recv(fd, buf + from_stage, queued, MSG_PEEK | MSG_DONTWAIT) : 0;
  int bye = n == (ssize_t)queued &&
            memcmp(buf + from_stage + queued - COLL_BYE_LEN, COLL_BYE, COLL_BYE_LEN) == 0;
  free(buf);
  return bye;
}

static int sock_err(int e) {
  if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR) return 0;
  if (e == EPIPE || e == ECONNRESET || e == ENOTCONN || e == ESHUTDOWN) return COHORT_EPEER;
  return -e;
}

static long tcp_send(void *tp, int peer, const struct iovec *iov, int iovcnt) {
  coll_tcp *t = tp;
  struct msghdr mh = {0};
  mh.msg_iov = (struct iovec *)iov;
  mh.msg_iovlen = (size_t)iovcnt;
  ssize_t n = sendmsg(t->peers[peer].fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n < 0) return sock_err(errno);
  return n;
}

static long raw_recv(tcp_peer *p, void *buf, size_t len) {
  ssize_t n = recv(p->fd, buf, len, MSG_DONTWAIT);
  if (n == 0) return COHORT_EPEER; /* orderly EOF in the middle of a collective */
  if (n < 0) return sock_err(errno);
  return n;
}

static long tcp_recv(void *tp, int peer, void *buf, size_t len) {
  coll_tcp *t = tp;
  tcp_peer *p = &t->peers[peer];
  if (len == 0) return 0;
  if (p->wpos > p->rpos) {
    size_t n = p->wpos - p->rpos;
    if (n > len) n = len;
    memcpy(buf, p->buf + p->rpos, n);
    p->rpos += n;
    p->rx_off += n;
    return (long)n;
  }
  /* Staging empty: small reads go through it (fewer syscalls for headers), large straight in. */
  if (len < 4096 && p->buf != NULL) {
    size_t base = p->rx_off & 7u;
    p->rpos = p->wpos = base;
    long n = raw_recv(p, p->buf + base, t->cap - base);
    if (n <= 0) return n;
    p->wpos += (size_t)n;
    return tcp_recv(tp, peer, buf, len);
  }
  long n = raw_recv(p, buf, len);
  if (n > 0) p->rx_off += (uint64_t)n;
  return n;
}

static long tcp_peek(void *tp, int peer, const void **data) {
  coll_tcp *t = tp;
  tcp_peer *p = &t->peers[peer];
  if (p->buf == NULL) {
    p->buf = malloc(t->cap);
    if (p->buf == NULL) return -ENOMEM;
    p->rpos = p->wpos = p->rx_off & 7u;
  }
  size_t have = p->wpos - p->rpos;
  if (have < t->cap / 2) {
    /* Compact, keeping staging index == stream offset (mod 8), and read more. */
    size_t base = p->rx_off & 7u;
    if (p->rpos != base) {
      memmove(p->buf + base, p->buf + p->rpos, have);
      p->rpos = base;
      p->wpos = base + have;
    }
    long n = raw_recv(p, p->buf + p->wpos, t->cap - p->wpos);
    if (n < 0 && (have == 0 || n != COHORT_EPEER)) return n;
    if (n > 0) p->wpos += (size_t)n;
    /* The peer ended with bytes still staged: hand them out, but once the caller takes nothing
     * more of them (the stream stopped inside an element) the end is the answer, not a spin. */
    if (n == COHORT_EPEER) {
      if (p->eof_have == have) return n;
      p->eof_have = have;
    }
  }
  *data = p->buf + p->rpos;
  return (long)(p->wpos - p->rpos);
}

/* Bytes in staging, or in the socket's receive queue. */
static int tcp_pending(void *tp, int peer) {
  coll_tcp *t = tp;
  tcp_peer *p = &t->peers[peer];
  if (p->wpos > p->rpos) return 1;
  struct pollfd pf = {.fd = p->fd, .events = POLLIN};
  return p->fd >= 0 && poll(&pf, 1, 0) == 1 && (pf.revents & POLLIN);
}

static void tcp_consume(void *tp, int peer, size_t n) {
  coll_tcp *t = tp;
  tcp_peer *p = &t->peers[peer];
  p->rpos += n;
  p->rx_off += n;
}

static int tcp_wait(void *tp, const int *peers, const int *want, int n, int timeout_ms,
                    int *bad_peer) {
  coll_tcp *t = tp;
  struct pollfd pf[8];
  if (n > 8) n = 8;
  for (int i = 0; i < n; i++) {
    pf[i].fd = t->peers[peers[i]].fd;
    pf[i].events = (short)(((want[i] & COLL_WANT_SEND) ? POLLOUT : 0) |
                           ((want[i] & COLL_WANT_RECV) ? POLLIN : 0) | POLLRDHUP);
    pf[i].revents = 0;
  }
  int r = poll(pf, (nfds_t)n, timeout_ms);
  if (r < 0) return errno == EINTR ? 0 : -errno;
  for (int i = 0; i < n; i++) {
    /* A peer we only send to and that hung up will never read again. When we also receive, the
     * next recv reports the hang-up after any bytes still buffered. */
    int hup = (pf[i].revents & (POLLRDHUP | POLLHUP)) && !(want[i] & COLL_WANT_RECV);
    if ((pf[i].revents & (POLLERR | POLLNVAL)) || hup) {
      *bad_peer = peers[i];
      return COHORT_EPEER;
    }
  }
  return 0;
}

static int tcp_watch_fd(void *tp, int peer) {
  coll_tcp *t = tp;
  return t->peers[peer].fd;
}

static int tcp_said_bye(void *tp, int peer) {
  coll_tcp *t = tp;
  tcp_peer *p = &t->peers[peer];
  if (p->buf == NULL) return coll_fd_said_bye(p->fd, NULL, 0);
  return coll_fd_said_bye(p->fd, p->buf + p->rpos, p->wpos - p->rpos);
}

const coll_tport_ops coll_tcp_ops = {
    .name = "tcp",
    .send = tcp_send,
    .recv = tcp_recv,
    .peek = tcp_peek,
    .consume = tcp_consume,
    .wait = tcp_wait,
    .peer_gone = NULL, /* tcp_wait reports a hang-up itself */
    .pending = tcp_pending,
    .watch_fd = tcp_watch_fd,
    .said_bye = tcp_said_bye,
    .abort = tcp_abort,
    .aborted = NULL,
    .reaches = NULL, /* no one-sided access */
    .frame_align = 8,
    .frame_min = 0,
    .peek_whole_max = 0,
    .polled = 0,
};

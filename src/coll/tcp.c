/*
 * tcp.c - the TCP transport: one connected socket per peer, used
 * non-blockingly.
 *
 * Receives land in a fixed per-peer staging buffer (allocated on first use)
 * so that reductions can read whole elements of what has arrived while the
 * kernel keeps receiving the rest; large plain copies bypass staging and go
 * straight into the destination. The staging index of a byte is kept equal
 * to its stream offset modulo 8, so elements handed out by peek are aligned.
 *
 * An abort writes a record with its reason (tport.h) before it shuts the
 * connections down, where the peer cannot take it for the end of a message:
 * the engine says where each message it sends ends (the frame op). So that
 * the record is found after the peer's end of stream even when the engine
 * read it into a payload that the end then cut short, staging also holds the
 * stream's last COLL_ABORT_LEN bytes read before its unread ones: it is
 * compacted only when little room is left after what it holds, and then
 * keeps that many read bytes; a large read straight into the destination
 * leaves a copy of its last COLL_ABORT_LEN bytes there. A receive that
 * staging serves costs nothing for the record, one that reads the socket
 * two byte compares. The stream's end is looked at by the thread that reads
 * it, when it ends or errs or the record's head or tail mark shows, and by
 * the peer watch (with no collective in flight, so the two never run at
 * once); a record found is kept for tcp_aborted, which any thread may call.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
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
  char *buf; /* staging, STAGE_SIZE(cap) bytes: buf[lo, wpos) is the stream's end, read */
  size_t lo, rpos, wpos; /* up to rpos (history for the abort record), and unread */
  uint64_t rx_off;       /* stream offset of buf[rpos] */
  size_t eof_have;       /* after the peer's end of stream: what staging held at the last peek */
  /* Sending: bytes sent, where the message being sent ends, and the handshake with an abort
   * from any thread: `sending` while a send runs, abort_state 0, then ABORTING, then ABORTED. */
  uint64_t tx_off;
  _Atomic uint64_t frame_end;
  _Atomic int sending, abort_state;
  /* Receiving: the peer's abort record once found (published by `aborted`). */
  _Atomic int aborted;
  int abort_rank;
  char abort_why[COLL_ABORT_LEN];
} tcp_peer;

/* Staging's size for `cap` bytes of room: the record's length of history and 8 for alignment. */
#define STAGE_SIZE(cap) ((cap) + COLL_ABORT_LEN + 8)

struct coll_tcp {
  int rank, size;
  size_t cap;
  tcp_peer *peers;
  _Atomic int any_aborted; /* some peer's record was found: the engine asks at every wait */
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

/* The abort record of rank with why (tport.h). */
static void make_record(char *rec, int rank, const char *why) {
  memset(rec, 0, COLL_ABORT_LEN);
  memcpy(rec, COLL_ABORT_HEAD, COLL_ABORT_MARK_LEN);
  snprintf(rec + COLL_ABORT_MARK_LEN, COLL_ABORT_LEN - 2 * COLL_ABORT_MARK_LEN, "%d %s", rank,
           why != NULL ? why : "");
  memcpy(rec + COLL_ABORT_LEN - COLL_ABORT_MARK_LEN, COLL_ABORT_TAIL, COLL_ABORT_MARK_LEN);
}

enum { ABORTING = 1, ABORTED = 2 };

/* Waits (a send or an abort in progress: microseconds, nothing blocks) until *v == want. */
static void await_int(_Atomic int *v, int want) {
  for (int spins = 0; atomic_load(v) != want; spins++)
    if (spins < 64)
      coll_cpu_relax();
    else
      sched_yield();
}

/* The record and shutdown() of every connection: peers see EOF at once, blocked waits wake. The
 * record goes where it cannot complete the message being sent (none is, or more than its length
 * of it is left); else the peer learns only that the connection ended. A send never runs beside
 * it (tcp_send): abort_state and `sending` are seq_cst, so either the send sees the abort and
 * sends nothing, or the abort waits for the send to end and sees its bytes in tx_off. */
static void tcp_abort(void *tp, int rank, const char *why) {
  coll_tcp *t = tp;
  char rec[COLL_ABORT_LEN];
  make_record(rec, rank, why);
  for (int i = 0; i < t->size; i++) {
    tcp_peer *p = &t->peers[i];
    if (p->fd < 0) continue;
    int none = 0;
    if (!atomic_compare_exchange_strong(&p->abort_state, &none, ABORTING)) {
      await_int(&p->abort_state, ABORTED); /* another thread's abort: done when it is */
      continue;
    }
    await_int(&p->sending, 0);
    /* frame_end is stored before a message's first send: once tx_off counts any of its bytes the
     * end is its. Before that the old end (owed 0) or the new one (none of it sent: the record
     * goes between messages, or is left out) are both safe. */
    uint64_t end = atomic_load_explicit(&p->frame_end, memory_order_relaxed);
    uint64_t owed = end > p->tx_off ? end - p->tx_off : 0;
    if (owed == 0 || owed > COLL_ABORT_LEN)
      (void)!send(p->fd, rec, sizeof rec, MSG_DONTWAIT | MSG_NOSIGNAL);
    shutdown(p->fd, SHUT_RDWR);
    atomic_store(&p->abort_state, ABORTED);
  }
}

/* Called by the thread that sends, between two messages: tx_off is its own to read. */
static void tcp_frame(void *tp, int peer, size_t bytes) {
  tcp_peer *p = &((coll_tcp *)tp)->peers[peer];
  atomic_store_explicit(&p->frame_end, p->tx_off + bytes, memory_order_relaxed);
}

int coll_tcp_parse_abort(const char *s, size_t n, int *rank, char *msg, size_t msglen) {
  if (n < COLL_ABORT_LEN) return 0;
  const char *r = s + n - COLL_ABORT_LEN, *body = r + COLL_ABORT_MARK_LEN;
  if (memcmp(r, COLL_ABORT_HEAD, COLL_ABORT_MARK_LEN) != 0 ||
      memcmp(r + COLL_ABORT_LEN - COLL_ABORT_MARK_LEN, COLL_ABORT_TAIL, COLL_ABORT_MARK_LEN) != 0 ||
      memchr(body, '\0', COLL_ABORT_LEN - 2 * COLL_ABORT_MARK_LEN) == NULL)
    return 0;
  char *end = NULL;
  long v = strtol(body, &end, 10);
  if (end == body || *end != ' ' || v < 0 || v > INT_MAX) return 0;
  *rank = (int)v;
  snprintf(msg, msglen, "%s", end + 1);
  return 1;
}

/* The queue's bytes are looked at only up to this many (a hung-up peer's stream that long ends
 * with no goodbye or record as far as the watch is concerned: a lost peer). */
#define PEEK_MAX (64u << 20)

/* The record that ends peer p's stream, read so far (staging's end) or queued (peeked; nothing
 * read), kept in p and published. Called by the thread that reads p's stream, or the watch. */
static void find_record(coll_tcp *t, tcp_peer *p) {
  if (atomic_load(&p->aborted)) return;
  int q = 0;
  if (ioctl(p->fd, FIONREAD, &q) != 0 || q < 0 || (unsigned)q > PEEK_MAX) q = 0;
  size_t queued = (size_t)q, held = p->buf != NULL ? p->wpos - p->lo : 0;
  size_t from_stage = queued >= COLL_ABORT_LEN ? 0 : COLL_ABORT_LEN - queued;
  if (from_stage > held) from_stage = held;
  char *buf = malloc(COLL_ABORT_LEN + queued);
  if (buf == NULL) return;
  if (from_stage > 0) memcpy(buf, p->buf + p->wpos - from_stage, from_stage);
  ssize_t n = queued > 0 ? recv(p->fd, buf + from_stage, queued, MSG_PEEK | MSG_DONTWAIT) : 0;
  size_t len = from_stage + (n > 0 ? (size_t)n : 0);
  if (coll_tcp_parse_abort(buf, len, &p->abort_rank, p->abort_why, sizeof p->abort_why)) {
    atomic_store(&p->aborted, 1);
    atomic_store(&t->any_aborted, 1);
  }
  free(buf);
}

/* n bytes were just read from p's stream into b, and staging ends with them: the record read
 * whole, or its head read where a header belongs (the rest may be queued), is looked for. */
static void record_shows(coll_tcp *t, tcp_peer *p, const char *b, size_t n) {
  const char *end = p->buf + p->wpos;
  if ((b[0] == COLL_ABORT_HEAD[0] && n >= COLL_ABORT_MARK_LEN &&
       memcmp(b, COLL_ABORT_HEAD, COLL_ABORT_MARK_LEN) == 0) ||
      (end[-1] == '\n' && p->wpos - p->lo >= COLL_ABORT_MARK_LEN &&
       memcmp(end - COLL_ABORT_MARK_LEN, COLL_ABORT_TAIL, COLL_ABORT_MARK_LEN) == 0))
    find_record(t, p);
}

/* A peer whose stream ended with an abort record: 1 with its rank and reason. */
static int tcp_aborted(void *tp, int *rank, char *msg, size_t msglen) {
  coll_tcp *t = tp;
  if (!atomic_load(&t->any_aborted)) return 0;
  for (int i = 0; i < t->size; i++) {
    tcp_peer *p = &t->peers[i];
    if (!atomic_load(&p->aborted)) continue;
    *rank = p->abort_rank;
    snprintf(msg, msglen, "%s", p->abort_why);
    return 1;
  }
  return 0;
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

int coll_fd_said_bye(int fd, const char *staged, size_t nstaged) {
  int q = 0;
  if (fd < 0 || ioctl(fd, FIONREAD, &q) != 0 || q < 0 || (unsigned)q > PEEK_MAX) return 0;
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
  tcp_peer *p = &t->peers[peer];
  struct msghdr mh = {0};
  mh.msg_iov = (struct iovec *)iov;
  mh.msg_iovlen = (size_t)iovcnt;
  atomic_store(&p->sending, 1);
  ssize_t n = -1;
  int e = EPIPE; /* aborted: as the shut-down socket would say */
  if (atomic_load(&p->abort_state) == 0) {
    n = sendmsg(p->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    e = errno;
    if (n > 0) p->tx_off += (uint64_t)n;
  }
  atomic_store_explicit(&p->sending, 0, memory_order_release);
  long rc = n < 0 ? sock_err(e) : n;
  if (rc < 0) find_record(t, p);
  return rc;
}

static long raw_recv(coll_tcp *t, tcp_peer *p, void *buf, size_t len) {
  ssize_t n = recv(p->fd, buf, len, MSG_DONTWAIT);
  if (n > 0) return n;
  long rc = n == 0 ? COHORT_EPEER : sock_err(errno); /* 0: orderly EOF inside a collective */
  if (rc < 0) find_record(t, p);
  return rc;
}

static int stage_alloc(coll_tcp *t, tcp_peer *p) {
  if (p->buf != NULL) return 0;
  p->buf = malloc(STAGE_SIZE(t->cap));
  if (p->buf == NULL) return -ENOMEM;
  p->lo = p->rpos = p->wpos = p->rx_off & 7u;
  return 0;
}

/* Moves the unread bytes, and up to COLL_ABORT_LEN read ones before them, to staging's front,
 * keeping staging index == stream offset (mod 8). */
static void compact(tcp_peer *p) {
  size_t keep = p->rpos - p->lo < COLL_ABORT_LEN ? p->rpos - p->lo : COLL_ABORT_LEN;
  size_t from = p->rpos - keep, have = p->wpos - p->rpos, to = (size_t)((p->rx_off - keep) & 7u);
  if (to != from) memmove(p->buf + to, p->buf + from, keep + have);
  p->lo = to;
  p->rpos = to + keep;
  p->wpos = p->rpos + have;
}

/* Reads what the socket holds into staging after its unread bytes (compacting it first when less
 * than half its room is left). */
static long stage_read(coll_tcp *t, tcp_peer *p) {
  if (STAGE_SIZE(t->cap) - p->wpos < t->cap / 2) compact(p);
  char *b = p->buf + p->wpos;
  long n = raw_recv(t, p, b, STAGE_SIZE(t->cap) - p->wpos);
  if (n <= 0) return n;
  p->wpos += (size_t)n;
  record_shows(t, p, b, (size_t)n);
  return n;
}

/* Reads into dst with staging empty; staging keeps a copy of the stream's end. */
static long direct_read(coll_tcp *t, tcp_peer *p, char *dst, size_t len) {
  long n = raw_recv(t, p, dst, len);
  if (n <= 0) return n;
  if ((size_t)n >= COLL_ABORT_LEN) /* the history starts over (COLL_ABORT_LEN % 8 == 0) */
    p->lo = p->wpos = (size_t)((p->rx_off + (uint64_t)n) & 7u);
  else if (STAGE_SIZE(t->cap) - p->wpos < t->cap / 2)
    compact(p);
  size_t k = (size_t)n < COLL_ABORT_LEN ? (size_t)n : COLL_ABORT_LEN;
  memcpy(p->buf + p->wpos, dst + n - k, k);
  p->wpos += k;
  p->rpos = p->wpos;
  p->rx_off += (uint64_t)n;
  record_shows(t, p, dst, (size_t)n);
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
  int rc = stage_alloc(t, p);
  if (rc != 0) return rc;
  /* Staging empty: small reads go through it (fewer syscalls for headers), large straight in. */
  if (len < 4096) {
    long n = stage_read(t, p);
    if (n <= 0) return n;
    return tcp_recv(tp, peer, buf, len);
  }
  return direct_read(t, p, buf, len);
}

static long tcp_peek(void *tp, int peer, const void **data) {
  coll_tcp *t = tp;
  tcp_peer *p = &t->peers[peer];
  int rc = stage_alloc(t, p);
  if (rc != 0) return rc;
  size_t have = p->wpos - p->rpos;
  if (have < t->cap / 2) {
    long n = stage_read(t, p);
    if (n < 0 && (have == 0 || n != COHORT_EPEER)) return n;
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
    if (pf[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) find_record(t, &t->peers[peers[i]]);
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
  int bye = p->buf == NULL ? coll_fd_said_bye(p->fd, NULL, 0)
                           : coll_fd_said_bye(p->fd, p->buf + p->rpos, p->wpos - p->rpos);
  if (!bye) find_record(t, p); /* lost, or aborted: its record says which */
  return bye;
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
    .frame = tcp_frame,
    .aborted = tcp_aborted,
    .reaches = NULL, /* no one-sided access */
    .frame_align = 8,
    .frame_min = 0,
    .peek_whole_max = 0,
    .polled = 0,
};

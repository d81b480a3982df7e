/*
 * control.c - the worker's end of the agent's control channel (control.h):
 * parsing the agent's messages, sending the worker's, and the thread that
 * listens (poll() on the channel and on an eventfd that stops it, with a
 * timeout only while a timed wake is set; it never spins) and hands reshape
 * and stop to the communicator at once, so that a collective blocked on a
 * peer that will never answer returns.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "cohort/cohort.h"
#include "coll/control.h"

/* One communicator per process owns the channel. */
static atomic_int ctl_claimed;

static int verb_of(const char *v) {
  if (strcmp(v, "reshape") == 0) return COLL_CTL_RESHAPE;
  if (strcmp(v, "form") == 0) return COLL_CTL_FORM;
  if (strcmp(v, "stop") == 0) return COLL_CTL_STOP;
  return COLL_CTL_UNKNOWN;
}

/* The integer fields: key, where in the message, range. */
typedef struct int_field {
  const char *key;
  size_t off;
  int min, max;
} int_field;

#define F(k, lo, hi)                                                                               \
  { #k, offsetof(coll_ctl_msg, k), lo, hi }
static const int_field int_fields[] = {
    F(epoch, 0, 1 << 30),      F(rank, 0, 1 << 20),       F(size, 1, 1 << 20),
    F(local_rank, 0, 1 << 20), F(local_size, 1, 1 << 20), F(node_rank, 0, 1 << 20),
    F(nnodes, 1, 1 << 20),     F(master_port, 1, 65535),  F(grow, 0, 1),
    F(defer_ms, 0, 1 << 30),
};
#undef F

static int fail(char *err, size_t errlen, const char *what, const char *key) {
  snprintf(err, errlen, "%s%s%.40s", what, key[0] ? ": " : "", key);
  return COHORT_EPROTO;
}

/* One key=value field (value NUL-terminated, key of klen bytes) into m. */
static int parse_field(coll_ctl_msg *m, const char *key, size_t klen, const char *val, char *err,
                       size_t errlen) {
  char k[48];
  if (klen == 0 || klen >= sizeof k) return fail(err, errlen, "bad key", "");
  memcpy(k, key, klen);
  k[klen] = '\0';
  for (size_t i = 0; i < sizeof int_fields / sizeof int_fields[0]; i++) {
    const int_field *f = &int_fields[i];
    if (strcmp(k, f->key) != 0) continue;
    if (base_parse_int(val, f->min, f->max, (int *)((char *)m + f->off)) != 0)
      return fail(err, errlen, "bad number for", k);
    return 0;
  }
  char *dst = strcmp(k, "store") == 0         ? m->store
              : strcmp(k, "job") == 0         ? m->job
              : strcmp(k, "master_addr") == 0 ? m->master_addr
                                              : NULL;
  size_t cap = dst == m->store ? sizeof m->store
               : dst == m->job ? sizeof m->job
                               : sizeof m->master_addr;
  if (dst == NULL) return 0; /* unknown keys are ignored */
  if (val[0] == '\0' || strlen(val) >= cap) return fail(err, errlen, "bad length of", k);
  memcpy(dst, val, strlen(val) + 1);
  return 0;
}

/* The rules of a complete form: every field its bootstrap needs, consistent. */
static int check_form(const coll_ctl_msg *m, char *err, size_t errlen) {
  if (m->epoch < 0 || m->rank < 0 || m->size < 1 || m->store[0] == '\0' || m->job[0] == '\0')
    return fail(err, errlen, "form lacks epoch, rank, size, store or job", "");
  if (m->rank >= m->size) return fail(err, errlen, "form's rank is not below its size", "");
  char host[BASE_HOST_MAX];
  int port;
  if (base_split_hostport(m->store, host, sizeof host, &port, 0) != 0)
    return fail(err, errlen, "form's store is not host:port", "");
  return 0;
}

static void init_msg(coll_ctl_msg *m) {
  memset(m, 0, sizeof *m);
  m->epoch = m->rank = m->size = m->local_rank = m->local_size = -1;
  m->node_rank = m->nnodes = m->master_port = m->grow = m->defer_ms = -1;
}

int coll_ctl_parse(const char *buf, size_t len, coll_ctl_msg *m, char *err, size_t errlen) {
  char s[COLL_CTL_MAX + 1];
  init_msg(m);
  if (len > 0 && buf[len - 1] == '\n') len--;
  if (len == 0) return fail(err, errlen, "empty message", "");
  if (len > COLL_CTL_MAX) return fail(err, errlen, "message longer than 1024 bytes", "");
  if (memchr(buf, '\0', len) != NULL) return fail(err, errlen, "NUL byte in the message", "");
  memcpy(s, buf, len);
  s[len] = '\0';
  size_t vlen = strcspn(s, " ");
  s[vlen] = '\0';
  for (size_t i = 0; i < vlen; i++)
    if (s[i] < 0x21 || s[i] > 0x7e) return fail(err, errlen, "control byte in the verb", "");
  m->verb = verb_of(s);
  char *p = vlen < len ? s + vlen + 1 : s + len;
  while (*p != '\0') {
    if (*p == ' ') {
      p++;
      continue;
    }
    if (strncmp(p, "why=", 4) == 0) { /* the rest, spaces and all */
      size_t i = 0;
      for (p += 4; p + i < s + len; i++) m->why[i] = (p[i] < 0x20 || p[i] > 0x7e) ? '?' : p[i];
      m->why[i] = '\0';
      break;
    }
    size_t tl = strcspn(p, " ");
    char *end = p + tl, *eq = memchr(p, '=', tl);
    if (eq == NULL) return fail(err, errlen, "field without '='", "");
    for (char *q = p; q < end; q++)
      if (*q < 0x21 || *q > 0x7e) return fail(err, errlen, "control byte in a field", "");
    char save = *end;
    *end = '\0';
    int rc = parse_field(m, p, (size_t)(eq - p), eq + 1, err, errlen);
    *end = save;
    if (rc != 0) return rc;
    p = end;
  }
  return m->verb == COLL_CTL_FORM ? check_form(m, err, errlen) : 0;
}

int coll_ctl_send(coll_ctl *ctl, const char *fmt, ...) {
  char msg[COLL_CTL_MAX + 1];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (ctl->fd < 0) return -ENOTSUP;
  if (n < 0 || n > COLL_CTL_MAX) return COHORT_ELIMIT;
  ssize_t w;
  do {
    w = send(ctl->fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (w < 0 && errno == EINTR);
  return w == n ? 0 : w < 0 ? -errno : -EIO;
}

/* A datagram of len bytes (its real length: more than was read when it was too long). */
static void ctl_handle(coll_ctl *ctl, const char *buf, size_t len) {
  coll_ctl_msg m;
  char err[128];
  int rc = coll_ctl_parse(buf, len, &m, err, sizeof err);
  pthread_mutex_lock(&ctl->mu);
  if (rc != 0) {
    ctl->bad = 1;
    snprintf(ctl->why, sizeof ctl->why, "malformed message from the agent (%s)", err);
    base_log(BASE_LOG_WARN, "control channel: %s", ctl->why);
  } else if (m.verb == COLL_CTL_FORM) {
    ctl->form = m;
  } else if (m.verb == COLL_CTL_STOP) {
    ctl->stopped = 1;
    snprintf(ctl->why, sizeof ctl->why, "%s", m.why[0] ? m.why : "(no reason given)");
  }
  if (rc == 0 && (m.verb == COLL_CTL_RESHAPE || m.verb == COLL_CTL_STOP) && ctl->notify != NULL)
    ctl->notify(ctl->notify_arg, &m);
  pthread_cond_broadcast(&ctl->cv);
  pthread_mutex_unlock(&ctl->mu);
}

/* The poll timeout until the timed wake (-1: none); once it passed, calls expire (under mu). */
static int ctl_tick(coll_ctl *ctl) {
  pthread_mutex_lock(&ctl->mu);
  int64_t left = ctl->deadline_ms > 0 ? ctl->deadline_ms - base_now_ms() : -1;
  if (ctl->deadline_ms > 0 && left <= 0) {
    ctl->deadline_ms = 0;
    left = -1;
    if (ctl->expire != NULL) ctl->expire(ctl->notify_arg);
    pthread_cond_broadcast(&ctl->cv);
  }
  pthread_mutex_unlock(&ctl->mu);
  return left > INT_MAX ? INT_MAX : (int)left;
}

static void *ctl_main(void *arg) {
  coll_ctl *ctl = arg;
  char buf[COLL_CTL_MAX + 1];
  for (;;) {
    struct pollfd p[2] = {{.fd = ctl->fd, .events = POLLIN},
                          {.fd = ctl->wake_fd, .events = POLLIN}};
    int n = poll(p, 2, ctl_tick(ctl));
    if (n == 0 || (n < 0 && errno == EINTR)) continue;
    if (n < 0 || p[1].revents != 0) break;
    ssize_t r = recv(ctl->fd, buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    int hup = (p[0].revents & (POLLHUP | POLLERR | POLLNVAL)) != 0;
    if (r < 0 || (r == 0 && hup)) {
      pthread_mutex_lock(&ctl->mu);
      ctl->closed = 1;
      pthread_cond_broadcast(&ctl->cv);
      pthread_mutex_unlock(&ctl->mu);
      break;
    }
    ctl_handle(ctl, buf, (size_t)r);
  }
  return NULL;
}

/* The fd COHORT_CONTROL_FD names: -1 when unset, COHORT_ENOENV when it is not a SEQPACKET socket.
 */
static int env_fd(int *fd) {
  const char *v = getenv("COHORT_CONTROL_FD");
  *fd = -1;
  if (v == NULL || v[0] == '\0') return 0;
  int type = 0;
  socklen_t tl = sizeof type;
  struct stat st;
  if (base_parse_int(v, 0, INT_MAX, fd) != 0 || fstat(*fd, &st) != 0 || !S_ISSOCK(st.st_mode) ||
      getsockopt(*fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_SEQPACKET) {
    base_log(BASE_LOG_ERROR,
             "COHORT_CONTROL_FD=%.20s is not a control channel (a SEQPACKET socket)", v);
    *fd = -1;
    return COHORT_ENOENV;
  }
  return 0;
}

int coll_ctl_open(coll_ctl *ctl, int await_form) {
  ctl->fd = ctl->wake_fd = -1;
  int fd, rc = env_fd(&fd), expect = 0;
  if (rc != 0 || fd < 0) return rc;
  if (!atomic_compare_exchange_strong(&ctl_claimed, &expect, 1)) return 0;
  ctl->wake_fd = eventfd(0, EFD_CLOEXEC);
  if (ctl->wake_fd < 0) {
    atomic_store(&ctl_claimed, 0);
    return -errno;
  }
  ctl->fd = fd;
  if (coll_ctl_send(ctl, "hello pid=%d%s", (int)getpid(), await_form ? " await_form=1" : "") != 0)
    ctl->closed = 1;
  if (pthread_create(&ctl->thread, NULL, ctl_main, ctl) != 0) {
    coll_ctl_close(ctl);
    return -EAGAIN;
  }
  ctl->started = 1;
  return 0;
}

void coll_ctl_close(coll_ctl *ctl) {
  if (ctl->started) {
    uint64_t one = 1;
    while (write(ctl->wake_fd, &one, sizeof one) < 0 && errno == EINTR) {
    }
    pthread_join(ctl->thread, NULL);
    ctl->started = 0;
  }
  if (ctl->wake_fd >= 0) close(ctl->wake_fd);
  if (ctl->fd >= 0) atomic_store(&ctl_claimed, 0);
  ctl->fd = ctl->wake_fd = -1;
}

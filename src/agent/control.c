/* control.c - the agent <-> worker control channel's messages. */
#include "agent/control.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "base/base.h"

/* A decimal integer filling [s, e), sign allowed, within int64_t's range. */
static int parse_i64(const char *s, const char *e, int64_t *out) {
  int neg = s < e && *s == '-';
  if (neg) s++;
  if (s == e || e - s > 18) return -EPROTO;
  int64_t v = 0;
  for (; s < e; s++) {
    if (*s < '0' || *s > '9') return -EPROTO;
    v = v * 10 + (*s - '0');
  }
  *out = neg ? -v : v;
  return 0;
}

/* One key=value token [s, e) into m (unknown keys skipped). */
static int parse_field(const char *s, const char *e, control_msg *m) {
  const char *eq = memchr(s, '=', (size_t)(e - s));
  if (eq == NULL || eq == s) return -EPROTO;
  size_t klen = (size_t)(eq - s);
  int64_t *at = NULL;
  if (klen == 3 && memcmp(s, "pid", 3) == 0) at = &m->pid;
  if (klen == 5 && memcmp(s, "epoch", 5) == 0) at = &m->epoch;
  if (klen == 4 && memcmp(s, "step", 4) == 0) at = &m->step;
  if (klen == 10 && memcmp(s, "await_form", 10) == 0) at = &m->await_form;
  return at != NULL ? parse_i64(eq + 1, e, at) : 0;
}

static control_verb verb_of(const char *s, size_t n) {
  static const struct {
    const char *name;
    control_verb verb;
  } verbs[] = {{"hello", CONTROL_HELLO},
               {"ready", CONTROL_READY},
               {"formed", CONTROL_FORMED},
               {"broken", CONTROL_BROKEN}};
  for (size_t i = 0; i < BASE_ARRAY_LEN(verbs); i++)
    if (strlen(verbs[i].name) == n && memcmp(verbs[i].name, s, n) == 0) return verbs[i].verb;
  return CONTROL_OTHER;
}

int agent_control_parse(const char *buf, size_t len, control_msg *out) {
  memset(out, 0, sizeof *out);
  out->pid = out->epoch = out->step = out->await_form = -1;
  if (len > 0 && buf[len - 1] == '\n') len--;
  if (len == 0 || len > CONTROL_MSG_MAX) return -EPROTO;
  for (size_t i = 0; i < len; i++)
    if (buf[i] < 0x20 || buf[i] > 0x7e) return -EPROTO;
  const char *p = buf, *end = buf + len;
  const char *v = p;
  while (p < end && ((*p >= 'a' && *p <= 'z') || *p == '_')) p++;
  if (p == v || (p < end && *p != ' ')) return -EPROTO;
  size_t vlen = (size_t)(p - v);
  size_t keep = vlen < sizeof out->name - 1 ? vlen : sizeof out->name - 1;
  memcpy(out->name, v, keep); /* buf is not NUL-terminated */
  out->name[keep] = '\0';
  out->verb = verb_of(v, vlen);
  while (p < end) {
    while (p < end && *p == ' ') p++;
    if (p == end) break;
    if (end - p >= 4 && memcmp(p, "why=", 4) == 0) break; /* the rest is the why */
    const char *t = p;
    while (p < end && *p != ' ') p++;
    if (parse_field(t, p, out) != 0) return -EPROTO;
  }
  return 0;
}

int agent_control_open(int fds[2]) {
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return -errno;
  return 0;
}

int agent_control_send(int fd, const char *fmt, ...) {
  char msg[CONTROL_MSG_MAX + 1];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n > CONTROL_MSG_MAX) return -EMSGSIZE;
  ssize_t sent = send(fd, msg, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
  return sent == n ? 0 : -errno;
}

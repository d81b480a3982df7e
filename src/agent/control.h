/*
 * control.h - the control channel between the agent and one worker under
 * `--on-failure reform` (docs/reform.md): a socketpair(AF_UNIX,
 * SOCK_SEQPACKET), the worker's end named by COHORT_CONTROL_FD.
 *
 * One datagram is one message: ASCII, at most CONTROL_MSG_MAX bytes,
 * "VERB key=value key=value ...", a `why=` field last taking the rest of the
 * message. The worker says `hello pid=P [await_form=1]` (1: it can be
 * started ahead of its membership, COHORT_AWAIT_FORM), `ready epoch=E step=S`,
 * `formed epoch=E step=S` and `broken epoch=E why=...` (its collectives of
 * membership E failed: a peer's connection closed, before any agent said
 * so); the agent says `reshape`, `form` and `stop` (docs/reform.md has the
 * fields).
 *
 * Thread safety: no shared state.
 */
#ifndef COHORT_AGENT_CONTROL_H
#define COHORT_AGENT_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#define CONTROL_MSG_MAX 1024

typedef enum control_verb {
  CONTROL_OTHER, /* a well-formed message with a verb the agent does not know */
  CONTROL_HELLO,
  CONTROL_READY,
  CONTROL_FORMED,
  CONTROL_BROKEN
} control_verb;

/* A worker's message; fields it did not carry are -1. */
typedef struct control_msg {
  control_verb verb;
  char name[16]; /* the verb as sent (truncated), for a log line */
  int64_t pid, epoch, step;
  int64_t await_form; /* hello: 1 when it can wait for its first `form` (started ahead) */
} control_msg;

/*
 * Parses one datagram of len bytes (not NUL-terminated; one trailing
 * newline allowed). Returns 0, or -EPROTO for anything that is not a
 * message: empty, too long, a byte that is not printable ASCII, a verb that
 * is not [a-z_]+, a token without '=', a number that is not one. Unknown
 * keys are skipped.
 */
int agent_control_parse(const char *buf, size_t len, control_msg *out);

/* A socketpair for one worker: fds[0] the agent's, fds[1] the worker's, both
 * close-on-exec (the spawn clears it on the worker's own end). 0 or -errno. */
int agent_control_open(int fds[2]);

/* Sends one message (printf-style) without blocking. 0, or -errno (-EPIPE:
 * the worker is gone; -EMSGSIZE: longer than CONTROL_MSG_MAX). */
int agent_control_send(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif

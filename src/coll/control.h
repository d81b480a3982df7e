/*
 * control.h - the agent's control channel of a re-formable communicator
 * (control.c): the message parser, the messages a worker sends, and the
 * listening thread that turns the agent's messages into the communicator's
 * state (docs/reform.md has the protocol: one SOCK_SEQPACKET datagram per
 * message, "VERB key=value ...", a trailing why= taking the rest).
 */
#ifndef COHORT_COLL_CONTROL_H
#define COHORT_COLL_CONTROL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* The longest message, in bytes. */
#define COLL_CTL_MAX 1024

enum coll_ctl_verb {
  COLL_CTL_UNKNOWN = 0, /* ignored by the worker */
  COLL_CTL_RESHAPE,
  COLL_CTL_FORM,
  COLL_CTL_STOP,
};

/* One parsed message from the agent; numbers absent from it are -1, strings "". */
typedef struct coll_ctl_msg {
  int verb;
  int epoch;
  int rank, size, local_rank, local_size, node_rank, nnodes, master_port;
  int grow;     /* reshape: 1 when a node joins (every member lives), else -1 */
  int defer_ms; /* reshape with grow=1: the most the agent lets a program defer it, else -1 */
  char store[280];
  char job[201];
  char master_addr[256];
  char why[COLL_CTL_MAX + 1]; /* control characters replaced by '?' */
} coll_ctl_msg;

/*
 * Parses one message of len bytes (not NUL-terminated). Returns 0, or
 * COHORT_EPROTO with a one-line reason in err (errlen bytes) when the
 * message is malformed: empty, too long, a NUL or control byte outside why=,
 * a field without '=', a number out of range, a string too long, or a form
 * without epoch, rank, size, store and job (or rank >= size). Unknown keys
 * are ignored; an unknown verb gives COLL_CTL_UNKNOWN and 0.
 */
int coll_ctl_parse(const char *buf, size_t len, coll_ctl_msg *m, char *err, size_t errlen);

/* What the listening thread learnt, under mu (the communicator reads it in reform). */
typedef struct coll_ctl {
  int fd;      /* the worker's end of the channel, -1 without one */
  int wake_fd; /* eventfd that stops the thread */
  pthread_t thread;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int closed;                 /* the agent's end closed (or a read failed) */
  int stopped;                /* a stop message came */
  int reshaped;               /* highest epoch a reshape ended, -1 */
  int bad;                    /* a malformed message came since the last reform */
  coll_ctl_msg form;          /* the newest form (form.verb == 0: none) */
  char why[COLL_CTL_MAX + 1]; /* the stop's why, or the malformed message's reason */
  /* Called by the thread, under mu, with the message (reshape, stop): it may fail the
   * communicator. */
  void (*notify)(void *arg, const coll_ctl_msg *m);
  void *notify_arg;
  /* A timed wake (base_now_ms(); 0: none), set under mu by notify: once it passes, the thread
   * clears it and calls expire under mu. */
  int64_t deadline_ms;
  void (*expire)(void *arg);
} coll_ctl;

/* Takes the channel named by COHORT_CONTROL_FD (when set and no other communicator of this
 * process holds it), says hello (with await_form=1 when await_form: this process can be started
 * ahead of its membership) and starts the thread. 0 (also without a channel: fd stays -1), or
 * COHORT_ENOENV for a malformed or unusable variable, or an error. */
int coll_ctl_open(coll_ctl *ctl, int await_form);
/* Stops the thread and gives the channel back (not closed: the process keeps it). */
void coll_ctl_close(coll_ctl *ctl);
/* Sends one message (printf format). 0 or an error (-EPIPE once the agent is gone). */
int coll_ctl_send(coll_ctl *ctl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif

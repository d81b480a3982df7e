/* relay.c - the workers' output relayed by a thread while the loop waits elsewhere. */
#include "agent/relay.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include "agent/agent.h"

static void *relay_main(void *arg) {
  relay *r = arg;
  for (;;) {
    struct pollfd pfd[1 + 2 * AGENT_MAX_NPROC];
    worker_stream *stream[1 + 2 * AGENT_MAX_NPROC];
    worker *owner[1 + 2 * AGENT_MAX_NPROC];
    nfds_t n = 0;
    pfd[n++] = (struct pollfd){.fd = r->stop[0], .events = POLLIN};
    for (int i = 0; i < r->n; i++) {
      worker_stream *ss[2] = {&r->w[i].out, &r->w[i].err};
      for (int k = 0; k < 2; k++) {
        if (ss[k]->fd < 0) continue;
        pfd[n] = (struct pollfd){.fd = ss[k]->fd, .events = POLLIN};
        stream[n] = ss[k];
        owner[n++] = &r->w[i];
      }
    }
    if (poll(pfd, n, -1) < 0 && errno != EINTR) return NULL;
    for (nfds_t k = 1; k < n; k++)
      if (pfd[k].revents != 0) agent_worker_stream_read(owner[k], stream[k]);
    if (pfd[0].revents != 0) return NULL;
  }
}

int agent_relay_start(relay *r, worker *w, int n) {
  *r = (relay){.w = w, .n = n, .stop = {-1, -1}};
  if (n > AGENT_MAX_NPROC) return -EINVAL;
  if (pipe2(r->stop, O_CLOEXEC) != 0) return -errno;
  /* The agent's signals are for its main thread's handlers, not this one. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&r->thread, NULL, relay_main, r);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc == 0) {
    r->on = 1;
    return 0;
  }
  close(r->stop[0]);
  close(r->stop[1]);
  r->stop[0] = r->stop[1] = -1;
  return -rc;
}

void agent_relay_stop(relay *r) {
  if (!r->on) return;
  char b = 0;
  while (write(r->stop[1], &b, 1) < 0 && errno == EINTR) {
  }
  pthread_join(r->thread, NULL);
  close(r->stop[0]);
  close(r->stop[1]);
  r->on = 0;
}

/* signals.c - the handler only writes the signal number to a pipe. */
#include "agent/signals.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "agent/dirs.h"
#include "base/base.h"

static int sig_pipe[2] = {-1, -1};
/* Caught and passed to the loop (SIGQUIT: a stack dump, not forwarded). */
static const int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT};

/* While no worker exists (rendezvous), a stop signal ends the agent at once. */
static volatile sig_atomic_t no_workers = 1;
/* The error-file directory, empty between attempts; removed (rmdir is
 * async-signal-safe) when a signal ends the agent. */
static char sig_err_dir[128], sig_err_lock[160];

int agent_signals_is_stop(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP;
}

static void on_signal(int sig) {
  int saved = errno;
  if (no_workers && agent_signals_is_stop(sig)) {
    if (sig_err_dir[0] != '\0') {
      unlink(sig_err_lock); /* the agent's lock on it (dirs.h) */
      rmdir(sig_err_dir);
    }
    signal(sig, SIG_DFL);
    raise(sig);
  }
  unsigned char b = (unsigned char)sig;
  ssize_t k = write(sig_pipe[1], &b, 1);
  (void)k;
  errno = saved;
}

int agent_signals_install(void) {
  if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return -errno;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCHLD, &sa, NULL);
  for (size_t i = 0; i < BASE_ARRAY_LEN(forwarded_signals); i++)
    sigaction(forwarded_signals[i], &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

void agent_signals_restore(void) {
  signal(SIGCHLD, SIG_DFL);
  for (size_t i = 0; i < BASE_ARRAY_LEN(forwarded_signals); i++)
    signal(forwarded_signals[i], SIG_DFL);
  for (int i = 0; i < 2; i++) {
    if (sig_pipe[i] >= 0) close(sig_pipe[i]);
    sig_pipe[i] = -1;
  }
  sig_err_dir[0] = '\0';
}

int agent_signals_fd(void) {
  return sig_pipe[0];
}

int agent_signals_notify_fd(void) {
  return sig_pipe[1];
}

ssize_t agent_signals_read(unsigned char *buf, size_t len) {
  ssize_t got = read(sig_pipe[0], buf, len);
  return got > 0 ? got : 0;
}

void agent_signals_set_workers(int running) {
  no_workers = !running;
}

void agent_signals_set_dir(const char *dir) {
  base_strlcpy(sig_err_dir, dir, sizeof sig_err_dir);
  snprintf(sig_err_lock, sizeof sig_err_lock, "%s/%s", dir, AGENT_DIRS_LOCK);
}

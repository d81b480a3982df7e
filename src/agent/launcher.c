/* launcher.c - the thread that reads the agent's connection to `cohort launch`. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "agent/launcher.h"

static atomic_int lost;
static atomic_int stop_asked;

static void *launcher_main(void *arg) {
  int fd = (int)(long)arg;
  char line[64];
  size_t len = 0;
  for (;;) {
    ssize_t got = read(fd, line + len, sizeof line - len);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    len += (size_t)got;
    char *nl = memchr(line, '\n', len);
    if (nl != NULL && nl - line == 4 && memcmp(line, "stop", 4) == 0) {
      atomic_store(&stop_asked, 1);
      kill(getpid(), SIGTERM);
      len = 0;
      continue;
    }
    /* Anything else is not the launcher's: forget it. */
    if (nl != NULL || len == sizeof line) len = 0;
  }
  /* End of file after a stop is the launcher closing its end, as it does. */
  if (!atomic_load(&stop_asked)) {
    atomic_store(&lost, 1);
    kill(getpid(), SIGHUP);
  }
  close(fd);
  return NULL;
}

int agent_launcher_read_token(int fd, char *out, size_t cap) {
  size_t len = 0;
  for (;;) {
    char c;
    ssize_t got = read(fd, &c, 1);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -errno;
    if (got == 0) return -ENODATA;
    if (c == '\n') break;
    if (len + 1 >= cap) return -EINVAL;
    out[len++] = c;
  }
  out[len] = '\0';
  return len > 0 ? 0 : -EINVAL;
}

int agent_launcher_watch_start(int fd) {
  pthread_t t;
  pthread_attr_t attr;
  sigset_t all, old;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  /* The agent's signals are for its main thread's handlers, not this one. */
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&t, &attr, launcher_main, (void *)(long)fd);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  return -rc;
}

int agent_launcher_lost(void) {
  return atomic_load(&lost);
}

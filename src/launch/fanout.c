/*
 * fanout.c - short commands run in parallel with a bound and one deadline
 * for all of them (pdsh's model): the pre-flight's `cohort --version` on
 * every host. Output is captured, not relayed; only its start is kept.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "launch/internal.h"
#include "launch/launch.h"

extern char **environ;

typedef struct child {
  pid_t pid; /* 0: not started or reaped */
  int fd[2]; /* stdout, stderr read ends; -1 when closed */
  size_t len[2];
} child;

int launch_spawn(char *const *argv, int stdin_pipe, int own_group, pid_t *pid, int fds[3],
                 int *spawn_errno) {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, rc = 0;
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  sigset_t none, all;
  *pid = 0;
  fds[0] = fds[1] = fds[2] = -1;
  if ((stdin_pipe && pipe2(in, O_CLOEXEC) != 0) || pipe2(out, O_CLOEXEC) != 0 ||
      pipe2(err, O_CLOEXEC) != 0) {
    rc = -errno;
    goto out;
  }
  posix_spawn_file_actions_init(&fa);
  if (stdin_pipe)
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  else
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  /* The child starts with no blocked signal and default dispositions,
   * whatever the caller has blocked or ignored. */
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_init(&attr);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                      (own_group ? POSIX_SPAWN_SETPGROUP : 0));
  int e = posix_spawnp(pid, argv[0], &fa, &attr, argv, environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  if (e != 0) {
    *pid = 0;
    *spawn_errno = e;
    goto out;
  }
  fds[0] = in[1];
  fds[1] = out[0];
  fds[2] = err[0];
  in[1] = out[0] = err[0] = -1;
out:
  for (int i = 0; i < 2; i++) {
    if (in[i] >= 0) close(in[i]);
    if (out[i] >= 0) close(out[i]);
    if (err[i] >= 0) close(err[i]);
  }
  return rc;
}

/* Starts argv with stdin on /dev/null and stdout/stderr captured. */
static int spawn_captured(char *const *argv, child *c, int *spawn_errno) {
  int fds[3];
  int rc = launch_spawn(argv, 0, 0, &c->pid, fds, spawn_errno);
  c->fd[0] = fds[1];
  c->fd[1] = fds[2];
  return rc;
}

/* Reads what is there; keeps the start of the output, discards the rest. */
static void drain(child *c, int s, launch_result *r) {
  char *buf = s == 0 ? r->out : r->err;
  size_t cap = s == 0 ? sizeof r->out : sizeof r->err;
  char scratch[4096];
  ssize_t got = read(c->fd[s], scratch, sizeof scratch);
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (got <= 0) {
    close(c->fd[s]);
    c->fd[s] = -1;
    return;
  }
  size_t keep = (size_t)got;
  if (keep > cap - 1 - c->len[s]) keep = cap - 1 - c->len[s];
  memcpy(buf + c->len[s], scratch, keep);
  c->len[s] += keep;
  buf[c->len[s]] = '\0';
}

/* Reaps the child once its output is closed; 1 when it is done. */
static int try_reap(child *c, launch_result *r) {
  if (c->pid == 0) return 1;
  if (c->fd[0] >= 0 || c->fd[1] >= 0) return 0;
  pid_t w = waitpid(c->pid, &r->status, WNOHANG);
  if (w == 0 || (w < 0 && errno == EINTR)) return 0;
  c->pid = 0;
  return 1;
}

static void kill_child(child *c, launch_result *r, int timed_out) {
  if (c->pid == 0) return;
  kill(c->pid, SIGKILL);
  while (waitpid(c->pid, &r->status, 0) < 0 && errno == EINTR) {
  }
  for (int s = 0; s < 2; s++)
    if (c->fd[s] >= 0) close(c->fd[s]);
  c->fd[0] = c->fd[1] = -1;
  c->pid = 0;
  r->timed_out = timed_out;
}

/* One poll() over every open output; at most 100 ms, or 5 ms while a
 * closed child waits to be reaped. */
static int poll_outputs(child *cs, size_t n, launch_result *results, int64_t deadline) {
  struct pollfd pfd[128];
  size_t who[128], np = 0;
  int reaping = 0;
  for (size_t i = 0; i < n; i++) {
    if (cs[i].pid == 0) continue;
    if (cs[i].fd[0] < 0 && cs[i].fd[1] < 0) reaping = 1;
    for (int s = 0; s < 2; s++)
      if (cs[i].fd[s] >= 0 && np < 128) {
        pfd[np] = (struct pollfd){.fd = cs[i].fd[s], .events = POLLIN};
        who[np++] = i * 2 + (size_t)s;
      }
  }
  int wait_ms = base_deadline_left(deadline);
  if (wait_ms > 100) wait_ms = 100;
  if (reaping && wait_ms > 5) wait_ms = 5;
  int ready = poll(pfd, np, wait_ms);
  if (ready < 0) return errno == EINTR ? 0 : -errno;
  for (size_t k = 0; k < np; k++)
    if (pfd[k].revents != 0) drain(&cs[who[k] / 2], (int)(who[k] % 2), &results[who[k] / 2]);
  return 0;
}

int launch_run_all(char **const *argvs, size_t n, int max_parallel, int64_t timeout_ms,
                   launch_result *results) {
  if (max_parallel < 1) max_parallel = 1;
  if (max_parallel > 64) max_parallel = 64; /* two fds each in one poll() of 128 */
  child *cs = calloc(n ? n : 1, sizeof *cs);
  if (cs == NULL) return -ENOMEM;
  memset(results, 0, n * sizeof *results);
  int64_t deadline = base_deadline_in(timeout_ms);
  size_t next = 0, done = 0;
  int running = 0, rc = 0;
  for (size_t i = 0; i < n; i++) cs[i].fd[0] = cs[i].fd[1] = -1;
  while (done < n && rc == 0) {
    while (running < max_parallel && next < n && base_deadline_left(deadline) > 0) {
      rc = spawn_captured(argvs[next], &cs[next], &results[next].spawn_errno);
      if (rc != 0) break;
      if (cs[next].pid != 0)
        running++;
      else
        done++;
      next++;
    }
    if (rc == 0) rc = poll_outputs(cs, next, results, deadline);
    for (size_t i = 0; i < next; i++) {
      if (cs[i].pid != 0 && try_reap(&cs[i], &results[i])) {
        running--;
        done++;
      }
    }
    if (base_deadline_left(deadline) == 0) {
      for (size_t i = 0; i < n; i++) {
        if (cs[i].pid != 0 || i >= next) results[i].timed_out = 1;
        kill_child(&cs[i], &results[i], 1);
      }
      break;
    }
  }
  for (size_t i = 0; i < n; i++) kill_child(&cs[i], &results[i], 0);
  free(cs);
  return rc;
}

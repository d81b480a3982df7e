/*
 * spawn.c - starting one ssh client with its standard streams on pipes
 * (internal.h): what the job's sessions are made of.
 *
 * fork() rather than posix_spawn(): glibc's posix_spawn is a vfork, which
 * holds the caller until the child has executed its program. With every
 * host's ssh client started at once, the CPUs are busy with the key
 * exchanges of those already started, and each start held the launcher
 * for one or two of the scheduler's slices: the sixteenth host's client
 * was started 95 ms after the first. After a fork the caller goes on at
 * once; whether the program could be executed comes later, on a pipe that
 * closes at the exec (launch_spawn_finish).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "launch/internal.h"

/* In the child: fd onto target, kept open across the exec. */
static int move_fd(int fd, int target) {
  if (fd == target) return fcntl(fd, F_SETFD, 0);
  return dup2(fd, target) < 0 ? -1 : 0;
}

/* The child between fork and exec: only async-signal-safe calls. Every
 * signal is blocked on entry (launch_spawn_start). */
static void child(char *const *argv, int in, int out, int err, int own_session, int exec_fd) {
  struct sigaction dfl = {.sa_handler = SIG_DFL};
  sigemptyset(&dfl.sa_mask);
  /* Default dispositions (the caller's handlers write to its own pipes, it ignores SIGPIPE),
   * then no blocked signal. */
  for (int sig = 1; sig < NSIG; sig++)
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  if (own_session) setsid();
  if (in < 0) in = open("/dev/null", O_RDONLY | O_CLOEXEC);
  /* Moved in the order 0, 1, 2: one still to be moved must not be where an earlier one goes
   * (the caller may have had stdin or stdout closed). */
  if (out <= 1) out = fcntl(out, F_DUPFD_CLOEXEC, 3);
  if (err <= 2) err = fcntl(err, F_DUPFD_CLOEXEC, 3);
  if (in >= 0 && out >= 0 && err >= 0 && move_fd(in, 0) == 0 && move_fd(out, 1) == 0 &&
      move_fd(err, 2) == 0)
    execvp(argv[0], argv);
  int e = errno;
  if (write(exec_fd, &e, sizeof e) < 0) {
    /* The caller sees an exit 127 without the reason. */
  }
  _exit(127);
}

int launch_spawn_start(char *const *argv, int stdin_pipe, int own_session, pid_t *pid, int fds[3],
                       int *exec_fd) {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, ex[2] = {-1, -1}, rc = 0;
  *pid = 0;
  *exec_fd = -1;
  fds[0] = fds[1] = fds[2] = -1;
  if ((stdin_pipe && pipe2(in, O_CLOEXEC) != 0) || pipe2(out, O_CLOEXEC) != 0 ||
      pipe2(err, O_CLOEXEC) != 0 || pipe2(ex, O_CLOEXEC) != 0) {
    rc = -errno;
    goto out;
  }
  /* No handler of the caller's may run in the child before it has put the defaults back. */
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, &old);
  pid_t p = fork();
  if (p == 0) child(argv, in[0], out[1], err[1], own_session, ex[1]);
  int e = errno;
  sigprocmask(SIG_SETMASK, &old, NULL);
  if (p < 0) {
    rc = -e;
    goto out;
  }
  *pid = p;
  fds[0] = in[1];
  fds[1] = out[0];
  fds[2] = err[0];
  *exec_fd = ex[0];
  in[1] = out[0] = err[0] = ex[0] = -1;
out:
  for (int i = 0; i < 2; i++) {
    if (in[i] >= 0) close(in[i]);
    if (out[i] >= 0) close(out[i]);
    if (err[i] >= 0) close(err[i]);
    if (ex[i] >= 0) close(ex[i]);
  }
  return rc;
}

int launch_spawn_finish(int exec_fd) {
  int e = 0;
  ssize_t got;
  while ((got = read(exec_fd, &e, sizeof e)) < 0 && errno == EINTR) {
  }
  close(exec_fd);
  return got == (ssize_t)sizeof e ? e : 0;
}

/*
 * spawn.c - starting one ssh client with its standard streams on pipes
 * (internal.h): what the job's sessions are made of.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include "launch/internal.h"

extern char **environ;

int launch_spawn(char *const *argv, int stdin_pipe, int own_session, pid_t *pid, int fds[3],
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
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                      (own_session ? POSIX_SPAWN_SETSID : 0));
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

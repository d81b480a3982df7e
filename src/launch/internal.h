/*
 * internal.h - what the files of src/launch share and nothing else uses.
 */
#ifndef COHORT_LAUNCH_INTERNAL_H
#define COHORT_LAUNCH_INTERNAL_H

#include <sys/types.h>

/*
 * Starts argv (searched in PATH) with default signal dispositions and no
 * blocked signal, without waiting for it to be executed. Its stdout and
 * stderr go to new pipes whose read ends are returned in fds[1] and fds[2]
 * (O_CLOEXEC); its stdin is a new pipe whose write end is fds[0] when
 * stdin_pipe is set, else /dev/null (fds[0] = -1). With own_session the
 * child leads a new session (setsid, as pdsh starts its ssh clients): a
 * Ctrl-C on the terminal reaches the caller alone, and where the scheduler
 * shares the CPU between sessions (autogroups), the ssh clients' key
 * exchanges do not all share one share. (ssh runs in batch mode: it never
 * needs the terminal.) Returns 0 with *pid set and *exec_fd, which
 * launch_spawn_finish takes; -errno when a pipe or the process could not
 * be made (nothing is left open then).
 */
int launch_spawn_start(char *const *argv, int stdin_pipe, int own_session, pid_t *pid, int fds[3],
                       int *exec_fd);

/*
 * Waits until the child of launch_spawn_start has executed its program,
 * and closes exec_fd. Returns 0, or the errno of a failed exec (the child
 * then exits with status 127: reap it). Starting many children first and
 * finishing them after lets them all be executed at once.
 */
int launch_spawn_finish(int exec_fd);

#endif

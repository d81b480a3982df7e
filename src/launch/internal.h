/*
 * internal.h - what the files of src/launch share and nothing else uses.
 */
#ifndef COHORT_LAUNCH_INTERNAL_H
#define COHORT_LAUNCH_INTERNAL_H

#include <sys/types.h>

/*
 * Starts argv (searched in PATH) with default signal dispositions and no
 * blocked signal. Its stdout and stderr go to new pipes whose read ends are
 * returned in fds[1] and fds[2] (O_CLOEXEC); its stdin is a new pipe whose
 * write end is fds[0] when stdin_pipe is set, else /dev/null (fds[0] = -1).
 * With own_session the child leads a new session (setsid, as pdsh starts
 * its ssh clients): a Ctrl-C on the terminal reaches the caller alone, and
 * where the scheduler shares the CPU between sessions (autogroups), the ssh
 * clients' key exchanges do not all share one share. (ssh runs in batch
 * mode: it never needs the terminal.) Returns 0 with *pid set; 0 with
 * *pid = 0 and *spawn_errno set when the program could not be executed;
 * -errno when a pipe could not be made.
 */
int launch_spawn(char *const *argv, int stdin_pipe, int own_session, pid_t *pid, int fds[3],
                 int *spawn_errno);

#endif

/*
 * handshake.c - the verdict on a host's first answer. Before anything
 * starts anywhere, every host must answer over ssh within the time given
 * and run the same cohort version as this machine: a job half-started on
 * the hosts that answered would only fail later, with a less clear cause,
 * and leave agents waiting for the others.
 */
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "launch/launch.h"

/* What ended a session that never answered. */
static void judge_ended(const launch_answer *a, const char *cohort_path, char *line, size_t cap) {
  const char *sep = a->err[0] ? ": " : "";
  if (WIFSIGNALED(a->status))
    snprintf(line, cap, "ssh was killed by signal %d", WTERMSIG(a->status));
  else if (WEXITSTATUS(a->status) == 255)
    snprintf(line, cap, "unreachable over ssh: %s", a->err[0] ? a->err : "ssh failed (exit 255)");
  else if (WEXITSTATUS(a->status) == 127)
    snprintf(line, cap, "%s is not there (give the remote path with --cohort PATH)", cohort_path);
  else
    snprintf(line, cap, "'%s run' ended with exit code %d before it answered%s%s", cohort_path,
             WEXITSTATUS(a->status), sep, a->err);
}

int launch_judge_answer(const launch_answer *a, const char *cohort_path, const char *expect,
                        int64_t timeout_ms, char *line, size_t cap) {
  line[0] = '\0';
  if (a->spawn_errno != 0)
    snprintf(line, cap, "cannot run ssh: %s", strerror(a->spawn_errno));
  else if (a->version == NULL && a->ended)
    judge_ended(a, cohort_path, line, cap);
  else if (a->version == NULL)
    snprintf(line, cap, "no answer over ssh within %lld s", (long long)((timeout_ms + 999) / 1000));
  else if (strcmp(a->version, expect) != 0)
    snprintf(line, cap, "runs '%.100s', not '%s' as this machine does", a->version, expect);
  else if (a->ended)
    snprintf(line, cap, "'%s run' ended with exit code %d before the job started%s%s", cohort_path,
             WIFEXITED(a->status) ? WEXITSTATUS(a->status) : 128 + WTERMSIG(a->status),
             a->err[0] ? ": " : "", a->err);
  return line[0] != '\0';
}

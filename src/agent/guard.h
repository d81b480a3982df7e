/*
 * guard.h - a small watcher process that kills the workers' process groups
 * when the agent dies without cleaning up (SIGKILL, OOM killer).
 *
 * PR_SET_PDEATHSIG covers the workers themselves but not the processes they
 * fork; the guard holds the read end of a pipe from the agent and, when it
 * sees end of file without having been told to quit, sends SIGKILL to every
 * process group the agent registered and to every process of the job's
 * cgroup (what left the groups: setsid, double forks, nohup).
 */
#ifndef COHORT_AGENT_GUARD_H
#define COHORT_AGENT_GUARD_H

#include <stddef.h>
#include <sys/types.h>

typedef struct guard {
  pid_t pid; /* 0 when not running */
  int fd;    /* write end of the pipe, -1 when not running */
} guard;

/* Starts the guard. Returns 0 or -errno. */
int agent_guard_start(guard *g);
/* Registers or forgets a process group. */
void agent_guard_add(guard *g, pid_t pgid);
void agent_guard_remove(guard *g, pid_t pgid);
/*
 * Multi-node: where to report the agent's death. When the agent dies, the
 * guard first publishes "node N (host): its agent died" as the round's
 * failure (so every node names the right cause), then kills the groups.
 */
void agent_guard_set_report(guard *g, const char *store_host, int store_port, const char *token,
                            const char *job_id, int round, int node, const char *hostname);

/* A directory of the agent's (its temporary files) to remove if it dies. */
void agent_guard_set_dir(guard *g, const char *dir);

/* The job's cgroup (sweep.h), every process of which the guard kills if the agent dies. */
void agent_guard_set_cgroup(guard *g, const char *dir, int v2);

/* Tells the guard to exit without killing anything and reaps it. */
void agent_guard_stop(guard *g);

#endif

/*
 * sweep.h - every process a job's workers started ends with the job,
 * whatever it did to leave: its own session (setsid), its own process
 * group, a double fork, nohup.
 *
 * Two nets, the second only where the node lets the agent have it:
 *  - the agent is the child subreaper of its workers' descendants
 *    (PR_SET_CHILD_SUBREAPER), so an orphan comes back to it instead of
 *    init; at the end of an attempt it kills every descendant it has left
 *    but the guard, walking /proc, until none is left;
 *  - a cgroup of the job's own, made by the agent under its own cgroup:
 *    cgroup v2 where `cgroup.kill` exists, else v1's freezer controller.
 *    Each worker moves itself into it before exec, and no descendant can
 *    leave it without privileges. The agent kills the cgroup at the end of
 *    an attempt, and the guard (guard.h) kills it when the agent is
 *    SIGKILLed, which the first net cannot cover: the orphans of a dead
 *    agent go to init.
 *
 * Thread safety: none; agent_sweep_enter_self() is async-signal-safe (a forked
 * child calls it before exec).
 */
#ifndef COHORT_AGENT_SWEEP_H
#define COHORT_AGENT_SWEEP_H

#include <stddef.h>
#include <sys/types.h>

typedef struct sweep {
  char dir[256];   /* the job's cgroup directory, "" none */
  char procs[272]; /* dir/cgroup.procs, what a worker writes itself into */
  int v2;          /* cgroup v2 (cgroup.kill), else v1 freezer */
} sweep;

/*
 * Makes the job's cgroup named name (e.g. "cohort-<pid>") under this
 * process's own cgroup, found through proc_root ("/proc"): v2 first, then
 * v1 freezer. Returns 0 with s->dir set, or -errno when the node gives none
 * (no writable hierarchy); s is usable either way.
 */
int agent_sweep_open(sweep *s, const char *proc_root, const char *name);

/* In a forked child before exec: moves the calling process into the job's
 * cgroup (nothing when there is none). Async-signal-safe. */
void agent_sweep_enter_self(const sweep *s);

/*
 * Kills what is left of the job: every process of its cgroup, and every
 * descendant of process self but spare (the guard; 0 none), found under
 * proc_root; repeats until none is left or a bounded number of passes.
 * Reaps the children it killed. Returns how many processes it killed.
 */
int agent_sweep_kill(const sweep *s, const char *proc_root, pid_t self, pid_t spare);

/* Kills every process of cgroup dir (v2: cgroup.kill; v1: frozen, killed,
 * thawed). What the guard does with the job's cgroup when the agent died. */
void agent_sweep_kill_cgroup(const char *dir, int v2);

/* Removes the job's cgroup (waiting briefly for its last processes to go). */
void agent_sweep_close(sweep *s);

#endif

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
 *    Each worker is born in it (clone3's CLONE_INTO_CGROUP, v2) or moves
 *    itself into it before exec, and no descendant can leave it without
 *    privileges. The agent kills the cgroup at the end of
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
  int fd;          /* v2: dir opened O_PATH, where clone3 starts a child; -1 none */
  int born;        /* children born in it by clone3: 1 yes, -1 no (moved in), 0 to be tried */
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
 * fork() whose child is in the job's cgroup (s NULL or without one: a
 * plain fork): born there by clone3's CLONE_INTO_CGROUP where the kernel
 * allows (v2, Linux >= 5.7), else moved in by agent_sweep_enter_self()
 * in the child. The first move into a new cgroup through cgroup.procs
 * waits out an RCU grace period (8-15 ms on a 6.x kernel), which a
 * one-node job would spend before its first worker ran. Whether clone3
 * works is tried first with a child that exits at once: some kernels
 * SIGKILL a child born in a cgroup that was ever killed, or whose parent's
 * cgroup was (6.18 here); it is tried again after each agent_sweep_kill().
 * The child may only make async-signal-safe calls, then exec or _exit.
 */
pid_t agent_sweep_fork(sweep *s);

/*
 * Kills what is left of the job: every process of its cgroup, and every
 * descendant of process self but spare (the guard; 0 none), found under
 * proc_root; repeats until none is left or a bounded number of passes.
 * Reaps the children it killed. Returns how many processes it killed.
 */
int agent_sweep_kill(sweep *s, const char *proc_root, pid_t self, pid_t spare);

/* Kills every process of cgroup dir (v2: cgroup.kill; v1: frozen, killed,
 * thawed). What the guard does with the job's cgroup when the agent died. */
void agent_sweep_kill_cgroup(const char *dir, int v2);

/* Removes the job's cgroup (waiting briefly for its last processes to go). */
void agent_sweep_close(sweep *s);

#endif

/*
 * dirs.h - an attempt's files and the agent's leftovers: the --log-dir
 * directory of an attempt, its per-rank logs, filtered logs and stacks;
 * removing an attempt's error files, its temporary directory,
 * shared-memory segments a crashed job left behind, the error directories
 * of agents that died with their guard (kill -9 of both). Removal: files,
 * and the files of subdirectories one level down (Python's __pycache__).
 */
#ifndef COHORT_AGENT_DIRS_H
#define COHORT_AGENT_DIRS_H

#include <stddef.h>

#include "agent/agent.h"

/* The file in a directory of agent_dirs_make_locked that its agent holds locked. */
#define AGENT_DIRS_LOCK ".cohort-lock"

/* Removes the entries of dir whose names start with prefix ("" for all)
 * but its lock file; with what (e.g. "shared memory"), names each one
 * removed in an info line. Errors are ignored. */
void agent_dirs_clear(const char *dir, const char *prefix, const char *what);

/* Removes dir, the files in it and its subdirectories' files. */
void agent_dirs_remove(const char *dir);

/*
 * mkdtemp(dir) (dir ends in XXXXXX, replaced), holding AGENT_DIRS_LOCK in it
 * locked (flock) until the returned descriptor (close-on-exec) is closed or
 * this process dies. Returns the descriptor, or a negative errno.
 */
int agent_dirs_make_locked(char *dir);

/*
 * Removes the directories parent/prefix* of this user that hold a lock file
 * no process holds: those of agents killed with their guard. A directory
 * without the lock file is left alone. Returns how many it removed.
 */
int agent_dirs_sweep(const char *parent, const char *prefix);

/* --log-dir DIR/attempt<K>, made if need be, into out; -1 without --log-dir. */
int agent_dirs_attempt(const agent_config *cfg, int restart, char *out, size_t outlen);

/* Where attempt restart's stacks go: --log-dir DIR/attempt<K>/stacks, else a
 * directory of its own under $TMPDIR (kept, named in the report); NULL if none. */
const char *agent_dirs_stacks(const agent_config *cfg, int restart, char *out, size_t outlen);

/* Rank rank's log file in the attempt's directory (opened for writing), -1 none: rank<R>.log,
 * or for a process a re-form started into round N > 0, rank<R>.round<N>.log. */
int agent_dirs_rank_log(const agent_config *cfg, int restart, int rank, int round);

/*
 * --duplicate-std*-filters: the attempt's filtered_stdout.log and
 * filtered_stderr.log into dup_fd (the previous ones closed; -1 none),
 * shared by the node's workers.
 */
void agent_dirs_open_filtered(const agent_config *cfg, int restart, int dup_fd[2]);

/* Removes shared-memory segments a crashed job of this run id left behind. */
void agent_dirs_clear_shm(const char *run_id);

#endif

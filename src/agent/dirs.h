/*
 * dirs.h - an attempt's files and the agent's leftovers: the --log-dir
 * directory of an attempt, its per-rank logs, filtered logs and stacks;
 * removing an attempt's error files, its temporary directory,
 * shared-memory segments a crashed job left behind. Removal: plain files
 * only (the agent makes no subdirectories there).
 */
#ifndef COHORT_AGENT_DIRS_H
#define COHORT_AGENT_DIRS_H

#include <stddef.h>

#include "agent/agent.h"

/* Removes the entries of dir whose names start with prefix ("" for all);
 * with what (e.g. "shared memory"), names each one removed in an info
 * line. Errors are ignored. */
void agent_dirs_clear(const char *dir, const char *prefix, const char *what);

/* Removes dir and the files in it. */
void agent_dirs_remove(const char *dir);

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

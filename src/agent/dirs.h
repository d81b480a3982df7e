/*
 * dirs.h - removing the agent's leftovers: an attempt's error files, its
 * temporary directory, shared-memory segments a crashed job left behind.
 * Plain files only (the agent makes no subdirectories there).
 */
#ifndef COHORT_AGENT_DIRS_H
#define COHORT_AGENT_DIRS_H

/* Removes the entries of dir whose names start with prefix ("" for all);
 * with what (e.g. "shared memory"), names each one removed in an info
 * line. Errors are ignored. */
void agent_dirs_clear(const char *dir, const char *prefix, const char *what);

/* Removes dir and the files in it. */
void agent_dirs_remove(const char *dir);

#endif

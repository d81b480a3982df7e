/*
 * proc.h - one reader of /proc/PID/stat, for the agent's files that ask
 * about a process (its state, parent and CPU time).
 *
 * The root is a parameter ("/proc" in production, a fixture tree in tests),
 * as for every probe of the system. Thread-safe: no state.
 */
#ifndef COHORT_BASE_PROC_H
#define COHORT_BASE_PROC_H

#include <stdint.h>
#include <sys/types.h>

/* The fields of /proc/PID/stat that cohort reads (proc(5)). */
typedef struct base_proc_stat {
  int pid;
  int ppid;
  char state;     /* R, S, D, T (stopped), t (traced), Z, ... */
  uint64_t utime; /* user CPU time, clock ticks */
  uint64_t stime; /* system CPU time, clock ticks */
} base_proc_stat;

/*
 * Parses the text of a stat file. The command name may hold spaces and
 * ')': the fields after it start at the last ')'. Returns 0 or -EPROTO.
 */
int base_proc_stat_parse(const char *text, base_proc_stat *out);

/*
 * Reads proc_root/<pid>/stat. Returns 0, -ESRCH when there is no such
 * process, -EPROTO for a malformed file, or another -errno.
 */
int base_proc_stat_read(const char *proc_root, pid_t pid, base_proc_stat *out);

#endif

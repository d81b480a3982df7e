/*
 * snapshot.h - this node's status as `cohort status` shows it: published by
 * the agent's loop to the store (key J/status/<node>, jobctl.h) once per
 * heartbeat period, one write for all the node's ranks.
 *
 * The snapshot is one JSON object (docs/status.md): the node (rank, host,
 * agent pid, round, restarts, node counts, the root cause once failing) and
 * per local rank its pid, state (starting, running, exited with a code,
 * killed by a signal), uptime, seconds since its last output, CPU % over the
 * last period and RSS from /proc. Times are ages at `time_ms` (wall clock,
 * ms since the epoch), so a reader adds the snapshot's own age.
 *
 * Main thread only.
 */
#ifndef COHORT_AGENT_SNAPSHOT_H
#define COHORT_AGENT_SNAPSHOT_H

#include <stdint.h>
#include <sys/types.h>

#include "agent/agent.h"

#define SNAPSHOT_VERSION 1

/* The loop's memory between two snapshots: when the next is due, and each
 * local rank's CPU time at the last one (for the CPU % in between). */
typedef struct snapshot {
  int64_t next_ms;
  pid_t cpu_pid[AGENT_MAX_NPROC];
  int64_t cpu_ticks[AGENT_MAX_NPROC];
  int64_t cpu_at_ms[AGENT_MAX_NPROC];
} snapshot;

struct job;

/*
 * Publishes the snapshot when one is due (now: base_now_ms()). Returns the
 * milliseconds until the next is due. A store that does not answer costs
 * at most a short deadline; the snapshot is then skipped.
 */
int agent_snapshot_tick(struct job *j, int64_t now);

/* The snapshot as JSON text (malloc'ed), or NULL when out of memory. */
char *agent_snapshot_json(struct job *j, int64_t now);

/*
 * CPU time (utime + stime, clock ticks) and RSS (bytes) of pid from
 * /proc/PID/stat and /proc/PID/statm. Returns 0 or -errno (-ESRCH gone).
 */
int agent_snapshot_proc(pid_t pid, int64_t *ticks, int64_t *rss_bytes);

#endif

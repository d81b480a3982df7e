/*
 * jobctl.h - the keys through which a running job is watched and controlled
 * from outside (`cohort status`, `cohort stop`), and how a command finds the
 * job the way its agents do.
 *
 * Keys, beside the rounds' keys of join.h ("J/R/..."):
 *   J/status/<node>  the node's snapshot (snapshot.h), rewritten on each heartbeat
 *   J/stop           "USER@HOST: TEXT" once `cohort stop` was asked; the
 *                    round's fail key then carries "stopped by USER@HOST: TEXT"
 * docs/status.md describes them.
 */
#ifndef COHORT_AGENT_JOBCTL_H
#define COHORT_AGENT_JOBCTL_H

#include <stddef.h>

#include "store/store.h"

#include "agent/agent.h"
#include "base/net.h"
#include "rdzv/backend.h"
#include "rdzv/discover.h"
#include "store/auth.h"

/* The prefix of the root cause of a job stopped by `cohort stop`. */
#define JOBCTL_STOPPED_BY "stopped by "

/* Node node's acknowledgement of a stop of round, the key `cohort stop`
 * waits for on every node: "J/<round>/stopped/<node>"; node -1: the key
 * `cohort stop` sets once it has read them all ("J/<round>/stopped/all"),
 * until which the store's host keeps it up (a few seconds at most). */
void agent_jobctl_stop_ack_key(char *out, size_t outlen, const char *job_id, int round, int node);

/* "J/<what>" or, for node >= 0, "J/<what>/<node>". */
void agent_jobctl_key(char *out, size_t outlen, const char *job_id, const char *what, int node);

/*
 * The job id every node derives from the store's address (and Slurm's job
 * and step when there), keyed by the token. Returns 0 or -errno.
 */
int agent_jobctl_job_id(const rdzv_target *t, const char *token, char out[STORE_JOB_ID_LEN + 1]);

/* Where a running job's store is, and the job's id. */
typedef struct jobctl_where {
  char host[BASE_HOST_MAX]; /* with etcd: the endpoint the job id derives from */
  int port;
  char job_id[RDZV_JOB_ID_MAX + 1];
  int etcd; /* the job's keys are in etcd (found with RDZV_ETCD) */
} jobctl_where;

/*
 * Finds a running job from outside it, by opts as an agent would
 * (opts->job_id when given is the id, else it is derived as the agents do).
 * Never hosts anything: discovery that would make this process the host
 * means no job was found (-ENOENT). Returns 0 or a negative code with a
 * one-line reason in err.
 */
int agent_jobctl_find(const rdzv_opts *opts, char *const envp[], const char *token,
                      jobctl_where *out, char *err, size_t errlen);

/*
 * The backend holding the keys of the job w (from agent_jobctl_find or
 * agent_jobctl_local_find): its built-in store with token, or, for w->etcd,
 * etcd at eo (endpoints, TLS, credentials) as a guest whose writes (a
 * stop, a stacks request) live as long as node 0's agent (backend.h).
 * Connects nothing. Returns 0 or -errno.
 */
int agent_jobctl_backend(const jobctl_where *w, const char *token, const etcd_opts *eo,
                         rdzv_backend **out);

/*
 * A job on one node alone keeps its store on loopback with a random token;
 * so that its own user can watch it, the agent writes "127.0.0.1 PORT TOKEN PID"
 * to a file named after the job in a directory only that user may enter:
 * $XDG_RUNTIME_DIR/cohort, else /tmp/cohort-<uid> (mode 0700, file 0600).
 *
 * agent_jobctl_local_publish() writes it (path receives its name, to remove when
 * the job ends); it refuses (-EPERM) a directory that is not the user's own
 * or that others may enter.
 */
int agent_jobctl_local_publish(const char *job_id, int port, const char *token, char *path,
                               size_t pathlen);
/*
 * Finds this user's one-node job: job_id's file, or with job_id NULL the
 * only one there is (files of agents no longer alive do not count). Fills
 * out and token (STORE_TOKEN_MAX + 1 bytes). -ENOENT none, -EINVAL several
 * (err lists them) or a malformed file, -ESRCH job_id's agent is gone.
 */
int agent_jobctl_local_find(const char *job_id, jobctl_where *out, char *token, char *err,
                            size_t errlen);

#endif

/*
 * backend.h - where a job's rendezvous keys live: the built-in store (hosted
 * by node 0's agent) or etcd. The agent opens connections through here and
 * speaks to both with the store's calls (store.h; etcd through
 * store_client_wrap), so it keeps one path.
 *
 * etcd: every connection of one agent shares one lease, granted by the
 * first and kept alive by a thread of its own every third of its TTL; every
 * key the agent writes is attached to it, so the keys of an agent that dies
 * go when its lease expires, and the job's keys are gone once every agent
 * closed its backend (which revokes the lease), but for writes made to
 * linger (rdzv_backend_linger), which go with a lease of their own. Keys
 * live under "/cohort/<job id>/".
 *
 * Thread safety: connect may be called from several threads (the agent's
 * main thread and its watcher); each connection is used by one thread.
 */
#ifndef COHORT_RDZV_BACKEND_H
#define COHORT_RDZV_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "rdzv/etcd.h"
#include "store/store.h"

typedef struct rdzv_backend rdzv_backend;

/* The built-in store at host:port, authenticated with token (NULL: none). */
int rdzv_backend_store(const char *host, int port, const char *token, rdzv_backend **out);

/*
 * etcd at o->endpoints for job job_id, leases of ttl_ms (rounded up to whole
 * seconds, at least 2). Copies what it needs of o. Connects nothing yet.
 */
int rdzv_backend_etcd(const etcd_opts *o, const char *job_id, int64_t ttl_ms, rdzv_backend **out);

/*
 * etcd for a command from outside the job (cohort status, stop, stacks): it
 * grants no lease of its own. What it writes is attached to the lease of
 * the job's key anchor (node 0's snapshot, which node 0's agent keeps
 * under its lease), looked up before each write: it goes with that agent's
 * keys, so nothing it wrote outlives the job. A write while anchor is
 * absent is -ENOENT.
 */
int rdzv_backend_etcd_guest(const etcd_opts *o, const char *job_id, const char *anchor,
                            rdzv_backend **out);

int rdzv_backend_is_etcd(const rdzv_backend *b);

/* What the backend is, for messages: "the rendezvous store at H:P" or "etcd E1,E2". */
const char *rdzv_backend_name(const rdzv_backend *b);

/* How many servers a request may go round: etcd's endpoints, 1 for the built-in store. */
int rdzv_backend_members(const rdzv_backend *b);

/*
 * etcd: when (base_now_ms) a member last answered anything, an error or a 503 of an election
 * included; 0 before any answer, and always for the built-in store. A member that answers
 * but cannot serve is etcd busy, not etcd gone.
 */
int64_t rdzv_backend_answered(rdzv_backend *b);

/*
 * A new connection (retrying until deadline_ms). etcd: the first one grants
 * the lease and starts keeping it alive (not for a guest). Errors with one line in err.
 */
int rdzv_backend_connect(rdzv_backend *b, int64_t deadline_ms, store_client **out, char *err,
                         size_t errlen);

/*
 * etcd: from now on, the writes through client (one of b's connections)
 * outlive this agent: they are attached to the lease of key anchor (looked
 * up at the first of them; -ENOENT then when it is absent or has none) or,
 * anchor NULL, to a lease of ttl_ms of their own, granted at the first and
 * never renewed, instead of the agent's. A connection already lingering
 * keeps its lease. The built-in store: nothing changes (its keys live as
 * long as node 0's store). For the records of a round's end, which a slow
 * node must still find after the others have gone (agent/cluster.c).
 */
int rdzv_backend_linger(rdzv_backend *b, store_client *client, const char *anchor, int64_t ttl_ms);
/* etcd: revokes the lease client's lingering writes take, deleting every key attached to it,
 * and client's writes take the agent's lease again. The built-in store: nothing. */
int rdzv_backend_linger_end(rdzv_backend *b, store_client *client, int64_t deadline_ms);

/* The store is gone: closing does not try to revoke the lease (it lapses after its TTL). */
void rdzv_backend_lost(rdzv_backend *b);
/* Stops the lease's keep-alive and revokes it (etcd) unless lost, frees b. NULL ok. */
void rdzv_backend_close(rdzv_backend *b);

#endif

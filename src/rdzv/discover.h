/*
 * discover.h - finding the rendezvous store: static address, DNS name,
 * UDP multicast, a shared file, or the scheduler's environment.
 *
 * Every method produces the same thing, an rdzv_target: where the store is,
 * whether this node hosts it, this node's rank if known, and the node count.
 * The agent then has a single join path (src/agent).
 *
 * Errors: 0 or a negative code; a one-line reason in errbuf.
 */
#ifndef COHORT_RDZV_DISCOVER_H
#define COHORT_RDZV_DISCOVER_H

#include <stddef.h>
#include <stdint.h>

#include "base/net.h"

#define RDZV_DEFAULT_PORT 29400

/*
 * A job id (--job, --run-id, --rdzv-id, and the ids read back from
 * rendezvous files and multicast datagrams): 1 to RDZV_JOB_ID_MAX of
 * [A-Za-z0-9._-]. The one rule for it; 1 when job_id follows it.
 */
#define RDZV_JOB_ID_MAX 64
int rdzv_job_id_valid(const char *job_id);

typedef enum rdzv_method {
  RDZV_AUTO = 0, /* scheduler environment if detected, else static (--master) */
  RDZV_STATIC,   /* --master HOST:PORT (HOST may be a DNS name that resolves late) */
  RDZV_MCAST,    /* UDP multicast announcements on a group derived from the job id */
  RDZV_FILE,     /* --rdzv-file PATH on a shared filesystem */
  RDZV_ENV,      /* the scheduler's environment only */
  RDZV_ETCD      /* etcd at `master` (HOST:PORT,...): no node hosts the store (backend.h) */
} rdzv_method;

typedef struct rdzv_opts {
  rdzv_method method;
  const char *master;         /* "HOST:PORT" or NULL */
  int node_rank;              /* --node-rank, -1 when not given */
  int nnodes_min, nnodes_max; /* --nnodes N or MIN:MAX; 0 when not given */
  const char *job_id;         /* --job / --run-id: keeps jobs apart */
  const char *token;          /* authenticates multicast datagrams and file records; may be NULL */
  const char *iface;          /* multicast interface name or NULL (default route's) */
  const char *mcast_group;    /* "ADDR:PORT" override or NULL (derived from job_id) */
  const char *rdzv_file;      /* path for RDZV_FILE */
  const char *local_addr;     /* --local-addr: this node's address for the others, or NULL */
  int64_t deadline_ms;        /* absolute base_now_ms() deadline for discovery */
  int settle_ms;              /* election window when nobody claims rank 0 (mcast) */
} rdzv_opts;

typedef struct rdzv_target {
  char host[BASE_HOST_MAX]; /* the store's host (name or address) */
  int port;                 /* the store's port */
  int host_store;           /* 1: this node must host the store on `port` */
  int node_rank;            /* this node's rank, -1 when assigned at join */
  int nnodes_min, nnodes_max;
  char source[128]; /* one line for the start report, e.g. "slurm job 42, node[01-04]" */
} rdzv_target;

/*
 * Runs discovery per opts over the environment envp (NULL-terminated).
 * RDZV_AUTO returns -ENOENT when there is nothing to go by (no scheduler
 * environment and no --master): the caller may then run as a single node;
 * any other error is bad input or a failed method. docs/rdzv.md has the
 * rules of every method.
 */
int rdzv_discover(const rdzv_opts *opts, char *const envp[], rdzv_target *out, char *errbuf,
                  size_t errlen);

/*
 * After a hosting node has started its store on store_port, makes it
 * findable for the method: multicast announcements repeated (with jitter)
 * from a background thread until rdzv_publish_stop(); the shared file written
 * atomically (temporary file + rename) with the job id; nothing for static,
 * DNS and scheduler methods (*out may then be NULL). advertise_host is the
 * address the others should connect to (NULL: opts->local_addr if given, else
 * the method's own choice: the multicast interface's address, or for the file
 * this node's address on its default route's interface). For RDZV_FILE it fails with -EEXIST
 * when another node has claimed the file for this job meanwhile (nodes with
 * and without --node-rank mixed), rather than making a second host.
 * (A host found by RDZV_FILE or RDZV_MCAST gets a free port in
 * rdzv_target.port, free when discovery returned.)
 */
typedef struct rdzv_publisher rdzv_publisher;
int rdzv_publish_start(const rdzv_opts *opts, const char *advertise_host, int store_port,
                       rdzv_publisher **out, char *errbuf, size_t errlen);
/* Stops announcing (removes nothing a late joiner would still need). NULL ok. */
void rdzv_publish_stop(rdzv_publisher *pub);
/*
 * The job has formed: multicast stops its periodic announcements but still
 * answers at once whoever looks for the job (a late node of an elastic job,
 * `cohort status --discover mcast`). Other methods: nothing. NULL ok.
 */
void rdzv_publish_quiet(rdzv_publisher *pub);

#endif

/*
 * internal.h - the pieces of discovery that tests reach directly:
 * Slurm hostlist expansion, scheduler environment detection, the shared
 * file's format, the multicast datagram codec and group derivation, and the
 * route-table lookup over a proc root.
 *
 * All functions here are pure or take their inputs (environment, proc root,
 * paths) as parameters, so tests run them over fixtures. Errors: 0 or a
 * negative code, with a one-line reason in errbuf where one is taken.
 */
#ifndef COHORT_RDZV_INTERNAL_H
#define COHORT_RDZV_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "rdzv/discover.h"

/* ---- errors ---- */

/* snprintf into errbuf (when not NULL) and return rc. */
int rdzv_err(char *errbuf, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Sets t->source (one line, truncated to fit). */
void rdzv_source(rdzv_target *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* 1 when s is 1..max printable ASCII characters without spaces. */
int rdzv_word_valid(const char *s, size_t max);

/* ---- Slurm hostlists ---- */

/* Largest host count an expression may expand to; more is COHORT_ELIMIT. */
#define RDZV_HOSTLIST_MAX 65536

/*
 * Expands a Slurm hostlist expression ("node[01-04,07]", "a[1-2]b[3-4]",
 * "x1,y[2-3]") into host names, keeping zero padding (the width of a range's
 * first number). On success *hosts is an array of *count strings, freed with
 * rdzv_hostlist_free(). Returns -EINVAL for a malformed expression,
 * COHORT_ELIMIT when it would expand to more than max_hosts names, -ENOMEM.
 */
int rdzv_hostlist_expand(const char *expr, size_t max_hosts, char ***hosts, size_t *count);
void rdzv_hostlist_free(char **hosts, size_t count);

/* ---- scheduler environments ---- */

/* Looks name up in a NULL-terminated envp (NULL envp: nothing is set). */
const char *rdzv_getenv(char *const envp[], const char *name);

/*
 * Fills out from the first scheduler environment found in envp (Slurm,
 * Kubernetes Indexed Job, MASTER_ADDR/RANK/WORLD_SIZE replicas, Open MPI),
 * with explicit values of opts taking precedence and conflicts refused.
 * Returns 0, -ENOENT when no scheduler environment is present (errbuf
 * untouched), or -EINVAL with a reason.
 */
int rdzv_env_discover(const rdzv_opts *opts, char *const envp[], rdzv_target *out, char *errbuf,
                      size_t errlen);

/* ---- static ---- */

/*
 * Whether host names this machine: it equals gethostname() (or is that name
 * followed by a domain), or one of its addresses belongs to a local
 * interface. A name that does not resolve within timeout_ms is not local.
 * Returns 1 or 0.
 */
int rdzv_host_is_local(const char *host, int timeout_ms);

/*
 * The address the other nodes reach this one by: o->local_addr when given,
 * else the IPv4 address of the default route's interface, else the first
 * non-loopback IPv4 address that is up, else 127.0.0.1.
 */
void rdzv_own_addr(const rdzv_opts *o, char *out, size_t len);

/* ---- shared file ---- */

/* Parsed contents of a rendezvous file. ready=0: claimed, store not up yet. */
typedef struct rdzv_file_info {
  char job_id[RDZV_JOB_ID_MAX + 1];
  uint64_t node_id; /* the agent that wrote it (rdzv_node_id()) */
  int ready;
  char host[BASE_HOST_MAX];
  int port;
} rdzv_file_info;

/* Formats info as the file's text; returns the length or COHORT_ELIMIT. */
int rdzv_file_format(const rdzv_file_info *info, char *buf, size_t cap);
/* Parses the file's text (len bytes). Returns 0 or -EINVAL (malformed). */
int rdzv_file_parse(const char *buf, size_t len, rdzv_file_info *out);
/*
 * With a token (non-empty), appends the "mac=" line to the len bytes of text
 * in buf (cap bytes); returns the new length, or COHORT_ELIMIT. Without one,
 * returns len.
 */
int rdzv_file_seal(const char *token, char *buf, size_t len, size_t cap);
/*
 * rdzv_file_parse of text sealed under token: COHORT_EAUTH when the MAC is
 * missing or wrong, or when the text carries a MAC and there is no token.
 */
int rdzv_file_open(const char *token, const char *buf, size_t len, rdzv_file_info *out);
/* Writes info, sealed under token, to path atomically (temporary file, fsync, rename). */
int rdzv_file_write(const char *path, const rdzv_file_info *info, const char *token);
/*
 * Publishes the store's address for job_id in path, unless the file holds a
 * claim or address of this job written by another node (-EEXIST, errbuf
 * says which). Returns 0 or a negative code.
 */
int rdzv_file_publish(const char *path, const char *job_id, const char *host, int port,
                      const char *token, char *errbuf, size_t errlen);
int rdzv_file_discover(const rdzv_opts *opts, rdzv_target *out, char *errbuf, size_t errlen);

/* ---- multicast ---- */

#define RDZV_DGRAM_MAGIC "CHRV"
#define RDZV_DGRAM_VERSION 1
#define RDZV_DGRAM_HEADER 24
#define RDZV_DGRAM_MAX 512
#define RDZV_MAC_LEN 32

typedef enum rdzv_dgram_kind { RDZV_ANNOUNCE = 1, RDZV_CANDIDATE = 2 } rdzv_dgram_kind;

typedef struct rdzv_dgram {
  int kind;         /* rdzv_dgram_kind */
  uint64_t node_id; /* the sender agent's random id */
  int claimed_rank; /* the sender's --node-rank, -1 when none */
  char job_id[RDZV_JOB_ID_MAX + 1];
  char host[BASE_HOST_MAX]; /* announce: the store's host, "" for the sender's address */
  int port;                 /* announce: the store's port (1..65535); 0 in a candidate */
  int authenticated;        /* set by parse: 1 when a MAC was present and verified */
} rdzv_dgram;

/*
 * Encodes d into buf (cap >= RDZV_DGRAM_MAX bytes is always enough),
 * appending an HMAC-SHA256 over all bytes before it when token is non-NULL
 * and non-empty. Returns the datagram's length, -EINVAL (a field out of
 * range) or -ENOMEM (no MAC could be computed).
 */
int rdzv_dgram_encode(const rdzv_dgram *d, const char *token, uint8_t *buf, size_t cap);

/*
 * Parses a datagram. Pure: no I/O, no global state; any bytes are valid
 * input. Returns 0; COHORT_EPROTO for anything malformed (magic, version,
 * kind, flags, lengths, characters, fields that do not fit the kind,
 * truncation, trailing bytes); COHORT_EAUTH when token is set and the MAC is
 * missing or wrong, or when a MAC is present but no token is set. The job id
 * is not checked here: datagrams of other jobs parse fine.
 */
int rdzv_dgram_parse(const uint8_t *buf, size_t len, const char *token, rdzv_dgram *out);

/*
 * The default group of a job: 239.255.x.y and port 29500 + hash % 1000, from
 * the SHA-256 of the job id. Returns 0 or -ENOMEM.
 */
int rdzv_mcast_group_for_job(const char *job_id, char *addr, size_t addrlen, int *port);

/*
 * The interface that routes to the IPv4 address group according to
 * <proc_root>/net/route: the longest matching prefix among routes that are
 * up, then the lowest metric (the default route matches every address).
 * Returns 0, -ENOENT (no route) or -errno (unreadable).
 */
int rdzv_route_iface(const char *proc_root, const char *group, char *ifname, size_t iflen);

/* This agent's random node id (one per process, a new one after fork). */
uint64_t rdzv_node_id(void);

int rdzv_mcast_discover(const rdzv_opts *opts, rdzv_target *out, char *errbuf, size_t errlen);
/* rdzv_mcast_discover() reading routes under proc_root instead of /proc. */
int rdzv_mcast_discover_root(const rdzv_opts *opts, const char *proc_root, rdzv_target *out,
                             char *errbuf, size_t errlen);

/* The multicast announcer behind rdzv_publish_start() for RDZV_MCAST. */
typedef struct rdzv_mcast_pub rdzv_mcast_pub;
int rdzv_mcast_publish_start(const rdzv_opts *opts, const char *advertise_host, int store_port,
                             rdzv_mcast_pub **out, char *errbuf, size_t errlen);
void rdzv_mcast_publish_stop(rdzv_mcast_pub *pub);
/* Stops the periodic announcements; a candidate (a node or tool looking for the job) is
 * still answered at once. */
void rdzv_mcast_publish_quiet(rdzv_mcast_pub *pub);

/* The absolute deadline of a discovery: opts->deadline_ms, or 5 minutes when 0. */
int64_t rdzv_deadline(const rdzv_opts *opts);

#endif

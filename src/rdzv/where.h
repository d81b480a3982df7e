/*
 * where.h - where a job's store is, decided once from the options of every
 * command that meets a job: `cohort run` to join it, and `cohort status`,
 * `stop` and `stacks` to find it from outside. The command lines parse and
 * print; this file decides what --rdzv-backend, --rdzv-endpoint, --master
 * and --rdzv-conf mean: the built-in store at HOST:PORT (c10d and static:
 * port 29400 when left out) or etcd at a list of endpoints (2379 when left
 * out) with its TLS and credentials.
 *
 * Pure: no I/O. Errors are -EINVAL with one line in err, naming the
 * option, for the command to print as a usage error.
 */
#ifndef COHORT_RDZV_WHERE_H
#define COHORT_RDZV_WHERE_H

#include <stddef.h>
#include <stdint.h>

#include "rdzv/discover.h"
#include "rdzv/etcd.h"

/* --rdzv-backend: torchrun's names for where the store is. */
typedef enum rdzv_backend_opt {
  RDZV_BACKEND_UNSET = 0, /* not given: cohort's own --master, --discover, ... */
  RDZV_BACKEND_STATIC,    /* torchrun's static: the store at --rdzv-endpoint (or MASTER_ADDR) */
  RDZV_BACKEND_C10D,      /* the store at --rdzv-endpoint, hosted by the node owning it */
  RDZV_BACKEND_ETCD       /* etcd at --rdzv-endpoint HOST[:PORT],... (also etcd-v2) */
} rdzv_backend_opt;

/* --rdzv-conf KEY=VALUE,...: the agent's keys and etcd's. Strings point into text. */
typedef struct rdzv_conf {
  int64_t join_timeout_ms; /* join_timeout (seconds), -1 not given */
  int64_t last_call_ms;    /* last_call_timeout (seconds), -1 not given */
  int is_host;             /* is_host: -1 not given, 0, 1 */
  int https;               /* protocol=https */
  const char *cacert, *cert, *key, *user, *password_file;
  char unused[256]; /* the keys cohort has no use for, "a,b" (for a note) */
  char text[1024];
} rdzv_conf;

/* Parses conf into out. Returns 0, or -EINVAL with one line in err. */
int rdzv_conf_parse(const char *conf, rdzv_conf *out, char *err, size_t errlen);

/* What a command was given. */
typedef struct rdzv_where_in {
  rdzv_backend_opt backend;
  rdzv_method discover;      /* --discover (RDZV_ETCD counts as --rdzv-backend etcd) */
  const char *master;        /* --master HOST:PORT, or etcd's endpoints */
  const char *endpoint;      /* --rdzv-endpoint HOST[:PORT], or etcd's list */
  const char *endpoint_dflt; /* c10d without --rdzv-endpoint: this, or NULL (an error) */
  int port0_ok;              /* port 0 in --rdzv-endpoint: a free one, one node (cohort run) */
  const rdzv_conf *conf;     /* --rdzv-conf, NULL when not given */
} rdzv_where_in;

/* What it means. */
typedef struct rdzv_where {
  rdzv_method method; /* RDZV_STATIC or RDZV_ETCD when decided here, else RDZV_AUTO */
  char master[2048];  /* the store's HOST:PORT, or etcd's HOST:PORT,...; "" none */
  int port0;          /* --rdzv-endpoint with port 0: this node's own store on a free port */
  etcd_opts etcd;     /* RDZV_ETCD: endpoints (= master), TLS and user; no password yet */
} rdzv_where;

/*
 * Decides where the store is. The method is RDZV_ETCD for etcd,
 * RDZV_STATIC for c10d or an --rdzv-endpoint (static), and RDZV_AUTO when
 * none of those was given (cohort's own --master and --discover then say,
 * as the command decides). out->etcd's strings point into out and in->conf.
 * Returns 0, or -EINVAL with one line in err.
 */
int rdzv_where_resolve(const rdzv_where_in *in, rdzv_where *out, char *err, size_t errlen);

/*
 * "HOST[:PORT],..." as "HOST:PORT,..." (2379 when left out, IPv6 in
 * brackets) into out: the one spelling every node and command derives the
 * job id from. Returns 0, or -EINVAL when an item is not HOST[:PORT] or out
 * is too small.
 */
int rdzv_etcd_endpoints(const char *list, char *out, size_t cap);

#endif

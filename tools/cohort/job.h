/*
 * job.h - what the commands that act on a running job share (`cohort
 * status`, `cohort stop`, `cohort stacks`): the options that find the job
 * as its agents do, and a connection to where its keys are (its built-in
 * store with the job's token, or etcd) through the one backend interface
 * (rdzv/backend.h).
 */
#ifndef COHORT_TOOLS_JOB_H
#define COHORT_TOOLS_JOB_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/jobctl.h"
#include "store/store.h"
#include "tools/cli.h"

typedef struct job_args {
  const char *master;      /* --master HOST:PORT */
  const char *rdzv_file;   /* --rdzv-file PATH */
  const char *job;         /* --job ID (--rdzv-id, --run-id): the id the agents were given */
  int discover;            /* --discover auto|mcast|etcd (an rdzv_method) */
  int backend;             /* --rdzv-backend c10d|etcd (an rdzv_backend_opt) */
  const char *endpoint;    /* --rdzv-endpoint HOST[:PORT] (etcd: a list) */
  const char *rdzv_conf;   /* --rdzv-conf K=V,... (etcd: TLS, user, password_file) */
  const char *iface;       /* --iface NAME (multicast) */
  const char *mcast_group; /* --mcast-group ADDR:PORT (multicast) */
  const char *token;
  const char *token_file;
  int64_t timeout_ms;
} job_args;

extern const cli_choice job_discover_methods[];
extern const cli_choice job_backends[];

/* The option rows of job_args, for a settings struct TYPE holding one as FIELD. */
#define JOB_ARGS_ROWS(TYPE, FIELD)                                                                 \
  {"--master",                                                                                     \
   0,                                                                                              \
   CLI_STR,                                                                                        \
   .at = CLI_AT(TYPE, FIELD.master, const char *),                                                 \
   .what = "HOST:PORT",                                                                            \
   .flags = CLI_NONEMPTY},                                                                         \
      {"--rdzv-file",    0,                                                                        \
       CLI_STR,          .at = CLI_AT(TYPE, FIELD.rdzv_file, const char *),                        \
       .what = "a path", .flags = CLI_NONEMPTY},                                                   \
      {"--job|--rdzv-id|--rdzv_id|--run-id",                                                       \
       0,                                                                                          \
       CLI_STR,                                                                                    \
       .at = CLI_AT(TYPE, FIELD.job, const char *),                                                \
       .what = "a job id",                                                                         \
       .flags = CLI_NONEMPTY},                                                                     \
      {"--rdzv-backend|--rdzv_backend",                                                            \
       0,                                                                                          \
       CLI_CHOICE,                                                                                 \
       .at = CLI_AT(TYPE, FIELD.backend, int),                                                     \
       .choices = job_backends,                                                                    \
       .what = "c10d, etcd or etcd-v2"},                                                           \
      {"--rdzv-endpoint|--rdzv_endpoint",                                                          \
       0,                                                                                          \
       CLI_STR,                                                                                    \
       .at = CLI_AT(TYPE, FIELD.endpoint, const char *),                                           \
       .what = "HOST[:PORT] (etcd: a list)",                                                       \
       .flags = CLI_NONEMPTY},                                                                     \
      {"--rdzv-conf|--rdzv_conf",                                                                  \
       0,                                                                                          \
       CLI_STR,                                                                                    \
       .at = CLI_AT(TYPE, FIELD.rdzv_conf, const char *),                                          \
       .what = "KEY=VALUE,...",                                                                    \
       .flags = CLI_NONEMPTY},                                                                     \
      {"--discover", 0, CLI_CHOICE, .at = CLI_AT(TYPE, FIELD.discover, int),                       \
       .choices = job_discover_methods},                                                           \
      {"--iface",                                                                                  \
       0,                                                                                          \
       CLI_STR,                                                                                    \
       .at = CLI_AT(TYPE, FIELD.iface, const char *),                                              \
       .what = "an interface name",                                                                \
       .flags = CLI_NONEMPTY},                                                                     \
      {"--mcast-group",                                                                            \
       0,                                                                                          \
       CLI_STR,                                                                                    \
       .at = CLI_AT(TYPE, FIELD.mcast_group, const char *),                                        \
       .what = "ADDR:PORT",                                                                        \
       .flags = CLI_NONEMPTY},                                                                     \
      {"--token", 0, CLI_STR, .at = CLI_AT(TYPE, FIELD.token, const char *)},                      \
      {"--token-file",                                                                             \
       0,                                                                                          \
       CLI_STR,                                                                                    \
       .at = CLI_AT(TYPE, FIELD.token_file, const char *),                                         \
       .what = "a file",                                                                           \
       .env = "COHORT_TOKEN_FILE",                                                                 \
       .flags = CLI_NONEMPTY},                                                                     \
  {                                                                                                \
    "--timeout", 0, CLI_SECONDS, .at = CLI_AT(TYPE, FIELD.timeout_ms, int64_t), .min = 1,          \
                                 .max = 3600000                                                    \
  }

/* The usage lines of those rows; DEFAULT_S: the command's default --timeout. */
#define JOB_ARGS_USAGE(DEFAULT_S)                                                                  \
  "finding the job (as its agents do):\n"                                                          \
  "  --master HOST:PORT   node 0's agent, as given to cohort run\n"                                \
  "  --rdzv-file PATH     the job's rendezvous file\n"                                             \
  "                       (neither: the scheduler's environment, as cohort run;\n"                 \
  "                       else this user's job running on this machine alone)\n"                   \
  "  --job ID             the job id given to cohort run, if any (also spelt\n"                    \
  "                       --rdzv-id, --run-id)\n"                                                  \
  "  --discover mcast     ask for the job by UDP multicast, as agents started with\n"              \
  "                       --discover mcast --job ID find each other (needs --job;\n"               \
  "                       --iface NAME and --mcast-group A:P as given to cohort run)\n"            \
  "  --rdzv-backend etcd --rdzv-endpoint HOST[:PORT],...\n"                                        \
  "                       the job's keys in etcd, as its agents were given it (also\n"             \
  "                       --discover etcd --master ...), with --rdzv-conf's protocol,\n"           \
  "                       cacert, cert, key, user and password_file as given to them\n"            \
  "  --rdzv-backend c10d --rdzv-endpoint HOST[:PORT]  the same as --master\n"                      \
  "  --token SECRET       the job's token (default: $COHORT_TOKEN)\n"                              \
  "  --token-file FILE    read the token from FILE (default: $COHORT_TOKEN_FILE)\n"                \
  "  --timeout S          give up after S seconds (default " DEFAULT_S ")\n"

#define JOB_ARGS_DEFAULT_TIMEOUT_MS 5000

/* A connection to where a running job's keys are. */
typedef struct job_conn {
  rdzv_backend *backend;
  store_client *client;
  jobctl_where where;
  char addr[2200];     /* HOST:PORT of the store, or "etcd E1,E2,...": for messages */
  int64_t deadline_ms; /* the --timeout of the whole command */
  int alone;           /* a job of this machine alone (agent_jobctl_local_find) */
} job_conn;

/*
 * Finds the job and connects with its token (etcd: with the TLS and
 * credentials of --rdzv-conf). Returns 0, or the exit status after one line
 * on stderr as prog: 2 for bad options, 1 when the job's store cannot be
 * found or reached or refuses the token (etcd: refuses the credentials).
 */
int job_connect(const char *prog, const job_args *a, job_conn *out);

/*
 * Reads node 0's snapshot, waiting for it until the deadline, for the round
 * and the node count (nnodes may be NULL). Returns 0, or 1 after one line on
 * stderr ("no job ... found").
 */
int job_round(const char *prog, job_conn *jc, int *round, int *nnodes);

/* Waits for node 0's snapshot until the deadline; NULL after one line on stderr. */
json_t *job_read_node0(const char *prog, job_conn *jc);

void job_close(job_conn *jc);

/* A node's snapshot (snapshot.h) parsed, or NULL when absent or malformed. */
json_t *job_parse_snapshot(const void *val, size_t len);

#endif

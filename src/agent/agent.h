/*
 * agent.h - the node agent behind `cohort run`: spawns one worker per slot,
 * relays their output, stops them all when one fails, restarts the group,
 * and reports the root cause.
 *
 * What runs where: the main thread runs one poll() loop (agent.c) over a
 * self-pipe (signals.h), the workers' output pipes and timers; signal
 * handlers only write to the self-pipe. Beside it run the store server's
 * thread when this node hosts the store (store/), with --rdzv mcast the
 * announcer's thread until the first round is joined (rdzv/), and in a multi-node job
 * the watcher's thread (watch.h), which tells the loop about other nodes'
 * failures by writing to the same self-pipe. A separate guard process
 * (guard.h) kills the workers if the agent dies. agent_run() is called once
 * per process.
 */
#ifndef COHORT_AGENT_AGENT_H
#define COHORT_AGENT_AGENT_H

#include <stdint.h>
#include <sys/types.h>

#include "rdzv/discover.h"
#include "rdzv/etcd.h"

/* Exit codes of `cohort run`. */
#define AGENT_EXIT_OK 0
#define AGENT_EXIT_WORKER_FAILED 1
#define AGENT_EXIT_USAGE 2
#define AGENT_EXIT_INTERNAL 3
#define AGENT_EXIT_STOPPED 4 /* `cohort stop` (docs/status.md) */
#define AGENT_EXIT_HUNG 5    /* --hang-timeout: a rank made no progress (docs/hang.md) */
#define AGENT_EXIT_RDZV 6    /* the rendezvous never completed: no worker ran */
#define AGENT_EXIT_NOT_EXECUTABLE 126
#define AGENT_EXIT_NOT_FOUND 127
/* Stopped by signal N: 128 + N. */

#define AGENT_MAX_NPROC 1024
#define AGENT_TAIL_LINES 10
#define AGENT_STD_MAX 64 /* local ranks a per-rank list may name */

/*
 * torchrun's Std, for each local rank: bit 1 stdout, bit 2 stderr. Its
 * "LR:V,LR:V" form (n > 0) names some local ranks; the others get `all`.
 */
typedef struct agent_std {
  int all;
  int n;
  int lr[AGENT_STD_MAX], v[AGENT_STD_MAX];
} agent_std;

/* Parses "V" or "LR:V,..." (V 0..3, LR 0..AGENT_MAX_NPROC-1). Returns 0 or -EINVAL. */
int agent_std_parse(const char *s, agent_std *out);
/* The value for local rank lr. */
int agent_std_of(const agent_std *s, int lr);

/* --nproc-per-node: a number, or one counted on the node when the agent starts. */
typedef enum agent_nproc {
  AGENT_NPROC_NUMBER, /* agent_config.nproc as given */
  AGENT_NPROC_CPU,    /* one per online CPU */
  AGENT_NPROC_GPU,    /* one per visible GPU (none: an error) */
  AGENT_NPROC_AUTO    /* one per visible GPU, else one per online CPU (torchrun's rule) */
} agent_nproc;

/* Which CPUs each local rank may use: cohort's --cpu-bind, torchrun's --numa-binding
 * (agent/place.h has the plans). */
typedef enum agent_bind {
  AGENT_BIND_NONE,
  AGENT_BIND_CORES,
  AGENT_BIND_NUMA,
  AGENT_BIND_GPU_NODE,
  AGENT_BIND_GPU_SOCKET,
  AGENT_BIND_GPU_EXCLUSIVE,
  AGENT_BIND_GPU_CORE_COMPLEX
} agent_bind;

/* torchrun's --duplicate-stdout-filters/--duplicate-stderr-filters: a line
 * holding any of these is also written to DIR/attempt<K>/filtered_std<out|err>.log. */
#define AGENT_FILTERS_MAX 32
typedef struct agent_filters {
  int n;
  const char *f[AGENT_FILTERS_MAX];
} agent_filters;

typedef struct agent_config {
  int nproc; /* workers on this node, 1..AGENT_MAX_NPROC (nproc_kind NUMBER) */
  agent_nproc nproc_kind;
  agent_bind bind;
  /* where GPUs and the CPU topology are read (tests: fixture trees); NULL: /sys /proc /dev */
  const char *sysfs_root, *proc_root, *dev_root;
  int max_restarts; /* whole-group restarts after a failure */
  int reform;       /* --on-failure reform: survivors re-form (agent/reform.h); 0 restart */
  int64_t reform_timeout_ms; /* a re-form not done within this fails the job */
  const char *log_dir;       /* NULL: no per-rank files */
  /* torchrun's -r and -t: streams to the files only, and to the files and the
   * console; the other streams reach the console only. */
  agent_std redirects, tee;
  /* --local-ranks-filter: only these local ranks reach the console (nshown 0: all). */
  int nshown;
  int shown[AGENT_STD_MAX];
  agent_filters dup[2];   /* stdout's and stderr's duplicate filters (files need log_dir) */
  int virtual_local_rank; /* LOCAL_RANK 0 for every worker, CUDA_VISIBLE_DEVICES its GPU */
  int64_t grace_ms;       /* SIGTERM -> SIGKILL delay */
  const char *run_id;     /* [A-Za-z0-9._-]{1,64}, or NULL: derived (see cmd_run) */
  const char *role;       /* ROLE_NAME, "default" */
  char *const *argv;      /* the worker command, argv[0] searched in PATH */
  const char *token;      /* job token, NULL: a random one is made on one node; several
                             nodes without one run an open store (with a warning) */
  int require_token;      /* refuse a multi-node job without a token (AGENT_EXIT_USAGE) */

  /*
   * Multi-node. With rdzv.method RDZV_AUTO and no master, node count or
   * scheduler environment, the job runs on this node alone.
   */
  rdzv_opts rdzv;
  etcd_opts etcd;          /* rdzv.method RDZV_ETCD: TLS and credentials (endpoints: rdzv.master) */
  int64_t join_timeout_ms; /* rendezvous deadline */
  int64_t last_call_ms;    /* elastic MIN:MAX: wait for more nodes after MIN */
  int64_t heartbeat_ms;    /* heartbeat period between agents */
  int64_t lost_after_ms;   /* a node silent this long is lost */
  int net_auto;            /* add derived network settings (cohort doctor) */
  int64_t hang_timeout_ms; /* a rank silent this long makes the job hung; 0: off */
  double straggler_factor; /* report a rank whose step time is this many times the others'; 0 off */
  int64_t hang_start_ms;   /* ... or this long before its first line or beat (0: the same) */
  int launcher_stdin;      /* stdin is the connection to `cohort launch` (agent/launcher.h) */
  int metrics_port;        /* serve Prometheus metrics on this port (agent/metrics.h); 0 off */
  const char *metrics_file;    /* ... and write them to this file (textfile collector), or NULL */
  const char *termination_log; /* write the root cause of a failure here when the file exists
                                  (Kubernetes' terminationMessagePath), or NULL */
} agent_config;

/*
 * The exception message a PyTorch worker left in its TORCHELASTIC_ERROR_FILE
 * (written by torch.distributed.elastic's @record), newlines folded.
 * Returns 0, -errno when unreadable, -EPROTO when not in that format.
 */
int agent_error_file_message(const char *path, char *out, size_t outlen);

/*
 * Runs the job on this node until it ends and returns the exit code of
 * `cohort run` (see AGENT_EXIT_*). Prints the failure report to stderr.
 */
int agent_run(const agent_config *cfg);

#endif

/*
 * env.h - the environment of one worker: what torchrun gives its workers
 * (docs/torchrun-env.md has the table), plus cohort's own variables.
 *
 * A pure function of its inputs: it reads no process state (the parent
 * environment is an input too), so it is tested variable by variable
 * against the documented table (tests/test_agent_env.c).
 *
 * Thread safety: no shared state.
 */
#ifndef COHORT_AGENT_ENV_H
#define COHORT_AGENT_ENV_H

#include <stddef.h>

#include "doctor/doctor.h"

/* What a worker's environment is made of. Strings are borrowed. */
typedef struct agent_env_in {
  char *const *parent; /* the agent's environment, NULL-terminated; copied first */
  int rank, local_rank;
  int world_size, local_world_size;
  int group_rank, group_world_size; /* node index and node count */
  const char *role;
  const char *master_addr;
  int master_port;
  int restart, max_restarts;
  int round; /* the rendezvous round, the same on every node (COHORT_ROUND) */
  const char *run_id;
  const char *error_file; /* TORCHELASTIC_ERROR_FILE, or NULL for none */
  const char *iface;      /* interface toward node 0, "" or NULL unknown */
  const char *store;      /* COHORT_STORE, host:port */
  const char *token;      /* COHORT_TOKEN, or NULL */
  const doctor_var *net;  /* derived network settings (--net auto), nnet of them */
  size_t nnet;
  const char *progress;   /* COHORT_PROGRESS (and COHORT_HEARTBEAT), NULL none */
  const char *hang_watch; /* --hang-timeout: COHORT_HANG_WATCH, the file of Python ranks'
                             automatic progress (progress.h); NULL none */
  /* The Python stack hook: its directory first on PYTHONPATH,
   * COHORT_STACKS_FILE/SIGNAL; NULL: none of them. */
  const char *stacks_file, *hook_dir;
  int stacks_signal;
  int virtual_local_rank; /* torchrun's --virtual-local-rank: LOCAL_RANK 0, CUDA_VISIBLE_DEVICES
                             the local rank's entry of the parent's list (or its number) */
  int control_fd;         /* COHORT_CONTROL_FD (--on-failure reform) when > 0 */
  int newcomer;           /* COHORT_NEWCOMER=1: started into a running re-formable job */
  int await_form;         /* started ahead of its membership: COHORT_AWAIT_FORM=1, and none of
                             the variables of a membership (rank, sizes, master, store): the
                             first `form` gives them */
  int omp_threads;        /* OMP_NUM_THREADS unless set (--cpu-bind: the rank's CPUs); 0: torchrun's
                             1 when several workers */
} agent_env_in;

/* A NULL-terminated list of NAME=VALUE strings the list owns. */
typedef struct agent_env {
  char **v; /* NULL until something was added */
  size_t n, cap;
} agent_env;

/*
 * Builds the worker's environment into out (zeroed by the caller). A
 * variable set both in the parent and by the agent appears once, with the
 * agent's value, except those the user's value wins for (OMP_NUM_THREADS,
 * NCCL_ASYNC_ERROR_HANDLING, GLOO/NCCL_SOCKET_IFNAME; the derived network
 * settings never name a variable the parent set). Returns 0 or -ENOMEM
 * (out is then freed).
 */
int agent_env_build(const agent_env_in *in, agent_env *out);

/* The value of name in a NULL-terminated NAME=VALUE list, or NULL. */
const char *agent_env_get(char *const *env, const char *name);

/* Frees the list; safe on a zeroed or freed one. */
void agent_env_free(agent_env *e);

#endif

/*
 * internal.h - the state of `cohort run` on this node, shared by the agent's
 * files (agent.c: the loop; report.c: the failure report; snapshot.c,
 * straggle.c and remote_stacks.c, which the loop's timers run).
 *
 * Main thread only.
 */
#ifndef COHORT_AGENT_INTERNAL_H
#define COHORT_AGENT_INTERNAL_H

#include <stdint.h>

#include "agent/agent.h"
#include "agent/cluster.h"
#include "agent/guard.h"
#include "agent/hang.h"
#include "agent/metrics.h"
#include "agent/place.h"
#include "agent/reform.h"
#include "agent/remote_stacks.h"
#include "agent/snapshot.h"
#include "agent/straggle.h"
#include "agent/sweep.h"
#include "agent/watch.h"
#include "agent/worker.h"
#include "doctor/doctor.h"

/* How one attempt (or round) ended; agent.c maps each to one exit status. */
typedef enum attempt_outcome {
  ATTEMPT_OK,
  ATTEMPT_FAILED,     /* a worker failed, here or on another node */
  ATTEMPT_EXEC_ERROR, /* the command could not be executed */
  ATTEMPT_SIGNALED,   /* the agent was told to stop */
  ATTEMPT_STOPPED,    /* `cohort stop` stopped the job (the report says who and why) */
  ATTEMPT_HUNG,       /* --hang-timeout: a rank made no progress (HANG_REPORT_PREFIX) */
  ATTEMPT_INTERNAL    /* the agent itself could not go on */
} attempt_outcome;

typedef struct job {
  const agent_config *cfg; /* &own_cfg */
  agent_config own_cfg;    /* as given, nproc counted on the node (placement) */
  placement place;         /* the worker count and each local rank's CPUs */
  worker *workers;         /* this node's, nworkers (cfg->nproc) of them */
  int nworkers;
  guard guard;
  sweep sweep;           /* the job's cgroup, what is left at an attempt's end killed */
  cluster cl;            /* the store and the other nodes */
  doctor_result *net;    /* derived network settings (--net auto), or NULL */
  int restart;           /* the attempt: restarts used so far (TORCHELASTIC_RESTART_COUNT) */
  int round;             /* the rendezvous round: restarts and re-formations (elastic growth) */
  char err_dir[128];     /* temporary directory for TORCHELASTIC_ERROR_FILE, "" none */
  int err_lock;          /* the lock held on err_dir (dirs.h), -1 none */
  snapshot snap;         /* this node's status for `cohort status` */
  remote_stacks rstacks; /* answering `cohort stacks` */
  int dup_fd[2];         /* this attempt's filtered_stdout.log and filtered_stderr.log, -1 none */
  hang hang;             /* progress files (--hang-timeout, --straggler-factor); prog NULL: off */
  straggle strag;        /* node 0: the ranks straggling now (--straggler-factor) */
  metrics metrics;       /* --metrics-port's server and --metrics-file */
  reform rf;             /* --on-failure reform: the control channels and the re-forms */
  /* per attempt */
  int stopping;       /* SIGTERM sent to the groups */
  int64_t kill_at;    /* when the stragglers get SIGKILL */
  int killed;         /* SIGKILL sent */
  int first_failed;   /* index of the first worker that failed here, -1 */
  int stop_signal;    /* signal that told the agent to stop, 0 */
  int64_t publish_at; /* when to publish a local failure held back, 0 none */
  int sigint_count;
  int exec_errno;                /* the command could not be executed: why */
  int remote_failed;             /* another node failed (or was lost) first */
  int hung;                      /* this node found a rank silent for --hang-timeout */
  int hung_rank;                 /* ... that rank (global) */
  char report[WATCH_REPORT_MAX]; /* the root cause, as every node prints it */
} job;

/* Where rank's TORCHELASTIC_ERROR_FILE is in this attempt ("" when none). */
void agent_job_error_file(const job *j, int rank, char *out, size_t outlen);

/* Joins round j->round and prepares what its workers need (agent.c); an exit status. */
int agent_job_begin_round(job *j);

/* The job fails together with j->report: published (or another node's adopted), every
 * worker stopped. */
void agent_job_fail(job *j);

/* This node's workers are stopped as they are not needed (agent_reform_tick: the job finished
 * as this late node joined it); its attempt ends well. */
void agent_job_stop_unneeded(job *j);

#endif

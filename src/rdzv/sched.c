/*
 * sched.c - the scheduler's environment: Open MPI, Slurm, Kubernetes
 * Indexed Jobs and replica-style environments (MASTER_ADDR, MASTER_PORT,
 * RANK, WORLD_SIZE per pod or replica, all node-level).
 *
 * Explicit flags (opts) take precedence for what the environment does not
 * fix (the store's address); where both give a node rank or a node count
 * and they differ, that is an error naming both, since one of them is wrong
 * and guessing which would start a job with a wrong layout.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "rdzv/internal.h"

#define MAX_NODES 1000000

const char *rdzv_getenv(char *const envp[], const char *name) {
  if (envp == NULL) return NULL;
  size_t n = strlen(name);
  for (size_t i = 0; envp[i] != NULL; i++)
    if (strncmp(envp[i], name, n) == 0 && envp[i][n] == '=') return envp[i] + n + 1;
  return NULL;
}

/* The first of the names that is set, with its name in *which. */
static const char *getenv_any(char *const envp[], const char *const *names, const char **which) {
  for (size_t i = 0; names[i] != NULL; i++) {
    const char *v = rdzv_getenv(envp, names[i]);
    if (v != NULL) {
      if (which) *which = names[i];
      return v;
    }
  }
  return NULL;
}

/* Parses an environment value as an integer in [min, max]. */
static int env_int(const char *name, const char *val, int min, int max, int *out, char *errbuf,
                   size_t errlen) {
  if (base_parse_int(val, min, max, out) != 0)
    return rdzv_err(errbuf, errlen, -EINVAL, "%s='%.40s' is not a whole number in %d..%d", name,
                    val != NULL ? val : "", min, max);
  return 0;
}

/* Applies --node-rank and --nnodes against the environment's rank and count (count 0: none). */
static int reconcile(const rdzv_opts *o, const char *rank_name, int rank, const char *count_name,
                     int count, rdzv_target *t, char *errbuf, size_t errlen) {
  if (o->node_rank >= 0 && o->node_rank != rank)
    return rdzv_err(errbuf, errlen, -EINVAL, "--node-rank %d conflicts with %s=%d", o->node_rank,
                    rank_name, rank);
  if (count > 0 && o->nnodes_max > 0 && (count < o->nnodes_min || count > o->nnodes_max)) {
    if (o->nnodes_min == o->nnodes_max)
      return rdzv_err(errbuf, errlen, -EINVAL, "--nnodes %d conflicts with %s=%d", o->nnodes_max,
                      count_name, count);
    return rdzv_err(errbuf, errlen, -EINVAL, "--nnodes %d:%d conflicts with %s=%d", o->nnodes_min,
                    o->nnodes_max, count_name, count);
  }
  if (count > 0 && rank >= count)
    return rdzv_err(errbuf, errlen, -EINVAL, "%s=%d is not below %s=%d", rank_name, rank,
                    count_name, count);
  if (count == 0 && o->nnodes_max > 0 && rank >= o->nnodes_max)
    return rdzv_err(errbuf, errlen, -EINVAL, "%s=%d is not below --nnodes %d", rank_name, rank,
                    o->nnodes_max);
  t->node_rank = rank;
  t->host_store = rank == 0;
  if (count > 0) {
    t->nnodes_min = count;
    t->nnodes_max = count;
  } else {
    t->nnodes_min = o->nnodes_min;
    t->nnodes_max = o->nnodes_max;
  }
  return 0;
}

/* The store's address from --master, else from MASTER_ADDR/MASTER_PORT when allow_env. */
static int store_from_master(const rdzv_opts *o, char *const envp[], int allow_env,
                             const char *what, rdzv_target *t, char *errbuf, size_t errlen) {
  if (o->master != NULL) {
    if (base_split_hostport(o->master, t->host, sizeof t->host, &t->port, 0) != 0)
      return rdzv_err(errbuf, errlen, -EINVAL, "--master '%.60s' is not HOST:PORT", o->master);
    return 0;
  }
  const char *addr = allow_env ? rdzv_getenv(envp, "MASTER_ADDR") : NULL;
  const char *port = allow_env ? rdzv_getenv(envp, "MASTER_PORT") : NULL;
  if (addr != NULL && port != NULL) {
    if (addr[0] == '\0' || strlen(addr) >= sizeof t->host)
      return rdzv_err(errbuf, errlen, -EINVAL, "MASTER_ADDR='%.60s' is not a host", addr);
    int rc = env_int("MASTER_PORT", port, 1, 65535, &t->port, errbuf, errlen);
    if (rc != 0) return rc;
    base_strlcpy(t->host, addr, sizeof t->host);
    return 0;
  }
  return rdzv_err(errbuf, errlen, -EINVAL,
                  "%s: give the store's address with --master HOST:PORT (node 0's host)", what);
}

/* Open MPI: one agent per node started by mpirun; the store from --master. */
static int env_ompi(const rdzv_opts *o, char *const envp[], const char *rank_s, rdzv_target *t,
                    char *errbuf, size_t errlen) {
  const char *size_s = rdzv_getenv(envp, "OMPI_COMM_WORLD_SIZE");
  if (size_s == NULL)
    return rdzv_err(errbuf, errlen, -EINVAL,
                    "OMPI_COMM_WORLD_RANK is set but not OMPI_COMM_WORLD_SIZE");
  int rank, size, rc;
  if ((rc = env_int("OMPI_COMM_WORLD_RANK", rank_s, 0, MAX_NODES - 1, &rank, errbuf, errlen)) ||
      (rc = env_int("OMPI_COMM_WORLD_SIZE", size_s, 1, MAX_NODES, &size, errbuf, errlen)))
    return rc;
  const char *local = rdzv_getenv(envp, "OMPI_COMM_WORLD_LOCAL_SIZE");
  int nlocal = 1;
  if (local != NULL &&
      (rc = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", local, 1, MAX_NODES, &nlocal, errbuf, errlen)))
    return rc;
  if (nlocal > 1)
    return rdzv_err(errbuf, errlen, -EINVAL,
                    "mpirun started %d agents on this node (OMPI_COMM_WORLD_LOCAL_SIZE); start one "
                    "per node (mpirun --map-by ppr:1:node)",
                    nlocal);
  if ((rc = reconcile(o, "OMPI_COMM_WORLD_RANK", rank, "OMPI_COMM_WORLD_SIZE", size, t, errbuf,
                      errlen)) ||
      (rc = store_from_master(o, envp, 0, "Open MPI", t, errbuf, errlen)))
    return rc;
  rdzv_source(t, "open mpi: node %d of %d", rank, size);
  return 0;
}

static int env_slurm(const rdzv_opts *o, char *const envp[], const char *jobid_s,
                     const char *nodeid_s, rdzv_target *t, char *errbuf, size_t errlen) {
  int64_t jobid;
  int nodeid, nnodes, rc;
  if (base_parse_i64(jobid_s, 0, INT64_MAX, &jobid) != 0)
    return rdzv_err(errbuf, errlen, -EINVAL, "SLURM_JOB_ID='%.40s' is not a job number", jobid_s);
  if ((rc = env_int("SLURM_NODEID", nodeid_s, 0, MAX_NODES - 1, &nodeid, errbuf, errlen)))
    return rc;
  /* Inside a step (srun) the step's node list and count apply; SLURM_NODEID is relative to it. */
  static const char *const step_list[] = {"SLURM_STEP_NODELIST", NULL};
  static const char *const job_list[] = {"SLURM_JOB_NODELIST", "SLURM_NODELIST", NULL};
  static const char *const step_count[] = {"SLURM_STEP_NUM_NODES", NULL};
  static const char *const job_count[] = {"SLURM_JOB_NUM_NODES", "SLURM_NNODES", NULL};
  const char *list_name = NULL, *count_name = NULL;
  const char *list = getenv_any(envp, step_list, &list_name);
  const char *count_s = list ? getenv_any(envp, step_count, &count_name) : NULL;
  if (list == NULL || count_s == NULL) {
    list = getenv_any(envp, job_list, &list_name);
    count_s = getenv_any(envp, job_count, &count_name);
  }
  if (count_s == NULL)
    return rdzv_err(errbuf, errlen, -EINVAL, "Slurm job %lld: SLURM_NNODES is not set",
                    (long long)jobid);
  if ((rc = env_int(count_name, count_s, 1, MAX_NODES, &nnodes, errbuf, errlen))) return rc;
  const char *tasks_s = rdzv_getenv(envp, "SLURM_STEP_NUM_TASKS");
  int ntasks = 0;
  if (tasks_s != NULL &&
      (rc = env_int("SLURM_STEP_NUM_TASKS", tasks_s, 1, INT32_MAX, &ntasks, errbuf, errlen)))
    return rc;
  if (ntasks > nnodes)
    return rdzv_err(errbuf, errlen, -EINVAL,
                    "srun started %d tasks on %d nodes; start one agent per node (srun "
                    "--ntasks-per-node=1)",
                    ntasks, nnodes);
  if ((rc = reconcile(o, "SLURM_NODEID", nodeid, count_name, nnodes, t, errbuf, errlen))) return rc;

  int port = RDZV_DEFAULT_PORT + (int)(jobid % 1000);
  if (o->master != NULL) {
    /* An explicit --master wins; a ":PORT" form keeps node 0 of the list as the host. */
    char host[BASE_HOST_MAX];
    if (base_split_hostport(o->master, host, sizeof host, &port, 0) != 0)
      return rdzv_err(errbuf, errlen, -EINVAL, "--master '%.60s' is not HOST:PORT or :PORT",
                      o->master);
    base_strlcpy(t->host, host, sizeof t->host);
  }
  if (t->host[0] == '\0') {
    if (list == NULL)
      return rdzv_err(errbuf, errlen, -EINVAL, "Slurm job %lld: SLURM_JOB_NODELIST is not set",
                      (long long)jobid);
    char **hosts;
    size_t n;
    rc = rdzv_hostlist_expand(list, RDZV_HOSTLIST_MAX, &hosts, &n);
    if (rc == COHORT_ELIMIT)
      return rdzv_err(errbuf, errlen, -EINVAL, "%s='%.60s' names more than %d hosts", list_name,
                      list, RDZV_HOSTLIST_MAX);
    if (rc != 0)
      return rdzv_err(errbuf, errlen, rc == -ENOMEM ? rc : -EINVAL,
                      "%s='%.60s' is not a valid Slurm hostlist", list_name, list);
    if (n != (size_t)nnodes) {
      rdzv_hostlist_free(hosts, n);
      return rdzv_err(errbuf, errlen, -EINVAL, "%s names %zu hosts but %s=%d", list_name, n,
                      count_name, nnodes);
    }
    base_strlcpy(t->host, hosts[0], sizeof t->host);
    rdzv_hostlist_free(hosts, n);
  }
  t->port = port;
  char hp[BASE_HOST_MAX + 16];
  base_join_hostport(t->host, t->port, hp, sizeof hp);
  rdzv_source(t, "slurm job %lld: node %d of %d, store %.60s", (long long)jobid, nodeid, nnodes,
              hp);
  return 0;
}

static int env_k8s(const rdzv_opts *o, char *const envp[], const char *index_s, rdzv_target *t,
                   char *errbuf, size_t errlen) {
  int index, rc;
  if ((rc = env_int("JOB_COMPLETION_INDEX", index_s, 0, MAX_NODES - 1, &index, errbuf, errlen)) ||
      (rc = reconcile(o, "JOB_COMPLETION_INDEX", index, NULL, 0, t, errbuf, errlen)) ||
      (rc = store_from_master(o, envp, 1, "Kubernetes Indexed Job", t, errbuf, errlen)))
    return rc;
  char hp[BASE_HOST_MAX + 16];
  base_join_hostport(t->host, t->port, hp, sizeof hp);
  rdzv_source(t, "kubernetes indexed job: index %d, store %.70s", index, hp);
  return 0;
}

static int env_replica(const rdzv_opts *o, char *const envp[], rdzv_target *t, char *errbuf,
                       size_t errlen) {
  int rank, size, rc;
  if ((rc = env_int("RANK", rdzv_getenv(envp, "RANK"), 0, MAX_NODES - 1, &rank, errbuf, errlen)) ||
      (rc = env_int("WORLD_SIZE", rdzv_getenv(envp, "WORLD_SIZE"), 1, MAX_NODES, &size, errbuf,
                    errlen)) ||
      (rc = reconcile(o, "RANK", rank, "WORLD_SIZE", size, t, errbuf, errlen)) ||
      (rc = store_from_master(o, envp, 1, "MASTER_ADDR environment", t, errbuf, errlen)))
    return rc;
  char hp[BASE_HOST_MAX + 16];
  base_join_hostport(t->host, t->port, hp, sizeof hp);
  rdzv_source(t, "MASTER_ADDR/RANK environment: node %d of %d, store %.60s", rank, size, hp);
  return 0;
}

int rdzv_env_discover(const rdzv_opts *o, char *const envp[], rdzv_target *t, char *errbuf,
                      size_t errlen) {
  /* mpirun's variables first: when present the process was certainly started by mpirun,
   * even inside a Slurm allocation whose SLURM_* variables it inherited. */
  const char *v = rdzv_getenv(envp, "OMPI_COMM_WORLD_RANK");
  if (v != NULL) return env_ompi(o, envp, v, t, errbuf, errlen);
  static const char *const jobid_names[] = {"SLURM_JOB_ID", "SLURM_JOBID", NULL};
  const char *jobid = getenv_any(envp, jobid_names, NULL);
  const char *nodeid = rdzv_getenv(envp, "SLURM_NODEID");
  if (jobid != NULL && nodeid != NULL) return env_slurm(o, envp, jobid, nodeid, t, errbuf, errlen);
  v = rdzv_getenv(envp, "JOB_COMPLETION_INDEX");
  if (v != NULL) return env_k8s(o, envp, v, t, errbuf, errlen);
  if (rdzv_getenv(envp, "MASTER_ADDR") && rdzv_getenv(envp, "MASTER_PORT") &&
      rdzv_getenv(envp, "RANK") && rdzv_getenv(envp, "WORLD_SIZE"))
    return env_replica(o, envp, t, errbuf, errlen);
  return -ENOENT;
}

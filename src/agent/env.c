/* env.c - the worker environment torchrun's workers get, plus cohort's own. */
#include "agent/env.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int env_push(agent_env *e, char *s) {
  if (s == NULL) return -ENOMEM;
  if (e->n + 2 > e->cap) {
    size_t cap = e->cap ? e->cap * 2 : 64;
    char **v = realloc(e->v, cap * sizeof *v);
    if (v == NULL) {
      free(s);
      return -ENOMEM;
    }
    e->v = v;
    e->cap = cap;
  }
  e->v[e->n++] = s;
  e->v[e->n] = NULL;
  return 0;
}

void agent_env_free(agent_env *e) {
  for (size_t i = 0; i < e->n; i++) free(e->v[i]);
  free(e->v);
  e->v = NULL;
  e->n = e->cap = 0;
}

const char *agent_env_get(char *const *env, const char *name) {
  size_t nl = strlen(name);
  for (char *const *p = env; p != NULL && *p != NULL; p++)
    if (strncmp(*p, name, nl) == 0 && (*p)[nl] == '=') return *p + nl + 1;
  return NULL;
}

/* Removes name's value, if any. */
static void env_unset(agent_env *e, const char *name) {
  size_t nl = strlen(name);
  for (size_t i = 0; i < e->n; i++) {
    if (strncmp(e->v[i], name, nl) == 0 && e->v[i][nl] == '=') {
      free(e->v[i]);
      e->v[i] = e->v[--e->n];
      e->v[e->n] = NULL;
      return;
    }
  }
}

/* Sets name, replacing an earlier value. */
static int env_setf(agent_env *e, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int env_setf(agent_env *e, const char *name, const char *fmt, ...) {
  env_unset(e, name);
  char val[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(val, sizeof val, fmt, ap);
  va_end(ap);
  char *s = NULL;
  if (asprintf(&s, "%s=%s", name, val) < 0) return -ENOMEM;
  return env_push(e, s);
}

/* Sets name unless the user's environment has it. */
static int env_default(agent_env *e, const agent_env_in *in, const char *name, const char *value) {
  if (agent_env_get(in->parent, name) != NULL) return 0;
  return env_setf(e, name, "%s", value);
}

/*
 * --virtual-local-rank: the worker sees only its own GPU, as device 0: the
 * local rank's entry of the parent's CUDA_VISIBLE_DEVICES, else its number.
 */
static int env_own_gpu(agent_env *e, const agent_env_in *in) {
  const char *list = agent_env_get(in->parent, "CUDA_VISIBLE_DEVICES");
  if (list == NULL) return env_setf(e, "CUDA_VISIBLE_DEVICES", "%d", in->local_rank);
  const char *p = list;
  for (int i = 0; i < in->local_rank && p != NULL; i++) {
    p = strchr(p, ',');
    if (p != NULL) p++;
  }
  if (p == NULL) return env_setf(e, "CUDA_VISIBLE_DEVICES", "%s", ""); /* no GPU left for it */
  return env_setf(e, "CUDA_VISIBLE_DEVICES", "%.*s", (int)strcspn(p, ","), p);
}

/* The variables torchrun sets, with its names and meanings. */
/* The variables of one membership: ranks, sizes, where node 0 is. */
static int env_membership(agent_env *e, const agent_env_in *in) {
  int rc = 0;
  rc |= env_setf(e, "RANK", "%d", in->rank);
  rc |= env_setf(e, "WORLD_SIZE", "%d", in->world_size);
  rc |= env_setf(e, "GROUP_RANK", "%d", in->group_rank);
  rc |= env_setf(e, "GROUP_WORLD_SIZE", "%d", in->group_world_size);
  rc |= env_setf(e, "ROLE_RANK", "%d", in->rank);
  rc |= env_setf(e, "ROLE_WORLD_SIZE", "%d", in->world_size);
  rc |= env_setf(e, "MASTER_ADDR", "%s", in->master_addr);
  rc |= env_setf(e, "MASTER_PORT", "%d", in->master_port);
  return rc;
}

static int env_torchrun(agent_env *e, const agent_env_in *in) {
  int rc = in->await_form ? 0 : env_membership(e, in);
  rc |= env_setf(e, "LOCAL_RANK", "%d", in->virtual_local_rank ? 0 : in->local_rank);
  if (in->virtual_local_rank) rc |= env_own_gpu(e, in);
  rc |= env_setf(e, "LOCAL_WORLD_SIZE", "%d", in->local_world_size);
  rc |= env_setf(e, "ROLE_NAME", "%s", in->role);
  rc |= env_setf(e, "TORCHELASTIC_RESTART_COUNT", "%d", in->restart);
  rc |= env_setf(e, "TORCHELASTIC_MAX_RESTARTS", "%d", in->max_restarts);
  rc |= env_setf(e, "TORCHELASTIC_RUN_ID", "%s", in->run_id);
  if (in->omp_threads > 0) {
    char n[16];
    snprintf(n, sizeof n, "%d", in->omp_threads);
    rc |= env_default(e, in, "OMP_NUM_THREADS", n);
  } else if (in->local_world_size > 1) {
    rc |= env_default(e, in, "OMP_NUM_THREADS", "1");
  }
  rc |= env_default(e, in, "NCCL_ASYNC_ERROR_HANDLING", "1");
  /* Its current name (PyTorch 2.2 on); torchrun 1.13 sets only the old one. */
  rc |= env_default(e, in, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  /* PyTorch's env:// init hosts its own store on MASTER_PORT (rank 0). */
  rc |= env_setf(e, "TORCHELASTIC_USE_AGENT_STORE", "%s", "False");
  /* Where torch.distributed.elastic's @record writes a worker's exception;
   * the failure report quotes it. */
  if (in->error_file != NULL) rc |= env_setf(e, "TORCHELASTIC_ERROR_FILE", "%s", in->error_file);
  return rc;
}

/*
 * The progress file, also under its earlier name COHORT_HEARTBEAT (for
 * scripts and libcohort builds that read that), and with --hang-timeout
 * the automatic progress of Python ranks.
 */
static int env_progress(agent_env *e, const agent_env_in *in) {
  int rc = env_setf(e, "COHORT_PROGRESS", "%s", in->progress);
  rc |= env_setf(e, "COHORT_HEARTBEAT", "%s", in->progress);
  if (in->hang_watch != NULL) rc |= env_setf(e, "COHORT_HANG_WATCH", "%s", in->hang_watch);
  return rc;
}

/* The Python stack hook: its directory first on PYTHONPATH, where it dumps, on what signal. */
static int env_stacks_hook(agent_env *e, const agent_env_in *in) {
  int rc = 0;
  const char *pp = agent_env_get(in->parent, "PYTHONPATH");
  if (pp != NULL && pp[0] != '\0')
    rc |= env_setf(e, "PYTHONPATH", "%s:%s", in->hook_dir, pp);
  else
    rc |= env_setf(e, "PYTHONPATH", "%s", in->hook_dir);
  rc |= env_setf(e, "COHORT_STACKS_FILE", "%s", in->stacks_file);
  rc |= env_setf(e, "COHORT_STACKS_SIGNAL", "%d", in->stacks_signal);
  return rc;
}

int agent_env_build(const agent_env_in *in, agent_env *out) {
  int rc = 0;
  for (char *const *p = in->parent; p != NULL && *p != NULL && rc == 0; p++)
    rc = env_push(out, strdup(*p));
  /* Derived network settings first, so that the agent's own values (the
   * interface it actually reached node 0 on) take precedence. Doctor never
   * lists a variable the user set. */
  for (size_t i = 0; rc == 0 && i < in->nnet; i++)
    rc |= env_setf(out, in->net[i].name, "%s", in->net[i].value);
  if (rc == 0) rc |= env_torchrun(out, in);
  /* The interface that reaches node 0 (loopback on one node), so that
   * Gloo and NCCL need no hand-set variables. */
  if (rc == 0 && in->iface != NULL && in->iface[0] != '\0') {
    rc |= env_default(out, in, "GLOO_SOCKET_IFNAME", in->iface);
    rc |= env_default(out, in, "NCCL_SOCKET_IFNAME", in->iface);
  }
  if (rc == 0 && in->progress != NULL) rc |= env_progress(out, in);
  if (rc == 0 && in->hook_dir != NULL) rc |= env_stacks_hook(out, in);
  if (rc == 0) {
    rc |= env_setf(out, "COHORT_JOB_ID", "%s", in->run_id);
    if (in->token != NULL) rc |= env_setf(out, "COHORT_TOKEN", "%s", in->token);
    if (!in->await_form) {
      rc |= env_setf(out, "COHORT_STORE", "%s", in->store);
      rc |= env_setf(out, "COHORT_ROUND", "%d", in->round);
      rc |= env_setf(out, "COHORT_NODE_RANK", "%d", in->group_rank);
      rc |= env_setf(out, "COHORT_NNODES", "%d", in->group_world_size);
    }
    if (in->control_fd > 0) rc |= env_setf(out, "COHORT_CONTROL_FD", "%d", in->control_fd);
    if (in->newcomer) rc |= env_setf(out, "COHORT_NEWCOMER", "1");
    if (in->await_form) rc |= env_setf(out, "COHORT_AWAIT_FORM", "1");
  }
  /* Started ahead: none of a membership's variables, not even the agent's own (the first
   * `form` gives them). */
  static const char *const membership[] = {
      "RANK",         "WORLD_SIZE",      "GROUP_RANK",       "GROUP_WORLD_SIZE",
      "ROLE_RANK",    "ROLE_WORLD_SIZE", "MASTER_ADDR",      "MASTER_PORT",
      "COHORT_STORE", "COHORT_ROUND",    "COHORT_NODE_RANK", "COHORT_NNODES"};
  for (size_t i = 0; in->await_form && i < sizeof membership / sizeof membership[0]; i++)
    env_unset(out, membership[i]);
  if (rc == 0) return 0;
  agent_env_free(out);
  return -ENOMEM;
}

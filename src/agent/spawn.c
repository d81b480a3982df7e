/* spawn.c - starting this node's workers: their files, environment and control channel. */
#include "agent/spawn.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "agent/dirs.h"
#include "agent/env.h"
#include "agent/reform.h"
#include "agent/signals.h"
#include "agent/stacks.h"
#include "base/base.h"

extern char **environ;

/* Starts w (its channel made here; newcomer: into a running re-formable job) without waiting
 * for its exec (agent_worker_started). 0 or -errno. */
static int start_one(job *j, worker *w, int newcomer) {
  const rdzv_plan *p = &j->cl.plan;
  const cpu_set_t *cpus = j->place.cpus != NULL ? &j->place.cpus[w->local_rank] : NULL;
  char errfile[256];
  agent_job_error_file(j, w->rank, errfile, sizeof errfile);
  agent_env_in in = {.parent = environ,
                     .rank = w->rank,
                     .local_rank = w->local_rank,
                     .world_size = p->world_size,
                     .local_world_size = j->nworkers,
                     .group_rank = p->my_index,
                     .group_world_size = p->nnodes,
                     .role = j->cfg->role,
                     .master_addr = p->master_addr,
                     .master_port = p->master_port,
                     /* Under reform the round (REFORM.md): a newcomer's membership number. */
                     .restart = j->cfg->reform ? j->round : j->restart,
                     .round = j->round,
                     .max_restarts = j->cfg->max_restarts,
                     .run_id = j->cl.run_id,
                     .error_file = errfile[0] ? errfile : NULL,
                     .iface = j->cl.iface,
                     .store = j->cl.store_env,
                     .token = agent_cluster_token(&j->cl),
                     .net = j->net ? j->net->set : NULL,
                     .nnet = j->net ? j->net->nset : 0,
                     .omp_threads = j->place.omp ? CPU_COUNT(cpus) : 0,
                     .virtual_local_rank = j->cfg->virtual_local_rank,
                     .newcomer = newcomer,
                     .await_form = j->cl.ahead == 1};
  char hb[PROGRESS_PATH_MAX], py[PROGRESS_PATH_MAX], watch[PROGRESS_PATH_MAX + 8];
  if (j->hang.prog != NULL) {
    agent_hang_paths(&j->hang, w->local_rank, hb, sizeof hb, py, sizeof py);
    in.progress = hb;
    snprintf(watch, sizeof watch, "%s.auto", hb);
    if (j->cfg->hang_timeout_ms > 0) in.hang_watch = watch;
  }
  if (j->hang.prog != NULL) { /* the stacks' hooks, with or without --hang-timeout */
    in.stacks_file = py;
    in.hook_dir = j->hang.dir;
    in.stacks_signal = agent_stacks_py_signal();
  }
  agent_env env = {0};
  int rc = agent_reform_channel(j, w->local_rank, &in.control_fd);
  if (rc == 0) rc = agent_env_build(&in, &env);
  w->keep_fd = in.control_fd;
  if (rc == 0) rc = agent_worker_start(w, j->cfg->argv, env.v, cpus, &j->sweep);
  if (in.control_fd >= 0) close(in.control_fd);
  w->keep_fd = -1;
  agent_env_free(&env);
  if (rc == 0) agent_guard_add(&j->guard, w->pid);
  return rc;
}

attempt_outcome agent_spawn_all(job *j) {
  const agent_config *cfg = j->cfg;
  /* Workers started ahead have no rank until their `form` (reform.c): their local ones meanwhile.
   */
  int offset = j->cl.ahead == 1 ? 0 : j->cl.plan.nodes[j->cl.plan.my_index].rank_offset;
  for (int i = 0; i < j->nworkers; i++) {
    int console, files;
    agent_worker_output(cfg, i, &console, &files);
    int fd = files ? agent_dirs_rank_log(cfg, j->restart, offset + i, 0) : -1;
    agent_worker_init(&j->workers[i], offset + i, i, console, files, fd);
  }
  agent_dirs_open_filtered(cfg, j->restart, j->dup_fd);
  for (int i = 0; i < j->nworkers; i++)
    for (int k = 0; k < 2; k++)
      agent_worker_duplicate(&j->workers[i], k, &cfg->dup[k], j->dup_fd[k]);
  if (j->hang.prog != NULL && agent_hang_begin(&j->hang, j->workers, base_now_ms()) != 0)
    base_log(BASE_LOG_WARN, "cannot create the progress files: no hang detection this attempt");
  agent_signals_set_workers(1);
  /* All forked first, then each exec awaited: a worker's exec overlaps the
   * next one's fork instead of holding it up. */
  int started = 0, rc = 0;
  while (started < j->nworkers && !j->stopping && j->stop_signal == 0) {
    worker *w = &j->workers[started];
    if ((rc = start_one(j, w, j->cl.newcomer && j->cfg->reform)) != 0) {
      base_log(BASE_LOG_ERROR, "cannot start rank %d: %s", w->rank, strerror(-rc));
      break;
    }
    started++;
  }
  for (int i = 0; i < started; i++) {
    int e = agent_worker_started(&j->workers[i]);
    if (e != 0 && j->exec_errno == 0) j->exec_errno = e;
  }
  if (rc != 0) return ATTEMPT_INTERNAL;
  return j->exec_errno != 0 ? ATTEMPT_EXEC_ERROR : ATTEMPT_OK;
}

int agent_spawn_newcomer(job *j, int i) {
  worker *w = &j->workers[i];
  int console, files;
  agent_worker_output(j->cfg, i, &console, &files);
  /* What the lost process printed last goes out before its streams close. */
  agent_worker_stream_read(w, &w->out);
  agent_worker_stream_read(w, &w->err);
  agent_worker_close_streams(w);
  if (w->pid > 0) agent_guard_remove(&j->guard, w->pid);
  int fd = files ? agent_dirs_rank_log(j->cfg, j->restart, w->rank, j->round) : -1;
  agent_worker_init(w, w->rank, i, console, files, fd);
  for (int k = 0; k < 2; k++) agent_worker_duplicate(w, k, &j->cfg->dup[k], j->dup_fd[k]);
  if (agent_hang_begin_rank(&j->hang, j->workers, i, base_now_ms()) != 0)
    base_log(BASE_LOG_WARN, "cannot create rank %d's progress file: no hang detection for it",
             w->rank);
  int rc = start_one(j, w, 1);
  int e = rc == 0 ? agent_worker_started(w) : 0;
  if (e != 0) {
    j->exec_errno = e;
    rc = -e;
  }
  return rc;
}

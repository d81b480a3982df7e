/* job.c - finding a running job and connecting to its keys, for status, stop and stacks. */
#include "tools/cohort/job.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "rdzv/join.h"
#include "rdzv/where.h"
#include "tools/cohort/cmd.h"

extern char **environ;

const cli_choice job_discover_methods[] = {
    {"auto", RDZV_AUTO}, {"mcast", RDZV_MCAST}, {"etcd", RDZV_ETCD}, {NULL, 0}};
const cli_choice job_backends[] = {{"c10d", RDZV_BACKEND_C10D},
                                   {"etcd", RDZV_BACKEND_ETCD},
                                   {"etcd-v2", RDZV_BACKEND_ETCD},
                                   {NULL, 0}};

/* No address given and no scheduler: this user's job on this machine alone. */
static int find_local(const char *prog_name, const job_args *a, const char **token, job_conn *jc) {
  static char local_token[STORE_TOKEN_MAX + 1];
  char err[512] = "";
  int rc = agent_jobctl_local_find(a->job, &jc->where, local_token, err, sizeof err);
  if (rc == -EINVAL && err[0] != '\0')
    return cli_usage_error(prog_name, "several jobs run on this machine alone (%s): give --job ID",
                           err);
  if (rc != 0 && a->job != NULL)
    return cli_error(prog_name, 1,
                     "no job %s runs on this machine alone (give --master or --rdzv-file for a "
                     "job of several nodes)",
                     a->job);
  if (rc != 0)
    return cli_error(prog_name, 1,
                     "no job found: none runs on this machine alone (give --master or "
                     "--rdzv-file for a job of several nodes)");
  *token = local_token;
  jc->alone = 1;
  base_join_hostport(jc->where.host, jc->where.port, jc->addr, sizeof jc->addr);
  return 0;
}

/*
 * How the agents met: where the store is as rdzv_where_resolve decides for
 * every command (etcd, or the store at --rdzv-endpoint), else cohort's own
 * --master, --rdzv-file or --discover mcast.
 */
static int job_method(const char *prog_name, const job_args *a, rdzv_opts *ro, rdzv_where *w,
                      rdzv_conf *conf) {
  char err[512];
  if (a->master != NULL && a->endpoint != NULL)
    return cli_usage_error(prog_name, "give --master or --rdzv-endpoint, not both");
  int in_etcd = a->backend == RDZV_BACKEND_ETCD || a->discover == RDZV_ETCD;
  if (a->rdzv_conf != NULL && !in_etcd)
    return cli_usage_error(prog_name, "--rdzv-conf goes with --rdzv-backend etcd");
  if (a->rdzv_conf != NULL && rdzv_conf_parse(a->rdzv_conf, conf, err, sizeof err) != 0)
    return cli_usage_error(prog_name, "%s", err);
  if (a->rdzv_conf != NULL && conf->unused[0] != '\0')
    fprintf(stderr, "%s: note: --rdzv-conf %s has no effect\n", prog_name, conf->unused);
  rdzv_where_in in = {.backend = (rdzv_backend_opt)a->backend,
                      .discover = (rdzv_method)a->discover,
                      .master = a->master,
                      .endpoint = a->endpoint,
                      .conf = a->rdzv_conf != NULL ? conf : NULL};
  if (rdzv_where_resolve(&in, w, err, sizeof err) != 0)
    return cli_usage_error(prog_name, "%s", err);
  if (w->method == RDZV_ETCD && (a->rdzv_file != NULL || a->discover == RDZV_MCAST))
    return cli_usage_error(prog_name, "the job's keys are in etcd: no --rdzv-file or --discover "
                                      "mcast with it");
  ro->method = w->method;
  ro->master = w->method != RDZV_AUTO ? w->master : a->master;
  if (w->method == RDZV_ETCD) return CLI_OK;
  ro->rdzv_file = a->rdzv_file;
  if (ro->master != NULL && a->rdzv_file != NULL)
    return cli_usage_error(prog_name, "give --master or --rdzv-file, not both");
  if (ro->master != NULL) ro->method = RDZV_STATIC;
  if (a->rdzv_file != NULL) ro->method = RDZV_FILE;
  if (a->discover == RDZV_MCAST) {
    if (ro->master != NULL || a->rdzv_file != NULL)
      return cli_usage_error(prog_name, "--discover mcast finds the job itself: no --master or "
                                        "--rdzv-file with it");
    if (a->job == NULL) return cli_usage_error(prog_name, "--discover mcast needs --job ID");
    ro->method = RDZV_MCAST;
    ro->iface = a->iface;
    ro->mcast_group = a->mcast_group;
  } else if (a->iface != NULL || a->mcast_group != NULL) {
    return cli_usage_error(prog_name, "--iface and --mcast-group go with --discover mcast");
  }
  return CLI_OK;
}

static int find_job(const char *prog_name, const job_args *a, const char **token, rdzv_where *w,
                    rdzv_conf *conf, job_conn *jc) {
  rdzv_opts ro = {.method = RDZV_AUTO, .node_rank = -1, .job_id = a->job};
  int rc = job_method(prog_name, a, &ro, w, conf);
  if (rc != CLI_OK) return rc;
  ro.deadline_ms = jc->deadline_ms;
  char err[512] = "";
  rc = agent_jobctl_find(&ro, environ, *token, &jc->where, err, sizeof err);
  if (rc == -ENOENT && ro.method == RDZV_AUTO) return find_local(prog_name, a, token, jc);
  if (rc == -EINVAL) return cli_usage_error(prog_name, "%s", err[0] ? err : cohort_strerror(rc));
  if (rc != 0) return cli_error(prog_name, 1, "%s", err[0] ? err : cohort_strerror(rc));
  if (jc->where.etcd)
    snprintf(jc->addr, sizeof jc->addr, "etcd %s", w->master);
  else
    base_join_hostport(jc->where.host, jc->where.port, jc->addr, sizeof jc->addr);
  return 0;
}

/* The backend the job's keys are in, connected. */
static int open_job(const char *prog_name, const char *token, const rdzv_where *w,
                    const rdzv_conf *conf, job_conn *jc) {
  static char password[STORE_TOKEN_MAX + 2];
  etcd_opts eo = w->etcd;
  int rc = CLI_OK;
  if (jc->where.etcd && conf->password_file != NULL) {
    rc = cmd_secret_file(prog_name, "password", conf->password_file, password, sizeof password);
    if (rc != CLI_OK) return rc;
    eo.password = password;
  }
  rc = agent_jobctl_backend(&jc->where, token, &eo, &jc->backend);
  memset(password, 0, sizeof password); /* the backend keeps its own copy */
  if (rc != 0) return cli_error(prog_name, 1, "cannot open %s: %s", jc->addr, cohort_strerror(rc));
  char err[512] = "";
  rc = rdzv_backend_connect(jc->backend, jc->deadline_ms, &jc->client, err, sizeof err);
  if (rc == COHORT_EAUTH && jc->where.etcd)
    return cli_error(prog_name, 1, "etcd refused this client: %s%s", err,
                     conf->user == NULL && conf->cert == NULL
                         ? " (no credentials given: --rdzv-conf user=NAME,password_file=FILE)"
                         : "");
  if (rc == COHORT_EAUTH)
    return cli_error(prog_name, 1, "the job's store at %s refused the token%s", jc->addr,
                     token == NULL ? " (none given: --token, --token-file or $COHORT_TOKEN)" : "");
  if (rc != 0)
    return cli_error(prog_name, 1, "no job found: %s", err[0] ? err : cohort_strerror(rc));
  return 0;
}

int job_connect(const char *prog_name, const job_args *a, job_conn *jc) {
  memset(jc, 0, sizeof *jc);
  jc->deadline_ms =
      base_deadline_in(a->timeout_ms > 0 ? a->timeout_ms : JOB_ARGS_DEFAULT_TIMEOUT_MS);
  static char tokbuf[STORE_TOKEN_MAX + 2];
  static rdzv_where w;
  static rdzv_conf conf;
  memset(&conf, 0, sizeof conf);
  const char *token = NULL;
  int rc = cmd_token_load(prog_name, a->token, a->token_file, tokbuf, sizeof tokbuf, &token);
  if (rc == CLI_OK) rc = find_job(prog_name, a, &token, &w, &conf, jc);
  if (rc == CLI_OK) rc = open_job(prog_name, token, &w, &conf, jc);
  if (rc != CLI_OK) job_close(jc);
  return rc;
}

void job_close(job_conn *jc) {
  store_client_close(jc->client);
  jc->client = NULL;
  rdzv_backend_close(jc->backend);
  jc->backend = NULL;
}

json_t *job_parse_snapshot(const void *val, size_t len) {
  if (val == NULL) return NULL;
  json_t *o = json_loadb(val, len, 0, NULL);
  if (o != NULL && (!json_is_object(o) || !json_is_integer(json_object_get(o, "nnodes")))) {
    json_decref(o);
    o = NULL;
  }
  return o;
}

json_t *job_read_node0(const char *prog_name, job_conn *jc) {
  char key[STORE_KEY_MAX];
  agent_jobctl_key(key, sizeof key, jc->where.job_id, "status", 0);
  const char *keys[1] = {key};
  int rc = store_wait(jc->client, keys, 1, jc->deadline_ms);
  void *val = NULL;
  size_t len = 0;
  if (rc == 0) rc = store_get(jc->client, key, &val, &len, jc->deadline_ms);
  json_t *o = rc == 0 ? job_parse_snapshot(val, len) : NULL;
  free(val);
  if (rc == -ETIMEDOUT || rc == -ENOENT)
    cli_error(prog_name, 1, "no job %s at %s: nothing published before the timeout",
              jc->where.job_id, jc->addr);
  else if (rc != 0)
    cli_error(prog_name, 1, "reading the job's status at %s: %s", jc->addr, cohort_strerror(rc));
  else if (o == NULL)
    cli_error(prog_name, 1, "the job's status at %s is malformed", jc->addr);
  return o;
}

int job_round(const char *prog_name, job_conn *jc, int *round, int *nnodes) {
  json_t *n0 = job_read_node0(prog_name, jc);
  if (n0 == NULL) return 1;
  *round = (int)json_integer_value(json_object_get(n0, "round"));
  if (nnodes != NULL) *nnodes = (int)json_integer_value(json_object_get(n0, "nnodes"));
  json_decref(n0);
  return 0;
}

/* jobctl.c - the job's control keys and finding a running job from outside. */
#include "agent/jobctl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

void jobctl_key(char *out, size_t outlen, const char *job_id, const char *what, int node) {
  if (node >= 0)
    snprintf(out, outlen, "%s/%s/%d", job_id, what, node);
  else
    snprintf(out, outlen, "%s/%s", job_id, what);
}

int jobctl_job_id(const rdzv_target *t, const char *token, char out[STORE_JOB_ID_LEN + 1]) {
  const char *sj = getenv("SLURM_JOB_ID");
  const char *ss = getenv("SLURM_STEP_ID");
  char basis[BASE_HOST_MAX + 64];
  snprintf(basis, sizeof basis, "%s:%d/%s/%s", t->host, t->port, sj ? sj : "", ss ? ss : "");
  return store_job_id(basis, token, out);
}

int jobctl_find(const rdzv_opts *opts, char *const envp[], const char *token, jobctl_where *out,
                char *err, size_t errlen) {
  rdzv_opts o = *opts;
  o.token = token;
  /* A joiner with a rank of its own never claims the shared file nor stands
   * for election: it only reads what the job's host published. */
  if (o.method == RDZV_FILE || (o.method == RDZV_AUTO && o.rdzv_file != NULL)) o.node_rank = 1;
  rdzv_target t;
  memset(&t, 0, sizeof t);
  int rc = rdzv_discover(&o, envp, &t, err, errlen);
  if (rc != 0) return rc;
  base_strlcpy(out->host, t.host, sizeof out->host);
  out->port = t.port;
  if (opts->job_id != NULL) {
    base_strlcpy(out->job_id, opts->job_id, sizeof out->job_id);
    return 0;
  }
  char id[STORE_JOB_ID_LEN + 1];
  rc = jobctl_job_id(&t, token, id);
  if (rc != 0) {
    snprintf(err, errlen, "cannot derive the job id: %s", cohort_strerror(rc));
    return rc;
  }
  base_strlcpy(out->job_id, id, sizeof out->job_id);
  return 0;
}

/* jobctl.c - the job's control keys and finding a running job from outside. */
#include "agent/jobctl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "rdzv/join.h"

void agent_jobctl_stop_ack_key(char *out, size_t outlen, const char *job_id, int round, int node) {
  char suffix[32];
  if (node >= 0)
    snprintf(suffix, sizeof suffix, "stopped/%d", node);
  else
    snprintf(suffix, sizeof suffix, "stopped/all");
  rdzv_key(out, outlen, job_id, round, suffix);
}

void agent_jobctl_key(char *out, size_t outlen, const char *job_id, const char *what, int node) {
  if (node >= 0)
    snprintf(out, outlen, "%s/%s/%d", job_id, what, node);
  else
    snprintf(out, outlen, "%s/%s", job_id, what);
}

int agent_jobctl_job_id(const rdzv_target *t, const char *token, char out[STORE_JOB_ID_LEN + 1]) {
  const char *sj = getenv("SLURM_JOB_ID");
  const char *ss = getenv("SLURM_STEP_ID");
  char basis[BASE_HOST_MAX + 64];
  snprintf(basis, sizeof basis, "%s:%d/%s/%s", t->host, t->port, sj ? sj : "", ss ? ss : "");
  return store_job_id(basis, token, out);
}

int agent_jobctl_find(const rdzv_opts *opts, char *const envp[], const char *token,
                      jobctl_where *out, char *err, size_t errlen) {
  rdzv_opts o = *opts;
  o.token = token;
  /* A joiner with a rank of its own never claims the shared file nor stands
   * for election: it only reads what the job's host published. */
  if (o.method == RDZV_FILE || o.method == RDZV_MCAST ||
      (o.method == RDZV_AUTO && o.rdzv_file != NULL))
    o.node_rank = 1;
  rdzv_target t;
  memset(&t, 0, sizeof t);
  int rc = rdzv_discover(&o, envp, &t, err, errlen);
  if (rc != 0) return rc;
  base_strlcpy(out->host, t.host, sizeof out->host);
  out->port = t.port;
  out->etcd = o.method == RDZV_ETCD;
  if (opts->job_id != NULL) {
    base_strlcpy(out->job_id, opts->job_id, sizeof out->job_id);
    return 0;
  }
  char id[STORE_JOB_ID_LEN + 1];
  rc = agent_jobctl_job_id(&t, token, id);
  if (rc != 0) {
    snprintf(err, errlen, "cannot derive the job id: %s", cohort_strerror(rc));
    return rc;
  }
  base_strlcpy(out->job_id, id, sizeof out->job_id);
  return 0;
}

int agent_jobctl_backend(const jobctl_where *w, const char *token, const etcd_opts *eo,
                         rdzv_backend **out) {
  if (!w->etcd) return rdzv_backend_store(w->host, w->port, token, out);
  char anchor[STORE_KEY_MAX];
  agent_jobctl_key(anchor, sizeof anchor, w->job_id, "status", 0);
  return rdzv_backend_etcd_guest(eo, w->job_id, anchor, out);
}

/* The directory of this user's one-node jobs; made (0700) when make is set. */
static int local_dir(char *out, size_t len, int make) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  if (xdg != NULL && xdg[0] == '/')
    snprintf(out, len, "%s/cohort", xdg);
  else
    snprintf(out, len, "/tmp/cohort-%u", (unsigned)getuid());
  if (make && mkdir(out, 0700) != 0 && errno != EEXIST) return -errno;
  struct stat st;
  if (lstat(out, &st) != 0) return -errno;
  if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077) != 0) return -EPERM;
  return 0;
}

int agent_jobctl_local_publish(const char *job_id, int port, const char *token, char *path,
                               size_t pathlen) {
  char dir[4096], tmp[4200], line[STORE_TOKEN_MAX + 64];
  path[0] = '\0';
  int rc = local_dir(dir, sizeof dir, 1);
  if (rc != 0) return rc;
  snprintf(tmp, sizeof tmp, "%s/.%s.%d", dir, job_id, (int)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return -errno;
  int n = snprintf(line, sizeof line, "127.0.0.1 %d %s %d\n", port, token, (int)getpid());
  rc = write(fd, line, (size_t)n) == n ? 0 : -EIO;
  close(fd);
  snprintf(path, pathlen, "%s/%s", dir, job_id);
  if (rc == 0 && rename(tmp, path) != 0) rc = -errno;
  if (rc != 0) {
    unlink(tmp);
    path[0] = '\0';
  }
  return rc;
}

/* Reads one job's file. */
static int read_local(const char *dir, const char *job_id, jobctl_where *out, char *token) {
  char path[4400], buf[STORE_TOKEN_MAX + 64];
  snprintf(path, sizeof path, "%s/%s", dir, job_id);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -errno;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -EINVAL;
  buf[n] = '\0';
  char host[64], tok[STORE_TOKEN_MAX + 1];
  int port = 0, pid = 0;
  if (sscanf(buf, "%63s %d %256s %d", host, &port, tok, &pid) != 4 || port < 1 || port > 65535 ||
      pid < 1)
    return -EINVAL;
  /* An agent killed outright leaves its file behind. */
  if (kill(pid, 0) != 0 && errno == ESRCH) return -ESRCH;
  base_strlcpy(out->host, host, sizeof out->host);
  out->port = port;
  out->etcd = 0;
  base_strlcpy(out->job_id, job_id, sizeof out->job_id);
  base_strlcpy(token, tok, STORE_TOKEN_MAX + 1);
  return 0;
}

int agent_jobctl_local_find(const char *job_id, jobctl_where *out, char *token, char *err,
                            size_t errlen) {
  char dir[4096], first[RDZV_JOB_ID_MAX + 1] = "";
  err[0] = '\0';
  if (local_dir(dir, sizeof dir, 0) != 0) return -ENOENT;
  if (job_id != NULL) return read_local(dir, job_id, out, token);
  DIR *d = opendir(dir);
  if (d == NULL) return -ENOENT;
  int count = 0, rc;
  size_t off = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || strlen(e->d_name) > RDZV_JOB_ID_MAX) continue;
    jobctl_where w;
    char t[STORE_TOKEN_MAX + 1];
    if (read_local(dir, e->d_name, &w, t) != 0) continue; /* stale or not a job's */
    if (count++ == 0) base_strlcpy(first, e->d_name, sizeof first);
    if (off < errlen)
      off += (size_t)snprintf(err + off, errlen - off, "%s%s", off ? ", " : "", e->d_name);
  }
  closedir(d);
  if (count == 0) return -ENOENT;
  if (count > 1) return -EINVAL;
  err[0] = '\0';
  rc = read_local(dir, first, out, token);
  return rc == -ESRCH ? -ENOENT : rc;
}

/* dirs.c - an attempt's files, and removing the agent's temporary files. */
#include "agent/dirs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

void agent_dirs_clear(const char *dir, const char *prefix, const char *what) {
  if (dir[0] == '\0') return;
  DIR *d = opendir(dir);
  if (d == NULL) return;
  size_t pl = strlen(prefix);
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
    if (strncmp(de->d_name, prefix, pl) != 0) continue;
    if (unlinkat(dirfd(d), de->d_name, 0) == 0 && what != NULL)
      base_log(BASE_LOG_INFO, "removed leftover %s %s/%s", what, dir, de->d_name);
  }
  closedir(d);
}

void agent_dirs_remove(const char *dir) {
  if (dir[0] == '\0') return;
  agent_dirs_clear(dir, "", NULL);
  rmdir(dir);
}

int agent_dirs_attempt(const agent_config *cfg, int restart, char *out, size_t outlen) {
  if (cfg->log_dir == NULL) return -1;
  mkdir(cfg->log_dir, 0755);
  snprintf(out, outlen, "%s/attempt%d", cfg->log_dir, restart);
  mkdir(out, 0755);
  return 0;
}

const char *agent_dirs_stacks(const agent_config *cfg, int restart, char *out, size_t outlen) {
  const char *tmp = getenv("TMPDIR");
  if (agent_dirs_attempt(cfg, restart, out, outlen) == 0) {
    size_t n = strlen(out);
    snprintf(out + n, outlen - n, "/stacks");
    return out;
  }
  snprintf(out, outlen, "%s/cohort-stacks-XXXXXX", tmp != NULL && tmp[0] ? tmp : "/tmp");
  return mkdtemp(out);
}

int agent_dirs_rank_log(const agent_config *cfg, int restart, int rank, int round) {
  char path[4096];
  if (agent_dirs_attempt(cfg, restart, path, sizeof path) != 0) return -1;
  size_t n = strlen(path);
  if (round > 0)
    snprintf(path + n, sizeof path - n, "/rank%d.round%d.log", rank, round);
  else
    snprintf(path + n, sizeof path - n, "/rank%d.log", rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) base_log(BASE_LOG_WARN, "cannot write log file %s: %s", path, strerror(errno));
  return fd;
}

void agent_dirs_open_filtered(const agent_config *cfg, int restart, int dup_fd[2]) {
  static const char *const names[2] = {"filtered_stdout.log", "filtered_stderr.log"};
  for (int k = 0; k < 2; k++) {
    if (dup_fd[k] >= 0) close(dup_fd[k]);
    dup_fd[k] = -1;
    char path[4096];
    if (cfg->dup[k].n == 0 || agent_dirs_attempt(cfg, restart, path, sizeof path) != 0) continue;
    size_t n = strlen(path);
    snprintf(path + n, sizeof path - n, "/%s", names[k]);
    dup_fd[k] = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (dup_fd[k] < 0) base_log(BASE_LOG_WARN, "cannot write %s: %s", path, strerror(errno));
  }
}

void agent_dirs_clear_shm(const char *run_id) {
  char prefix[RDZV_JOB_ID_MAX + 16];
  snprintf(prefix, sizeof prefix, "cohort-%s-", run_id);
  agent_dirs_clear("/dev/shm", prefix, "shared memory");
}

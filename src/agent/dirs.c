/* dirs.c - an attempt's files, and removing the agent's temporary files. */
#include "agent/dirs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
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
    if (strncmp(de->d_name, prefix, pl) != 0 || strcmp(de->d_name, AGENT_DIRS_LOCK) == 0) continue;
    if (unlinkat(dirfd(d), de->d_name, 0) == 0 && what != NULL)
      base_log(BASE_LOG_INFO, "removed leftover %s %s/%s", what, dir, de->d_name);
  }
  closedir(d);
}

/* dir, its files, and its subdirectories' files (Python's __pycache__ beside the hooks). */
static void remove_tree(const char *dir, int depth) {
  DIR *d = opendir(dir);
  if (d == NULL) return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
    if (unlinkat(dirfd(d), de->d_name, 0) == 0 || errno != EISDIR || depth <= 0) continue;
    char sub[4096];
    if ((size_t)snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name) < sizeof sub)
      remove_tree(sub, depth - 1);
  }
  closedir(d);
  rmdir(dir);
}

void agent_dirs_remove(const char *dir) {
  if (dir[0] != '\0') remove_tree(dir, 1);
}

int agent_dirs_make_locked(char *dir) {
  char tmp[4096], lock[4096];
  if (strlen(dir) + sizeof AGENT_DIRS_LOCK + 6 > sizeof tmp) return -ENAMETOOLONG;
  if (mkdtemp(dir) == NULL) return -errno;
  snprintf(tmp, sizeof tmp, "%s/%s.new", dir, AGENT_DIRS_LOCK);
  snprintf(lock, sizeof lock, "%s/%s", dir, AGENT_DIRS_LOCK);
  /* Locked before it has its name: a sweeping agent never sees it unlocked. */
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return -errno;
  if (flock(fd, LOCK_EX) != 0 || rename(tmp, lock) != 0) {
    int e = errno;
    close(fd);
    unlink(tmp);
    rmdir(dir);
    return -e;
  }
  return fd;
}

/* Whether parent/name is a directory of this user's whose lock no process holds. */
static int unheld(const char *parent, const char *name) {
  char path[4096];
  struct stat st;
  if ((size_t)snprintf(path, sizeof path, "%s/%s", parent, name) >= sizeof path ||
      lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
    return 0;
  if ((size_t)snprintf(path, sizeof path, "%s/%s/%s", parent, name, AGENT_DIRS_LOCK) >= sizeof path)
    return 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return 0; /* no lock file: an agent from before the locks, or not ours */
  int free_now = flock(fd, LOCK_EX | LOCK_NB) == 0;
  close(fd);
  return free_now;
}

int agent_dirs_sweep(const char *parent, const char *prefix) {
  DIR *d = opendir(parent);
  if (d == NULL) return 0;
  size_t pl = strlen(prefix);
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strncmp(de->d_name, prefix, pl) != 0 || !unheld(parent, de->d_name)) continue;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", parent, de->d_name) >= sizeof path) continue;
    remove_tree(path, 1);
    n++;
  }
  closedir(d);
  return n;
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

/*
 * spawn_files.h - starting a test's program with its output in files
 * (<dir>/<tag>.out and .err), waiting for it, and reading files back. For
 * tests that look at a run's files after it ended or while it runs.
 */
#ifndef COHORT_TESTS_SPAWN_FILES_H
#define COHORT_TESTS_SPAWN_FILES_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SPAWN_MAXARGS 64

/* Starts bin with args (NULL-terminated). env: NULL-terminated "NAME=value"
 * to set, or "NAME" alone to unset, applied in the child. */
static inline pid_t spawn_to_files(const char *bin, const char *dir, const char *tag,
                                   const char **args, const char *const *env) {
  const char *argv[SPAWN_MAXARGS];
  int n = 0;
  argv[n++] = bin;
  for (int i = 0; args[i] != NULL && n < SPAWN_MAXARGS - 1; i++) argv[n++] = args[i];
  argv[n] = NULL;
  pid_t pid = fork();
  if (pid != 0) return pid;
  char path[512];
  snprintf(path, sizeof(path), "%s/%s.out", dir, tag);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, 1);
  snprintf(path, sizeof(path), "%s/%s.err", dir, tag);
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, 2);
  for (int i = 0; env != NULL && env[i] != NULL; i++) {
    const char *eq = strchr(env[i], '=');
    if (eq == NULL) {
      unsetenv(env[i]);
    } else {
      char name[128];
      size_t l = (size_t)(eq - env[i]) < sizeof name - 1 ? (size_t)(eq - env[i]) : sizeof name - 1;
      memcpy(name, env[i], l);
      name[l] = '\0';
      setenv(name, eq + 1, 1);
    }
  }
  execv(bin, (char *const *)argv);
  _exit(127);
}

/* Exit status, or 128+N for signal N, or -1. */
static inline int spawn_wait(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return -1;
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return WEXITSTATUS(st);
}

/* The file's first MiB, NUL-terminated (an empty string when it cannot be read). */
static inline char *spawn_slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return strdup("");
  char *buf = calloc(1, 1 << 20);
  size_t n = buf != NULL ? fread(buf, 1, (1 << 20) - 1, f) : 0;
  fclose(f);
  if (buf == NULL) return strdup("");
  buf[n] = '\0';
  return buf;
}

#endif

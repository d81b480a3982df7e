/*
 * proc.h - running commands from tests: capture stdout and stderr, bound
 * the run by a timeout (the child's process group is killed when it passes),
 * and report the exit status and the elapsed time.
 */
#ifndef COHORT_TESTS_PROC_H
#define COHORT_TESTS_PROC_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct proc_result {
  int status; /* waitpid() status; -1 when the run timed out */
  int timed_out;
  char *out, *err; /* NUL-terminated captured output (malloc'ed) */
  size_t outlen, errlen;
  double seconds; /* wall time until exit */
} proc_result;

typedef struct proc_handle {
  pid_t pid;
  int outfd, errfd;
  struct timespec start;
} proc_handle;

static inline double proc_elapsed(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

/* Starts argv (searched in PATH) in its own process group; extra_env entries
 * ("NAME=value") are added to the environment. */
static inline int proc_start(char *const argv[], char *const extra_env[], proc_handle *h) {
  int o[2], e[2];
  if (pipe2(o, O_CLOEXEC) != 0 || pipe2(e, O_CLOEXEC) != 0) return -errno;
  clock_gettime(CLOCK_MONOTONIC, &h->start);
  pid_t pid = fork();
  if (pid < 0) return -errno;
  if (pid == 0) {
    setpgid(0, 0);
    dup2(o[1], 1);
    dup2(e[1], 2);
    for (size_t i = 0; extra_env != NULL && extra_env[i] != NULL; i++) putenv(extra_env[i]);
    execvp(argv[0], argv);
    _exit(127);
  }
  setpgid(pid, pid);
  close(o[1]);
  close(e[1]);
  h->pid = pid;
  h->outfd = o[0];
  h->errfd = e[0];
  return 0;
}

static inline void proc_append(int fd, char **buf, size_t *len, int *open_) {
  char tmp[65536];
  ssize_t n = read(fd, tmp, sizeof tmp);
  if (n <= 0) {
    if (n < 0 && errno == EINTR) return;
    *open_ = 0;
    return;
  }
  char *nb = realloc(*buf, *len + (size_t)n + 1);
  if (nb == NULL) return;
  memcpy(nb + *len, tmp, (size_t)n);
  *len += (size_t)n;
  nb[*len] = '\0';
  *buf = nb;
}

/* Collects output until the process exits and its pipes close, or until
 * timeout_ms passes (then the process group gets SIGKILL). */
static inline void proc_wait(proc_handle *h, int timeout_ms, proc_result *r) {
  memset(r, 0, sizeof *r);
  r->out = calloc(1, 1);
  r->err = calloc(1, 1);
  int oo = 1, eo = 1;
  while (oo || eo) {
    struct pollfd p[2] = {{.fd = oo ? h->outfd : -1, .events = POLLIN},
                          {.fd = eo ? h->errfd : -1, .events = POLLIN}};
    int left = timeout_ms - (int)(proc_elapsed(&h->start) * 1000);
    if (left <= 0) {
      r->timed_out = 1;
      kill(-h->pid, SIGKILL);
      kill(h->pid, SIGKILL);
      break;
    }
    int n = poll(p, 2, left);
    if (n <= 0) continue;
    if (p[0].revents) proc_append(h->outfd, &r->out, &r->outlen, &oo);
    if (p[1].revents) proc_append(h->errfd, &r->err, &r->errlen, &eo);
  }
  int st = 0;
  while (waitpid(h->pid, &st, 0) < 0 && errno == EINTR) {
  }
  r->status = r->timed_out ? -1 : st;
  r->seconds = proc_elapsed(&h->start);
  close(h->outfd);
  close(h->errfd);
}

static inline int proc_run(char *const argv[], char *const extra_env[], int timeout_ms,
                           proc_result *r) {
  proc_handle h;
  int rc = proc_start(argv, extra_env, &h);
  if (rc != 0) {
    memset(r, 0, sizeof *r);
    return rc;
  }
  proc_wait(&h, timeout_ms, r);
  return 0;
}

static inline int proc_exit_code(const proc_result *r) {
  if (r->timed_out) return -1;
  if (WIFEXITED(r->status)) return WEXITSTATUS(r->status);
  return 128 + WTERMSIG(r->status);
}

static inline void proc_result_free(proc_result *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}

/* 1 when pid no longer exists (or is a zombie), waiting up to timeout_ms. */
static inline int proc_gone(pid_t pid, int timeout_ms) {
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n > 0) {
      buf[n] = '\0';
      char *rp = strrchr(buf, ')');
      if (rp != NULL && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X')) return 1;
    }
    if (proc_elapsed(&t0) * 1000 > timeout_ms) return 0;
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

#endif

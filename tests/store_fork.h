/*
 * store_fork.h - a rendezvous store server in a child process, for tests
 * whose own process must stay free to fork ranks or attackers: the child
 * starts the server and passes its port back through a pipe, serves until
 * store_fork_stop(), and dies with the test (PR_SET_PDEATHSIG).
 */
#ifndef COHORT_TESTS_STORE_FORK_H
#define COHORT_TESTS_STORE_FORK_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "cohort/cohort.h"
#include "store/store.h"

typedef struct store_fork {
  pid_t pid;
  int port;
  int stop_fd; /* the parent's end of the pipe that stops the server */
} store_fork;

/* Starts a server with options o in a child. quiet: the child logs errors
 * only (hostile-client tests cut many connections, each a warning). Returns
 * 0 with f filled in, or -1 (the child, if any, has exited). */
static inline int store_fork_start(const store_server_opts *o, int quiet, store_fork *f) {
  int ready[2], stop[2];
  if (pipe2(ready, O_CLOEXEC) != 0) return -1;
  if (pipe2(stop, O_CLOEXEC) != 0) {
    close(ready[0]);
    close(ready[1]);
    return -1;
  }
  f->pid = fork();
  if (f->pid == 0) {
    close(ready[0]);
    close(stop[1]);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
    if (quiet) base_log_set_level(BASE_LOG_ERROR);
    store_server *s = NULL;
    int port = store_server_start(o, &s) == 0 ? store_server_port(s) : -1;
    if (write(ready[1], &port, sizeof port) != (ssize_t)sizeof port || port <= 0) _exit(1);
    char c;
    while (read(stop[0], &c, 1) < 0 && errno == EINTR) {
    }
    store_server_stop(s);
    _exit(0);
  }
  close(ready[1]);
  close(stop[0]);
  int port = -1;
  ssize_t n = f->pid > 0 ? read(ready[0], &port, sizeof port) : -1;
  close(ready[0]);
  f->port = port;
  f->stop_fd = stop[1];
  if (n != (ssize_t)sizeof port || port <= 0) {
    close(stop[1]);
    if (f->pid > 0) waitpid(f->pid, NULL, 0);
    return -1;
  }
  return 0;
}

/* Stops the server and reaps the child (SIGKILL after 10 s). Returns the
 * child's exit status (0: the server stopped cleanly), or -1. */
static inline int store_fork_stop(store_fork *f) {
  /* A byte, not only EOF: forked children may still hold the write end. */
  if (write(f->stop_fd, "q", 1) != 1) kill(f->pid, SIGKILL);
  close(f->stop_fd);
  int st = 0;
  for (int i = 0; i < 1000; i++) {
    pid_t r = waitpid(f->pid, &st, WNOHANG);
    if (r == f->pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (r < 0 && errno != EINTR) return -1;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  kill(f->pid, SIGKILL);
  waitpid(f->pid, NULL, 0);
  return -1;
}

/* A rank's communicator of `world` over the forked store on loopback port `port` (20 s
 * deadline); NULL, with the reason on stderr, when it cannot be made. */
static inline cohort_comm *store_fork_comm(int rank, int world, int port, const char *job) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  cohort_comm_config cc = {
      .rank = rank, .size = world, .store_addr = addr, .job_id = job, .timeout_ms = 20000};
  cohort_comm *comm = NULL;
  int rc = cohort_comm_create(&cc, &comm);
  if (rc != 0) fprintf(stderr, "rank %d: cohort_comm_create: %s\n", rank, cohort_strerror(rc));
  return comm;
}

/* A store on loopback and `world` forked ranks, rank r running rank_main(r, world, port) and
 * exiting with its result (fork before the test process starts OpenMP threads). Returns how many
 * ranks did not exit 0 (each named on stderr), or -1 when the store would not start. */
static inline int store_fork_ranks(int world, int (*rank_main)(int rank, int world, int port)) {
  store_fork sf;
  store_server_opts so = {.bind_host = "127.0.0.1"};
  if (store_fork_start(&so, 1, &sf) != 0) return -1;
  pid_t pids[64];
  if (world > 64) world = 64;
  for (int r = 0; r < world; r++) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(rank_main(r, world, sf.port));
  }
  int bad = 0;
  for (int r = 0; r < world; r++) {
    int st = 0;
    if (pids[r] > 0 && waitpid(pids[r], &st, 0) == pids[r] && WIFEXITED(st) && WEXITSTATUS(st) == 0)
      continue;
    fprintf(stderr, "rank %d: status 0x%x\n", r, st);
    bad++;
  }
  store_fork_stop(&sf);
  return bad;
}

#endif

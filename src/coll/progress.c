/*
 * progress.c - writing the progress file `cohort run` gives each worker
 * (COHORT_PROGRESS, or its earlier name COHORT_HEARTBEAT; see
 * docs/hang.md): on request with a step number (cohort_progress), and
 * after every completed collective, so that a libcohort program that
 * prints nothing is not taken for a hung one.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "coll/coll.h"

/* Collectives report progress at most this often: a touch per collective
 * would cost a system call per small allreduce. */
#define AUTO_PROGRESS_MS 200

static pthread_once_t progress_once = PTHREAD_ONCE_INIT;
static int progress_fd = -1;
static _Atomic int64_t progress_last_ms;

/* COHORT_PROGRESS, else COHORT_HEARTBEAT: an agent before the rename set only that. */
static void progress_open(void) {
  const char *path = getenv("COHORT_PROGRESS");
  if (path == NULL || path[0] == '\0') path = getenv("COHORT_HEARTBEAT");
  if (path != NULL && path[0] != '\0') progress_fd = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
}

COHORT_API int cohort_progress(int64_t step) {
  pthread_once(&progress_once, progress_open);
  if (progress_fd < 0) return 0; /* not under an agent that asks for progress */
  atomic_store(&progress_last_ms, base_now_ms());
  if (step < 0) return futimens(progress_fd, NULL) == 0 ? 0 : -errno;
  char line[32];
  int n = snprintf(line, sizeof line, "%lld\n", (long long)step);
  /* The number replaces the last: write it whole at the start, then cut. */
  if (pwrite(progress_fd, line, (size_t)n, 0) != n) return -errno;
  return ftruncate(progress_fd, n) == 0 ? 0 : -errno;
}

COHORT_API int cohort_heartbeat(int64_t step) {
  return cohort_progress(step);
}

void coll_progress_auto(void) {
  pthread_once(&progress_once, progress_open);
  if (progress_fd < 0) return;
  int64_t now = base_now_ms();
  if (now - atomic_load(&progress_last_ms) < AUTO_PROGRESS_MS) return;
  atomic_store(&progress_last_ms, now);
  futimens(progress_fd, NULL);
}

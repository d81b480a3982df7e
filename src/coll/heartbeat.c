/*
 * heartbeat.c - beating the heartbeat file `cohort run` gives each worker
 * (COHORT_HEARTBEAT; see docs/hang.md): on request with a step number
 * (cohort_heartbeat), and after every completed collective, so that a
 * libcohort program that prints nothing is not taken for a hung one.
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

/* Collectives beat at most this often: a touch per collective would cost a
 * system call per small allreduce. */
#define AUTO_BEAT_MS 200

static pthread_once_t hb_once = PTHREAD_ONCE_INIT;
static int hb_fd = -1;
static _Atomic int64_t hb_last_ms;

static void hb_open(void) {
  const char *path = getenv("COHORT_HEARTBEAT");
  if (path != NULL && path[0] != '\0') hb_fd = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
}

COHORT_API int cohort_heartbeat(int64_t step) {
  pthread_once(&hb_once, hb_open);
  if (hb_fd < 0) return 0; /* not under an agent that asks for beats */
  atomic_store(&hb_last_ms, base_now_ms());
  if (step < 0) return futimens(hb_fd, NULL) == 0 ? 0 : -errno;
  char line[32];
  int n = snprintf(line, sizeof line, "%lld\n", (long long)step);
  /* The number replaces the last: write it whole at the start, then cut. */
  if (pwrite(hb_fd, line, (size_t)n, 0) != n) return -errno;
  return ftruncate(hb_fd, n) == 0 ? 0 : -errno;
}

void coll_heartbeat_auto(void) {
  pthread_once(&hb_once, hb_open);
  if (hb_fd < 0) return;
  int64_t now = base_now_ms();
  if (now - atomic_load(&hb_last_ms) < AUTO_BEAT_MS) return;
  atomic_store(&hb_last_ms, now);
  futimens(hb_fd, NULL);
}

/* progress.c - progress files, output progress and step times. */
#include "agent/progress.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

/* The bad states of a progress file, one report each. */
enum { BAD_GONE = 1u, BAD_DIR = 2u, BAD_GARBAGE = 4u, BAD_UNREADABLE = 8u };
/* The states in which no beat can be seen: the rank's output counts again. */
#define BAD_BLIND (BAD_GONE | BAD_DIR | BAD_UNREADABLE)

/* Creates path empty (or truncates it; never through a symlink) and gives its state. */
static int create_empty(const char *path, struct stat *st) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return -errno;
  int rc = fstat(fd, st) == 0 ? 0 : -errno;
  close(fd);
  return rc;
}

int agent_progress_init(progress *p, int rank, const char *path, int64_t now) {
  memset(p, 0, sizeof *p);
  p->rank = rank;
  p->step = -1;
  p->last_ms = now;
  if (strlen(path) >= sizeof p->path) return -ENAMETOOLONG;
  base_strlcpy(p->path, path, sizeof p->path);
  struct stat st;
  int rc = create_empty(path, &st);
  if (rc != 0) return rc;
  p->exists = 1;
  p->mtime = st.st_mtim;
  p->size = st.st_size;
  p->ino = st.st_ino;
  return 0;
}

int agent_progress_watch_auto(progress *p) {
  char path[PROGRESS_PATH_MAX + 8];
  snprintf(path, sizeof path, "%s.auto", p->path);
  struct stat st;
  int rc = create_empty(path, &st);
  if (rc != 0) return rc;
  p->auto_on = 1;
  p->auto_mtime = st.st_mtim;
  p->auto_size = st.st_size;
  return 0;
}

/* Automatic progress: <path>.auto changed since the last look. */
static void poll_auto(progress *p, int64_t now) {
  char path[PROGRESS_PATH_MAX + 8];
  struct stat st;
  snprintf(path, sizeof path, "%s.auto", p->path);
  if (!p->auto_on || stat(path, &st) != 0) return;
  if (st.st_size == p->auto_size && st.st_mtim.tv_sec == p->auto_mtime.tv_sec &&
      st.st_mtim.tv_nsec == p->auto_mtime.tv_nsec)
    return;
  p->auto_mtime = st.st_mtim;
  p->auto_size = st.st_size;
  p->last_ms = now;
  if (st.st_size > 0) p->started = 1; /* a collective or a DDP step completed */
}

void agent_progress_output(progress *p, int64_t now) {
  p->started = 1;
  if (!p->beaten || (p->problems & BAD_BLIND)) p->last_ms = now;
}

/* Reports a bad state once: 1 and the line in msg when it is new. */
static int bad(progress *p, unsigned kind, char *msg, size_t len, const char *what) {
  if (p->problems & kind) return 0;
  p->problems |= kind;
  snprintf(msg, len, "rank %d: progress file %s %s", p->rank, p->path, what);
  return 1;
}

static double ms_between(const struct timespec *a, const struct timespec *b) {
  return (double)(b->tv_sec - a->tv_sec) * 1e3 + (double)(b->tv_nsec - a->tv_nsec) / 1e6;
}

/* A new step number written at mtime: one more step duration. */
static void note_step(progress *p, int64_t step, const struct timespec *mtime) {
  if (p->step >= 0 && step > p->step) {
    double per = ms_between(&p->step_mtime, mtime) / (double)(step - p->step);
    if (per >= 0) {
      p->step_ms[p->next] = per;
      p->next = (p->next + 1) % PROGRESS_WINDOW;
      if (p->nsteps < PROGRESS_WINDOW) p->nsteps++;
    }
  }
  if (step != p->step) p->step_mtime = *mtime;
  p->step = step;
}

/* Reads the step number the file holds: 1 a number, 0 empty, -1 garbage. */
static int read_step(int fd, int64_t *step) {
  char buf[64];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n < 0) return -1;
  buf[n] = '\0';
  size_t b = strspn(buf, " \t\r\n");
  if (buf[b] == '\0') return 0;
  size_t e = b + strspn(buf + b, "0123456789");
  if (e == b || buf[e + strspn(buf + e, " \t\r\n")] != '\0' || e - b > 18) return -1;
  buf[e] = '\0';
  return base_parse_i64(buf + b, 0, INT64_MAX, step) == 0 ? 1 : -1;
}

int agent_progress_poll(progress *p, int64_t now, char *msg, size_t msglen) {
  poll_auto(p, now);
  int fd = open(p->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) {
    int e = errno;
    p->exists = 0;
    if (e == ENOENT) return bad(p, BAD_GONE, msg, msglen, "was deleted; waiting for it to return");
    return bad(p, BAD_UNREADABLE, msg, msglen, "cannot be read; its beats are not seen");
  }
  struct stat st;
  int rc = 0;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    rc = bad(p, BAD_DIR, msg, msglen,
             "is not a regular file (a directory?); its beats are not seen");
    goto out;
  }
  int changed = !p->exists || st.st_ino != p->ino || st.st_size != p->size ||
                st.st_mtim.tv_sec != p->mtime.tv_sec || st.st_mtim.tv_nsec != p->mtime.tv_nsec;
  p->exists = 1;
  if (!changed) goto out;
  p->ino = st.st_ino;
  p->size = st.st_size;
  p->mtime = st.st_mtim;
  p->beaten = 1;
  p->started = 1;
  p->last_ms = now;
  p->problems &= ~(unsigned)BAD_BLIND;
  int64_t step = 0;
  int got = read_step(fd, &step);
  if (got > 0) note_step(p, step, &st.st_mtim);
  if (got < 0) rc = bad(p, BAD_GARBAGE, msg, msglen, "holds no step number; only its writes count");
out:
  close(fd);
  return rc;
}

int64_t agent_progress_silent_ms(const progress *p, int64_t now) {
  return now - p->last_ms;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double agent_progress_step_ms(const progress *p) {
  if (p->nsteps < PROGRESS_MIN_STEPS) return 0;
  double v[PROGRESS_WINDOW];
  memcpy(v, p->step_ms, sizeof v);
  return median(v, p->nsteps);
}

/* The median of the known step times other than step_ms[skip], 0 if fewer than one. */
static double median_of_others(const double *step_ms, int n, int skip, double *scratch) {
  int k = 0;
  for (int i = 0; i < n; i++)
    if (i != skip && step_ms[i] > 0) scratch[k++] = step_ms[i];
  return k > 0 ? median(scratch, k) : 0;
}

int agent_progress_stragglers(const double *step_ms, int n, double factor, int *flagged, int *out,
                              double *ratio) {
  if (factor <= 0 || n < 2) return 0;
  double *scratch = malloc((size_t)n * sizeof *scratch);
  if (scratch == NULL) return 0;
  int found = 0;
  for (int i = 0; i < n; i++) {
    double mid = median_of_others(step_ms, n, i, scratch);
    if (step_ms[i] <= 0 || mid <= 0) continue;
    double r = step_ms[i] / mid;
    if (r <= factor) {
      flagged[i] = 0; /* the episode is over */
    } else if (!flagged[i]) {
      flagged[i] = 1;
      out[found] = i;
      ratio[found] = r;
      found++;
    }
  }
  free(scratch);
  return found;
}

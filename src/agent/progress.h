/*
 * progress.h - whether a rank is making progress, and how fast.
 *
 * A rank makes progress when it writes a line of output or reports it in
 * its progress file: COHORT_PROGRESS (also spelt COHORT_HEARTBEAT, its
 * earlier name) names a file of its own, and a write to it or an update of
 * its modification time (a replacement by rename counts too) is a beat.
 * What the file holds may be the step number, in decimal. Once a rank has
 * beaten its progress file, only beats count for it: output alone no
 * longer says it is alive.
 *
 * The file may be deleted, replaced by a directory or filled with garbage by
 * the worker; none of that is an error of the agent. agent_progress_poll() reports
 * each such state in one line, once, and the rank's progress is then what
 * is left (its output until it beats again).
 *
 * Automatic progress: the file <path>.auto (agent_progress_watch_auto) is touched
 * by the agent's Python start-up hook when the rank's Python stack moves,
 * and written (non-empty) once a collective or a DDP step completed. A
 * touch is progress but neither a beat nor the end of the start-up (a
 * long import moves too); once non-empty, the start-up is over.
 *
 * Step times: each rise of the step number gives a step duration, measured
 * between the file's modification times; the median of the last
 * PROGRESS_WINDOW of them is the rank's step time. agent_progress_stragglers()
 * compares those across ranks.
 *
 * Thread safety: none; the agent's loop owns these.
 */
#ifndef COHORT_AGENT_PROGRESS_H
#define COHORT_AGENT_PROGRESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define PROGRESS_WINDOW 8
#define PROGRESS_PATH_MAX 4096
/* Step times needed before a rank is compared with the others. */
#define PROGRESS_MIN_STEPS 3

typedef struct progress {
  int rank;
  char path[PROGRESS_PATH_MAX];
  int beaten;      /* the progress file has been beaten at least once */
  int started;     /* a line or a beat came: the rank is past its start-up */
  int64_t last_ms; /* last progress, base_now_ms() clock */
  int64_t step;    /* last step number written, -1 none */
  /* the file as last seen, to tell a beat */
  int exists;
  struct timespec mtime;
  off_t size;
  ino_t ino;
  unsigned problems; /* the bad states already reported (bit per kind) */
  /* <path>.auto as last seen: automatic progress (agent_progress_watch_auto) */
  int auto_on;
  struct timespec auto_mtime;
  off_t auto_size;
  /* step durations */
  double step_ms[PROGRESS_WINDOW];
  int nsteps; /* how many of step_ms hold values (up to the window) */
  int next;
  struct timespec step_mtime; /* when `step` was written */
} progress;

/*
 * Starts tracking rank's progress file at path (created empty, mode 0644, so the
 * worker can write it; the creation is no beat). now: base_now_ms().
 * Returns 0 or -errno (the path is too long, the file cannot be created).
 */
int agent_progress_init(progress *p, int rank, const char *path, int64_t now);

/* Creates <path>.auto (empty) and counts its changes as automatic
 * progress. 0 or -errno. */
int agent_progress_watch_auto(progress *p);

/* The rank printed a line: progress, until its first beat. */
void agent_progress_output(progress *p, int64_t now);

/*
 * Looks at the progress file: a beat moves last_ms (and the step and step
 * times when a number was written). Returns 1 and one line in msg when the
 * file turned bad in a way not reported before, else 0.
 */
int agent_progress_poll(progress *p, int64_t now, char *msg, size_t msglen);

/* Milliseconds since the rank last made progress. */
int64_t agent_progress_silent_ms(const progress *p, int64_t now);

/* The median of the rank's recent step times in ms, 0 while fewer than
 * PROGRESS_MIN_STEPS are known. */
double agent_progress_step_ms(const progress *p);

/*
 * Stragglers among n ranks given their step times (0: unknown): a rank
 * whose step time is above factor times the median of the other ranks'
 * known ones (the others, so that two ranks can be compared too).
 * flagged[i] carries the episode across calls (1 while rank i straggles);
 * a rank is reported once per episode: the newly flagged indices go to
 * out[] with their ratio to the median, and their count is returned.
 * factor <= 0 turns this off (returns 0). Needs two known ranks.
 */
int agent_progress_stragglers(const double *step_ms, int n, double factor, int *flagged, int *out,
                              double *ratio);

#endif

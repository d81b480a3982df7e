/* snapshot.c - this node's status for `cohort status`, as JSON in the store. */
#include "agent/snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/internal.h"
#include "base/base.h"
#include "base/proc.h"

/* Reads a small /proc file into buf; returns its length or -errno. */
static ssize_t read_small(const char *path, char *buf, size_t len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t n = read(fd, buf, len - 1);
  int e = errno;
  close(fd);
  if (n < 0) return -e;
  buf[n] = '\0';
  return n;
}

int agent_snapshot_proc(pid_t pid, int64_t *ticks, int64_t *rss_bytes) {
  char path[64], buf[1024];
  base_proc_stat st;
  int rc = base_proc_stat_read("/proc", pid, &st);
  if (rc != 0) return rc;
  *ticks = (int64_t)(st.utime + st.stime);
  snprintf(path, sizeof path, "/proc/%d/statm", (int)pid);
  ssize_t n = read_small(path, buf, sizeof buf);
  if (n < 0) return n == -ENOENT ? -ESRCH : (int)n;
  unsigned long long size = 0, resident = 0;
  if (sscanf(buf, "%llu %llu", &size, &resident) != 2) return -EPROTO;
  *rss_bytes = (int64_t)resident * (int64_t)sysconf(_SC_PAGESIZE);
  return 0;
}

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* CPU % of local rank i since the last snapshot (since its start the first time). */
static double cpu_percent(snapshot *s, const worker *w, int i, int64_t ticks, int64_t now) {
  long hz = sysconf(_SC_CLK_TCK);
  int64_t t0 = 0, at0 = w->started_ms;
  if (s->cpu_pid[i] == w->pid) {
    t0 = s->cpu_ticks[i];
    at0 = s->cpu_at_ms[i];
  }
  s->cpu_pid[i] = w->pid;
  s->cpu_ticks[i] = ticks;
  s->cpu_at_ms[i] = now;
  if (hz <= 0 || now <= at0) return 0.0;
  return 100.0 * (double)(ticks - t0) * 1000.0 / (double)hz / (double)(now - at0);
}

/* The state fields of one rank: starting, running, exited (code) or killed (signal). */
static void rank_state(json_t *r, const worker *w) {
  if (w->pid <= 0) {
    json_object_set_new(r, "state", json_string("starting"));
  } else if (w->running) {
    json_object_set_new(r, "state", json_string("running"));
  } else if (WIFSIGNALED(w->status)) {
    json_object_set_new(r, "state", json_string("killed"));
    json_object_set_new(r, "signal", json_integer(WTERMSIG(w->status)));
  } else {
    json_object_set_new(r, "state", json_string("exited"));
    json_object_set_new(r, "code", json_integer(WEXITSTATUS(w->status)));
  }
}

static json_t *rank_json(snapshot *s, const worker *w, int i, int64_t now) {
  json_t *r = json_object();
  if (r == NULL) return NULL;
  json_object_set_new(r, "rank", json_integer(w->rank));
  json_object_set_new(r, "local_rank", json_integer(w->local_rank));
  json_object_set_new(r, "pid", json_integer(w->pid));
  rank_state(r, w);
  if (w->pid > 0) json_object_set_new(r, "uptime_ms", json_integer(now - w->started_ms));
  if (w->last_output_ms > 0)
    json_object_set_new(r, "silent_ms", json_integer(now - w->last_output_ms));
  /* Its progress (the COHORT_PROGRESS file), once it wrote it; its step time once known. */
  if (w->prog != NULL && w->prog->beaten) {
    if (w->prog->step >= 0) json_object_set_new(r, "step", json_integer(w->prog->step));
    json_object_set_new(r, "beat_age_ms", json_integer(now - w->prog->last_ms));
    double step_ms = agent_progress_step_ms(w->prog);
    if (step_ms > 0) json_object_set_new(r, "step_ms", json_real(step_ms));
  }
  int64_t ticks = 0, rss = 0;
  if (w->running && agent_snapshot_proc(w->pid, &ticks, &rss) == 0) {
    json_object_set_new(r, "cpu_percent", json_real(cpu_percent(s, w, i, ticks, now)));
    json_object_set_new(r, "rss_bytes", json_integer(rss));
  }
  return r;
}

/* --on-failure reform: how many re-forms, and the last one (null before any). */
static void reform_json(json_t *o, const job *j) {
  const reform *rf = &j->rf;
  json_object_set_new(o, "reforms", json_integer(rf->count));
  if (rf->count == 0 && !rf->forming) {
    json_object_set_new(o, "last_reform", json_null());
    return;
  }
  const reform_record *r = &rf->last;
  json_t *l = json_object();
  json_object_set_new(l, "round", json_integer(r->round));
  json_object_set_new(l, "nodes_before", json_integer(r->nodes_before));
  json_object_set_new(l, "nodes_after", json_integer(r->nodes_after));
  json_object_set_new(l, "world_before", json_integer(r->world_before));
  json_object_set_new(l, "world_after", json_integer(r->world_after));
  json_object_set_new(l, "duration_ms",
                      r->duration_ms >= 0 ? json_integer(r->duration_ms) : json_null());
  json_object_set_new(l, "steps_lost",
                      r->steps_lost >= 0 ? json_integer(r->steps_lost) : json_null());
  json_object_set_new(o, "last_reform", l);
}

static json_t *node_json(const job *j) {
  const cluster *c = &j->cl;
  json_t *o = json_object();
  if (o == NULL) return NULL;
  json_object_set_new(o, "version", json_integer(SNAPSHOT_VERSION));
  json_object_set_new(o, "node", json_integer(c->plan.my_index));
  json_object_set_new(o, "host", json_string(c->hostname));
  json_object_set_new(o, "agent_pid", json_integer(getpid()));
  json_object_set_new(o, "round", json_integer(j->round));
  json_object_set_new(o, "restarts", json_integer(j->restart));
  json_object_set_new(o, "max_restarts", json_integer(j->cfg->max_restarts));
  json_object_set_new(o, "nnodes", json_integer(c->plan.nnodes));
  json_object_set_new(o, "nnodes_min", json_integer(c->multinode ? c->nnodes_min : 1));
  json_object_set_new(o, "nnodes_max", json_integer(c->multinode ? c->nnodes_max : 1));
  json_object_set_new(o, "world_size", json_integer(c->plan.world_size));
  json_object_set_new(o, "time_ms", json_integer(wall_ms()));
  json_object_set_new(o, "failure", j->report[0] ? json_string(j->report) : json_null());
  if (j->rf.slot != NULL) reform_json(o, j);
  return o;
}

char *agent_snapshot_json(job *j, int64_t now) {
  json_t *o = node_json(j);
  json_t *ranks = json_array();
  char *text = NULL;
  if (o != NULL && ranks != NULL) {
    for (int i = 0; i < j->nworkers; i++)
      json_array_append_new(ranks, rank_json(&j->snap, &j->workers[i], i, now));
    json_object_set(o, "ranks", ranks);
    text = json_dumps(o, JSON_COMPACT);
  }
  json_decref(ranks);
  json_decref(o);
  return text;
}

int agent_snapshot_tick(job *j, int64_t now) {
  int64_t period = j->cfg->heartbeat_ms > 0 ? j->cfg->heartbeat_ms : 500;
  if (now >= j->snap.next_ms) {
    j->snap.next_ms = now + period;
    char *text = agent_snapshot_json(j, now);
    if (text != NULL) agent_cluster_publish_status(&j->cl, text);
    free(text);
  }
  int64_t left = j->snap.next_ms - base_now_ms();
  return left < 0 ? 0 : (int)left;
}

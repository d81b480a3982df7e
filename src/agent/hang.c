/* hang.c - --hang-timeout: silent ranks, their stacks, the hang report. */
#include "agent/hang.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "agent/python_hook.h" /* generated from python/: py_hook[], py_reform[] */
#include "agent/stacks.h"
#include "base/base.h"

/* A debugger gets this long for every rank together; a stuck one is killed. */
#define COLLECT_MS 15000
/* Checks come at least this often while every rank is within the timeout. */
#define CHECK_MAX_MS 1000

static int write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  size_t n = strlen(text), off = 0;
  while (off < n) {
    ssize_t k = write(fd, text + off, n - off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      int e = k < 0 ? errno : EIO;
      close(fd);
      return -e;
    }
    off += (size_t)k;
  }
  return close(fd) == 0 ? 0 : -errno;
}

int agent_hang_is_report(const char *report) {
  return strncmp(report, HANG_REPORT_PREFIX, strlen(HANG_REPORT_PREFIX)) == 0;
}

int agent_hang_setup(hang *h, int64_t timeout_ms, int64_t start_ms, const char *dir, int n) {
  memset(h, 0, sizeof *h);
  if (strlen(dir) >= sizeof h->dir) return -ENAMETOOLONG;
  base_strlcpy(h->dir, dir, sizeof h->dir);
  h->prog = calloc((size_t)n, sizeof *h->prog);
  if (h->prog == NULL) return -ENOMEM;
  h->n = n;
  h->timeout_ms = timeout_ms;
  h->start_ms = start_ms > timeout_ms ? start_ms : timeout_ms;
  return 0;
}

void agent_hang_free(hang *h) {
  free(h->prog);
  h->prog = NULL;
  h->timeout_ms = 0;
}

void agent_hang_paths(const hang *h, int i, char *hb, size_t hblen, char *py, size_t pylen) {
  snprintf(hb, hblen, "%s/progress-%d", h->dir, i);
  snprintf(py, pylen, "%s/py-%d.txt", h->dir, i);
}

int agent_hang_begin(hang *h, worker *w, int64_t now) {
  /* The agent empties the directory after each attempt: the hook too, and
   * cohort_reform, which PyTorch scripts import to take part in re-forms. */
  char file[sizeof h->dir + 32];
  snprintf(file, sizeof file, "%s/sitecustomize.py", h->dir);
  int rc = write_file(file, py_hook);
  snprintf(file, sizeof file, "%s/cohort_reform.py", h->dir);
  if (rc == 0) rc = write_file(file, py_reform);
  if (rc != 0) return rc;
  for (int i = 0; i < h->n && rc == 0; i++) rc = agent_hang_begin_rank(h, w, i, now);
  return rc;
}

int agent_hang_begin_rank(hang *h, worker *w, int i, int64_t now) {
  if (h->prog == NULL) return 0;
  char hb[PROGRESS_PATH_MAX], py[PROGRESS_PATH_MAX];
  agent_hang_paths(h, i, hb, sizeof hb, py, sizeof py);
  unlink(hb); /* a new file: the last process's beats are not this one's */
  int rc = agent_progress_init(&h->prog[i], w[i].rank, hb, now);
  if (rc == 0 && h->timeout_ms > 0) rc = agent_progress_watch_auto(&h->prog[i]);
  if (rc == 0) w[i].prog = &h->prog[i];
  return rc;
}

int agent_hang_check(hang *h, const worker *w, int64_t now, int *next_ms) {
  int64_t next = CHECK_MAX_MS;
  for (int i = 0; i < h->n; i++) {
    if (!w[i].running) continue;
    char msg[512];
    if (agent_progress_poll(&h->prog[i], now, msg, sizeof msg))
      fprintf(stderr, "cohort: %s\n", msg); /* msg names the rank */
    if (h->timeout_ms == 0) continue;       /* progress files for the step times alone */
    int64_t silent = agent_progress_silent_ms(&h->prog[i], now);
    int64_t limit = h->prog[i].started ? h->timeout_ms : h->start_ms;
    if (silent >= limit) return i;
    if (limit - silent < next) next = limit - silent;
  }
  *next_ms = (int)(next > 0 ? next : 1);
  return -1;
}

void agent_hang_resume(hang *h, int64_t now) {
  for (int i = 0; h->prog != NULL && i < h->n; i++) h->prog[i].last_ms = now;
}

/* The arrays of one collection, sized for every local rank. */
typedef struct hang_scratch {
  stacks_dump *d;
  stacks_verdict *v;
  stacks_target *t;
  stacks_place *at;
  char (*py)[PROGRESS_PATH_MAX];
} hang_scratch;

/* The stacks of the running ranks, classified into s; returns how many. */
static int collect(hang *h, const worker *w, const char *stacks_dir, hang_scratch *s) {
  stacks_target *t = s->t;
  char(*py)[PROGRESS_PATH_MAX] = s->py;
  int n = 0;
  for (int i = 0; i < h->n; i++) {
    if (!w[i].running || w[i].pid <= 0) continue;
    char hb[PROGRESS_PATH_MAX];
    agent_hang_paths(h, i, hb, sizeof hb, py[n], sizeof py[n]);
    t[n] = (stacks_target){.rank = w[i].rank, .pid = w[i].pid, .py_file = py[n]};
    n++;
  }
  if (n == 0) return 0;
  if (stacks_dir != NULL) mkdir(stacks_dir, 0755);
  const char *path = getenv("PATH");
  stacks_opts o = {.dir = stacks_dir,
                   .path = path != NULL ? path : "/usr/bin:/bin",
                   .proc_root = "/proc",
                   .deadline_ms = base_now_ms() + COLLECT_MS};
  if (agent_stacks_collect(t, n, &o, s->d) != 0) return 0;
  for (int k = 0; k < n; k++) agent_stacks_classify(&s->d[k], &s->v[k]);
  return n;
}

static int scratch_alloc(hang_scratch *s, int n) {
  s->d = calloc((size_t)n, sizeof *s->d);
  s->v = calloc((size_t)n, sizeof *s->v);
  s->t = calloc((size_t)n, sizeof *s->t);
  s->at = calloc((size_t)n, sizeof *s->at);
  s->py = calloc((size_t)n, sizeof *s->py);
  return s->d && s->v && s->t && s->at && s->py ? 0 : -ENOMEM;
}

static void scratch_free(hang_scratch *s, int n) {
  if (s->d != NULL) agent_stacks_dump_free(s->d, n);
  free(s->d);
  free(s->v);
  free(s->t);
  free(s->at);
  free(s->py);
}

/* Where each collected rank is and how long it has been silent. */
static void places(hang *h, const worker *w, const hang_node *node, const hang_scratch *s, int n) {
  int64_t now = base_now_ms();
  for (int k = 0; k < n; k++) {
    int64_t silent = 0;
    for (int i = 0; i < h->n; i++)
      if (w[i].rank == s->t[k].rank) silent = agent_progress_silent_ms(&h->prog[i], now);
    s->at[k] = (stacks_place){
        .node = node->node, .host = node->host, .pid = s->t[k].pid, .silent_ms = silent};
  }
}

/* One rank's verdict and place, as the other nodes read it. */
static json_t *rank_json(const stacks_verdict *v, const stacks_place *at) {
  return json_pack("{s:i, s:i, s:i, s:I, s:b, s:b, s:s, s:s}", "rank", v->rank, "node", at->node,
                   "pid", (int)at->pid, "silent_ms", (json_int_t)at->silent_ms, "collected",
                   v->collected, "in_collective", v->in_collective, "where", v->where, "frames",
                   v->frames);
}

char *agent_hang_local(hang *h, const worker *w, const hang_node *at, const char *stacks_dir) {
  hang_scratch s = {0};
  char *text = NULL;
  json_t *doc = json_pack("{s:s, s:[]}", "host", at->host, "ranks");
  if (doc != NULL && scratch_alloc(&s, h->n) == 0) {
    int n = collect(h, w, stacks_dir, &s);
    places(h, w, at, &s, n);
    json_t *ranks = json_object_get(doc, "ranks");
    for (int k = 0; k < n; k++) json_array_append_new(ranks, rank_json(&s.v[k], &s.at[k]));
    text = json_dumps(doc, JSON_COMPACT);
  }
  json_decref(doc);
  scratch_free(&s, h->n);
  return text;
}

/* Reads one node's text into v/at from index *n on (up to cap); hosts kept in doc. */
static void read_node(json_t *doc, stacks_verdict *v, stacks_place *at, int *n, int cap) {
  const char *host = json_string_value(json_object_get(doc, "host"));
  json_t *ranks = json_object_get(doc, "ranks"), *r;
  size_t i;
  json_array_foreach(ranks, i, r) {
    if (*n >= cap) return;
    const char *where = json_string_value(json_object_get(r, "where"));
    const char *frames = json_string_value(json_object_get(r, "frames"));
    stacks_verdict *vk = &v[*n];
    memset(vk, 0, sizeof *vk);
    vk->rank = (int)json_integer_value(json_object_get(r, "rank"));
    vk->collected = json_is_true(json_object_get(r, "collected"));
    vk->in_collective = json_is_true(json_object_get(r, "in_collective"));
    base_strlcpy(vk->where, where ? where : "", sizeof vk->where);
    base_strlcpy(vk->frames, frames ? frames : "", sizeof vk->frames);
    at[*n] = (stacks_place){.node = (int)json_integer_value(json_object_get(r, "node")),
                            .host = host ? host : "?",
                            .pid = (pid_t)json_integer_value(json_object_get(r, "pid")),
                            .silent_ms = json_integer_value(json_object_get(r, "silent_ms"))};
    (*n)++;
  }
}

int agent_hang_report_all(char *const *texts, int ntexts, const char *stacks_dir, char *out,
                          size_t outlen) {
  json_t **docs = calloc((size_t)(ntexts > 0 ? ntexts : 1), sizeof *docs);
  int cap = 0;
  for (int k = 0; docs != NULL && k < ntexts; k++) {
    docs[k] = texts[k] != NULL ? json_loads(texts[k], 0, NULL) : NULL;
    if (docs[k] != NULL) cap += (int)json_array_size(json_object_get(docs[k], "ranks"));
  }
  stacks_verdict *v = calloc((size_t)(cap > 0 ? cap : 1), sizeof *v);
  stacks_place *at = calloc((size_t)(cap > 0 ? cap : 1), sizeof *at);
  int n = 0, rc = -1;
  if (v != NULL && at != NULL) {
    for (int k = 0; k < ntexts; k++)
      if (docs[k] != NULL) read_node(docs[k], v, at, &n, cap);
    if (n > 0 && agent_stacks_report(v, at, n, stacks_dir, out, outlen) >= 0) rc = 0;
  }
  for (int k = 0; docs != NULL && k < ntexts; k++) json_decref(docs[k]);
  free(docs);
  free(v);
  free(at);
  return rc;
}

void agent_hang_dump(hang *h, const worker *w, const hang_node *at, const char *stacks_dir) {
  hang_scratch s = {0};
  if (scratch_alloc(&s, h->n) == 0) {
    int n = collect(h, w, stacks_dir, &s);
    places(h, w, at, &s, n);
    for (int k = 0; k < n; k++)
      fprintf(stderr, "cohort: stacks of rank %d (pid %d):\n%s\n", s.d[k].rank, (int)s.d[k].pid,
              s.d[k].text);
    char groups[4096] = "";
    if (n > 0) agent_stacks_group_lines(s.v, n, -1, groups, sizeof groups);
    fprintf(stderr, "cohort: where the ranks are:\n%s%s%s\n", groups,
            stacks_dir != NULL ? "\ncohort: full stacks: " : "", stacks_dir ? stacks_dir : "");
  }
  scratch_free(&s, h->n);
}

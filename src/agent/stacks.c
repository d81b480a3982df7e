/* stacks.c - collecting workers' stacks within a deadline. */
#include "agent/stacks.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "base/proc.h"

/* A stack text is cut here: a dump of hundreds of threads stays readable. */
#define TEXT_MAX (512 * 1024)
/* A Python dump is complete once its file stops growing for this long. */
#define PY_SETTLE_MS 100
/* The Python dumps get at most this much of the deadline before the native
 * tools take over for the ranks that did not answer. */
#define PY_WAIT_MS 1500
#define POLL_MS 20

int agent_stacks_py_signal(void) {
  return SIGRTMIN + STACKS_PY_SIGNAL_OFFSET;
}

typedef struct slot {
  pid_t tool;    /* running debugger, 0 none */
  int out_fd;    /* its output (a memfd), -1 none */
  int py_sent;   /* the Python signal was sent */
  off_t py_size; /* last size seen of the Python file */
  int64_t py_grew_at;
  char tool_name[16];
} slot;

/* Reads at most TEXT_MAX bytes of fd from offset 0 into a new string. */
static char *read_fd_text(int fd) {
  char *buf = malloc(TEXT_MAX + 1);
  if (buf == NULL) return NULL;
  size_t n = 0;
  while (n < TEXT_MAX) {
    ssize_t k = pread(fd, buf + n, TEXT_MAX - n, (off_t)n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    n += (size_t)k;
  }
  buf[n] = '\0';
  return buf;
}

static char *read_path_text(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return NULL;
  struct stat st;
  char *s = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read_fd_text(fd) : NULL;
  close(fd);
  return s;
}

/* 1 when the process has a handler for sig (the SigCgt mask of its status). */
static int catches_signal(const char *proc_root, pid_t pid, int sig) {
  char path[512];
  snprintf(path, sizeof path, "%s/%d/status", proc_root, (int)pid);
  char *s = read_path_text(path);
  if (s == NULL) return 0;
  const char *p = strstr(s, "SigCgt:");
  unsigned long long mask = 0;
  int ok = p != NULL && sscanf(p + 7, " %llx", &mask) == 1;
  free(s);
  return ok && (mask >> (sig - 1)) & 1ull;
}

/* The first of the names found in the search path, copied to out. */
static int find_tool(const char *search, const char *name, char *out, size_t outlen) {
  const char *p = search;
  while (p != NULL && *p != '\0') {
    const char *colon = strchr(p, ':');
    size_t n = colon ? (size_t)(colon - p) : strlen(p);
    size_t nl = strlen(name);
    if (n > 0 && n + nl + 2 <= outlen) {
      memcpy(out, p, n);
      out[n] = '/';
      memcpy(out + n + 1, name, nl + 1);
      if (access(out, X_OK) == 0) return 1;
    }
    p = colon ? colon + 1 : NULL;
  }
  return 0;
}

/* Starts the debugger on pid with its output on a memfd. */
static int start_tool(const char *tool, const char *name, pid_t pid, slot *s) {
  int fd = memfd_create("cohort-stack", MFD_CLOEXEC);
  if (fd < 0) return -errno;
  char pidarg[16];
  snprintf(pidarg, sizeof pidarg, "%d", (int)pid);
  pid_t c = fork();
  if (c < 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  if (c == 0) {
    setpgid(0, 0);
    int devnull = open("/dev/null", O_RDWR);
    dup2(devnull, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    if (strcmp(name, "gdb") == 0)
      execl(tool, "gdb", "-p", pidarg, "-batch", "-nx", "-q", "-ex", "thread apply all bt",
            (char *)NULL);
    else
      execl(tool, "eu-stack", "-s", "-p", pidarg, (char *)NULL);
    _exit(127);
  }
  setpgid(c, c);
  s->tool = c;
  s->out_fd = fd;
  base_strlcpy(s->tool_name, name, sizeof s->tool_name);
  return 0;
}

/* Sends the Python dump signal to the targets whose hook is listening. */
static void python_request(const stacks_target *t, int n, const stacks_opts *o, slot *s) {
  int sig = agent_stacks_py_signal();
  for (int i = 0; i < n; i++) {
    if (t[i].py_file == NULL || !catches_signal(o->proc_root, t[i].pid, sig)) continue;
    /* The hook appends (O_APPEND): emptying the file first leaves only this dump. */
    int fd = open(t[i].py_file, O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    close(fd);
    if (kill(t[i].pid, sig) == 0) {
      s[i].py_sent = 1;
      s[i].py_grew_at = base_now_ms();
    }
  }
}

/* 1 when the Python dump of slot i is still expected. */
static int python_pending(const stacks_target *t, slot *s, int64_t now) {
  if (!s->py_sent) return 0;
  struct stat st;
  if (stat(t->py_file, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  if (st.st_size != s->py_size) {
    s->py_size = st.st_size;
    s->py_grew_at = now;
  }
  return s->py_size == 0 || now - s->py_grew_at < PY_SETTLE_MS;
}

static void python_wait(const stacks_target *t, int n, const stacks_opts *o, slot *s) {
  int64_t until = base_now_ms() + PY_WAIT_MS;
  if (until > o->deadline_ms) until = o->deadline_ms;
  for (;;) {
    int64_t now = base_now_ms();
    int pending = 0;
    for (int i = 0; i < n; i++) pending += python_pending(&t[i], &s[i], now);
    if (pending == 0 || now >= until) return;
    base_sleep_ms(POLL_MS);
  }
}

/* Waits for the debuggers until the deadline, then kills what is left: a
 * debugger killed while attached may leave its target stopped, so the
 * target is continued (the dump must never stop the job). */
static void tools_wait(const stacks_target *t, int n, const stacks_opts *o, slot *s) {
  for (;;) {
    int running = 0;
    for (int i = 0; i < n; i++) {
      if (s[i].tool <= 0) continue;
      pid_t r = waitpid(s[i].tool, NULL, WNOHANG);
      if (r == s[i].tool || (r < 0 && errno == ECHILD))
        s[i].tool = 0;
      else
        running++;
    }
    if (running == 0) return;
    if (base_now_ms() >= o->deadline_ms) break;
    base_sleep_ms(POLL_MS);
  }
  for (int i = 0; i < n; i++) {
    if (s[i].tool <= 0) continue;
    kill(-s[i].tool, SIGKILL);
    waitpid(s[i].tool, NULL, 0);
    kill(t[i].pid, SIGCONT);
    s[i].tool = -1; /* killed: its output is partial */
  }
}

/* The state and wait channel, for when no debugger could say more. */
static char *proc_state_text(const char *proc_root, pid_t pid, const char *why) {
  char path[512], state = '?', wchan[128] = "?";
  base_proc_stat st;
  if (base_proc_stat_read(proc_root, pid, &st) == 0) state = st.state;
  snprintf(path, sizeof path, "%s/%d/wchan", proc_root, (int)pid);
  char *wc = read_path_text(path);
  if (wc != NULL && wc[0] != '\0') snprintf(wchan, sizeof wchan, "%s", wc);
  free(wc);
  char *out = NULL;
  if (asprintf(&out, "process state %c, kernel wait channel %s\n%s\n", state, wchan, why) < 0)
    return NULL;
  return out;
}

/* A Python interpreter: its executable's name, or its native frames. */
static int is_python(const char *proc_root, pid_t pid, const char *text) {
  char path[512], exe[4096];
  snprintf(path, sizeof path, "%s/%d/exe", proc_root, (int)pid);
  ssize_t len = readlink(path, exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = '\0';
    const char *slash = strrchr(exe, '/');
    if (strncmp(slash != NULL ? slash + 1 : exe, "python", 6) == 0) return 1;
  }
  return strstr(text, "_PyEval_EvalFrame") != NULL;
}

/* One line first: this rank's Python frames cannot be had, and why. */
static void note_no_python(stacks_dump *d, const char *why) {
  char *t = NULL;
  if (asprintf(&t, "(no Python frames for this rank: %s)\n%s", why, d->text) < 0) return;
  free(d->text);
  d->text = t;
}

static void finish_one(const stacks_target *t, const stacks_opts *o, slot *s, stacks_dump *d) {
  d->rank = t->rank;
  d->pid = t->pid;
  d->kind = STACKS_NONE;
  d->text = NULL;
  if (s->py_sent) {
    d->text = read_path_text(t->py_file);
    if (d->text != NULL && d->text[0] != '\0')
      d->kind = STACKS_PYTHON;
    else {
      free(d->text);
      d->text = NULL;
    }
  }
  if (d->text == NULL && s->out_fd >= 0) {
    char *raw = read_fd_text(s->out_fd);
    if (raw != NULL && strstr(raw, "#0") != NULL) {
      d->kind = STACKS_NATIVE;
      if (s->tool < 0 &&
          asprintf(&d->text, "%s(%s did not finish before the deadline)\n", raw, s->tool_name) < 0)
        d->text = NULL;
      else if (s->tool >= 0)
        d->text = raw, raw = NULL;
    }
    free(raw);
  }
  if (d->text == NULL && kill(t->pid, 0) == 0) {
    const char *why = s->out_fd >= 0 ? "(the debugger gave no backtrace)"
                                     : "(no native backtraces: install gdb or elfutils' eu-stack)";
    d->text = proc_state_text(o->proc_root, t->pid, why);
    if (d->text != NULL) d->kind = STACKS_PROC_STATE;
  }
  if (d->text == NULL) {
    d->kind = STACKS_NONE;
    d->text = strdup("(the process is gone)\n");
  }
  if (t->py_file == NULL && t->no_py != NULL && d->kind != STACKS_NONE &&
      is_python(o->proc_root, t->pid, d->text))
    note_no_python(d, t->no_py);
  if (s->out_fd >= 0) close(s->out_fd);
  s->out_fd = -1;
}

static const char *kind_name(const stacks_dump *d) {
  switch (d->kind) {
  case STACKS_PYTHON:
    return "Python traceback of every thread";
  case STACKS_NATIVE:
    return "native backtrace of every thread";
  case STACKS_PROC_STATE:
    return "process state";
  default:
    return "no stack";
  }
}

static void write_file(const stacks_opts *o, const stacks_dump *d) {
  char path[4096];
  snprintf(path, sizeof path, "%s/rank%d.txt", o->dir, d->rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    base_log(BASE_LOG_WARN, "cannot write %s: %s", path, strerror(errno));
    return;
  }
  dprintf(fd, "rank %d, pid %d: %s\n\n%s", d->rank, (int)d->pid, kind_name(d), d->text);
  close(fd);
}

int agent_stacks_collect(const stacks_target *t, int n, const stacks_opts *o, stacks_dump *out) {
  slot *s = calloc((size_t)(n > 0 ? n : 1), sizeof *s);
  if (s == NULL) return -ENOMEM;
  for (int i = 0; i < n; i++) s[i].out_fd = -1;
  python_request(t, n, o, s);
  python_wait(t, n, o, s);
  char tool[4096] = "";
  const char *name = find_tool(o->path, "eu-stack", tool, sizeof tool) ? "eu-stack"
                     : find_tool(o->path, "gdb", tool, sizeof tool)    ? "gdb"
                                                                       : NULL;
  for (int i = 0; i < n && name != NULL; i++) {
    if (s[i].py_sent && s[i].py_size > 0) continue;
    if (kill(t[i].pid, 0) != 0) continue;
    int rc = start_tool(tool, name, t[i].pid, &s[i]);
    if (rc != 0) base_log(BASE_LOG_WARN, "cannot start %s: %s", name, strerror(-rc));
  }
  tools_wait(t, n, o, s);
  if (o->dir != NULL) mkdir(o->dir, 0755);
  for (int i = 0; i < n; i++) {
    finish_one(&t[i], o, &s[i], &out[i]);
    if (o->dir != NULL) write_file(o, &out[i]);
  }
  free(s);
  return 0;
}

void agent_stacks_dump_free(stacks_dump *d, int n) {
  for (int i = 0; d != NULL && i < n; i++) {
    free(d[i].text);
    d[i].text = NULL;
  }
}

/* ---- reading a dump ---- */

#define FRAMES_MAX 48

typedef struct frame {
  char func[160];
  char file[256];
  int line;
} frame;

typedef struct thread_frames {
  frame f[FRAMES_MAX]; /* innermost first */
  int n;
  int score; /* how surely this is the main thread */
} thread_frames;

static void frame_add(thread_frames *t, const char *func, size_t flen, const char *file,
                      size_t filelen, int line) {
  if (t->n >= FRAMES_MAX) return;
  frame *f = &t->f[t->n++];
  snprintf(f->func, sizeof f->func, "%.*s", (int)flen, func);
  snprintf(f->file, sizeof f->file, "%.*s", (int)filelen, file);
  f->line = line;
}

/* `  File "x.py", line 41 in step` */
static void py_frame(thread_frames *t, const char *ln) {
  const char *q1 = strchr(ln, '"');
  const char *q2 = q1 ? strstr(q1 + 1, "\", line ") : NULL;
  if (q2 == NULL) return;
  int line = 0;
  int used = 0;
  if (sscanf(q2 + 8, "%d in %n", &line, &used) < 1 || used == 0) return;
  const char *fn = q2 + 8 + used;
  frame_add(t, fn, strcspn(fn, "\n"), q1 + 1, (size_t)(q2 - q1 - 1), line);
}

/* eu-stack's `    ../path/file.c:30:10` under a frame: its source line. */
static void eu_source(thread_frames *t, const char *ln) {
  if (t->n == 0) return;
  while (*ln == ' ' || *ln == '\t') ln++;
  size_t len = strcspn(ln, "\n");
  const char *c2 = memrchr(ln, ':', len);
  const char *c1 = c2 ? memrchr(ln, ':', (size_t)(c2 - ln)) : NULL;
  if (c1 == NULL) return;
  frame *f = &t->f[t->n - 1];
  snprintf(f->file, sizeof f->file, "%.*s", (int)(c1 - ln), ln);
  f->line = atoi(c1 + 1);
}

/* `#3  0x00005555 in step (n=1) at /src/w.c:40` (gdb) or `#3 0x00005555 step` (eu-stack). */
static void native_frame(thread_frames *t, const char *ln) {
  const char *p = ln + 1;
  while (*p >= '0' && *p <= '9') p++;
  while (*p == ' ') p++;
  if (strncmp(p, "0x", 2) == 0) {
    p += strcspn(p, " \n");
    while (*p == ' ') p++;
  }
  if (strncmp(p, "in ", 3) == 0) p += 3;
  size_t flen = strcspn(p, " (\n");
  const char *at = strstr(p, " at ");
  const char *eol = p + strcspn(p, "\n");
  if (at != NULL && at < eol) {
    const char *file = at + 4;
    const char *colon = memrchr(file, ':', (size_t)(eol - file));
    if (colon != NULL) {
      frame_add(t, p, flen, file, (size_t)(colon - file), atoi(colon + 1));
      return;
    }
  }
  frame_add(t, p, flen, "", 0, 0);
}

/* Keeps `cand` as the chosen thread when it is a surer main thread. */
static void thread_done(thread_frames *chosen, const thread_frames *cand, int python) {
  if (cand->n == 0) return;
  int score = cand->score;
  if (python && strcmp(cand->f[cand->n - 1].func, "<module>") == 0) score += 2;
  if (chosen->n == 0 || score > chosen->score) {
    *chosen = *cand;
    chosen->score = score;
  }
}

/* The main thread of a dump: for Python the one running the script's
 * <module>, for native the thread whose id is the process id. */
static void main_thread(const stacks_dump *d, thread_frames *chosen, thread_frames *cur) {
  int python = d->kind == STACKS_PYTHON;
  char tidmark[64];
  memset(chosen, 0, sizeof *chosen);
  memset(cur, 0, sizeof *cur);
  for (const char *ln = d->text; ln != NULL && *ln != '\0';) {
    const char *next = strchr(ln, '\n');
    next = next ? next + 1 : NULL;
    int is_header =
        python ? (strncmp(ln, "Thread 0x", 9) == 0 || strncmp(ln, "Current thread", 14) == 0)
               : (strncmp(ln, "TID ", 4) == 0 || strncmp(ln, "Thread ", 7) == 0);
    if (is_header) {
      thread_done(chosen, cur, python);
      memset(cur, 0, sizeof *cur);
      snprintf(tidmark, sizeof tidmark, "LWP %d)", (int)d->pid);
      size_t hl = next ? (size_t)(next - ln) : strlen(ln);
      char head[256];
      snprintf(head, sizeof head, "%.*s", (int)hl, ln);
      if (python)
        cur->score = strncmp(ln, "Current", 7) == 0;
      else if (strstr(head, tidmark) != NULL || atoi(ln + 4) == (int)d->pid)
        cur->score = 3;
    } else if (python && strncmp(ln, "  File \"", 8) == 0) {
      py_frame(cur, ln);
    } else if (!python && ln[0] == '#') {
      native_frame(cur, ln);
    } else if (!python && (ln[0] == ' ' || ln[0] == '\t')) {
      eu_source(cur, ln);
    }
    ln = next;
  }
  thread_done(chosen, cur, python);
}

static const char *const collectives[] = {"allreduce",    "reduce_scatter", "allgather",
                                          "broadcast",    "reduce",         "barrier",
                                          "request_wait", "iallreduce"};

/* The name of the collective a frame belongs to, or NULL. */
static int collective_name(const frame *f, int python, char *out, size_t outlen) {
  if (python) {
    if (strstr(f->file, "torch/distributed/") != NULL && strcmp(f->func, "wrapper") != 0) {
      snprintf(out, outlen, "%s", f->func);
    } else if (strstr(f->file, "torch/nn/parallel/distributed.py") != NULL) {
      snprintf(out, outlen, "DDP %s", f->func);
    } else if (strstr(f->file, "torch/autograd/") != NULL && strcmp(f->func, "backward") == 0) {
      snprintf(out, outlen, "backward (DDP's gradient all_reduce)");
    } else {
      return 0;
    }
    return 1;
  }
  if (strncmp(f->func, "cohort_", 7) == 0) {
    for (size_t i = 0; i < BASE_ARRAY_LEN(collectives); i++) {
      if (strcmp(f->func + 7, collectives[i]) == 0) {
        snprintf(out, outlen, "%s", f->func);
        return 1;
      }
    }
  }
  if (strstr(f->func, "gloo::") || strstr(f->func, "c10d::") || strncmp(f->func, "nccl", 4) == 0) {
    snprintf(out, outlen, "%s", f->func);
    return 1;
  }
  return 0;
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* A frame of the user's own code rather than of Python, torch or libc. */
static int user_frame(const frame *f, int python) {
  if (f->line <= 0 || f->file[0] == '\0') return 0;
  if (!python) return f->file[0] == '/';
  /* cohort's start-up hook (its collective wrappers) is no user code either. */
  return strstr(f->file, "-packages/") == NULL &&
         strcmp(base_name(f->file), "sitecustomize.py") != 0 &&
         strncmp(f->file, "/usr/lib/python", 15) != 0 && f->file[0] != '<';
}

void agent_stacks_classify(const stacks_dump *d, stacks_verdict *v) {
  memset(v, 0, sizeof *v);
  v->rank = d->rank;
  if (d->kind != STACKS_PYTHON && d->kind != STACKS_NATIVE) {
    snprintf(v->where, sizeof v->where, "%s",
             d->kind == STACKS_PROC_STATE ? "unknown (no debugger)" : "unknown (no stack)");
    const char *nl = strchr(d->text, '\n');
    snprintf(v->frames, sizeof v->frames, "    %.*s\n", nl ? (int)(nl - d->text) : 200, d->text);
    return;
  }
  thread_frames *t = malloc(2 * sizeof *t);
  if (t == NULL) return;
  int python = d->kind == STACKS_PYTHON;
  main_thread(d, &t[0], &t[1]);
  const thread_frames *m = &t[0];
  v->collected = m->n > 0;
  /* The outermost collective frame is the call the user's code made. */
  char coll[200] = "";
  int ci = -1;
  for (int i = 0; i < m->n; i++)
    if (collective_name(&m->f[i], python, coll, sizeof coll)) ci = i;
  if (ci >= 0) collective_name(&m->f[ci], python, coll, sizeof coll);
  v->in_collective = ci >= 0;
  int ui = -1;
  for (int i = ci + 1; i < m->n && ui < 0; i++)
    if (user_frame(&m->f[i], python)) ui = i;
  const char *what = ci >= 0 ? coll : (m->n > 0 ? m->f[0].func : "?");
  if (ui >= 0)
    snprintf(v->where, sizeof v->where, "%s, %s:%d", what, base_name(m->f[ui].file), m->f[ui].line);
  else
    snprintf(v->where, sizeof v->where, "%s", what);
  size_t off = 0;
  for (int i = 0; i < m->n && i < 8 && off < sizeof v->frames; i++) {
    const frame *f = &m->f[i];
    if (f->line > 0)
      off += (size_t)snprintf(v->frames + off, sizeof v->frames - off, "    %s at %s:%d\n", f->func,
                              f->file, f->line);
    else /* a native frame without a symbol has no name */
      off += (size_t)snprintf(v->frames + off, sizeof v->frames - off, "    %s\n",
                              f->func[0] != '\0' ? f->func : "?? (no symbol)");
  }
  free(t);
}

/* ---- blame and grouping ---- */

/* How many verdicts share v[i]'s place (collected, collective and where). */
static int same_place(const stacks_verdict *a, const stacks_verdict *b) {
  return a->collected == b->collected && a->in_collective == b->in_collective &&
         strcmp(a->where, b->where) == 0;
}

static int group_size(const stacks_verdict *v, int n, int i) {
  int k = 0;
  for (int j = 0; j < n; j++) k += same_place(&v[i], &v[j]);
  return k;
}

/* Index of the longest silent verdict for which keep() holds, or -1. */
static int longest_silent(const stacks_verdict *v, const int64_t *silent_ms, int n,
                          int (*keep)(const stacks_verdict *, int, int), int arg) {
  int best = -1;
  for (int i = 0; i < n; i++) {
    if (!keep(&v[i], arg, i)) continue;
    if (best < 0 || silent_ms[i] > silent_ms[best]) best = i;
  }
  return best;
}

static int keep_not_waiting(const stacks_verdict *v, int arg, int i) {
  (void)arg, (void)i;
  return v->collected && !v->in_collective;
}
static int keep_uncollected(const stacks_verdict *v, int arg, int i) {
  (void)arg, (void)i;
  return !v->collected;
}
static int keep_any(const stacks_verdict *v, int arg, int i) {
  (void)v, (void)arg, (void)i;
  return 1;
}

int agent_stacks_blame(const stacks_verdict *v, const int64_t *silent_ms, int n, const char **why) {
  if (n <= 0) return -1;
  int i = longest_silent(v, silent_ms, n, keep_not_waiting, 0);
  if (i >= 0) {
    *why = "is not in a collective";
    return i;
  }
  /* Everyone waits: the odd one out is in a different collective. */
  int smallest = -1, ngroups = 0;
  for (int k = 0; k < n; k++) {
    if (!v[k].collected) continue;
    int first = 1;
    for (int j = 0; j < k; j++) first &= !same_place(&v[k], &v[j]);
    ngroups += first;
    if (smallest < 0 || group_size(v, n, k) < group_size(v, n, smallest) ||
        (group_size(v, n, k) == group_size(v, n, smallest) && silent_ms[k] > silent_ms[smallest]))
      smallest = k;
  }
  if (ngroups > 1) {
    *why = "waits in a different collective from the others";
    return smallest;
  }
  i = longest_silent(v, silent_ms, n, keep_uncollected, 0);
  if (i >= 0) {
    *why = "gave no stack while the others wait in a collective";
    return i;
  }
  *why = "fell silent first (every rank waits in the same collective)";
  return longest_silent(v, silent_ms, n, keep_any, 0);
}

void agent_stacks_rank_list(const int *ranks, int n, char *out, size_t outlen) {
  size_t off = 0;
  out[0] = '\0';
  for (int i = 0; i < n && off < outlen;) {
    int j = i;
    while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) j++;
    if (j == i)
      off += (size_t)snprintf(out + off, outlen - off, "%s%d", i ? "," : "", ranks[i]);
    else
      off += (size_t)snprintf(out + off, outlen - off, "%s%d-%d", i ? "," : "", ranks[i], ranks[j]);
    i = j + 1;
  }
}

static int cmp_rank(const void *a, const void *b) {
  const stacks_verdict *const *x = a, *const *y = b;
  return ((*x)->rank > (*y)->rank) - ((*x)->rank < (*y)->rank);
}

void agent_stacks_group_lines(const stacks_verdict *v, int n, int skip, char *out, size_t outlen) {
  out[0] = '\0';
  const stacks_verdict **order = calloc((size_t)(n > 0 ? n : 1), sizeof *order);
  int *ranks = calloc((size_t)(n > 0 ? n : 1), sizeof *ranks);
  char *done = calloc((size_t)(n > 0 ? n : 1), 1);
  size_t off = 0;
  if (order == NULL || ranks == NULL || done == NULL) goto out;
  for (int i = 0; i < n; i++) order[i] = &v[i];
  qsort(order, (size_t)n, sizeof *order, cmp_rank);
  for (int i = 0; i < n && off < outlen; i++) {
    if (done[i] || (skip >= 0 && order[i] == &v[skip])) continue;
    int k = 0;
    for (int j = i; j < n; j++) {
      if (done[j] || (skip >= 0 && order[j] == &v[skip]) || !same_place(order[i], order[j]))
        continue;
      done[j] = 1;
      ranks[k++] = order[j]->rank;
    }
    char list[512];
    agent_stacks_rank_list(ranks, k, list, sizeof list);
    const char *how = order[i]->in_collective ? "waiting in" : order[i]->collected ? "in" : "";
    off += (size_t)snprintf(out + off, outlen - off, "%s%s %s %s %s", off ? "\n" : "",
                            k > 1 ? "ranks" : "rank", list, how, order[i]->where);
  }
out:
  free(order);
  free(ranks);
  free(done);
}

int agent_stacks_report(const stacks_verdict *v, const stacks_place *at, int n,
                        const char *stacks_dir, char *out, size_t outlen) {
  out[0] = '\0';
  int64_t *silent = calloc((size_t)(n > 0 ? n : 1), sizeof *silent);
  if (silent == NULL || n <= 0) {
    free(silent);
    return -1;
  }
  for (int i = 0; i < n; i++) silent[i] = at[i].silent_ms;
  const char *why = "";
  int c = agent_stacks_blame(v, silent, n, &why);
  free(silent);
  size_t off = (size_t)snprintf(
      out, outlen,
      "job hung: rank %d (node %d, %s, pid %d) made no progress for %.1f s and %s: %s\n%s",
      v[c].rank, at[c].node, at[c].host, (int)at[c].pid, (double)at[c].silent_ms / 1000, why,
      v[c].where, v[c].frames);
  if (off < outlen) agent_stacks_group_lines(v, n, c, out + off, outlen - off);
  off = strlen(out);
  if (stacks_dir != NULL && off < outlen)
    snprintf(out + off, outlen - off, "%sfull stacks: %s/rank<R>.txt on each node",
             off && out[off - 1] != '\n' ? "\n" : "", stacks_dir);
  return c;
}

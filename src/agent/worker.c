/* worker.c - spawning workers and relaying their output. */
#include "agent/worker.h"

#include "base/base.h"
#include "base/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

int agent_std_parse(const char *s, agent_std *out) {
  agent_std r = {0};
  if (base_parse_int(s, 0, 3, &r.all) == 0) {
    *out = r;
    return 0;
  }
  char buf[1024];
  if (s[0] == '\0' || strlen(s) >= sizeof buf) return -EINVAL;
  memcpy(buf, s, strlen(s) + 1);
  char *save = NULL;
  for (char *item = strtok_r(buf, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
    char *colon = strchr(item, ':');
    if (colon == NULL || r.n == AGENT_STD_MAX) return -EINVAL;
    *colon = '\0';
    if (base_parse_int(item, 0, AGENT_MAX_NPROC - 1, &r.lr[r.n]) != 0 ||
        base_parse_int(colon + 1, 0, 3, &r.v[r.n]) != 0)
      return -EINVAL;
    r.n++;
  }
  if (r.n == 0) return -EINVAL;
  *out = r;
  return 0;
}

int agent_std_of(const agent_std *s, int lr) {
  for (int i = 0; i < s->n; i++)
    if (s->lr[i] == lr) return s->v[i];
  return s->all;
}

void agent_worker_output(const agent_config *cfg, int lr, int *console, int *files) {
  int r = agent_std_of(&cfg->redirects, lr), t = agent_std_of(&cfg->tee, lr);
  *files = cfg->log_dir != NULL ? (r | t) : 0;
  *console = (~r | t) & 3;
  int shown = cfg->nshown == 0;
  for (int i = 0; i < cfg->nshown; i++)
    if (cfg->shown[i] == lr) shown = 1;
  if (!shown) *console = 0;
}

void agent_worker_init(worker *w, int rank, int local_rank, int console, int files, int log_fd) {
  w->rank = rank;
  w->local_rank = local_rank;
  w->pid = 0;
  w->running = 0;
  w->status = 0;
  w->stopped_by = 0;
  w->was_frozen = 0;
  w->started_ms = 0;
  w->last_output_ms = 0;
  w->out.fd = -1;
  w->out.len = 0;
  w->out.console_fd = (console & 1) ? STDOUT_FILENO : -1;
  w->out.to_file = (files & 1) != 0;
  w->err.fd = -1;
  w->err.len = 0;
  w->err.console_fd = (console & 2) ? STDERR_FILENO : -1;
  w->err.to_file = (files & 2) != 0;
  w->log_fd = log_fd;
  w->keep_fd = -1;
  w->exec_fd = -1;
  w->out.dup_fd = w->err.dup_fd = -1;
  w->out.dup = w->err.dup = NULL;
  w->prog = NULL;
  w->tail_next = 0;
  w->tail_count = 0;
}

/* Writes everything, retrying after signals; output errors are ignored on
 * purpose: a closed console must not stop the job. */
static void write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return;
    }
    p += k;
    n -= (size_t)k;
  }
}

void agent_worker_duplicate(worker *w, int stream, const agent_filters *f, int fd) {
  worker_stream *s = stream == 0 ? &w->out : &w->err;
  s->dup = f;
  s->dup_fd = fd;
}

/* Whether the line holds one of the filters. */
static int line_matches(const agent_filters *f, const char *line, size_t len) {
  for (int i = 0; i < f->n; i++)
    if (memmem(line, len, f->f[i], strlen(f->f[i])) != NULL) return 1;
  return 0;
}

/* The line with its rank prefix, in one write so that ranks' lines never interleave. */
static void write_prefixed(int fd, int rank, const char *line, size_t len) {
  char prefix[32];
  int plen = snprintf(prefix, sizeof prefix, "[r%d] ", rank);
  char *msg = malloc((size_t)plen + len + 1);
  if (msg == NULL) return;
  memcpy(msg, prefix, (size_t)plen);
  memcpy(msg + plen, line, len);
  msg[(size_t)plen + len] = '\n';
  write_all(fd, msg, (size_t)plen + len + 1);
  free(msg);
}

static void emit_line(worker *w, worker_stream *s, const char *line, size_t len) {
  if (w->prog != NULL) agent_progress_output(w->prog, base_now_ms());
  if (s->console_fd >= 0) write_prefixed(s->console_fd, w->rank, line, len);
  if (s->dup_fd >= 0 && line_matches(s->dup, line, len))
    write_prefixed(s->dup_fd, w->rank, line, len);
  if (w->log_fd >= 0 && s->to_file) {
    write_all(w->log_fd, line, len);
    write_all(w->log_fd, "\n", 1);
  }
  size_t keep = len < WORKER_TAIL_LINE_MAX - 1 ? len : WORKER_TAIL_LINE_MAX - 1;
  memcpy(w->tail[w->tail_next], line, keep);
  w->tail[w->tail_next][keep] = '\0';
  w->tail_next = (w->tail_next + 1) % AGENT_TAIL_LINES;
  if (w->tail_count < AGENT_TAIL_LINES) w->tail_count++;
}

int agent_worker_stream_read(worker *w, worker_stream *s) {
  if (s->fd < 0) return 1;
  for (;;) {
    ssize_t n = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return 0;
      n = 0; /* treat a read error like the end of the stream */
    }
    if (n > 0) w->last_output_ms = base_now_ms();
    if (n == 0) {
      if (s->len > 0) emit_line(w, s, s->buf, s->len);
      s->len = 0;
      close(s->fd);
      s->fd = -1;
      return 1;
    }
    size_t start = 0, end = s->len + (size_t)n;
    for (size_t i = s->len; i < end; i++) {
      if (s->buf[i] == '\n') {
        emit_line(w, s, s->buf + start, i - start);
        start = i + 1;
      }
    }
    if (start == 0 && end == sizeof s->buf) {
      emit_line(w, s, s->buf, end); /* an over-long line, relayed in pieces */
      start = end;
    }
    memmove(s->buf, s->buf + start, end - start);
    s->len = end - start;
    if ((size_t)n < sizeof s->buf) return 0; /* drained what was there */
  }
}

void agent_worker_close_streams(worker *w) {
  worker_stream *streams[2] = {&w->out, &w->err};
  for (int i = 0; i < 2; i++) {
    worker_stream *s = streams[i];
    if (s->len > 0) emit_line(w, s, s->buf, s->len);
    s->len = 0;
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
  }
  if (w->log_fd >= 0) close(w->log_fd);
  w->log_fd = -1;
}

/* The forked child: its own group, dies with the agent, stdin from
 * /dev/null, output on the pipes; a failed exec's errno goes to ex_w.
 * Only async-signal-safe calls until exec. */
static void exec_child(pid_t parent, int out_w, int err_w, int ex_w, char *const argv[],
                       char *const envp[], const cpu_set_t *cpus) __attribute__((noreturn));
static void exec_child(pid_t parent, int out_w, int err_w, int ex_w, char *const argv[],
                       char *const envp[], const cpu_set_t *cpus) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127); /* the agent died before we got here */
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, STDIN_FILENO);
  dup2(out_w, STDOUT_FILENO);
  dup2(err_w, STDERR_FILENO);
  if (cpus == NULL || sched_setaffinity(0, sizeof *cpus, cpus) == 0) execvpe(argv[0], argv, envp);
  int e = errno;
  ssize_t k = write(ex_w, &e, sizeof e);
  (void)k;
  _exit(127);
}

int agent_worker_start(worker *w, char *const argv[], char *const envp[], const cpu_set_t *cpus,
                       sweep *sw) {
  int out[2] = {-1, -1}, err[2] = {-1, -1}, ex[2] = {-1, -1};
  int rc = 0;
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(ex, O_CLOEXEC) != 0) {
    rc = -errno;
    goto out;
  }
  pid_t parent = getpid();
  pid_t pid = agent_sweep_fork(sw); /* in the job's cgroup: nothing it starts is outside */
  if (pid < 0) {
    rc = -errno;
    goto out;
  }
  if (pid == 0) {
    if (w->keep_fd >= 0) fcntl(w->keep_fd, F_SETFD, 0); /* its control channel's end */
    exec_child(parent, out[1], err[1], ex[1], argv, envp, cpus);
  }
  /* Parent: set the group here too so that it exists before we signal it. */
  setpgid(pid, pid);
  w->pid = pid;
  w->running = 1;
  w->started_ms = base_now_ms();
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  w->out.fd = out[0];
  w->err.fd = err[0];
  w->exec_fd = ex[0];
  out[0] = err[0] = ex[0] = -1;
out:
  for (int i = 0; i < 2; i++) {
    if (out[i] >= 0) close(out[i]);
    if (err[i] >= 0) close(err[i]);
    if (ex[i] >= 0) close(ex[i]);
  }
  return rc;
}

int agent_worker_started(worker *w) {
  if (w->exec_fd < 0) return 0;
  int e = 0;
  ssize_t n;
  do {
    n = read(w->exec_fd, &e, sizeof e);
  } while (n < 0 && errno == EINTR);
  close(w->exec_fd);
  w->exec_fd = -1;
  return n == (ssize_t)sizeof e ? e : 0;
}

void agent_worker_describe_status(int status, char *out, size_t outlen) {
  if (WIFEXITED(status)) {
    snprintf(out, outlen, "exited with code %d", WEXITSTATUS(status));
  } else if (WIFSIGNALED(status)) {
    const char *name = sigabbrev_np(WTERMSIG(status));
    snprintf(out, outlen, "was killed by SIG%s (signal %d)%s", name ? name : "?", WTERMSIG(status),
             WCOREDUMP(status) ? ", core dumped" : "");
  } else {
    snprintf(out, outlen, "ended with status 0x%x", (unsigned)status);
  }
}

int agent_worker_succeeded(const worker *w) {
  return WIFEXITED(w->status) && WEXITSTATUS(w->status) == 0;
}

int agent_worker_is_frozen(pid_t pid) {
  base_proc_stat s;
  return base_proc_stat_read("/proc", pid, &s) == 0 && (s.state == 'T' || s.state == 't');
}

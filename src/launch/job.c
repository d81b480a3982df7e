/*
 * job.c - a job started over ssh: one session (ssh client) per host, each
 * running a `cohort run` agent; the handshake (every host answers its
 * version before any gets the token); their output relayed to one
 * terminal; the job stopped on every host when the launcher is told to
 * stop, and every session ended before the launcher exits.
 *
 * The agents do the supervising (fail-together, reports) among themselves
 * through node 0's store; the launcher only relays, stops, and notices a
 * session that ssh lost. An agent started by launch watches its standard
 * input: a "stop" line stops the job as SIGTERM does, end of file (the
 * launcher or the connection gone) fails it with that cause.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "launch/internal.h"
#include "launch/launch.h"

#define RELAY_LINE_MAX 16384
#define SEEN_MAX 1024           /* cohort lines remembered for the once-only relay */
#define LOST_WAIT_MS 30000      /* after one session failed, the others' time to follow */
#define KILL_AFTER_TERM_MS 2000 /* ssh clients: SIGTERM, then SIGKILL this much later */
#define DEFAULT_PORT 29400
#define DEFAULT_FANOUT 32
#define DEFAULT_ANSWER_MS 30000
#define HELD_MAX 2048      /* stderr kept from a session before the job starts */
#define ABORT_TERM_MS 5000 /* after a failed handshake, the sessions' time to end */
#define VERSION_PREFIX "cohort "

typedef struct relay {
  int fd; /* read end, -1 once closed */
  size_t len;
  char buf[RELAY_LINE_MAX];
} relay;

typedef struct session {
  pid_t pid;         /* 0 before the start and once reaped */
  int started;       /* its ssh was started, or could not be (spawn_errno) */
  int ended;         /* reaped, or never started */
  int spawn_errno;   /* ssh could not be started */
  int exec_fd;       /* until ssh is executed (launch_spawn_finish), -1 */
  int in_fd;         /* ssh's stdin, -1 once closed */
  relay io[2];       /* the agent's stdout and stderr */
  int status;        /* waitpid() status once reaped */
  int64_t answer_by; /* the deadline of its answer */
  int timed_out;     /* no answer by then */
  char *version;     /* its answer (malloc'ed), NULL before it */
  size_t nheld;
  char held[HELD_MAX]; /* its stderr before the job starts (the last part) */
} session;

/* Answering: every host's version is awaited; running: the token went out;
 * aborted: it never will, the sessions are being ended. */
typedef enum phase { PHASE_ANSWER, PHASE_RUN, PHASE_ABORT } phase;

typedef struct run_state {
  const launch_job *job;
  session *s;
  size_t n;
  char *seen[SEEN_MAX]; /* cohort's own stderr lines already relayed */
  size_t nseen;
  int stop_signal;   /* first stop signal, 0 none */
  int64_t term_at;   /* SIGTERM to the ssh clients still running, 0 none */
  int64_t kill_at;   /* SIGKILL to them, 0 none */
  int64_t follow_by; /* a session failed: the rest must end by then, 0 none */
  phase ph;
  size_t next; /* the next session to start */
  char master[LAUNCH_HOST_MAX + 16], job_id[72];
  char token[65]; /* until it went out */
} run_state;

static void write_all(int fd, const char *p, size_t len) {
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    len -= (size_t)w;
  }
}

/* 1 when the line was relayed before (and remembers it otherwise). */
static int seen_before(run_state *st, const char *line, size_t len) {
  for (size_t i = 0; i < st->nseen; i++)
    if (strlen(st->seen[i]) == len && memcmp(st->seen[i], line, len) == 0) return 1;
  if (st->nseen < SEEN_MAX && (st->seen[st->nseen] = strndup(line, len)) != NULL) st->nseen++;
  return 0;
}

/* Relays one line (with its newline) from stream k (0 stdout, 1 stderr). */
static void emit(run_state *st, int k, const char *line, size_t len) {
  if (k == 1 && len > 8 && memcmp(line, "cohort: ", 8) == 0 && seen_before(st, line, len)) return;
  write_all(k == 0 ? st->job->out_fd : st->job->err_fd, line, len);
}

/* Keeps a line of stderr from before the start; the oldest go when it is full. */
static void hold(session *s, const char *line, size_t len) {
  if (len > sizeof s->held) {
    line += len - sizeof s->held;
    len = sizeof s->held;
  }
  if (s->nheld + len > sizeof s->held) {
    size_t drop = s->nheld + len - sizeof s->held;
    memmove(s->held, s->held + drop, s->nheld - drop);
    s->nheld -= drop;
  }
  memcpy(s->held + s->nheld, line, len);
  s->nheld += len;
}

/* A whole line (with its newline) of session i's stream k: its answer, held
 * until the start, relayed, or dropped after a failed handshake. */
static void on_line(run_state *st, size_t i, int k, const char *line, size_t len) {
  session *s = &st->s[i];
  if (st->ph == PHASE_ABORT) return;
  /* The first "cohort " line is the agent's version; lines before it (a login shell's) and
   * stderr before the start are kept for the start or for the verdict. */
  if (k == 0 && s->version == NULL && st->ph == PHASE_ANSWER) {
    if (len > strlen(VERSION_PREFIX) && memcmp(line, VERSION_PREFIX, strlen(VERSION_PREFIX)) == 0)
      s->version = strndup(line, len - 1);
    else
      emit(st, 0, line, len);
    return;
  }
  if (k == 1 && st->ph == PHASE_ANSWER)
    hold(s, line, len);
  else
    emit(st, k, line, len);
}

/* Reads what is there from session i's stream k and passes on whole lines; at EOF the rest,
 * ended. */
static void relay_read(run_state *st, size_t i, int k) {
  relay *r = &st->s[i].io[k];
  ssize_t got = read(r->fd, r->buf + r->len, sizeof r->buf - 1 - r->len);
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (got > 0) r->len += (size_t)got;
  size_t start = 0;
  for (size_t j = 0; j < r->len; j++)
    if (r->buf[j] == '\n') {
      on_line(st, i, k, r->buf + start, j + 1 - start);
      start = j + 1;
    }
  memmove(r->buf, r->buf + start, r->len - start);
  r->len -= start;
  if (got <= 0 || r->len == sizeof r->buf - 1) {
    /* End of file, or a line longer than the buffer: out in pieces. */
    if (r->len > 0) {
      r->buf[r->len++] = '\n';
      on_line(st, i, k, r->buf, r->len);
      r->len = 0;
    }
  }
  if (got <= 0) {
    close(r->fd);
    r->fd = -1;
  }
}

static void say(const run_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const run_state *st, const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  write_all(st->job->err_fd, line, (size_t)n);
}

static void close_stdin(session *s) {
  if (s->in_fd >= 0) close(s->in_fd);
  s->in_fd = -1;
}

static void signal_sessions(run_state *st, int sig) {
  for (size_t i = 0; i < st->n; i++)
    if (st->s[i].pid > 0) kill(st->s[i].pid, sig);
}

/* SIGTERM to the ssh clients still running by then (SIGKILL later), at the soonest asked. */
static void term_by(run_state *st, int64_t at) {
  if (st->term_at == 0 || at < st->term_at) st->term_at = at;
}

/*
 * No agent will get the token: every session's stdin closes (an agent that
 * answered ends without starting anything), the clients still connecting
 * are ended, and the rest get ABORT_TERM_MS. Their output is dropped.
 */
static void abort_start(run_state *st) {
  st->ph = PHASE_ABORT;
  explicit_bzero(st->token, sizeof st->token);
  for (size_t i = 0; i < st->n; i++) {
    close_stdin(&st->s[i]);
    if (st->s[i].pid > 0 && st->s[i].version == NULL) kill(st->s[i].pid, SIGTERM);
  }
  st->next = st->n;
  term_by(st, base_now_ms() + ABORT_TERM_MS);
}

/* Tells every agent to stop (a "stop" line, then end of file); before the start, nothing
 * starts. */
static void stop_all(run_state *st, int64_t grace_ms) {
  if (st->ph != PHASE_RUN) {
    abort_start(st);
    return;
  }
  for (size_t i = 0; i < st->n; i++) {
    if (st->s[i].in_fd >= 0) write_all(st->s[i].in_fd, "stop\n", 5);
    close_stdin(&st->s[i]);
  }
  term_by(st, base_now_ms() + grace_ms);
}

/* The host part of [user@]host. */
static const char *host_part(const char *name) {
  const char *at = strchr(name, '@');
  return at != NULL ? at + 1 : name;
}

int launch_remote_command(const launch_job *job, size_t i, const char *master, const char *job_id,
                          char **out) {
  char nnodes[16], rank[16], nproc[16];
  size_t nwords = 0, ncmd = 0;
  while (job->run_words != NULL && job->run_words[nwords] != NULL) nwords++;
  while (job->command[ncmd] != NULL) ncmd++;
  char **v = calloc(nwords + ncmd + 24, sizeof *v);
  if (v == NULL) return -ENOMEM;
  int slots = job->nproc > 0 ? job->nproc : job->hosts.v[i].slots > 0 ? job->hosts.v[i].slots : 1;
  snprintf(nnodes, sizeof nnodes, "%zu", job->hosts.n);
  snprintf(rank, sizeof rank, "%zu", i);
  snprintf(nproc, sizeof nproc, "%d", slots);
  size_t k = 0;
  /* --launcher-stdin first: the agent answers its version before it parses the rest, so that
   * another version's options cannot hide its answer (cmd_run.c). */
  const char *words[] = {job->cohort_path,
                         "run",
                         "--launcher-stdin",
                         "--nnodes",
                         nnodes,
                         "--node-rank",
                         rank,
                         "--master",
                         master,
                         "--job",
                         job_id,
                         "--nproc-per-node",
                         nproc};
  for (size_t w = 0; w < BASE_ARRAY_LEN(words); w++) v[k++] = (char *)words[w];
  for (size_t w = 0; w < nwords; w++) v[k++] = job->run_words[w];
  v[k++] = "--";
  for (size_t w = 0; w < ncmd; w++) v[k++] = job->command[w];
  char *joined = NULL;
  int rc = launch_shell_join(v, &joined);
  free(v);
  if (rc != 0) return rc;
  *out = malloc(strlen(joined) + 8);
  if (*out != NULL) sprintf(*out, "exec %s", joined);
  free(joined);
  return *out != NULL ? 0 : -ENOMEM;
}

/* Starts host i's session (this machine's under sh, the others' over ssh); it answers its
 * version, then waits for the token. A missing ssh is the host's verdict, not an error. */
static int start_session(run_state *st, size_t i) {
  const launch_job *job = st->job;
  session *s = &st->s[i];
  char *cmd = NULL, **argv = NULL;
  int rc = launch_remote_command(job, i, st->master, st->job_id, &cmd);
  char *here[] = {"sh", "-c", cmd, NULL};
  if (rc == 0 && (long)i != job->local)
    rc = launch_ssh_argv(&job->ssh, job->hosts.v[i].name, cmd, &argv);
  int fds[3];
  if (rc == 0) rc = launch_spawn_start(argv != NULL ? argv : here, 1, 1, &s->pid, fds, &s->exec_fd);
  free(argv);
  free(cmd);
  s->started = 1;
  s->ended = s->pid == 0;
  if (rc != 0 || s->pid == 0) return rc;
  s->in_fd = fds[0];
  s->io[0].fd = fds[1];
  s->io[1].fd = fds[2];
  s->answer_by = base_now_ms() + (job->answer_ms > 0 ? job->answer_ms : DEFAULT_ANSWER_MS);
  return 0;
}

/* 1 while session s may still answer. */
static int awaiting(const session *s) {
  return s->started && !s->ended && s->version == NULL && !s->timed_out;
}

/* Waits until session s's ssh is executed; 1 when it could not be (the host's verdict: its
 * session ends here). */
static int finish_session(session *s) {
  if (s->exec_fd < 0) return 0;
  s->spawn_errno = launch_spawn_finish(s->exec_fd);
  s->exec_fd = -1;
  if (s->spawn_errno == 0) return 0;
  while (waitpid(s->pid, &s->status, 0) < 0 && errno == EINTR) {
  }
  s->pid = 0;
  s->ended = 1;
  close_stdin(s);
  for (int k = 0; k < 2; k++) {
    close(s->io[k].fd);
    s->io[k].fd = -1;
  }
  return 1;
}

/*
 * Starts sessions while fewer than the fan-out are connecting: the ssh
 * clients are all started before any is waited for, so that they are
 * executed at once (spawn.c); a slot of one that could not be is filled in
 * the next batch.
 */
static int start_more(run_state *st) {
  int fanout = st->job->fanout > 0 ? st->job->fanout : DEFAULT_FANOUT, rc = 0;
  for (;;) {
    int connecting = 0, failed = 0;
    for (size_t i = 0; i < st->next; i++) connecting += awaiting(&st->s[i]);
    size_t first = st->next;
    while (rc == 0 && st->next < st->n && connecting < fanout) {
      rc = start_session(st, st->next++);
      connecting += rc == 0;
    }
    for (size_t i = first; i < st->next; i++) failed += finish_session(&st->s[i]);
    if (rc != 0 || failed == 0 || st->next == st->n) return rc;
  }
}

/* Every host answered: the token to each, and what they held back is relayed. */
static void go(run_state *st) {
  char line[80];
  int n = snprintf(line, sizeof line, "%s\n", st->token);
  st->ph = PHASE_RUN;
  for (size_t i = 0; i < st->n; i++) {
    session *s = &st->s[i];
    write_all(s->in_fd, line, (size_t)n);
    for (size_t a = 0, b = 0; b < s->nheld; b++)
      if (s->held[b] == '\n' || b + 1 == s->nheld) {
        emit(st, 1, s->held + a, b + 1 - a);
        a = b + 1;
      }
    s->nheld = 0;
  }
  explicit_bzero(line, sizeof line);
  explicit_bzero(st->token, sizeof st->token);
}

/* The last non-empty line of session s's held stderr, without its newline. */
static void held_tail(const session *s, char *out, size_t cap) {
  size_t end = s->nheld;
  while (end > 0 &&
         (s->held[end - 1] == '\n' || s->held[end - 1] == '\r' || s->held[end - 1] == ' '))
    end--;
  size_t start = end;
  while (start > 0 && s->held[start - 1] != '\n') start--;
  size_t n = end - start < cap - 1 ? end - start : cap - 1;
  memcpy(out, s->held + start, n);
  out[n] = '\0';
}

/*
 * Once no host may still answer: the token to all when all answered this
 * version; else one line per host with a problem, and nothing starts.
 */
static void decide(run_state *st) {
  for (size_t i = 0; i < st->n; i++)
    if (i >= st->next || awaiting(&st->s[i])) return;
  int bad = 0;
  for (size_t i = 0; i < st->n; i++) {
    session *s = &st->s[i];
    char err[200], line[512];
    held_tail(s, err, sizeof err);
    launch_answer a = {.version = s->version,
                       .ended = s->ended,
                       .status = s->status,
                       .timed_out = s->timed_out,
                       .spawn_errno = s->spawn_errno,
                       .err = err};
    int64_t ms = st->job->answer_ms > 0 ? st->job->answer_ms : DEFAULT_ANSWER_MS;
    if (launch_judge_answer(&a, st->job->cohort_path, st->job->expect, ms, line, sizeof line)) {
      say(st, "cohort launch: %s: %s", st->job->hosts.v[i].name, line);
      bad = 1;
    }
  }
  if (!bad) {
    go(st);
    return;
  }
  say(st, "cohort launch: nothing was started");
  abort_start(st);
}

/* Reaps sessions whose output has closed; once running, notes one that failed. */
static void reap_sessions(run_state *st) {
  for (size_t i = 0; i < st->n; i++) {
    session *s = &st->s[i];
    if (s->pid <= 0 || s->io[0].fd >= 0 || s->io[1].fd >= 0) continue;
    pid_t w = waitpid(s->pid, &s->status, WNOHANG);
    if (w == 0 || (w < 0 && errno == EINTR)) continue;
    s->pid = 0;
    s->ended = 1;
    close_stdin(s);
    int failed = !WIFEXITED(s->status) || WEXITSTATUS(s->status) != 0;
    if (!failed || st->stop_signal != 0 || st->ph != PHASE_RUN) continue;
    if (!WIFEXITED(s->status) || WEXITSTATUS(s->status) == 255)
      say(st, "cohort launch: lost the connection to %s (node %zu)", st->job->hosts.v[i].name, i);
    if (st->follow_by == 0) st->follow_by = base_now_ms() + LOST_WAIT_MS;
  }
}

/* Sends what is due: the late stop, SIGTERM and SIGKILL to the clients; marks the hosts whose
 * answer is late. */
static void run_timers(run_state *st) {
  int64_t now = base_now_ms();
  for (size_t i = 0; st->ph == PHASE_ANSWER && i < st->next; i++)
    if (awaiting(&st->s[i]) && now >= st->s[i].answer_by) st->s[i].timed_out = 1;
  if (st->follow_by != 0 && now >= st->follow_by) {
    st->follow_by = 0;
    stop_all(st, st->job->stop_grace_ms);
  }
  if (st->term_at != 0 && now >= st->term_at) {
    st->term_at = 0;
    signal_sessions(st, SIGTERM);
    st->kill_at = now + KILL_AFTER_TERM_MS;
  }
  if (st->kill_at != 0 && now >= st->kill_at) {
    st->kill_at = 0;
    signal_sessions(st, SIGKILL);
  }
}

/* The soonest timer, as a poll() timeout (-1: none). */
static int next_timeout(const run_state *st) {
  int64_t at[3] = {st->follow_by, st->term_at, st->kill_at};
  int t = -1;
  for (int k = 0; k < 3; k++) {
    if (at[k] == 0) continue;
    int left = base_deadline_left(at[k]);
    if (t < 0 || left < t) t = left;
  }
  for (size_t i = 0; i < st->n; i++) {
    const session *s = &st->s[i];
    if (s->pid > 0 && s->io[0].fd < 0 && s->io[1].fd < 0) return 5;
    if (st->ph == PHASE_ANSWER && awaiting(s)) {
      int left = base_deadline_left(s->answer_by);
      if (t < 0 || left < t) t = left;
    }
  }
  return t;
}

static void on_stop_signal(run_state *st, int sig) {
  if (sig != SIGINT && sig != SIGTERM && sig != SIGHUP) return;
  if (st->stop_signal == 0) {
    st->stop_signal = sig;
    const char *name = sigabbrev_np(sig);
    say(st, "cohort launch: SIG%s: stopping the job on every host", name ? name : "?");
    stop_all(st, st->job->stop_grace_ms + 3000);
  } else {
    /* Asked twice: the agents' grace is over; their ends of ssh close. */
    say(st, "cohort launch: stopping now");
    signal_sessions(st, SIGTERM);
    st->term_at = 0;
    st->kill_at = base_now_ms() + KILL_AFTER_TERM_MS;
  }
}

/* One poll() over the stop pipe and every open output; relays what came. */
static int poll_once(run_state *st, int stop_fd) {
  size_t cap = 1 + 2 * st->n;
  struct pollfd *pfd = calloc(cap, sizeof *pfd);
  size_t *who = calloc(cap, sizeof *who);
  if (pfd == NULL || who == NULL) {
    free(pfd);
    free(who);
    return -ENOMEM;
  }
  nfds_t np = 0;
  pfd[np++] = (struct pollfd){.fd = stop_fd, .events = POLLIN};
  for (size_t i = 0; i < st->n; i++)
    for (int k = 0; k < 2; k++)
      if (st->s[i].io[k].fd >= 0) {
        pfd[np] = (struct pollfd){.fd = st->s[i].io[k].fd, .events = POLLIN};
        who[np++] = i * 2 + (size_t)k;
      }
  int ready = poll(pfd, np, next_timeout(st));
  int rc = ready < 0 && errno != EINTR ? -errno : 0;
  for (nfds_t p = 1; ready > 0 && p < np; p++)
    if (pfd[p].revents != 0) relay_read(st, who[p] / 2, (int)(who[p] % 2));
  if (ready > 0 && stop_fd >= 0 && (pfd[0].revents & POLLIN)) {
    unsigned char sigs[16];
    ssize_t got = read(stop_fd, sigs, sizeof sigs);
    for (ssize_t k = 0; k < got; k++) on_stop_signal(st, sigs[k]);
  }
  free(pfd);
  free(who);
  return rc;
}

/* The job's exit status once every session has ended. */
static int job_status(const run_state *st) {
  if (st->stop_signal != 0) return 128 + st->stop_signal;
  if (st->ph != PHASE_RUN) return 1; /* a host failed the handshake */
  for (size_t i = 0; i < st->n; i++) {
    int s = st->s[i].status;
    if (!WIFEXITED(s) || WEXITSTATUS(s) == 255) return 1;
    if (WEXITSTATUS(s) != 0) return WEXITSTATUS(s);
  }
  return 0;
}

static int any_running(const run_state *st) {
  for (size_t i = 0; i < st->n; i++)
    if (st->s[i].pid > 0) return 1;
  return 0;
}

/* The stop signals reach the loop through a self-pipe; SIGPIPE is ignored
 * (a session's stdin may close under a write). */
static int stop_pipe[2] = {-1, -1};
static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};

static void on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  if (write(stop_pipe[1], &b, 1) < 0) {
    /* Full pipe: enough stop requests are queued. */
  }
  errno = saved;
}

static int signals_install(struct sigaction *old) {
  if (pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return -errno;
  struct sigaction sa = {.sa_handler = on_signal}, ign = {.sa_handler = SIG_IGN};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (size_t k = 0; k < BASE_ARRAY_LEN(stop_signals); k++)
    sigaction(stop_signals[k], &sa, &old[k]);
  sigaction(SIGPIPE, &ign, &old[BASE_ARRAY_LEN(stop_signals)]);
  return 0;
}

static void signals_restore(const struct sigaction *old) {
  for (size_t k = 0; k < BASE_ARRAY_LEN(stop_signals); k++)
    sigaction(stop_signals[k], &old[k], NULL);
  sigaction(SIGPIPE, &old[BASE_ARRAY_LEN(stop_signals)], NULL);
  close(stop_pipe[0]);
  close(stop_pipe[1]);
  stop_pipe[0] = stop_pipe[1] = -1;
}

/* The job's names and token: node 0's store, the job id, a fresh token. */
static int job_names(run_state *st) {
  const launch_job *job = st->job;
  unsigned char raw[32];
  int rc = base_random_bytes(raw, sizeof raw);
  base_hex(raw, sizeof raw, st->token);
  if (job->job_id != NULL) {
    base_strlcpy(st->job_id, job->job_id, sizeof st->job_id);
  } else {
    memcpy(st->job_id, "launch-", 7);
    base_hex(raw, 4, st->job_id + 7);
  }
  explicit_bzero(raw, sizeof raw);
  if (job->master != NULL)
    base_strlcpy(st->master, job->master, sizeof st->master);
  else
    snprintf(st->master, sizeof st->master, "%s:%d", host_part(job->hosts.v[0].name), DEFAULT_PORT);
  return rc;
}

static void run_state_free(run_state *st) {
  explicit_bzero(st->token, sizeof st->token);
  for (size_t i = 0; i < st->nseen; i++) free(st->seen[i]);
  for (size_t i = 0; i < st->n; i++) free(st->s[i].version);
  free(st->s);
}

int launch_job_run(const launch_job *job, int *status) {
  run_state st = {.job = job, .n = job->hosts.n};
  struct sigaction old[BASE_ARRAY_LEN(stop_signals) + 1];
  st.s = calloc(st.n, sizeof *st.s);
  if (st.s == NULL) return -ENOMEM;
  int rc = signals_install(old);
  if (rc != 0) {
    free(st.s);
    return rc;
  }
  for (size_t i = 0; i < st.n; i++)
    st.s[i].exec_fd = st.s[i].in_fd = st.s[i].io[0].fd = st.s[i].io[1].fd = -1;
  rc = job_names(&st);
  for (;;) {
    if (rc == 0 && st.ph == PHASE_ANSWER) rc = start_more(&st);
    if (rc != 0 && st.ph == PHASE_ANSWER) {
      say(&st, "cohort launch: cannot start ssh: %s", strerror(-rc));
      abort_start(&st);
    }
    reap_sessions(&st);
    run_timers(&st);
    if (st.ph == PHASE_ANSWER) decide(&st);
    if (!any_running(&st) && st.ph != PHASE_ANSWER) break;
    int prc = poll_once(&st, stop_pipe[0]);
    if (prc != 0 && rc == 0) {
      rc = prc;
      stop_all(&st, 0);
      base_sleep_ms(10);
    }
  }
  *status = job_status(&st);
  signals_restore(old);
  run_state_free(&st);
  return rc;
}

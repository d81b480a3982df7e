/* guard.c - kills the workers' groups if the agent dies. */
#include "agent/guard.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/dirs.h"
#include "agent/sweep.h"
#include "agent/watch.h"
#include "base/base.h"

/* Where to publish the agent's death: one line "r<fields>\n" from the agent. */
static char report_line[1024];
/* A directory of the agent's to remove after it died: "d<path>\n". */
static char dir_line[256];
/* The job's cgroup to kill after it died: "c<1 v2, 0 v1><path>\n". */
static char cgroup_line[300];

/* Publishes the agent's death as the job's failure (see agent_guard_set_report). */
static void publish_death(void) {
  char host[256], token_hex[520], job[80], hostname[256];
  int port, round, node;
  if (sscanf(report_line, "%255s %d %519s %79s %d %d %255s", host, &port, token_hex, job, &round,
             &node, hostname) != 7)
    return;
  char token[260];
  const char *tok = NULL;
  if (strcmp(token_hex, "-") != 0) {
    size_t n = strlen(token_hex) / 2;
    if (n >= sizeof token) return;
    for (size_t i = 0; i < n; i++) {
      unsigned v;
      if (sscanf(token_hex + 2 * i, "%2x", &v) != 1) return;
      token[i] = (char)v;
    }
    token[n] = '\0';
    tok = token;
  }
  char report[512], winner[WATCH_REPORT_MAX];
  snprintf(report, sizeof report,
           "node %d (%s): its agent died (killed, or the node is out of memory); its workers were "
           "killed with it",
           node, hostname);
  rdzv_backend *b = NULL;
  if (rdzv_backend_store(host, port, tok, &b) != 0) return;
  agent_watch_publish_failure(b, job, round, report, winner, sizeof winner);
  rdzv_backend_close(b);
}

/* The guard's reading of the agent's lines: "+PGID" and "-PGID" register
 * and forget a group, "r..." and "d..." set report_line and dir_line, "q"
 * says the agent is ending on its own. */
typedef struct guard_reader {
  pid_t groups[AGENT_MAX_NPROC * 2];
  size_t ngroups;
  char op; /* '+' or '-' while reading a group line, else 0 */
  char num[32];
  size_t numlen;
  int in_text; /* 'r' or 'd' while reading that line, else 0 */
  size_t textlen;
} guard_reader;

static void read_text_char(guard_reader *r, char c) {
  char *line = r->in_text == 'r' ? report_line : r->in_text == 'd' ? dir_line : cgroup_line;
  size_t cap = r->in_text == 'r'   ? sizeof report_line
               : r->in_text == 'd' ? sizeof dir_line
                                   : sizeof cgroup_line;
  if (c == '\n') {
    line[r->textlen] = '\0';
    r->in_text = 0;
  } else if (r->textlen < cap - 1) {
    line[r->textlen++] = c;
  }
}

static void add_or_forget(guard_reader *r, pid_t p) {
  if (r->op == '+' && r->ngroups < BASE_ARRAY_LEN(r->groups)) {
    r->groups[r->ngroups++] = p;
    return;
  }
  for (size_t k = 0; r->op == '-' && k < r->ngroups; k++) {
    if (r->groups[k] == p) {
      r->groups[k] = r->groups[--r->ngroups];
      break;
    }
  }
}

static void read_char(guard_reader *r, char c) {
  if (r->in_text) {
    read_text_char(r, c);
  } else if (c == 'r' || c == 'd' || c == 'c') {
    r->in_text = c;
    r->textlen = 0;
  } else if (c == 'q') {
    _exit(0);
  } else if (c == '+' || c == '-') {
    r->op = c;
    r->numlen = 0;
  } else if (c >= '0' && c <= '9' && r->numlen < sizeof r->num - 1) {
    r->num[r->numlen++] = c;
  } else if (c == '\n' && r->op != 0 && r->numlen > 0) {
    pid_t p = 0;
    for (size_t k = 0; k < r->numlen; k++) p = p * 10 + (r->num[k] - '0');
    add_or_forget(r, p);
    r->op = 0;
    r->numlen = 0;
  }
}

/* Runs in the forked child, which was forked before the agent started any
 * thread, so ordinary library calls are safe here. */
static void guard_main(int fd) {
  static guard_reader r;
  char buf[256];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break; /* the agent is gone: kill what it left */
    for (ssize_t i = 0; i < n; i++) read_char(&r, buf[i]);
  }
  /* Say why before the workers' deaths make their peers fail for another reason. */
  if (report_line[0] != '\0' && r.ngroups > 0) publish_death();
  for (size_t k = 0; k < r.ngroups; k++) kill(-r.groups[k], SIGKILL);
  /* What left the groups is still in the job's cgroup. */
  if (cgroup_line[0] != '\0') {
    sweep s = {.v2 = cgroup_line[0] == '1'};
    base_strlcpy(s.dir, cgroup_line + 1, sizeof s.dir);
    agent_sweep_kill_cgroup(s.dir, s.v2);
    agent_sweep_close(&s);
  }
  if (dir_line[0] != '\0') agent_dirs_remove(dir_line);
  _exit(0);
}

int agent_guard_start(guard *g) {
  int p[2];
  g->pid = 0;
  g->fd = -1;
  if (pipe2(p, O_CLOEXEC) != 0) return -errno;
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close(p[0]);
    close(p[1]);
    return -e;
  }
  if (pid == 0) {
    /* Its own group, deaf to the terminal's and the user's stop signals. */
    setpgid(0, 0);
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGUSR1, SIG_IGN);
    signal(SIGUSR2, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    close(p[1]);
    int keep = p[0];
    if (keep != 3) {
      dup2(keep, 3);
      keep = 3;
    }
    close_range(4, ~0u, 0);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, 0);
      dup2(devnull, 1);
      dup2(devnull, 2);
      if (devnull > 3) close(devnull);
    }
    guard_main(keep);
  }
  close(p[0]);
  g->pid = pid;
  g->fd = p[1];
  return 0;
}

static void guard_send(guard *g, char op, pid_t pgid) {
  if (g->fd < 0) return;
  char line[32];
  int n = snprintf(line, sizeof line, "%c%d\n", op, (int)pgid);
  ssize_t k = write(g->fd, line, (size_t)n);
  (void)k;
}

void agent_guard_add(guard *g, pid_t pgid) {
  guard_send(g, '+', pgid);
}

void agent_guard_remove(guard *g, pid_t pgid) {
  guard_send(g, '-', pgid);
}

void agent_guard_stop(guard *g) {
  if (g->fd >= 0) {
    ssize_t k = write(g->fd, "q", 1);
    (void)k;
    close(g->fd);
    g->fd = -1;
  }
  if (g->pid > 0) {
    while (waitpid(g->pid, NULL, 0) < 0 && errno == EINTR) {
    }
    g->pid = 0;
  }
}

void agent_guard_set_report(guard *g, const char *store_host, int store_port, const char *token,
                            const char *job_id, int round, int node, const char *hostname) {
  if (g->fd < 0) return;
  char token_hex[520] = "-";
  if (token != NULL && strlen(token) < 256) base_hex(token, strlen(token), token_hex);
  char line[1200];
  int n = snprintf(line, sizeof line, "r%s %d %s %s %d %d %s\n", store_host, store_port, token_hex,
                   job_id, round, node, hostname[0] ? hostname : "unknown");
  if (n > 0 && (size_t)n < sizeof line) {
    ssize_t k = write(g->fd, line, (size_t)n);
    (void)k;
  }
}

void agent_guard_set_dir(guard *g, const char *dir) {
  if (g->fd < 0 || strlen(dir) >= sizeof dir_line || strchr(dir, '\n') != NULL) return;
  char line[300];
  int n = snprintf(line, sizeof line, "d%s\n", dir);
  ssize_t k = write(g->fd, line, (size_t)n);
  (void)k;
}

void agent_guard_set_cgroup(guard *g, const char *dir, int v2) {
  if (g->fd < 0 || strlen(dir) + 2 >= sizeof cgroup_line || strchr(dir, '\n') != NULL) return;
  char line[320];
  int n = snprintf(line, sizeof line, "c%d%s\n", v2 ? 1 : 0, dir);
  ssize_t k = write(g->fd, line, (size_t)n);
  (void)k;
}

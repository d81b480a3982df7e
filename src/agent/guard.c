/* guard.c - kills the workers' groups if the agent dies. */
#include "agent/guard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/watch.h"
#include "base/base.h"

/* Where to publish the agent's death: one line "r<fields>\n" from the agent. */
static char report_line[1024];
/* A directory of the agent's to remove after it died: "d<path>\n". */
static char dir_line[256];

/* Publishes the agent's death as the job's failure (see guard_set_report). */
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
  watch_publish_failure(host, port, tok, job, round, report, winner, sizeof winner);
}

/* Runs in the forked child, which was forked before the agent started any
 * thread, so ordinary library calls are safe here. */
static void guard_main(int fd) {
  static pid_t groups[AGENT_MAX_NPROC * 2];
  size_t ngroups = 0;
  char buf[256];
  char num[32];
  size_t numlen = 0;
  char op = 0;
  size_t rlen = 0;
  int in_report = 0; /* 'r' or 'd' while reading that line, else 0 */
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break; /* the agent is gone: kill what it left */
    for (ssize_t i = 0; i < n; i++) {
      char c = buf[i];
      if (in_report) {
        char *line = in_report == 'r' ? report_line : dir_line;
        size_t cap = in_report == 'r' ? sizeof report_line : sizeof dir_line;
        if (c == '\n') {
          line[rlen] = '\0';
          in_report = 0;
        } else if (rlen < cap - 1) {
          line[rlen++] = c;
        }
        continue;
      }
      if (c == 'r' || c == 'd') {
        in_report = c;
        rlen = 0;
        continue;
      }
      if (c == 'q') _exit(0);
      if (c == '+' || c == '-') {
        op = c;
        numlen = 0;
      } else if (c >= '0' && c <= '9' && numlen < sizeof num - 1) {
        num[numlen++] = c;
      } else if (c == '\n' && op != 0 && numlen > 0) {
        pid_t p = 0;
        for (size_t k = 0; k < numlen; k++) p = p * 10 + (num[k] - '0');
        if (op == '+' && ngroups < sizeof groups / sizeof groups[0]) {
          groups[ngroups++] = p;
        } else if (op == '-') {
          for (size_t k = 0; k < ngroups; k++) {
            if (groups[k] == p) {
              groups[k] = groups[--ngroups];
              break;
            }
          }
        }
        op = 0;
        numlen = 0;
      }
    }
  }
  /* Say why before the workers' deaths make their peers fail for another reason. */
  if (report_line[0] != '\0' && ngroups > 0) publish_death();
  for (size_t k = 0; k < ngroups; k++) kill(-groups[k], SIGKILL);
  if (dir_line[0] != '\0') {
    DIR *d = opendir(dir_line);
    if (d != NULL) {
      struct dirent *de;
      while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
          unlinkat(dirfd(d), de->d_name, 0);
      }
      closedir(d);
    }
    rmdir(dir_line);
  }
  _exit(0);
}

int guard_start(guard *g) {
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

void guard_add(guard *g, pid_t pgid) {
  guard_send(g, '+', pgid);
}

void guard_remove(guard *g, pid_t pgid) {
  guard_send(g, '-', pgid);
}

void guard_stop(guard *g) {
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

void guard_set_report(guard *g, const char *store_host, int store_port, const char *token,
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

void guard_set_dir(guard *g, const char *dir) {
  if (g->fd < 0 || strlen(dir) >= sizeof dir_line || strchr(dir, '\n') != NULL) return;
  char line[300];
  int n = snprintf(line, sizeof line, "d%s\n", dir);
  ssize_t k = write(g->fd, line, (size_t)n);
  (void)k;
}

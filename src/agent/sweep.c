/* sweep.c - every descendant of the workers ends with the job. */
#include "agent/sweep.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "base/proc.h"

/* How many times the descendants are looked for and killed at most, and
 * how long between two looks: a process forking as fast as it can is
 * caught within these. */
#define PASSES 100
#define PASS_MS 10

/* The directory of this process's cgroup in the v2 hierarchy (v2) or in
 * v1's freezer hierarchy, from mountinfo and cgroup under proc_root. */
static int own_cgroup(const char *proc_root, int v2, char *out, size_t outlen) {
  char path[300], line[1024], mnt[512] = "", root[512] = "";
  snprintf(path, sizeof path, "%s/self/mountinfo", proc_root);
  FILE *f = fopen(path, "re");
  if (f == NULL) return -errno;
  while (mnt[0] == '\0' && fgets(line, sizeof line, f) != NULL) {
    char r[512], m[512], type[64], opts[512];
    const char *dash = strstr(line, " - ");
    if (dash == NULL || sscanf(line, "%*s %*s %*s %511s %511s", r, m) != 2 ||
        sscanf(dash, " - %63s %*s %511s", type, opts) != 2)
      continue;
    char key[520];
    snprintf(key, sizeof key, ",%s,", opts);
    int match = v2 ? strcmp(type, "cgroup2") == 0
                   : strcmp(type, "cgroup") == 0 && strstr(key, ",freezer,") != NULL;
    if (match && strchr(m, '\\') == NULL) {
      base_strlcpy(mnt, m, sizeof mnt);
      base_strlcpy(root, strcmp(r, "/") == 0 ? "" : r, sizeof root);
    }
  }
  fclose(f);
  if (mnt[0] == '\0') return -ENOENT;
  snprintf(path, sizeof path, "%s/self/cgroup", proc_root);
  if ((f = fopen(path, "re")) == NULL) return -errno;
  int rc = -ENOENT;
  while (rc != 0 && fgets(line, sizeof line, f) != NULL) {
    line[strcspn(line, "\n")] = '\0';
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (c2 == NULL) continue;
    *c2 = '\0';
    char key[520];
    snprintf(key, sizeof key, ",%s,", c1 + 1);
    int match =
        v2 ? strncmp(line, "0:", 2) == 0 && c1[1] == '\0' : strstr(key, ",freezer,") != NULL;
    const char *rel = c2 + 1;
    size_t rl = strlen(root);
    if (!match || strncmp(rel, root, rl) != 0) continue;
    rel += rl;
    snprintf(out, outlen, "%s%s", mnt, strcmp(rel, "/") == 0 ? "" : rel);
    rc = 0;
  }
  fclose(f);
  return rc;
}

/* Makes name under the v2 or v1-freezer cgroup of this process. */
static int make_cgroup(sweep *s, const char *proc_root, const char *name, int v2) {
  char base[256], probe[300];
  int rc = own_cgroup(proc_root, v2, base, sizeof base);
  if (rc != 0) return rc;
  if ((size_t)snprintf(s->dir, sizeof s->dir, "%s/%s", base, name) >= sizeof s->dir)
    return -ENAMETOOLONG;
  if (mkdir(s->dir, 0755) != 0 && errno != EEXIST) return -errno;
  snprintf(probe, sizeof probe, "%s/%s", s->dir, v2 ? "cgroup.kill" : "freezer.state");
  snprintf(s->procs, sizeof s->procs, "%s/cgroup.procs", s->dir);
  if (access(probe, W_OK) != 0 || access(s->procs, W_OK) != 0) {
    rc = -errno;
    rmdir(s->dir);
    return rc;
  }
  s->v2 = v2;
  s->fd = v2 ? open(s->dir, O_PATH | O_DIRECTORY | O_CLOEXEC) : -1;
  return 0;
}

int agent_sweep_open(sweep *s, const char *proc_root, const char *name) {
  memset(s, 0, sizeof *s);
  int rc = make_cgroup(s, proc_root, name, 1);
  if (rc != 0) rc = make_cgroup(s, proc_root, name, 0);
  if (rc != 0) {
    memset(s, 0, sizeof *s);
    s->fd = -1;
  }
  return rc;
}

void agent_sweep_enter_self(const sweep *s) {
  if (s == NULL || s->procs[0] == '\0') return;
  int fd = open(s->procs, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t k = write(fd, "0", 1); /* 0: the writer itself */
  (void)k;
  close(fd);
}

/* clone3 into the job's cgroup: like fork(). */
static pid_t clone_into(const sweep *s) {
  struct clone_args a = {
      .flags = CLONE_INTO_CGROUP, .exit_signal = SIGCHLD, .cgroup = (uint64_t)s->fd};
  return (pid_t)syscall(SYS_clone3, &a, sizeof a);
}

/* Whether a child born in the cgroup by clone3 lives: ENOSYS (before 5.7,
 * or a seccomp filter), EPERM, a kernel that kills it (sweep.h): no. */
static int clone_works(const sweep *s) {
  pid_t pid = clone_into(s);
  if (pid == 0) _exit(0);
  if (pid < 0) return 0;
  int st = 0;
  pid_t r;
  while ((r = waitpid(pid, &st, 0)) < 0 && errno == EINTR) {
  }
  return r == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

pid_t agent_sweep_fork(sweep *s) {
  int v2 = s != NULL && s->procs[0] != '\0' && s->v2 && s->fd >= 0;
  if (v2 && s->born == 0) s->born = clone_works(s) ? 1 : -1;
  if (v2 && s->born == 1) {
    pid_t pid = clone_into(s);
    if (pid >= 0) return pid;
  }
  pid_t pid = fork();
  if (pid == 0) agent_sweep_enter_self(s);
  return pid;
}

static int write_text(const char *dir, const char *file, const char *text) {
  char path[320];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t k = write(fd, text, strlen(text));
  int rc = k == (ssize_t)strlen(text) ? 0 : -errno;
  close(fd);
  return rc;
}

/* v1: the freezer's state is FROZEN (every task stopped where it was). */
static int frozen(const char *dir) {
  char path[320], buf[32] = "";
  snprintf(path, sizeof path, "%s/freezer.state", dir);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 1; /* nothing to wait for */
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  return n > 0 && strncmp(buf, "FROZEN", 6) == 0;
}

/* SIGKILL to every process listed in dir/cgroup.procs. */
static void kill_listed(const char *dir) {
  char path[320], buf[4096];
  snprintf(path, sizeof path, "%s/cgroup.procs", dir);
  FILE *f = fopen(path, "re");
  if (f == NULL) return;
  while (fgets(buf, sizeof buf, f) != NULL) {
    int64_t pid;
    buf[strcspn(buf, "\n")] = '\0';
    if (base_parse_i64(buf, 1, INT32_MAX, &pid) == 0) kill((pid_t)pid, SIGKILL);
  }
  fclose(f);
}

void agent_sweep_kill_cgroup(const char *dir, int v2) {
  if (dir == NULL || dir[0] == '\0') return;
  if (v2) {
    write_text(dir, "cgroup.kill", "1");
    return;
  }
  /* Frozen, none can fork between the listing and the kill; killed
   * processes die once thawed. */
  write_text(dir, "freezer.state", "FROZEN");
  for (int k = 0; k < PASSES && !frozen(dir); k++) base_sleep_ms(PASS_MS);
  kill_listed(dir);
  write_text(dir, "freezer.state", "THAWED");
}

/* One process of the table: its id, its parent's, and whether it is a
 * descendant of the agent. */
typedef struct proc_entry {
  pid_t pid, ppid;
  char state;
  int mine;
} proc_entry;

static int by_pid(const void *a, const void *b) {
  pid_t x = ((const proc_entry *)a)->pid, y = ((const proc_entry *)b)->pid;
  return (x > y) - (x < y);
}

/* Reads pid, ppid and state of process pid under proc_root; 0 or -1. */
static int read_stat(const char *proc_root, pid_t pid, proc_entry *e) {
  base_proc_stat s;
  if (base_proc_stat_read(proc_root, pid, &s) != 0) return -1;
  *e = (proc_entry){.pid = s.pid, .ppid = s.ppid, .state = s.state};
  return 0;
}

/* Every process under proc_root, sorted by pid; *n of them (malloc'ed). */
static proc_entry *proc_table(const char *proc_root, size_t *n) {
  DIR *d = opendir(proc_root);
  if (d == NULL) return NULL;
  size_t cap = 256;
  proc_entry *t = malloc(cap * sizeof *t);
  *n = 0;
  struct dirent *de;
  while (t != NULL && (de = readdir(d)) != NULL) {
    if (de->d_name[0] < '1' || de->d_name[0] > '9') continue;
    if (*n == cap) {
      proc_entry *bigger = realloc(t, 2 * cap * sizeof *t);
      if (bigger == NULL) break;
      t = bigger;
      cap *= 2;
    }
    if (read_stat(proc_root, (pid_t)strtol(de->d_name, NULL, 10), &t[*n]) == 0) (*n)++;
  }
  closedir(d);
  if (t != NULL) qsort(t, *n, sizeof *t, by_pid);
  return t;
}

/* Marks the descendants of self in t (sorted); returns how many are alive. */
static int mark_descendants(proc_entry *t, size_t n, pid_t self, pid_t spare) {
  for (int changed = 1, depth = 0; changed && depth < 4096; depth++) {
    changed = 0;
    for (size_t i = 0; i < n; i++) {
      if (t[i].mine || t[i].pid == spare || t[i].pid == self) continue;
      proc_entry key = {.pid = t[i].ppid};
      const proc_entry *p = bsearch(&key, t, n, sizeof *t, by_pid);
      if (t[i].ppid == self || (p != NULL && p->mine)) changed = t[i].mine = 1;
    }
  }
  int alive = 0;
  for (size_t i = 0; i < n; i++) alive += t[i].mine && t[i].state != 'Z';
  return alive;
}

/* A growing list of pids. */
typedef struct pid_list {
  pid_t *p;
  size_t n, cap;
} pid_list;

static int pid_push(pid_list *l, pid_t pid) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    pid_t *bigger = realloc(l->p, cap * sizeof *bigger);
    if (bigger == NULL) return -1;
    l->p = bigger;
    l->cap = cap;
  }
  l->p[l->n++] = pid;
  return 0;
}

/* Appends the children of pid, those of each of its threads, from
 * proc_root/pid/task/TID/children (one gone meanwhile has none); -1 out of memory. */
static int add_children(const char *proc_root, pid_t pid, pid_list *out) {
  char path[320];
  snprintf(path, sizeof path, "%s/%d/task", proc_root, (int)pid);
  DIR *d = opendir(path);
  if (d == NULL) return 0;
  int rc = 0;
  struct dirent *de;
  while (rc == 0 && (de = readdir(d)) != NULL) {
    if (de->d_name[0] < '1' || de->d_name[0] > '9') continue;
    snprintf(path, sizeof path, "%s/%d/task/%s/children", proc_root, (int)pid, de->d_name);
    FILE *f = fopen(path, "re");
    if (f == NULL) continue;
    long c;
    while (rc == 0 && fscanf(f, "%ld", &c) == 1)
      if (pid_push(out, (pid_t)c) != 0) rc = -1;
    fclose(f);
  }
  closedir(d);
  return rc;
}

/*
 * One pass through the tree of self's descendants, from the kernel's lists
 * of children (an orphan comes back to self, the subreaper, so none is out
 * of it): SIGKILL to each live one but spare and what is under spare, its
 * children read first (once it dies they are self's, for the next pass).
 * How many there were; -1 where the kernel keeps no such lists
 * (CONFIG_PROC_CHILDREN) or out of memory. Costs
 * what the descendants number, where the walk of every process on the
 * machine cost what they number (a few thousand file reads on a busy node,
 * for each agent of 256 on one machine in bench/scale).
 */
static int kill_tree(const char *proc_root, pid_t self, pid_t spare) {
  char path[320];
  snprintf(path, sizeof path, "%s/%d/task/%d/children", proc_root, (int)self, (int)self);
  if (access(path, R_OK) != 0) return -1;
  pid_list l = {0};
  int rc = add_children(proc_root, self, &l), alive = 0;
  for (size_t i = 0; rc == 0 && i < l.n && i < 1000000; i++) {
    proc_entry e;
    if (l.p[i] == spare || read_stat(proc_root, l.p[i], &e) != 0) continue;
    rc = add_children(proc_root, e.pid, &l);
    if (e.state != 'Z') {
      kill(e.pid, SIGKILL);
      alive++;
    }
  }
  free(l.p);
  return rc == 0 ? alive : -1;
}

/* One pass: SIGKILL to each live descendant; how many there were. */
static int kill_pass(const char *proc_root, pid_t self, pid_t spare) {
  int found = kill_tree(proc_root, self, spare);
  if (found >= 0) return found;
  size_t n = 0;
  proc_entry *t = proc_table(proc_root, &n);
  if (t == NULL) return 0;
  int alive = mark_descendants(t, n, self, spare);
  for (size_t i = 0; i < n; i++)
    if (t[i].mine && t[i].state != 'Z') kill(t[i].pid, SIGKILL);
  free(t);
  return alive;
}

int agent_sweep_kill(sweep *s, const char *proc_root, pid_t self, pid_t spare) {
  agent_sweep_kill_cgroup(s->dir, s->v2);
  if (s->born == 1) s->born = 0; /* killed: clone3 into it is tried again */
  int first = -1;
  for (int k = 0; k < PASSES; k++) {
    int alive = kill_pass(proc_root, self, spare);
    if (first < 0) first = alive;
    /* The orphans killed come back to us (the subreaper): reap them. */
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    if (alive == 0) break;
    base_sleep_ms(PASS_MS);
  }
  return first;
}

void agent_sweep_close(sweep *s) {
  if (s->dir[0] == '\0') return;
  if (s->fd >= 0) close(s->fd);
  for (int k = 0; k < PASSES && rmdir(s->dir) != 0 && errno == EBUSY; k++) base_sleep_ms(PASS_MS);
  memset(s, 0, sizeof *s);
  s->fd = -1;
}

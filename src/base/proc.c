/* proc.c - the /proc/PID/stat reader (proc.h). */
#include "base/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int base_proc_stat_parse(const char *text, base_proc_stat *out) {
  const char *rp = strrchr(text, ')');
  int pid, ppid;
  char state;
  unsigned long long ut, st;
  if (rp == NULL || sscanf(text, "%d (", &pid) != 1) return -EPROTO;
  /* After ")": state(3) ppid(4) pgrp session tty_nr tpgid flags minflt
   * cminflt majflt cmajflt utime(14) stime(15). */
  if (sscanf(rp + 1, " %c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &state, &ppid, &ut,
             &st) != 4)
    return -EPROTO;
  *out = (base_proc_stat){.pid = pid, .ppid = ppid, .state = state, .utime = ut, .stime = st};
  return 0;
}

int base_proc_stat_read(const char *proc_root, pid_t pid, base_proc_stat *out) {
  char path[4200], buf[1024];
  if (snprintf(path, sizeof path, "%s/%d/stat", proc_root, (int)pid) >= (int)sizeof path)
    return -ENAMETOOLONG;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? -ESRCH : -errno;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  int e = errno;
  close(fd);
  if (n < 0) return e == ESRCH ? -ESRCH : -e;
  buf[n] = '\0';
  return base_proc_stat_parse(buf, out);
}

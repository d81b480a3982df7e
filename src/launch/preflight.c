/*
 * preflight.c - before anything starts anywhere, every host must answer
 * over ssh within the timeout and run the same cohort version as this
 * machine: a job half-started on the hosts that answered would only fail
 * later, with a less clear cause, and leave agents waiting for the others.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "launch/launch.h"

/* The last non-empty line of text, without its newline, into out. */
static void last_line(const char *text, char *out, size_t cap) {
  const char *end = text + strlen(text);
  while (end > text && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' ')) end--;
  const char *start = end;
  while (start > text && start[-1] != '\n') start--;
  size_t n = (size_t)(end - start) < cap - 1 ? (size_t)(end - start) : cap - 1;
  memcpy(out, start, n);
  out[n] = '\0';
}

/* Describes one host's problem into line (empty when there is none). */
static void judge(const launch_result *r, const char *cohort_path, const char *expect,
                  int64_t timeout_ms, char *line, size_t cap) {
  char msg[200], first[200];
  last_line(r->err, msg, sizeof msg);
  size_t fl = strcspn(r->out, "\n");
  snprintf(first, sizeof first, "%.*s", (int)(fl < 199 ? fl : 199), r->out);
  line[0] = '\0';
  if (r->spawn_errno != 0) {
    snprintf(line, cap, "cannot run ssh: %s", strerror(r->spawn_errno));
  } else if (r->timed_out) {
    snprintf(line, cap, "no answer over ssh within %lld s", (long long)((timeout_ms + 999) / 1000));
  } else if (WIFSIGNALED(r->status)) {
    snprintf(line, cap, "ssh was killed by signal %d", WTERMSIG(r->status));
  } else if (WEXITSTATUS(r->status) == 255) {
    snprintf(line, cap, "unreachable over ssh: %s", msg[0] ? msg : "ssh failed (exit 255)");
  } else if (WEXITSTATUS(r->status) == 127) {
    snprintf(line, cap, "%s is not there (give the remote path with --cohort PATH)", cohort_path);
  } else if (WEXITSTATUS(r->status) != 0) {
    snprintf(line, cap, "'%s --version' failed with exit code %d%s%s", cohort_path,
             WEXITSTATUS(r->status), msg[0] ? ": " : "", msg);
  } else if (strcmp(first, expect) != 0) {
    snprintf(line, cap, "runs '%s', not '%s' as this machine does", first, expect);
  }
}

int launch_preflight(const launch_ssh *s, const launch_hosts *h, const char *cohort_path,
                     const char *expect, int max_parallel, int64_t timeout_ms, char **report) {
  char *argv[] = {(char *)cohort_path, "--version", NULL};
  char *cmd = NULL, ***argvs = calloc(h->n, sizeof *argvs);
  launch_result *res = calloc(h->n, sizeof *res);
  char *rep = NULL;
  size_t replen = 0;
  int rc = argvs == NULL || res == NULL ? -ENOMEM : launch_shell_join(argv, &cmd);
  for (size_t i = 0; rc == 0 && i < h->n; i++)
    rc = launch_ssh_argv(s, h->v[i].name, cmd, &argvs[i]);
  if (rc == 0) rc = launch_run_all(argvs, h->n, max_parallel, timeout_ms, res);
  for (size_t i = 0; rc == 0 && i < h->n; i++) {
    char line[512];
    judge(&res[i], cohort_path, expect, timeout_ms, line, sizeof line);
    if (line[0] == '\0') continue;
    size_t add = strlen(h->v[i].name) + strlen(line) + 3;
    char *grown = realloc(rep, replen + add + 1);
    if (grown == NULL) {
      rc = -ENOMEM;
      break;
    }
    rep = grown;
    replen += (size_t)sprintf(rep + replen, "%s: %s\n", h->v[i].name, line);
  }
  for (size_t i = 0; argvs != NULL && i < h->n; i++) free(argvs[i]);
  free(argvs);
  free(res);
  free(cmd);
  if (rc != 0) {
    free(rep);
    return rc;
  }
  *report = rep;
  return 0;
}

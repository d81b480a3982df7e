/*
 * ssh.c - ssh command lines: the remote command quoted for the remote
 * shell, and ssh's own argv. The system's `ssh` does the connecting, so the
 * user's ssh_config, agent and keys apply as they do for mpirun; BatchMode
 * keeps a host that wants a password from waiting for one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch/launch.h"

int launch_shell_join(char *const *argv, char **out) {
  size_t need = 1;
  for (size_t i = 0; argv[i] != NULL; i++) {
    need += 3; /* quotes and a space */
    for (const char *p = argv[i]; *p; p++) need += *p == '\'' ? 4 : 1;
  }
  char *s = malloc(need), *w = s;
  if (s == NULL) return -ENOMEM;
  for (size_t i = 0; argv[i] != NULL; i++) {
    if (i > 0) *w++ = ' ';
    *w++ = '\'';
    for (const char *p = argv[i]; *p; p++) {
      if (*p == '\'') {
        memcpy(w, "'\\''", 4);
        w += 4;
      } else {
        *w++ = *p;
      }
    }
    *w++ = '\'';
  }
  *w = '\0';
  *out = s;
  return 0;
}

int launch_ssh_set_opts(launch_ssh *s, const char *ssh_opts) {
  size_t n = 0;
  const char *p = ssh_opts == NULL ? "" : ssh_opts;
  char **v = calloc(strlen(p) / 2 + 2, sizeof *v);
  if (v == NULL) return -ENOMEM;
  while (*p) {
    while (*p == ' ' || *p == '\t') p++;
    size_t len = strcspn(p, " \t");
    if (len == 0) break;
    v[n] = strndup(p, len);
    if (v[n++] == NULL) {
      s->opts = v;
      launch_ssh_free(s);
      return -ENOMEM;
    }
    p += len;
  }
  s->opts = v;
  return 0;
}

void launch_ssh_free(launch_ssh *s) {
  if (s == NULL || s->opts == NULL) return;
  for (size_t i = 0; s->opts[i] != NULL; i++) free(s->opts[i]);
  free(s->opts);
  s->opts = NULL;
}

int launch_ssh_argv(const launch_ssh *s, const char *host, const char *remote_cmd,
                    char ***argv_out) {
  size_t nopts = 0;
  while (s->opts != NULL && s->opts[nopts] != NULL) nopts++;
  size_t n = 1 + 4 + nopts + 3;
  /* One block: the pointers, then ConnectTimeout's text. */
  char **v = malloc((n + 1) * sizeof *v + 48);
  if (v == NULL) return -ENOMEM;
  char *timeout = (char *)(v + n + 1);
  snprintf(timeout, 48, "ConnectTimeout=%d", s->connect_timeout_s > 0 ? s->connect_timeout_s : 10);
  size_t k = 0;
  v[k++] = (char *)(s->program != NULL ? s->program : "ssh");
  v[k++] = "-o";
  v[k++] = "BatchMode=yes";
  v[k++] = "-o";
  v[k++] = timeout;
  for (size_t i = 0; i < nopts; i++) v[k++] = s->opts[i];
  v[k++] = "--";
  v[k++] = (char *)host;
  v[k++] = (char *)remote_cmd;
  v[k] = NULL;
  *argv_out = v;
  return 0;
}

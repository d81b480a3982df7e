/*
 * ssh.c - ssh command lines and the bounded fan-out of short remote
 * commands (the pre-flight). The system's `ssh` does the connecting, so the
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

/* How long a host's master connection outlives its last session (seconds): long enough to
 * bridge the pre-flight and the job's start; launch_ssh_release ends it sooner. */
#define CONTROL_PERSIST_S 30

/*
 * program -o BatchMode=yes -o ConnectTimeout=T [-o ControlMaster=auto
 * -o ControlPath=DIR/%C -o ControlPersist=S] [opts...] then tail (NULL-ended),
 * as one malloc'ed block.
 */
static int ssh_argv(const launch_ssh *s, const char *const *tail, char ***argv_out) {
  size_t nopts = 0, ntail = 0, pathlen = s->control_dir ? strlen(s->control_dir) + 8 : 0;
  while (s->opts != NULL && s->opts[nopts] != NULL) nopts++;
  while (tail[ntail] != NULL) ntail++;
  size_t n = 1 + 4 + 6 + nopts + ntail;
  /* One block: the pointers, then the options' texts. */
  char **v = malloc((n + 1) * sizeof *v + 48 + 48 + pathlen + 16);
  if (v == NULL) return -ENOMEM;
  char *timeout = (char *)(v + n + 1), *persist = timeout + 48, *path = persist + 48;
  snprintf(timeout, 48, "ConnectTimeout=%d", s->connect_timeout_s > 0 ? s->connect_timeout_s : 10);
  size_t k = 0;
  v[k++] = (char *)(s->program != NULL ? s->program : "ssh");
  v[k++] = "-o";
  v[k++] = "BatchMode=yes";
  v[k++] = "-o";
  v[k++] = timeout;
  if (s->control_dir != NULL) {
    snprintf(persist, 48, "ControlPersist=%d", CONTROL_PERSIST_S);
    snprintf(path, pathlen + 16, "ControlPath=%s/%%C", s->control_dir);
    v[k++] = "-o";
    v[k++] = "ControlMaster=auto";
    v[k++] = "-o";
    v[k++] = path;
    v[k++] = "-o";
    v[k++] = persist;
  }
  for (size_t i = 0; i < nopts; i++) v[k++] = s->opts[i];
  for (size_t i = 0; i < ntail; i++) v[k++] = (char *)tail[i];
  v[k] = NULL;
  *argv_out = v;
  return 0;
}

int launch_ssh_argv(const launch_ssh *s, const char *host, const char *remote_cmd,
                    char ***argv_out) {
  const char *tail[] = {"--", host, remote_cmd, NULL};
  return ssh_argv(s, tail, argv_out);
}

int launch_ssh_release(const launch_ssh *s, const launch_hosts *h, int64_t timeout_ms) {
  if (s->control_dir == NULL) return 0;
  char ***argvs = calloc(h->n ? h->n : 1, sizeof *argvs);
  launch_result *res = calloc(h->n ? h->n : 1, sizeof *res);
  int rc = argvs == NULL || res == NULL ? -ENOMEM : 0;
  for (size_t i = 0; rc == 0 && i < h->n; i++) {
    const char *tail[] = {"-O", "exit", "--", h->v[i].name, NULL};
    rc = ssh_argv(s, tail, &argvs[i]);
  }
  if (rc == 0) rc = launch_run_all(argvs, h->n, 64, timeout_ms, res);
  for (size_t i = 0; argvs != NULL && i < h->n; i++) free(argvs[i]);
  free(argvs);
  free(res);
  /* A master asked to exit removes its socket; one that did not answer leaves it. */
  if (rmdir(s->control_dir) != 0 && rc == 0) rc = -errno;
  return rc;
}

/* remote_stacks.c - answering `cohort stacks` with this node's ranks' stacks. */
#include "agent/remote_stacks.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "agent/internal.h"
#include "agent/stacks.h"
#include "base/base.h"

static const char *kind_name(stacks_kind k) {
  switch (k) {
  case STACKS_PYTHON:
    return "python";
  case STACKS_NATIVE:
    return "native";
  case STACKS_PROC_STATE:
    return "proc";
  case STACKS_NONE:
    break;
  }
  return "none";
}

/* The answer: the request it answers, the node, and each rank's stack
 * (each cut to an equal share of REMOTE_STACKS_BYTES). */
static char *answer_json(const job *j, int64_t req, const stacks_dump *d, int n) {
  json_t *o = json_object(), *ranks = json_array();
  char *text = NULL;
  size_t share = n > 0 ? REMOTE_STACKS_BYTES / (size_t)n : REMOTE_STACKS_BYTES;
  if (o != NULL && ranks != NULL) {
    json_object_set_new(o, "request", json_integer(req));
    json_object_set_new(o, "node", json_integer(j->cl.plan.my_index));
    json_object_set_new(o, "host", json_string(j->cl.hostname));
    for (int i = 0; i < n; i++) {
      json_t *r = json_object();
      size_t len = strlen(d[i].text);
      json_object_set_new(r, "rank", json_integer(d[i].rank));
      json_object_set_new(r, "pid", json_integer(d[i].pid));
      json_object_set_new(r, "kind", json_string(kind_name(d[i].kind)));
      json_object_set_new(r, "text", json_stringn(d[i].text, len < share ? len : share));
      json_array_append_new(ranks, r);
    }
    json_object_set(o, "ranks", ranks);
    text = json_dumps(o, JSON_COMPACT);
  }
  json_decref(ranks);
  json_decref(o);
  return text;
}

/* Answers request req: this node's running ranks' stacks to its key. */
static void answer(job *j, int64_t req) {
  stacks_target *t = calloc((size_t)j->nworkers, sizeof *t);
  stacks_dump *d = calloc((size_t)j->nworkers, sizeof *d);
  char(*py)[256] = NULL;
  int n = 0;
  if (t == NULL || d == NULL) goto out;
  /* With the progress files the Python hook is there: each rank's dump file. */
  if (j->hang.prog != NULL) py = calloc((size_t)j->nworkers, sizeof *py);
  const char *no_py = j->cfg->hang_timeout_ms == 0 && j->cfg->straggler_factor <= 0
                          ? "the agent's Python stack hook is off (--straggler-factor 0 and no "
                            "--hang-timeout)"
                          : "the agent's Python stack hook is off (no progress files)";
  for (int i = 0; i < j->nworkers; i++) {
    if (!j->workers[i].running) continue;
    char hb[256];
    if (py != NULL) agent_hang_paths(&j->hang, i, hb, sizeof hb, py[n], sizeof py[n]);
    t[n] = (stacks_target){.rank = j->workers[i].rank, .pid = j->workers[i].pid};
    t[n].py_file = py != NULL ? py[n] : NULL;
    t[n].no_py = j->hang.prog == NULL ? no_py : NULL;
    n++;
  }
  const char *path = getenv("PATH");
  stacks_opts so = {.path = path != NULL ? path : "/usr/bin:/bin",
                    .proc_root = "/proc",
                    .deadline_ms = base_deadline_in(REMOTE_STACKS_MS)};
  if (agent_stacks_collect(t, n, &so, d) != 0) goto out;
  char *text = answer_json(j, req, d, n);
  if (text != NULL) agent_cluster_publish_stacks(&j->cl, text);
  free(text);
  agent_stacks_dump_free(d, n);
out:
  free(py);
  free(t);
  free(d);
}

int agent_remote_stacks_tick(job *j, int64_t now) {
  remote_stacks *rs = &j->rstacks;
  if (now >= rs->next_ms) {
    rs->next_ms = now + (j->cfg->heartbeat_ms > 0 ? j->cfg->heartbeat_ms : 500);
    int64_t req = 0;
    if (agent_cluster_stacks_requested(&j->cl, &req) == 0 && req > rs->seen) {
      rs->seen = req;
      answer(j, req);
    }
  }
  int64_t left = rs->next_ms - base_now_ms();
  return left < 0 ? 0 : (int)left;
}

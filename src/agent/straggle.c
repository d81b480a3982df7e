/* straggle.c - stragglers across the job, seen from node 0 through the nodes' snapshots. */
#include "agent/straggle.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/internal.h"
#include "agent/progress.h"
#include "base/base.h"

/* Where each rank runs, for the report. */
typedef struct rank_place {
  int node;
  char host[64];
} rank_place;

/* One node's snapshot: each rank's step time into step_ms[rank] and its place. */
static void read_node(const char *text, int n, double *step_ms, rank_place *at) {
  json_t *o = json_loads(text, 0, NULL);
  json_t *ranks = json_object_get(o, "ranks");
  int node = (int)json_integer_value(json_object_get(o, "node"));
  const char *host = json_string_value(json_object_get(o, "host"));
  for (size_t i = 0; i < json_array_size(ranks); i++) {
    json_t *r = json_array_get(ranks, i);
    json_int_t rank = json_integer_value(json_object_get(r, "rank"));
    double ms = json_number_value(json_object_get(r, "step_ms"));
    if (rank < 0 || rank >= n || !json_is_number(json_object_get(r, "step_ms")) || ms <= 0)
      continue;
    step_ms[rank] = ms;
    at[rank].node = node;
    base_strlcpy(at[rank].host, host != NULL ? host : "?", sizeof at[rank].host);
  }
  json_decref(o);
}

/* The median of the known step times other than rank i's, for the report. */
static double others_median(const double *step_ms, int n, int i) {
  double *v = malloc((size_t)n * sizeof *v);
  int k = 0;
  for (int r = 0; v != NULL && r < n; r++)
    if (r != i && step_ms[r] > 0) v[k++] = step_ms[r];
  for (int a = 1; a < k; a++) /* insertion sort: a job's ranks, a few times a second */
    for (int b = a; b > 0 && v[b - 1] > v[b]; b--) {
      double t = v[b];
      v[b] = v[b - 1], v[b - 1] = t;
    }
  double m = k == 0 ? 0 : k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
  free(v);
  return m;
}

/* Compares the ranks whose step times the snapshots carry; prints the new stragglers. */
static void compare(straggle *s, double factor, const double *step_ms, const rank_place *at) {
  int *out = malloc((size_t)s->n * sizeof *out);
  double *ratio = malloc((size_t)s->n * sizeof *ratio);
  int found =
      out && ratio ? agent_progress_stragglers(step_ms, s->n, factor, s->flagged, out, ratio) : 0;
  for (int k = 0; k < found; k++) {
    int r = out[k];
    fprintf(stderr,
            "cohort: straggler: rank %d (node %d, host %s) takes %.1fx the other ranks' median "
            "step time (%.0f ms against %.0f ms)\n",
            r, at[r].node, at[r].host, ratio[k], step_ms[r], others_median(step_ms, s->n, r));
  }
  free(out);
  free(ratio);
}

/* The flags follow the round's world size (a new round starts new episodes). */
static int track(straggle *s, int world) {
  if (s->n == world) return 0;
  free(s->flagged);
  s->flagged = calloc((size_t)world, sizeof *s->flagged);
  s->n = s->flagged != NULL ? world : 0;
  return s->flagged != NULL ? 0 : -1;
}

/* Reads every node's snapshot and reports the new stragglers. */
static void check(job *j, straggle *s) {
  int nodes = j->cl.plan.nnodes, world = j->cl.plan.world_size;
  if (world < 2 || track(s, world) != 0) return;
  char **texts = calloc((size_t)nodes, sizeof *texts);
  double *step_ms = calloc((size_t)world, sizeof *step_ms);
  rank_place *at = calloc((size_t)world, sizeof *at);
  if (texts != NULL && step_ms != NULL && at != NULL &&
      agent_cluster_read_status(&j->cl, texts) == 0) {
    for (int k = 0; k < nodes; k++)
      if (texts[k] != NULL) read_node(texts[k], world, step_ms, at);
    compare(s, j->cfg->straggler_factor, step_ms, at);
  }
  for (int k = 0; texts != NULL && k < nodes; k++) free(texts[k]);
  free(texts);
  free(step_ms);
  free(at);
}

int agent_straggle_tick(job *j, int64_t now) {
  straggle *s = &j->strag;
  if (j->cfg->straggler_factor <= 0 || j->cl.plan.my_index != 0) return -1;
  if (now >= s->next_ms) {
    s->next_ms = now + STRAGGLE_PERIOD_MS;
    check(j, s);
  }
  int64_t left = s->next_ms - base_now_ms();
  return left < 0 ? 0 : (int)left;
}

void agent_straggle_free(straggle *s) {
  free(s->flagged);
  *s = (straggle){0};
}

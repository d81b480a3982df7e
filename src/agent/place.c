/* place.c - counting workers on the node's devices and binding them to CPUs; see place.h. */
#include "agent/place.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- counting ---- */

static const char *vendor_name(const topo *t) {
  return t->vendor == TOPO_AMD ? "AMD " : t->vendor == TOPO_NVIDIA ? "NVIDIA " : "";
}

int agent_place_count(const topo *t, agent_nproc kind, int n, int *nproc, char *err,
                      size_t errlen) {
  int gpus = t->ngpu;
  switch (kind) {
  case AGENT_NPROC_NUMBER:
    *nproc = n;
    return 0;
  case AGENT_NPROC_CPU:
    *nproc = t->ncpu;
    break;
  case AGENT_NPROC_AUTO:
    *nproc = gpus > 0 ? gpus : t->ncpu;
    break;
  case AGENT_NPROC_GPU:
    if (gpus > 0) {
      *nproc = gpus;
      break;
    }
    if (t->nfound > 0)
      snprintf(err, errlen, "--nproc-per-node gpu: %s leaves none of this node's %d %sGPUs visible",
               t->visible_var, t->nfound, vendor_name(t));
    else
      snprintf(err, errlen,
               "--nproc-per-node gpu: this node shows no GPU (no NVIDIA driver/nvidia/gpus or "
               "nvidia<N> device, no AMD render node); give a number of workers");
    return -ENODEV;
  }
  if (*nproc > AGENT_MAX_NPROC) *nproc = AGENT_MAX_NPROC;
  return 0;
}

/* ---- CPU sets ---- */

typedef enum { BY_ALL, BY_NUMA, BY_SOCKET, BY_CACHE } cpu_key;

/* The allowed CPUs of t whose key equals value. */
static void select_cpus(const topo *t, const cpu_set_t *allowed, cpu_key key, int value,
                        cpu_set_t *out) {
  CPU_ZERO(out);
  for (int i = 0; i < t->ncpu; i++) {
    const topo_cpu *c = &t->cpu[i];
    int v = key == BY_NUMA     ? c->numa
            : key == BY_SOCKET ? c->socket
            : key == BY_CACHE  ? c->cache
                               : 0;
    if (v == value && (allowed == NULL || CPU_ISSET(c->id, allowed))) CPU_SET(c->id, out);
  }
}

/* The distinct values of key (cores when by_core) over the CPUs of group, ascending. */
static int distinct(const topo *t, const cpu_set_t *group, int by_core, int *out) {
  int n = 0;
  for (int i = 0; i < t->ncpu; i++) {
    const topo_cpu *c = &t->cpu[i];
    if (!CPU_ISSET(c->id, group)) continue;
    int v = by_core ? c->core : c->id;
    int seen = 0;
    for (int k = 0; k < n && !seen; k++) seen = out[k] == v;
    if (!seen) out[n++] = v;
  }
  return n;
}

/* [start, end) of part index of parts over n items, the first n % parts one larger. */
static void slice(int n, int parts, int index, int *start, int *end) {
  int per = n / parts, extra = n % parts;
  *start = index * per + (index < extra ? index : extra);
  *end = *start + per + (index < extra ? 1 : 0);
}

/*
 * Part index of group split into parts: whole physical cores, or logical
 * CPUs when there are fewer cores than parts and threads_ok. 0, or -EINVAL.
 */
static int split(const topo *t, const cpu_set_t *group, int parts, int index, int threads_ok,
                 cpu_set_t *out) {
  int units[TOPO_MAX_CPUS];
  int by_core = 1, n = distinct(t, group, 1, units);
  if (n < parts && threads_ok) by_core = 0, n = distinct(t, group, 0, units);
  if (n < parts) return -EINVAL;
  int start, end;
  slice(n, parts, index, &start, &end);
  CPU_ZERO(out);
  for (int i = 0; i < t->ncpu; i++) {
    const topo_cpu *c = &t->cpu[i];
    if (!CPU_ISSET(c->id, group)) continue;
    for (int k = start; k < end; k++)
      if (units[k] == (by_core ? c->core : c->id)) CPU_SET(c->id, out);
  }
  return 0;
}

/* --cpu-bind numa: rank r's NUMA node (an index of k) and the block of ranks sharing it. */
static void numa_block(int r, int nproc, int k, int *node, int *first, int *count) {
  *node = (int)((long)r * k / nproc);
  *first = -1, *count = 0;
  for (int q = 0; q < nproc; q++) {
    if ((int)((long)q * k / nproc) != *node) continue;
    if (*first < 0) *first = q;
    (*count)++;
  }
}

/* --cpu-bind cores and numa. */
static int plan_cpu(const topo *t, const cpu_set_t *allowed, agent_bind mode, int nproc,
                    cpu_set_t *sets, char *err, size_t errlen) {
  cpu_set_t all;
  select_cpus(t, allowed, BY_ALL, 0, &all);
  int nodes[TOPO_MAX_CPUS], k = 0;
  if (mode == AGENT_BIND_NUMA) {
    for (int i = 0; i < t->ncpu; i++) {
      int seen = 0;
      for (int j = 0; j < k && !seen; j++) seen = nodes[j] == t->cpu[i].numa;
      if (!seen && CPU_ISSET(t->cpu[i].id, &all)) nodes[k++] = t->cpu[i].numa;
    }
  }
  for (int r = 0; r < nproc; r++) {
    cpu_set_t group = all;
    int parts = nproc, index = r;
    if (mode == AGENT_BIND_NUMA) {
      int node, first, count;
      numa_block(r, nproc, k, &node, &first, &count);
      select_cpus(t, allowed, BY_NUMA, nodes[node], &group);
      parts = count, index = r - first;
    }
    if (split(t, &group, parts, index, 1, &sets[r]) != 0) {
      snprintf(err, errlen, "--cpu-bind: %d local ranks but only %d CPUs to share among them",
               parts, CPU_COUNT(&group));
      return -EINVAL;
    }
  }
  return 0;
}

/* The GPU's NUMA node's allowed CPUs; -EINVAL when it has none. */
static int gpu_node(const topo *t, const cpu_set_t *allowed, int g, cpu_set_t *out, char *err,
                    size_t errlen) {
  select_cpus(t, allowed, BY_NUMA, t->gpu[g].numa, out);
  if (CPU_COUNT(out) > 0) return 0;
  snprintf(err, errlen, "--numa-binding: GPU %d is on NUMA node %d, which has no CPU to bind to", g,
           t->gpu[g].numa);
  return -EINVAL;
}

/* GPU g's index among the visible GPUs on its NUMA node, and their count. */
static void node_peers(const topo *t, int g, int *index, int *count) {
  *index = *count = 0;
  for (int i = 0; i < t->ngpu; i++) {
    if (t->gpu[i].numa != t->gpu[g].numa) continue;
    if (i < g) (*index)++;
    (*count)++;
  }
}

/* The index-th largest core complex of node (ties: the lowest CPU first), cycling. */
static void core_complex(const topo *t, const cpu_set_t *node, int index, cpu_set_t *out) {
  int caches[TOPO_MAX_CPUS], sizes[TOPO_MAX_CPUS], n = 0;
  for (int i = 0; i < t->ncpu; i++) {
    if (!CPU_ISSET(t->cpu[i].id, node)) continue;
    int k = 0;
    while (k < n && caches[k] != t->cpu[i].cache) k++;
    if (k == n) caches[n] = t->cpu[i].cache, sizes[n++] = 0;
    sizes[k]++;
  }
  /* insertion sort by size descending, cache id ascending */
  for (int i = 1; i < n; i++)
    for (int k = i; k > 0 && (sizes[k] > sizes[k - 1] ||
                              (sizes[k] == sizes[k - 1] && caches[k] < caches[k - 1]));
         k--) {
      int c = caches[k], s = sizes[k];
      caches[k] = caches[k - 1], sizes[k] = sizes[k - 1];
      caches[k - 1] = c, sizes[k - 1] = s;
    }
  cpu_set_t in_cache;
  select_cpus(t, NULL, BY_CACHE, caches[index % n], &in_cache);
  CPU_AND(out, &in_cache, node);
}

/* torchrun's --numa-binding modes for local rank g on visible GPU g. */
static int plan_gpu(const topo *t, const cpu_set_t *allowed, agent_bind mode, int g, cpu_set_t *set,
                    char *err, size_t errlen) {
  cpu_set_t node;
  int rc = gpu_node(t, allowed, g, &node, err, errlen);
  if (rc != 0) return rc;
  int index, count;
  node_peers(t, g, &index, &count);
  switch (mode) {
  case AGENT_BIND_GPU_SOCKET:
    for (int i = 0; i < t->ncpu; i++)
      if (CPU_ISSET(t->cpu[i].id, &node)) {
        select_cpus(t, allowed, BY_SOCKET, t->cpu[i].socket, set);
        break;
      }
    return 0;
  case AGENT_BIND_GPU_EXCLUSIVE:
    if (split(t, &node, count, index, 0, set) == 0) return 0;
    snprintf(err, errlen, "--numa-binding exclusive: NUMA node %d has %d GPUs but fewer cores",
             t->gpu[g].numa, count);
    return -EINVAL;
  case AGENT_BIND_GPU_CORE_COMPLEX:
    core_complex(t, &node, index, set);
    return 0;
  default:
    *set = node;
    return 0;
  }
}

int agent_place_plan(const topo *t, const cpu_set_t *allowed, agent_bind mode, int nproc,
                     cpu_set_t *sets, char *err, size_t errlen) {
  if (mode == AGENT_BIND_CORES || mode == AGENT_BIND_NUMA)
    return plan_cpu(t, allowed, mode, nproc, sets, err, errlen);
  if (nproc > t->ngpu) {
    snprintf(err, errlen, "--numa-binding binds local rank N to GPU N: %d local ranks, %d GPUs",
             nproc, t->ngpu);
    return -EINVAL;
  }
  for (int g = 0; g < nproc; g++) {
    int rc = plan_gpu(t, allowed, mode, g, &sets[g], err, errlen);
    if (rc != 0) return rc;
  }
  return 0;
}

/* ---- on this machine ---- */

static const char *mode_name(agent_bind mode) {
  static const char *const names[] = {"none",   "cores",     "numa",        "node",
                                      "socket", "exclusive", "core-complex"};
  return names[mode];
}

static void print_plan(const topo *t, const placement *p, agent_bind mode, FILE *log) {
  int gpu = mode >= AGENT_BIND_GPU_NODE;
  for (int r = 0; r < p->nproc; r++) {
    char list[512], where[96] = "";
    topo_format_cpulist(&p->cpus[r], list, sizeof list);
    if (gpu) snprintf(where, sizeof where, ", GPU %d on NUMA node %d", r, t->gpu[r].numa);
    fprintf(log, "cohort run: local rank %d bound to CPUs %s (%s %s%s)\n", r, list,
            gpu ? "--numa-binding" : "--cpu-bind", mode_name(mode), where);
  }
}

int agent_place_resolve(const agent_config *cfg, char *const *envp, FILE *log, placement *out,
                        char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->nproc = cfg->nproc;
  if (cfg->nproc_kind == AGENT_NPROC_NUMBER && cfg->bind == AGENT_BIND_NONE) return 0;
  topo *t = malloc(sizeof *t);
  if (t == NULL) return -ENOMEM;
  topo_config tc = {cfg->sysfs_root, cfg->proc_root, cfg->dev_root, envp};
  int rc = topo_probe(&tc, t, err, errlen);
  if (rc == 0) rc = agent_place_count(t, cfg->nproc_kind, cfg->nproc, &out->nproc, err, errlen);
  if (rc == 0 && cfg->bind != AGENT_BIND_NONE) {
    cpu_set_t allowed;
    out->cpus = calloc((size_t)out->nproc, sizeof *out->cpus);
    out->omp = cfg->bind == AGENT_BIND_CORES || cfg->bind == AGENT_BIND_NUMA;
    if (out->cpus == NULL)
      rc = -ENOMEM;
    else if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
      rc = -errno;
    else
      rc = agent_place_plan(t, &allowed, cfg->bind, out->nproc, out->cpus, err, errlen);
    if (rc == 0) print_plan(t, out, cfg->bind, log);
  }
  free(t);
  if (rc != 0) agent_place_free(out);
  if (rc == -ENOMEM || (rc != 0 && err[0] == '\0')) snprintf(err, errlen, "%s", strerror(-rc));
  return rc;
}

void agent_place_free(placement *p) {
  free(p->cpus);
  p->cpus = NULL;
}

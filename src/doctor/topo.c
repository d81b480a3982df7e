/*
 * topo.c - CPUs (sockets, cores, caches, NUMA nodes) and GPUs of a node,
 * read below the roots of a topo_config. See topo.h.
 */
#include "doctor/topo.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "doctor/internal.h"

typedef struct roots {
  const char *sys, *proc, *dev;
} roots;

/* ---- CPU lists ---- */

static int parse_cpu(const char **p, int *out) {
  if (!isdigit((unsigned char)**p)) return -EINVAL;
  long v = 0;
  while (isdigit((unsigned char)**p)) {
    v = v * 10 + (**p - '0');
    if (v >= TOPO_MAX_CPUS) return -EINVAL;
    (*p)++;
  }
  *out = (int)v;
  return 0;
}

int topo_parse_cpulist(const char *s, cpu_set_t *out) {
  CPU_ZERO(out);
  while (isspace((unsigned char)*s)) s++;
  while (*s != '\0' && !isspace((unsigned char)*s)) {
    int lo, hi;
    if (parse_cpu(&s, &lo) != 0) return -EINVAL;
    hi = lo;
    if (*s == '-') {
      s++;
      if (parse_cpu(&s, &hi) != 0 || hi < lo) return -EINVAL;
    }
    for (int c = lo; c <= hi; c++) CPU_SET(c, out);
    if (*s == ',') {
      s++;
      if (!isdigit((unsigned char)*s)) return -EINVAL;
    }
  }
  while (isspace((unsigned char)*s)) s++;
  return *s == '\0' ? 0 : -EINVAL;
}

void topo_format_cpulist(const cpu_set_t *set, char *out, size_t len) {
  size_t at = 0;
  if (len == 0) return;
  out[0] = '\0';
  for (int c = 0; c < TOPO_MAX_CPUS; c++) {
    if (!CPU_ISSET(c, set)) continue;
    int end = c;
    while (end + 1 < TOPO_MAX_CPUS && CPU_ISSET(end + 1, set)) end++;
    char item[32];
    int n = end > c ? snprintf(item, sizeof item, "%s%d-%d", at ? "," : "", c, end)
                    : snprintf(item, sizeof item, "%s%d", at ? "," : "", c);
    if (at + (size_t)n + 4 > len) {
      snprintf(out + at, len - at, "...");
      return;
    }
    memcpy(out + at, item, (size_t)n + 1);
    at += (size_t)n;
    c = end;
  }
}

/* The lowest CPU of a list file, or fallback when it cannot be read. */
static int lowest_of(const char *path, int fallback) {
  char text[4096];
  cpu_set_t set;
  if (doctor_read_text(path, text, sizeof text) != 0 || topo_parse_cpulist(text, &set) != 0)
    return fallback;
  for (int c = 0; c < TOPO_MAX_CPUS; c++)
    if (CPU_ISSET(c, &set)) return c;
  return fallback;
}

/* ---- CPUs ---- */

static int int_file(const char *path, int fallback) {
  char text[32], *end;
  if (doctor_read_text(path, text, sizeof text) != 0) return fallback;
  long v = strtol(text, &end, 10);
  return end == text || *end != '\0' || v < INT_MIN || v > INT_MAX ? fallback : (int)v;
}

/* The lowest CPU sharing the highest-level data or unified cache; -1 none described. */
static int last_level_cache(const char *cpudir) {
  char dir[PATH_MAX], path[PATH_MAX], text[32];
  char **names;
  size_t n;
  int best_level = -1, best = -1;
  if (doctor_pathf(dir, sizeof dir, "%s/cache", cpudir) != 0 ||
      doctor_list_dir(dir, &names, &n) != 0)
    return -1;
  for (size_t i = 0; i < n; i++) {
    if (strncmp(names[i], "index", 5) != 0 || !doctor_is_number(names[i] + 5)) continue;
    if (doctor_read_textf(text, sizeof text, "%s/%s/type", dir, names[i]) != 0 ||
        (strcmp(text, "Unified") != 0 && strcmp(text, "Data") != 0))
      continue;
    if (doctor_pathf(path, sizeof path, "%s/%s/level", dir, names[i]) != 0) continue;
    int level = int_file(path, -1);
    if (level <= best_level) continue;
    if (doctor_pathf(path, sizeof path, "%s/%s/shared_cpu_list", dir, names[i]) != 0) continue;
    int low = lowest_of(path, -1);
    if (low < 0) continue;
    best_level = level;
    best = low;
  }
  doctor_list_free(names, n);
  return best;
}

static void probe_cpu(const roots *r, int id, topo_cpu *c) {
  char dir[PATH_MAX], rel[64], path[PATH_MAX];
  snprintf(rel, sizeof rel, "devices/system/cpu/cpu%d", id);
  c->id = id;
  c->numa = 0;
  if (doctor_join(dir, sizeof dir, r->sys, rel) != 0) {
    c->socket = 0, c->core = c->cache = id;
    return;
  }
  c->socket = doctor_pathf(path, sizeof path, "%s/topology/physical_package_id", dir) == 0
                  ? int_file(path, 0)
                  : 0;
  if (c->socket < 0) c->socket = 0;
  c->core = doctor_pathf(path, sizeof path, "%s/topology/thread_siblings_list", dir) == 0
                ? lowest_of(path, id)
                : id;
  c->cache = last_level_cache(dir);
}

/* A CPU's index in t->cpu, or -1. */
static int cpu_index(const topo *t, int id) {
  for (int i = 0; i < t->ncpu; i++)
    if (t->cpu[i].id == id) return i;
  return -1;
}

/* NUMA nodes: SYSFS/devices/system/node/node<N>/cpulist. */
static void probe_numa(const roots *r, topo *t) {
  char dir[PATH_MAX], text[4096];
  char **names;
  size_t n;
  if (doctor_join(dir, sizeof dir, r->sys, "devices/system/node") != 0 ||
      doctor_list_dir(dir, &names, &n) != 0)
    return;
  for (size_t i = 0; i < n; i++) {
    cpu_set_t set;
    if (strncmp(names[i], "node", 4) != 0 || !doctor_is_number(names[i] + 4) ||
        strlen(names[i]) > 9)
      continue;
    if (doctor_read_textf(text, sizeof text, "%s/%s/cpulist", dir, names[i]) != 0 ||
        topo_parse_cpulist(text, &set) != 0)
      continue;
    for (int k = 0; k < t->ncpu; k++)
      if (CPU_ISSET(t->cpu[k].id, &set)) t->cpu[k].numa = atoi(names[i] + 4);
  }
  doctor_list_free(names, n);
}

/* Caches not described: the socket's lowest CPU stands for its cache. */
static void default_caches(topo *t) {
  for (int i = 0; i < t->ncpu; i++) {
    if (t->cpu[i].cache >= 0 && cpu_index(t, t->cpu[i].cache) >= 0) continue;
    for (int k = 0; k < t->ncpu; k++)
      if (t->cpu[k].socket == t->cpu[i].socket) {
        t->cpu[i].cache = t->cpu[k].id;
        break;
      }
  }
}

/* The first characters of text for a message: one line, printable. */
static void excerpt(const char *text, char *out, size_t len) {
  size_t i = 0;
  for (; text[i] != '\0' && i + 1 < len; i++)
    out[i] = isprint((unsigned char)text[i]) ? text[i] : '?';
  out[i] = '\0';
}

static int probe_cpus(const roots *r, topo *t, char *err, size_t errlen) {
  char path[PATH_MAX], text[4096];
  cpu_set_t online;
  int rc = doctor_join(path, sizeof path, r->sys, "devices/system/cpu/online");
  if (rc == 0) rc = doctor_read_text(path, text, sizeof text);
  if (rc != 0) {
    snprintf(err, errlen, "cannot read %s: %s", path, strerror(-rc));
    return rc;
  }
  if (topo_parse_cpulist(text, &online) != 0 || CPU_COUNT(&online) == 0) {
    char shown[41];
    excerpt(text, shown, sizeof shown);
    snprintf(err, errlen, "%s: not a CPU list: '%s'", path, shown);
    return -EINVAL;
  }
  t->ncpu = 0;
  for (int id = 0; id < TOPO_MAX_CPUS; id++)
    if (CPU_ISSET(id, &online)) probe_cpu(r, id, &t->cpu[t->ncpu++]);
  probe_numa(r, t);
  default_caches(t);
  return 0;
}

/* ---- GPUs ---- */

static int numa_file(const char *path) {
  int v = int_file(path, 0);
  return v < 0 ? 0 : v;
}

/* "GPU UUID:  GPU-..." in an NVIDIA information file. */
static void nvidia_uuid(const char *info, char *out, size_t len) {
  char text[4096];
  out[0] = '\0';
  if (doctor_read_text(info, text, sizeof text) != 0) return;
  const char *p = strstr(text, "GPU UUID:");
  if (p == NULL) return;
  p += strlen("GPU UUID:");
  while (*p == ' ' || *p == '\t') p++;
  size_t n = strcspn(p, " \t\r\n");
  snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), p);
}

/* PROC/driver/nvidia/gpus/<PCI address>; without it, DEV/nvidia<N>. */
static int probe_nvidia(const roots *r, topo_gpu *found) {
  char dir[PATH_MAX], path[PATH_MAX];
  char **names;
  size_t n;
  int count = 0;
  if (doctor_join(dir, sizeof dir, r->proc, "driver/nvidia/gpus") == 0 &&
      doctor_list_dir(dir, &names, &n) == 0) {
    for (size_t i = 0; i < n && count < TOPO_MAX_GPUS; i++) {
      topo_gpu *g = &found[count++];
      snprintf(g->pci, sizeof g->pci, "%.31s", names[i]);
      if (doctor_pathf(path, sizeof path, "%s/%s/information", dir, names[i]) == 0)
        nvidia_uuid(path, g->uuid, sizeof g->uuid);
      char rel[128];
      snprintf(rel, sizeof rel, "bus/pci/devices/%.31s/numa_node", names[i]);
      g->numa = doctor_join(path, sizeof path, r->sys, rel) == 0 ? numa_file(path) : 0;
    }
    doctor_list_free(names, n);
    if (count > 0) return count;
  }
  if (doctor_join(dir, sizeof dir, r->dev, "") != 0 || doctor_list_dir(dir, &names, &n) != 0)
    return 0;
  for (size_t i = 0; i < n && count < TOPO_MAX_GPUS; i++)
    if (strncmp(names[i], "nvidia", 6) == 0 && doctor_is_number(names[i] + 6))
      memset(&found[count++], 0, sizeof *found);
  doctor_list_free(names, n);
  return count;
}

/* SYSFS/class/drm/renderD<N> whose device is AMD's (vendor 0x1002). */
static int probe_amd(const roots *r, topo_gpu *found) {
  char dir[PATH_MAX], path[PATH_MAX], text[32], real[PATH_MAX];
  char **names;
  size_t n;
  int count = 0;
  if (doctor_join(dir, sizeof dir, r->sys, "class/drm") != 0 ||
      doctor_list_dir(dir, &names, &n) != 0)
    return 0;
  for (size_t i = 0; i < n && count < TOPO_MAX_GPUS; i++) {
    if (strncmp(names[i], "renderD", 7) != 0 || !doctor_is_number(names[i] + 7)) continue;
    if (doctor_read_textf(text, sizeof text, "%s/%s/device/vendor", dir, names[i]) != 0 ||
        strcmp(text, "0x1002") != 0)
      continue;
    topo_gpu *g = &found[count++];
    memset(g, 0, sizeof *g);
    if (doctor_pathf(path, sizeof path, "%s/%s/device", dir, names[i]) == 0 &&
        realpath(path, real) != NULL && strrchr(real, '/') != NULL)
      snprintf(g->pci, sizeof g->pci, "%.31s", strrchr(real, '/') + 1);
    if (doctor_pathf(path, sizeof path, "%s/%s/device/numa_node", dir, names[i]) == 0)
      g->numa = numa_file(path);
  }
  doctor_list_free(names, n);
  return count;
}

static const char *env_value(char *const *envp, const char *name) {
  size_t nl = strlen(name);
  for (char *const *p = envp; p != NULL && *p != NULL; p++)
    if (strncmp(*p, name, nl) == 0 && (*p)[nl] == '=') return *p + nl + 1;
  return NULL;
}

/* Which found GPU an entry of the visible list names: an index or a UUID prefix; -1 none. */
static int visible_entry(const char *e, size_t len, const topo_gpu *found, int nfound) {
  char item[80];
  if (len == 0 || len >= sizeof item) return -1;
  memcpy(item, e, len);
  item[len] = '\0';
  if (doctor_is_number(item)) {
    long i = strtol(item, NULL, 10);
    return i < nfound ? (int)i : -1;
  }
  int match = -1;
  for (int i = 0; i < nfound; i++) {
    if (found[i].uuid[0] == '\0' || strncmp(found[i].uuid, item, len) != 0) continue;
    if (match >= 0) return -1; /* an ambiguous prefix */
    match = i;
  }
  return match;
}

/* The found GPUs the visible list lets a process see, in its order (CUDA's reading). */
static void choose_visible(topo *t, const topo_gpu *found, const char *list) {
  int used[TOPO_MAX_GPUS] = {0};
  t->ngpu = 0;
  for (const char *p = list; *p != '\0' && t->ngpu < TOPO_MAX_GPUS;) {
    while (*p == ' ') p++;
    size_t len = strcspn(p, ",");
    size_t trim = len;
    while (trim > 0 && p[trim - 1] == ' ') trim--;
    int i = visible_entry(p, trim, found, t->nfound);
    if (i < 0 || used[i]) break;
    used[i] = 1;
    t->gpu[t->ngpu++] = found[i];
    p += len;
    if (*p == ',') p++;
  }
}

static void probe_gpus(const roots *r, char *const *envp, topo *t) {
  static const char *const nvidia_vars[] = {"CUDA_VISIBLE_DEVICES", NULL};
  static const char *const amd_vars[] = {"HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", NULL};
  topo_gpu found[TOPO_MAX_GPUS];
  memset(found, 0, sizeof found);
  t->vendor = TOPO_NVIDIA;
  t->nfound = probe_nvidia(r, found);
  if (t->nfound == 0) {
    t->vendor = TOPO_AMD;
    t->nfound = probe_amd(r, found);
  }
  if (t->nfound == 0) t->vendor = TOPO_NO_GPU;
  const char *const *vars = t->vendor == TOPO_AMD ? amd_vars : nvidia_vars;
  for (int v = 0; vars[v] != NULL; v++) {
    const char *list = env_value(envp, vars[v]);
    if (list == NULL) continue;
    snprintf(t->visible_var, sizeof t->visible_var, "%s", vars[v]);
    choose_visible(t, found, list);
    return;
  }
  t->visible_var[0] = '\0';
  t->ngpu = t->nfound;
  memcpy(t->gpu, found, sizeof found);
}

int topo_probe(const topo_config *cfg, topo *t, char *err, size_t errlen) {
  roots r = {cfg->sysfs_root ? cfg->sysfs_root : "/sys", cfg->proc_root ? cfg->proc_root : "/proc",
             cfg->dev_root ? cfg->dev_root : "/dev"};
  int rc = probe_cpus(&r, t, err, errlen);
  if (rc != 0) return rc;
  probe_gpus(&r, cfg->envp, t);
  return 0;
}

/*
 * test_place.c - the node's CPUs and GPUs (doctor/topo.h) and the workers'
 * count and CPU binding (agent/place.h) on fixture trees this test writes:
 * two sockets of two NUMA nodes each, SMT siblings and core complexes, eight
 * NVIDIA GPUs spread over the NUMA nodes out of PCI order; AMD render nodes;
 * /dev/nvidia<N> alone; a node without GPUs; broken files.
 *
 * usage: test_place
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/place.h"
#include "doctor/topo.h"
#include "tests/check.h"
#include "tests/fixture_tree.h"

static char base[64];

static void putf(const char *root, const char *text, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void putf(const char *root, const char *text, const char *fmt, ...) {
  char rel[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rel, sizeof rel, fmt, ap);
  va_end(ap);
  fixture_put(root, rel, text);
}

static void cache(const char *sys, int cpu, int index, int level, const char *type,
                  const char *shared) {
  char text[16];
  snprintf(text, sizeof text, "%d\n", level);
  putf(sys, text, "devices/system/cpu/cpu%d/cache/index%d/level", cpu, index);
  putf(sys, type, "devices/system/cpu/cpu%d/cache/index%d/type", cpu, index);
  putf(sys, shared, "devices/system/cpu/cpu%d/cache/index%d/shared_cpu_list", cpu, index);
}

/*
 * The big node: 2 sockets x 2 NUMA nodes x 4 cores x 2 threads = 32 CPUs;
 * CPU c and c+16 are siblings; NUMA node n holds cores 4n..4n+3; pairs of
 * cores share an L3 (a core complex). Eight GPUs, two per NUMA node, with
 * the NUMA nodes out of PCI order: 1 1 0 0 3 3 2 2.
 */
static const int gpu_numa[8] = {1, 1, 0, 0, 3, 3, 2, 2};

static void big_node(const char *root) {
  char sys[512], proc[512], text[128];
  snprintf(sys, sizeof sys, "%s/sys", root);
  snprintf(proc, sizeof proc, "%s/proc", root);
  fixture_put(sys, "devices/system/cpu/online", "0-31\n");
  for (int c = 0; c < 32; c++) {
    int core = c % 16, numa = core / 4, cc = core / 2 * 2;
    snprintf(text, sizeof text, "%d\n", numa / 2);
    putf(sys, text, "devices/system/cpu/cpu%d/topology/physical_package_id", c);
    snprintf(text, sizeof text, "%d,%d\n", core, core + 16);
    putf(sys, text, "devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
    cache(sys, c, 0, 1, "Data\n", text);
    cache(sys, c, 1, 1, "Instruction\n", text);
    cache(sys, c, 2, 2, "Unified\n", text);
    snprintf(text, sizeof text, "%d-%d,%d-%d\n", cc, cc + 1, cc + 16, cc + 17);
    cache(sys, c, 3, 3, "Unified\n", text);
  }
  for (int n = 0; n < 4; n++) {
    snprintf(text, sizeof text, "%d-%d,%d-%d\n", 4 * n, 4 * n + 3, 4 * n + 16, 4 * n + 19);
    putf(sys, text, "devices/system/node/node%d/cpulist", n);
  }
  for (int g = 0; g < 8; g++) {
    snprintf(text, sizeof text, "Model: \t\t Test GPU\nGPU UUID: \t GPU-aaaa%04d-11\n", g);
    putf(proc, text, "driver/nvidia/gpus/0000:%02x:00.0/information", 0x10 + 0x10 * g);
    snprintf(text, sizeof text, "%d\n", gpu_numa[g]);
    putf(sys, text, "bus/pci/devices/0000:%02x:00.0/numa_node", 0x10 + 0x10 * g);
  }
}

/* Reads the fixture named name under base with the environment env. */
static int probe(const char *name, char *const *env, topo *t, char *err) {
  char sys[512], proc[512], dev[512];
  snprintf(sys, sizeof sys, "%s/%s/sys", base, name);
  snprintf(proc, sizeof proc, "%s/%s/proc", base, name);
  snprintf(dev, sizeof dev, "%s/%s/dev", base, name);
  topo_config cfg = {sys, proc, dev, env};
  err[0] = '\0';
  return topo_probe(&cfg, t, err, 256);
}

static const topo_cpu *cpu(const topo *t, int id) {
  for (int i = 0; i < t->ncpu; i++)
    if (t->cpu[i].id == id) return &t->cpu[i];
  return NULL;
}

static int list_is(const cpu_set_t *set, const char *want) {
  char got[256];
  topo_format_cpulist(set, got, sizeof got);
  if (strcmp(got, want) == 0) return 1;
  fprintf(stderr, "  CPU list %s, expected %s\n", got, want);
  return 0;
}

static void test_cpulists(void) {
  cpu_set_t s;
  char out[64];
  CHECK(topo_parse_cpulist(" 0-3,8,10-11\n", &s) == 0 && CPU_COUNT(&s) == 7);
  topo_format_cpulist(&s, out, sizeof out);
  CHECK_STREQ(out, "0-3,8,10-11");
  CHECK(topo_parse_cpulist("", &s) == 0 && CPU_COUNT(&s) == 0);
  const char *bad[] = {"3-1", "1,", ",1", "a", "1-", "1024", "0-99999999999", "1 2", "-1"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    CHECK(topo_parse_cpulist(bad[i], &s) == -EINVAL);
  CHECK(topo_parse_cpulist("0-1023", &s) == 0 && CPU_COUNT(&s) == 1024);
  topo_format_cpulist(&s, out, 6);
  CHECK_STREQ(out, "...");
}

static void test_big_topology(topo *t) {
  char err[256];
  CHECK(probe("big", NULL, t, err) == 0);
  CHECK_EQ_INT(t->ncpu, 32);
  const topo_cpu *c5 = cpu(t, 5), *c21 = cpu(t, 21), *c12 = cpu(t, 12);
  CHECK(c5 && c5->socket == 0 && c5->core == 5 && c5->numa == 1 && c5->cache == 4);
  CHECK(c21 && c21->core == 5 && c21->numa == 1 && c21->cache == 4);
  CHECK(c12 && c12->socket == 1 && c12->numa == 3 && c12->cache == 12);
  CHECK_EQ_INT(t->vendor, TOPO_NVIDIA);
  CHECK_EQ_INT(t->nfound, 8);
  CHECK_EQ_INT(t->ngpu, 8);
  CHECK_STREQ(t->gpu[0].pci, "0000:10:00.0");
  CHECK_STREQ(t->gpu[5].uuid, "GPU-aaaa0005-11");
  for (int g = 0; g < 8; g++) CHECK_EQ_INT(t->gpu[g].numa, gpu_numa[g]);
}

/* CUDA_VISIBLE_DEVICES as CUDA reads it. */
static void test_visible(topo *t) {
  char err[256];
  struct {
    const char *value;
    int n, first;
  } cases[] = {{"3,1", 2, 3},       {"0,9,1", 1, 0}, {"2,2", 1, 2},
               {"", 0, -1},         {"5, 4", 2, 5},  {"GPU-aaaa0006", 1, 6},
               {"GPU-aaaa", 0, -1}, {"x", 0, -1},    {"7,GPU-aaaa0000-11,nope,1", 2, 7}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char var[128];
    snprintf(var, sizeof var, "CUDA_VISIBLE_DEVICES=%s", cases[i].value);
    char *env[] = {var, NULL};
    CHECK(probe("big", env, t, err) == 0);
    CHECK_EQ_INT(t->nfound, 8);
    if (t->ngpu != cases[i].n) fprintf(stderr, "  with %s\n", var);
    CHECK_EQ_INT(t->ngpu, cases[i].n);
    if (cases[i].first >= 0 && t->ngpu > 0) CHECK_EQ_INT(t->gpu[0].numa, gpu_numa[cases[i].first]);
  }
  char *env[] = {"CUDA_VISIBLE_DEVICES=3,1", NULL};
  probe("big", env, t, err);
  CHECK_STREQ(t->gpu[0].pci, "0000:40:00.0");
  CHECK_STREQ(t->gpu[1].pci, "0000:20:00.0");
}

static void test_count(topo *t) {
  char err[256];
  int n = 0;
  probe("big", NULL, t, err);
  CHECK(agent_place_count(t, AGENT_NPROC_GPU, 1, &n, err, sizeof err) == 0 && n == 8);
  CHECK(agent_place_count(t, AGENT_NPROC_AUTO, 1, &n, err, sizeof err) == 0 && n == 8);
  CHECK(agent_place_count(t, AGENT_NPROC_CPU, 1, &n, err, sizeof err) == 0 && n == 32);
  CHECK(agent_place_count(t, AGENT_NPROC_NUMBER, 3, &n, err, sizeof err) == 0 && n == 3);
  char *hidden[] = {"CUDA_VISIBLE_DEVICES=", NULL};
  probe("big", hidden, t, err);
  CHECK(agent_place_count(t, AGENT_NPROC_GPU, 1, &n, err, sizeof err) == -ENODEV);
  CHECK(strstr(err, "CUDA_VISIBLE_DEVICES leaves none of this node's 8 NVIDIA GPUs") != NULL);
  CHECK(agent_place_count(t, AGENT_NPROC_AUTO, 1, &n, err, sizeof err) == 0 && n == 32);
  CHECK(probe("none", NULL, t, err) == 0 && t->ngpu == 0 && t->vendor == TOPO_NO_GPU);
  CHECK(agent_place_count(t, AGENT_NPROC_GPU, 1, &n, err, sizeof err) == -ENODEV);
  CHECK(strstr(err, "shows no GPU") != NULL && strchr(err, '\n') == NULL);
  CHECK(agent_place_count(t, AGENT_NPROC_AUTO, 1, &n, err, sizeof err) == 0 && n == 2);
}

/* Sets pairwise disjoint, each non-empty. */
static int disjoint(const cpu_set_t *sets, int n) {
  for (int i = 0; i < n; i++) {
    if (CPU_COUNT(&sets[i]) == 0) return 0;
    for (int k = i + 1; k < n; k++) {
      cpu_set_t both;
      CPU_AND(&both, &sets[i], &sets[k]);
      if (CPU_COUNT(&both) != 0) return 0;
    }
  }
  return 1;
}

static void test_gpu_modes(topo *t) {
  cpu_set_t s[9];
  char err[256];
  probe("big", NULL, t, err);
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_GPU_NODE, 8, s, err, sizeof err) == 0);
  CHECK(list_is(&s[0], "4-7,20-23") && list_is(&s[2], "0-3,16-19") && list_is(&s[7], "8-11,24-27"));
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_GPU_SOCKET, 8, s, err, sizeof err) == 0);
  CHECK(list_is(&s[0], "0-7,16-23") && list_is(&s[4], "8-15,24-31"));
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_GPU_EXCLUSIVE, 8, s, err, sizeof err) == 0);
  CHECK(list_is(&s[0], "4-5,20-21") && list_is(&s[1], "6-7,22-23") && list_is(&s[2], "0-1,16-17"));
  CHECK(disjoint(s, 8));
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_GPU_CORE_COMPLEX, 8, s, err, sizeof err) == 0);
  CHECK(list_is(&s[0], "4-5,20-21") && list_is(&s[1], "6-7,22-23") && list_is(&s[6], "8-9,24-25"));
  CHECK(disjoint(s, 8));
  /* Fewer ranks than GPUs: ranks take GPUs 0.. (exclusive still shares with GPU 1's slot). */
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_GPU_EXCLUSIVE, 1, s, err, sizeof err) == 0);
  CHECK(list_is(&s[0], "4-5,20-21"));
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_GPU_NODE, 9, s, err, sizeof err) == -EINVAL);
  CHECK(strstr(err, "9 local ranks, 8 GPUs") != NULL);
  /* Allowed CPUs (the agent's affinity): node 1 only. */
  cpu_set_t allowed;
  topo_parse_cpulist("4-7,20-23", &allowed);
  CHECK(agent_place_plan(t, &allowed, AGENT_BIND_GPU_NODE, 2, s, err, sizeof err) == 0);
  CHECK(list_is(&s[0], "4-7,20-23"));
  CHECK(agent_place_plan(t, &allowed, AGENT_BIND_GPU_NODE, 3, s, err, sizeof err) == -EINVAL);
  CHECK(strstr(err, "GPU 2 is on NUMA node 0, which has no CPU") != NULL);
  /* Visible GPUs renumber: local rank 0 is on GPU 4 (NUMA node 3). */
  char *env[] = {"CUDA_VISIBLE_DEVICES=4,0", NULL};
  probe("big", env, t, err);
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_GPU_EXCLUSIVE, 2, s, err, sizeof err) == 0);
  CHECK(list_is(&s[0], "12-15,28-31") && list_is(&s[1], "4-7,20-23"));
}

static void test_cpu_modes(topo *t) {
  cpu_set_t s[40];
  char err[256];
  probe("big", NULL, t, err);
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_CORES, 8, s, err, sizeof err) == 0);
  CHECK(list_is(&s[0], "0-1,16-17") && list_is(&s[7], "14-15,30-31"));
  CHECK(disjoint(s, 8));
  /* 16 cores over 5 ranks: 4 3 3 3 3 cores, siblings kept together. */
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_CORES, 5, s, err, sizeof err) == 0);
  CHECK(list_is(&s[0], "0-3,16-19") && list_is(&s[1], "4-6,20-22") &&
        list_is(&s[4], "13-15,29-31"));
  CHECK(disjoint(s, 5));
  /* More ranks than cores: logical CPUs. */
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_CORES, 32, s, err, sizeof err) == 0);
  CHECK(disjoint(s, 32) && CPU_COUNT(&s[31]) == 1);
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_CORES, 33, s, err, sizeof err) == -EINVAL);
  CHECK(strstr(err, "33 local ranks but only 32 CPUs") != NULL);
  /* numa: two ranks per node, each half the node's cores. */
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_NUMA, 8, s, err, sizeof err) == 0);
  CHECK(list_is(&s[0], "0-1,16-17") && list_is(&s[2], "4-5,20-21") && list_is(&s[3], "6-7,22-23"));
  CHECK(disjoint(s, 8));
  /* Fewer ranks than nodes: a whole node each, spread. */
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_NUMA, 2, s, err, sizeof err) == 0);
  CHECK(list_is(&s[0], "0-3,16-19") && list_is(&s[1], "8-11,24-27"));
  /* Three ranks over four nodes. */
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_NUMA, 3, s, err, sizeof err) == 0);
  CHECK(disjoint(s, 3));
  cpu_set_t allowed;
  topo_parse_cpulist("0-7", &allowed);
  CHECK(agent_place_plan(t, &allowed, AGENT_BIND_CORES, 2, s, err, sizeof err) == 0);
  CHECK(list_is(&s[0], "0-3") && list_is(&s[1], "4-7"));
}

/* Small and odd machines. */
static void test_others(topo *t) {
  char err[256];
  cpu_set_t s[4];
  /* One NUMA node of two cores without SMT or caches, four GPUs. */
  CHECK(probe("crowded", NULL, t, err) == 0);
  CHECK_EQ_INT(t->ncpu, 2);
  CHECK_EQ_INT(t->ngpu, 4);
  CHECK_EQ_INT(t->gpu[0].numa, 0); /* numa_node -1 */
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_GPU_EXCLUSIVE, 4, s, err, sizeof err) == -EINVAL);
  CHECK(strstr(err, "NUMA node 0 has 4 GPUs but fewer cores") != NULL);
  CHECK(agent_place_plan(t, NULL, AGENT_BIND_GPU_CORE_COMPLEX, 4, s, err, sizeof err) == 0);
  CHECK(list_is(&s[0], "0-1") && list_is(&s[3], "0-1"));
  /* AMD render nodes (an Intel one ignored); HIP_VISIBLE_DEVICES first. */
  CHECK(probe("amd", NULL, t, err) == 0);
  CHECK_EQ_INT(t->vendor, TOPO_AMD);
  CHECK_EQ_INT(t->ngpu, 2);
  CHECK_EQ_INT(t->gpu[1].numa, 1);
  char *env[] = {"HIP_VISIBLE_DEVICES=1", "CUDA_VISIBLE_DEVICES=0,1", NULL};
  CHECK(probe("amd", env, t, err) == 0 && t->ngpu == 1 && t->gpu[0].numa == 1);
  CHECK_STREQ(t->visible_var, "HIP_VISIBLE_DEVICES");
  /* /dev/nvidia<N> without the driver's /proc directory. */
  CHECK(probe("devonly", NULL, t, err) == 0 && t->vendor == TOPO_NVIDIA && t->ngpu == 2);
  /* Broken: no online file; garbage in it. */
  CHECK(probe("broken", NULL, t, err) == -ENOENT && strstr(err, "cpu/online") != NULL);
  CHECK(probe("garbage", NULL, t, err) == -EINVAL && strstr(err, "not a CPU list") != NULL);
}

static void small_fixtures(void) {
  char root[512];
  snprintf(root, sizeof root, "%s/crowded/sys", base);
  fixture_put(root, "devices/system/cpu/online", "0-1\n");
  snprintf(root, sizeof root, "%s/crowded/proc", base);
  for (int g = 0; g < 4; g++)
    putf(root, "GPU UUID: GPU-c\n", "driver/nvidia/gpus/0000:0%d:00.0/information", g);
  snprintf(root, sizeof root, "%s/crowded/sys", base);
  for (int g = 0; g < 4; g++) putf(root, "-1\n", "bus/pci/devices/0000:0%d:00.0/numa_node", g);
  snprintf(root, sizeof root, "%s/amd/sys", base);
  fixture_put(root, "devices/system/cpu/online", "0-3\n");
  fixture_put(root, "class/drm/renderD128/device/vendor", "0x1002\n");
  fixture_put(root, "class/drm/renderD128/device/numa_node", "0\n");
  fixture_put(root, "class/drm/renderD129/device/vendor", "0x8086\n");
  fixture_put(root, "class/drm/renderD130/device/vendor", "0x1002\n");
  fixture_put(root, "class/drm/renderD130/device/numa_node", "1\n");
  fixture_put(root, "class/drm/card0/device/vendor", "0x1002\n");
  snprintf(root, sizeof root, "%s/devonly/sys", base);
  fixture_put(root, "devices/system/cpu/online", "0\n");
  snprintf(root, sizeof root, "%s/devonly/dev", base);
  fixture_put(root, "nvidia0", "");
  fixture_put(root, "nvidia1", "");
  fixture_put(root, "nvidiactl", "");
  fixture_put(root, "nvidia-uvm", "");
  snprintf(root, sizeof root, "%s/none/sys", base);
  fixture_put(root, "devices/system/cpu/online", "0-1\n");
  snprintf(root, sizeof root, "%s/broken/sys", base);
  fixture_put(root, "devices/system/cpu/possible", "0-1\n");
  snprintf(root, sizeof root, "%s/garbage/sys", base);
  fixture_put(root, "devices/system/cpu/online", "zero to one\n");
}

int main(void) {
  snprintf(base, sizeof base, "/tmp/cohort-place-XXXXXX");
  if (mkdtemp(base) == NULL) return 2;
  char big[128];
  snprintf(big, sizeof big, "%s/big", base);
  big_node(big);
  small_fixtures();
  topo *t = malloc(sizeof *t);
  test_cpulists();
  test_big_topology(t);
  test_visible(t);
  test_count(t);
  test_gpu_modes(t);
  test_cpu_modes(t);
  test_others(t);
  free(t);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", base);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", base);
  return check_report();
}

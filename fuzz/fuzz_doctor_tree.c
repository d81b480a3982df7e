/*
 * fuzz_doctor_tree.c - libFuzzer target for the doctor's readers of sysfs,
 * procfs, /dev and the NCCL installation (src/doctor/probe.c) and for what
 * derives and renders their facts.
 *
 * The input describes a machine as a fixture tree: entries separated by NUL
 * bytes, each "PATH\nCONTENT". PATH is relative and starts with sys/, proc/,
 * dev/ or lib/, or is "ifaddrs" (the interface address list) or "env" (the
 * job's environment for doctor_derive, one NAME=VALUE per line). A CONTENT
 * of "->TARGET" makes PATH a symbolic link to TARGET inside the tree. Paths
 * are kept inside the tree (no "..", no absolute paths, no empty parts).
 * The harness builds the tree in a private temporary directory, runs
 * doctor_probe() + doctor_derive() against it (master 10.3.0.1, so the
 * route lookup runs), renders the report, export lines, the checks' verdicts
 * and JSON, round-trips the one-line summary, then removes the tree.
 *
 * Then the CPU and GPU topology of the same tree (src/doctor/topo.c) and
 * the agent's worker count and CPU binding over it (src/agent/place.c).
 *
 * Checks: no crash, leak or undefined behaviour; probe and derive succeed
 * or fail with -ENOMEM only (a damaged tree is facts, not an error); the
 * summary parses back to itself; each check's verdict is one line; the JSON
 * document parses (jansson); nothing
 * it sets was in the environment. The topology probe succeeds or names
 * the file it could not use; a CPU list prints back to itself; every plan
 * succeeds or fails with one line, and a plan gives each rank CPUs of the
 * node's, without overlap where the mode promises it.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/place.h"
#include "doctor/doctor.h"
#include "doctor/topo.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define MAX_ENTRIES 256
#define MAX_ENV 32

static char base_dir[64];

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_doctor_tree: check failed: %s\n", what);
    abort();
  }
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

static void remove_tree(const char *path) {
  nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void cleanup(void) {
  remove_tree(base_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_scratch_dir(base_dir, sizeof base_dir, "doctor");
  atexit(cleanup);
  return 0;
}

/* A relative path that stays inside the tree: [A-Za-z0-9._-] parts, no "." or "..". */
static int path_ok(const char *p, size_t n) {
  if (n == 0 || n > 200 || p[0] == '/' || p[n - 1] == '/') return 0;
  size_t part = 0;
  for (size_t i = 0; i <= n; i++) {
    if (i == n || p[i] == '/') {
      if (part == 0) return 0;
      const char *s = p + i - part;
      if ((part == 1 && s[0] == '.') || (part == 2 && s[0] == '.' && s[1] == '.')) return 0;
      part = 0;
      continue;
    }
    char c = p[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return 0;
    part++;
  }
  return 1;
}

static int top_ok(const char *p) {
  return strncmp(p, "sys/", 4) == 0 || strncmp(p, "proc/", 5) == 0 || strncmp(p, "dev/", 4) == 0 ||
         strncmp(p, "lib/", 4) == 0 || strcmp(p, "ifaddrs") == 0;
}

/* mkdir -p of the parent directories of root/rel. */
static void make_parents(const char *root, const char *rel) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  for (char *s = path + strlen(root) + 1; (s = strchr(s, '/')) != NULL; s++) {
    *s = '\0';
    mkdir(path, 0700);
    *s = '/';
  }
}

static void write_entry(const char *root, const char *rel, const uint8_t *content, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  make_parents(root, rel);
  if (n >= 2 && content[0] == '-' && content[1] == '>') {
    char target[256];
    size_t tl = n - 2;
    if (tl >= sizeof target) return;
    memcpy(target, content + 2, tl);
    target[tl] = '\0';
    if (!path_ok(target, tl)) return;
    char abs[512];
    snprintf(abs, sizeof abs, "%s/%s", root, target);
    if (symlink(abs, path) != 0) return;
    return;
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  size_t off = 0;
  while (off < n) {
    ssize_t w = write(fd, content + off, n - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
  close(fd);
}

/* Each set non-empty and among the node's CPUs; pairwise disjoint when asked. */
static void check_sets(const topo *t, const cpu_set_t *sets, int n, int disjoint) {
  cpu_set_t node, seen;
  CPU_ZERO(&node);
  CPU_ZERO(&seen);
  for (int i = 0; i < t->ncpu; i++) CPU_SET(t->cpu[i].id, &node);
  for (int r = 0; r < n; r++) {
    cpu_set_t outside, both;
    CPU_XOR(&outside, &sets[r], &node);
    CPU_AND(&outside, &outside, &sets[r]);
    check(CPU_COUNT(&sets[r]) > 0 && CPU_COUNT(&outside) == 0, "a rank's CPUs are not the node's");
    CPU_AND(&both, &seen, &sets[r]);
    check(!disjoint || CPU_COUNT(&both) == 0, "two ranks share a CPU");
    CPU_OR(&seen, &seen, &sets[r]);
  }
}

static void check_topology(const char *sys, const char *proc, const char *dev, char **envp,
                           size_t size) {
  static topo t;
  static cpu_set_t sets[24];
  char err[256] = "";
  topo_config tc = {sys, proc, dev, envp};
  if (topo_probe(&tc, &t, err, sizeof err) != 0) {
    check(err[0] != '\0' && strchr(err, '\n') == NULL, "a topology error without its one line");
    return;
  }
  check(t.ncpu > 0 && t.ngpu <= t.nfound, "topology counts");
  cpu_set_t all, back;
  CPU_ZERO(&all);
  for (int i = 0; i < t.ncpu; i++) CPU_SET(t.cpu[i].id, &all);
  char list[8192];
  topo_format_cpulist(&all, list, sizeof list);
  check(topo_parse_cpulist(list, &back) == 0 && CPU_EQUAL(&all, &back), "CPU list round trip");
  int n = 0;
  for (int kind = AGENT_NPROC_NUMBER; kind <= AGENT_NPROC_AUTO; kind++) {
    err[0] = '\0';
    int rc = agent_place_count(&t, (agent_nproc)kind, 2, &n, err, sizeof err);
    check(rc == 0 ? n >= 1 : rc == -ENODEV && err[0] != '\0', "agent_place_count");
  }
  static const int disjoint[] = {0, 1, 1, 0, 0, 1, 0};
  for (int mode = AGENT_BIND_CORES; mode <= AGENT_BIND_GPU_CORE_COMPLEX; mode++) {
    int nproc = 1 + (int)((size + (size_t)mode) % 24);
    err[0] = '\0';
    int rc = agent_place_plan(&t, NULL, (agent_bind)mode, nproc, sets, err, sizeof err);
    check(rc == 0 || (rc == -EINVAL && err[0] != '\0' && strchr(err, '\n') == NULL),
          "agent_place_plan");
    if (rc == 0) check_sets(&t, sets, nproc, disjoint[mode]);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 65536) return 0;
  char root[128];
  snprintf(root, sizeof root, "%s/t", base_dir);
  remove_tree(root);
  check(mkdir(root, 0700) == 0, "mkdir root");
  static const char *const tops[] = {"sys", "proc", "dev", "lib"};
  for (size_t i = 0; i < 4; i++) {
    char p[160];
    snprintf(p, sizeof p, "%s/%s", root, tops[i]);
    mkdir(p, 0700);
  }

  char *envtext = NULL;
  size_t start = 0, entries = 0;
  for (size_t i = 0; i <= size && entries < MAX_ENTRIES; i++) {
    if (i < size && data[i] != '\0') continue;
    const uint8_t *e = data + start;
    size_t n = i - start;
    start = i + 1;
    entries++;
    const uint8_t *nl = memchr(e, '\n', n);
    if (nl == NULL) continue;
    size_t plen = (size_t)(nl - e);
    char rel[256];
    if (plen >= sizeof rel) continue;
    memcpy(rel, e, plen);
    rel[plen] = '\0';
    const uint8_t *content = nl + 1;
    size_t clen = n - plen - 1;
    if (strcmp(rel, "env") == 0) {
      free(envtext);
      envtext = malloc(clen + 1);
      check(envtext != NULL, "out of memory");
      memcpy(envtext, content, clen);
      envtext[clen] = '\0';
      continue;
    }
    if (!path_ok(rel, plen) || !top_ok(rel)) continue;
    write_entry(root, rel, content, clen);
  }

  char *envp[MAX_ENV + 1];
  size_t nenv = 0;
  if (envtext != NULL)
    for (char *s = envtext, *save = NULL; nenv < MAX_ENV && (s = strtok_r(s, "\n", &save)) != NULL;
         s = NULL)
      if (strchr(s, '=') != NULL) envp[nenv++] = s;
  envp[nenv] = NULL;

  char sys[160], proc[160], dev[160], lib[160], ifaddrs[160];
  snprintf(sys, sizeof sys, "%s/sys", root);
  snprintf(proc, sizeof proc, "%s/proc", root);
  snprintf(dev, sizeof dev, "%s/dev", root);
  snprintf(lib, sizeof lib, "%s/lib", root);
  snprintf(ifaddrs, sizeof ifaddrs, "%s/ifaddrs", root);
  doctor_config cfg = {.sysfs_root = sys,
                       .proc_root = proc,
                       .dev_root = dev,
                       .lib_root = lib,
                       .master = "10.3.0.1",
                       .ifaddrs_file = ifaddrs,
                       .set_gid_index = (size & 1) != 0};
  doctor_result *r = NULL;
  int rc = doctor_plan(&cfg, envp, &r);
  check(rc == 0 || rc == -ENOMEM, "doctor_plan failed on a fixture tree");
  if (rc == 0) {
    char *text = NULL;
    check(doctor_format_report(r, &text) == 0, "report");
    free(text);
    check(doctor_format_export(r, &text) == 0, "export");
    free(text);
    check(doctor_format_checks(r, &text) == 0, "checks");
    free(text);
    for (size_t i = 0; i < r->nchecks; i++)
      check(r->checks[i].detail[0] != '\0' && strchr(r->checks[i].detail, '\n') == NULL,
            "a check's verdict is not one line");
    check(doctor_format_json(r, &text) == 0, "json");
    json_t *doc = json_loads(text, 0, NULL);
    check(doc != NULL && json_is_object(doc), "the JSON document does not parse back");
    json_decref(doc);
    free(text);
    char line[DOCTOR_SUMMARY_MAX];
    check(doctor_summary_format(&r->summary, line, sizeof line) == 0, "summary format");
    doctor_summary back;
    check(doctor_summary_parse(line, &back) == 0, "summary does not parse back");
    char warn[1024];
    check(doctor_summary_compare("a", &r->summary, "b", &back, warn, sizeof warn) == 0,
          "summary changed in a round trip");
    for (size_t i = 0; i < r->nset; i++)
      for (size_t k = 0; k < nenv; k++) {
        size_t l = strlen(r->set[i].name);
        check(!(strncmp(envp[k], r->set[i].name, l) == 0 && envp[k][l] == '='),
              "a variable the user set is overridden");
      }
    doctor_result_destroy(r);
  }
  check_topology(sys, proc, dev, envp, size);
  free(envtext);
  remove_tree(root);
  return 0;
}

/*
 * test_doctor_check.c - `cohort doctor --check` over the fixture trees
 * (tests/fixtures/doctor/): every check fails on one fixture (with the
 * environment the test gives) and passes on another; the cases a fixture
 * cannot hold are the same facts edited; the binary's lines and exit
 * status; a tree of nonsense gives one-line verdicts.
 *
 * usage: test_doctor_check FIXTURES_DIR COHORT_BINARY
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "doctor/doctor.h"
#include "tests/check.h"
#include "tests/fixture_tree.h"

static const char *fixtures;
static const char *cohort_bin;

static char *clean_env[] = {"PATH=/usr/bin:/bin", NULL};

static doctor_result *plan_env(const char *name, char **envp) {
  char sys[512], proc[512], dev[512], lib[512], ifa[512];
  snprintf(sys, sizeof sys, "%s/%s/sys", fixtures, name);
  snprintf(proc, sizeof proc, "%s/%s/proc", fixtures, name);
  snprintf(dev, sizeof dev, "%s/%s/dev", fixtures, name);
  snprintf(lib, sizeof lib, "%s/%s/lib", fixtures, name);
  snprintf(ifa, sizeof ifa, "%s/%s/ifaddrs", fixtures, name);
  doctor_config cfg = {sys, proc, dev, lib, NULL, ifa, 0, 0, NULL};
  doctor_result *r = NULL;
  int rc = doctor_plan(&cfg, envp ? envp : clean_env, &r);
  if (rc != 0) fprintf(stderr, "doctor_plan(%s): %s\n", name, strerror(-rc));
  CHECK_EQ_INT(rc, 0);
  return r;
}

static const doctor_check *find(const doctor_result *r, const char *name) {
  for (size_t i = 0; r != NULL && i < r->nchecks; i++)
    if (strcmp(r->checks[i].name, name) == 0) return &r->checks[i];
  fprintf(stderr, "no check named %s\n", name);
  return NULL;
}

/* The check's status is st and its detail holds text (NULL: any). */
static void expect(const doctor_result *r, const char *name, doctor_check_status st,
                   const char *text) {
  const doctor_check *c = find(r, name);
  CHECK(c != NULL);
  if (c == NULL) return;
  if (c->status != st || (text != NULL && strstr(c->detail, text) == NULL))
    fprintf(stderr, "check %s: %s '%s', expected %s '%s'\n", name,
            doctor_check_status_name(c->status), c->detail, doctor_check_status_name(st),
            text ? text : "");
  CHECK_EQ_INT(c->status, st);
  if (text != NULL) CHECK(strstr(c->detail, text) != NULL);
}

/* Every verdict is one line; the list is the documented eleven, in order. */
static void well_formed(const doctor_result *r) {
  static const char *const names[] = {"gpu-driver",         "gpu-visible", "nccl-library",
                                      "rdma-devices",       "rdma-ports",  "memlock",
                                      "gpu-hca-numa",       "nccl-ib-hca", "nccl-ib-gid-index",
                                      "nccl-socket-ifname", "settings"};
  CHECK_EQ_INT(r->nchecks, sizeof names / sizeof names[0]);
  for (size_t i = 0; i < r->nchecks && i < sizeof names / sizeof names[0]; i++) {
    CHECK_STREQ(r->checks[i].name, names[i]);
    CHECK(r->checks[i].detail[0] != '\0' && strchr(r->checks[i].detail, '\n') == NULL);
  }
}

/* The healthy GPU node: nothing fails or warns. */
static void test_gpu_ib_passes(void) {
  doctor_result *r = plan_env("gpu_ib", NULL);
  if (r == NULL) return;
  well_formed(r);
  const doctor_facts *f = r->facts;
  CHECK_EQ_INT(f->hcas[0].numa, 0);
  CHECK_EQ_INT(f->hcas[1].numa, 1);
  CHECK_STREQ(f->cuda_lib_version, "580.159.04");
  CHECK(strstr(f->cuda_lib, "gpu_ib/lib/usr/lib/x86_64-linux-gnu/libcuda.so.1") != NULL);
  CHECK(f->mem_total_known && f->mem_total_bytes == 1056561448ull * 1024);
  expect(r, "gpu-driver", DOCTOR_CHECK_OK, "driver 580.159.04, libcuda the same");
  expect(r, "gpu-visible", DOCTOR_CHECK_OK, "2 GPU(s), all visible");
  expect(r, "nccl-library", DOCTOR_CHECK_OK, "NCCL 2.21.5");
  expect(r, "rdma-devices", DOCTOR_CHECK_OK, "2 RDMA device(s), 2 uverbs");
  expect(r, "rdma-ports", DOCTOR_CHECK_OK, "2 of 2 port(s) ACTIVE");
  expect(r, "memlock", DOCTOR_CHECK_OK, "unlimited");
  expect(r, "gpu-hca-numa", DOCTOR_CHECK_OK, "mlx5_0 node 0, mlx5_1 node 1");
  expect(r, "settings", DOCTOR_CHECK_OK, NULL);
  CHECK_EQ_INT(doctor_checks_failed(r), 0);
  for (size_t i = 0; i < r->nchecks; i++) CHECK(r->checks[i].status != DOCTOR_CHECK_WARN);
  doctor_result_destroy(r);
}

/* The broken GPU node, and the fixtures made to fail one check each. */
static void test_fixtures_fail(void) {
  doctor_result *r = plan_env("gpu_broken", NULL);
  if (r == NULL) return;
  well_formed(r);
  expect(r, "gpu-driver", DOCTOR_CHECK_FAIL, "kernel module 580.159.04 but libcuda 570.86.15");
  expect(r, "nccl-library", DOCTOR_CHECK_FAIL, "2 NVIDIA GPU(s) but no NCCL");
  expect(r, "memlock", DOCTOR_CHECK_FAIL, "limited to 64 KiB");
  expect(r, "gpu-hca-numa", DOCTOR_CHECK_WARN,
         "GPU 0 (0000:98:00.0) on node 1, GPU 1 (0000:99:00.0) on node 1");
  expect(r, "rdma-ports", DOCTOR_CHECK_OK, NULL);
  CHECK_EQ_INT(doctor_checks_failed(r), 3);
  doctor_result_destroy(r);

  r = plan_env("ib_down", NULL);
  if (r == NULL) return;
  expect(r, "rdma-ports", DOCTOR_CHECK_FAIL,
         "none of the 1 port(s) of 1 RDMA device(s) is ACTIVE "
         "(mlx5_0:1 INIT)");
  expect(r, "memlock", DOCTOR_CHECK_NA, NULL);
  expect(r, "gpu-driver", DOCTOR_CHECK_NA, "no GPU found");
  doctor_result_destroy(r);

  r = plan_env("roce_single", NULL);
  if (r == NULL) return;
  expect(r, "rdma-devices", DOCTOR_CHECK_FAIL, "but no /dev/infiniband");
  doctor_result_destroy(r);

  r = plan_env("roce_none", NULL);
  if (r == NULL) return;
  expect(r, "settings", DOCTOR_CHECK_FAIL, "no GID qualifies");
  doctor_result_destroy(r);

  /* GPUs and the driver, but no libcuda and no NCCL. */
  r = plan_env("no_rdma", NULL);
  if (r == NULL) return;
  expect(r, "gpu-driver", DOCTOR_CHECK_WARN, "no libcuda.so.1");
  expect(r, "nccl-library", DOCTOR_CHECK_FAIL, NULL);
  doctor_result_destroy(r);

  /* Turning RDMA off makes the RDMA checks not apply. */
  char *off[] = {"PATH=/usr/bin:/bin", "NCCL_IB_DISABLE=1", NULL};
  r = plan_env("roce_single", off);
  if (r == NULL) return;
  expect(r, "rdma-devices", DOCTOR_CHECK_NA, "NCCL_IB_DISABLE=1");
  expect(r, "memlock", DOCTOR_CHECK_NA, NULL);
  doctor_result_destroy(r);
}

/* The variables of the job's environment checked against the node. */
static void test_environment(void) {
  char *bad_gpu[] = {"PATH=/bin", "CUDA_VISIBLE_DEVICES=0,5", "NCCL_IB_HCA=mlx5_7,mlx5_0:2", NULL};
  doctor_result *r = plan_env("gpu_ib", bad_gpu);
  if (r == NULL) return;
  expect(r, "gpu-visible", DOCTOR_CHECK_FAIL,
         "CUDA_VISIBLE_DEVICES='0,5' lists 2 GPUs but selects 1");
  expect(r, "nccl-ib-hca", DOCTOR_CHECK_FAIL,
         "'mlx5_7' names no RDMA device; 'mlx5_0' has no port 2 (the node has mlx5_0, mlx5_1)");
  doctor_result_destroy(r);

  char *none[] = {"PATH=/bin", "CUDA_VISIBLE_DEVICES=", "NCCL_IB_HCA=^mlx5_9", NULL};
  r = plan_env("gpu_ib", none);
  if (r == NULL) return;
  expect(r, "gpu-visible", DOCTOR_CHECK_FAIL, "selects none of the 2 GPU(s)");
  expect(r, "nccl-ib-hca", DOCTOR_CHECK_WARN, "'mlx5_9' names no RDMA device");
  expect(r, "gpu-hca-numa", DOCTOR_CHECK_NA, "no visible GPU");
  doctor_result_destroy(r);

  char *good[] = {"PATH=/bin", "CUDA_VISIBLE_DEVICES=GPU-aa000000-0001", "NCCL_IB_HCA==mlx5_0:1",
                  NULL};
  r = plan_env("gpu_ib", good);
  if (r == NULL) return;
  expect(r, "gpu-visible", DOCTOR_CHECK_OK, "selects 1 of the 2 GPU(s)");
  expect(r, "nccl-ib-hca", DOCTOR_CHECK_OK, NULL);
  doctor_result_destroy(r);

  /* The GID one-liner's leftovers, an empty slot, RoCE v1, and the right one. */
  static const struct {
    const char *value;
    doctor_check_status st;
    const char *text;
  } gids[] = {{"NCCL_IB_GID_INDEX=RoCE v2", DOCTOR_CHECK_FAIL, "is not one number"},
              {"NCCL_IB_GID_INDEX=11\n3", DOCTOR_CHECK_FAIL, "'11?3' is not one number"},
              {"NCCL_IB_GID_INDEX=12", DOCTOR_CHECK_FAIL, "mlx5_bond_0:1 has no entry there"},
              {"NCCL_IB_GID_INDEX=8", DOCTOR_CHECK_WARN, "has RoCE v1 there"},
              {"NCCL_IB_GID_INDEX=9", DOCTOR_CHECK_OK, "is RoCE v2 on the 1 ACTIVE RoCE port"}};
  for (size_t i = 0; i < sizeof gids / sizeof gids[0]; i++) {
    char *env[] = {"PATH=/bin", (char *)gids[i].value, NULL};
    r = plan_env("roce_bond", env);
    if (r == NULL) return;
    expect(r, "nccl-ib-gid-index", gids[i].st, gids[i].text);
    doctor_result_destroy(r);
  }
  char *ib_gid[] = {"PATH=/bin", "NCCL_IB_GID_INDEX=3", NULL};
  r = plan_env("ib_hdr4", ib_gid);
  if (r == NULL) return;
  expect(r, "nccl-ib-gid-index", DOCTOR_CHECK_NA, "no ACTIVE RoCE port");
  doctor_result_destroy(r);

  /* Interfaces: a missing one, one without an address (eth10), all excluded. */
  static const struct {
    const char *nccl, *gloo;
    doctor_check_status st;
    const char *text;
  } ifs[] = {
      {"NCCL_SOCKET_IFNAME=eth9", NULL, DOCTOR_CHECK_FAIL,
       "NCCL_SOCKET_IFNAME='eth9' selects no interface with an address"},
      {"NCCL_SOCKET_IFNAME=eth0", "GLOO_SOCKET_IFNAME=eth10", DOCTOR_CHECK_FAIL,
       "GLOO_SOCKET_IFNAME: 'eth10' is no interface with an address (interfaces with an "
       "address: eth0, eth1, lo)"},
      {"NCCL_SOCKET_IFNAME=^eth,lo", NULL, DOCTOR_CHECK_FAIL, "selects no interface"},
      {"NCCL_SOCKET_IFNAME==eth1,eth9", NULL, DOCTOR_CHECK_WARN, "'eth9' names no interface"},
      {"NCCL_SOCKET_IFNAME=eth", "GLOO_SOCKET_IFNAME=eth0,eth1", DOCTOR_CHECK_OK, NULL},
      {"NCCL_SOCKET_IFNAME=^docker,lo", NULL, DOCTOR_CHECK_OK, NULL}};
  for (size_t i = 0; i < sizeof ifs / sizeof ifs[0]; i++) {
    char *env[] = {"PATH=/bin", (char *)ifs[i].nccl, (char *)ifs[i].gloo, NULL};
    r = plan_env("no_rdma", env);
    if (r == NULL) return;
    expect(r, "nccl-socket-ifname", ifs[i].st, ifs[i].text);
    doctor_result_destroy(r);
  }
}

/* Cases a fixture does not hold: the same facts, edited, derived again. */
static doctor_result *rederive(doctor_facts *f, char **envp) {
  doctor_result *r = NULL;
  CHECK_EQ_INT(doctor_derive(f, NULL, envp ? envp : clean_env, &r), 0);
  return r;
}

static void test_edited_facts(void) {
  doctor_result *base = plan_env("gpu_ib", NULL);
  if (base == NULL) return;
  doctor_facts *f = base->facts;
  doctor_result *r;

  f->driver[0] = '\0';
  r = rederive(f, NULL);
  expect(r, "gpu-driver", DOCTOR_CHECK_FAIL, "gives no version");
  doctor_result_destroy(r);
  snprintf(f->driver, sizeof f->driver, "575.51.03");
  snprintf(f->cuda_lib, sizeof f->cuda_lib, "/usr/local/cuda-13.0/compat/libcuda.so.1");
  r = rederive(f, NULL);
  expect(r, "gpu-driver", DOCTOR_CHECK_OK, "forward-compatibility libcuda 580.159.04");
  doctor_result_destroy(r);
  snprintf(f->driver, sizeof f->driver, "580.200.1");
  r = rederive(f, NULL);
  expect(r, "gpu-driver", DOCTOR_CHECK_FAIL, "older than the kernel module");
  doctor_result_destroy(r);
  snprintf(f->driver, sizeof f->driver, "580.159.4"); /* 04 and 4 are one number */
  snprintf(f->cuda_lib, sizeof f->cuda_lib, "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
  r = rederive(f, NULL);
  expect(r, "gpu-driver", DOCTOR_CHECK_OK, NULL);
  doctor_result_destroy(r);
  f->cuda_lib_version[0] = '\0';
  r = rederive(f, NULL);
  expect(r, "gpu-driver", DOCTOR_CHECK_WARN, "does not tell its version");
  doctor_result_destroy(r);

  /* A finite limit no smaller than the memory cannot bind; an unread one is a warning. */
  f->memlock_unlimited = 0;
  f->memlock_bytes = f->mem_total_bytes;
  r = rederive(f, NULL);
  expect(r, "memlock", DOCTOR_CHECK_OK, "not below the node's");
  doctor_result_destroy(r);
  f->memlock_bytes = f->mem_total_bytes - 1;
  r = rederive(f, NULL);
  expect(r, "memlock", DOCTOR_CHECK_FAIL, "below the node's memory");
  doctor_result_destroy(r);
  f->memlock_known = 0;
  r = rederive(f, NULL);
  expect(r, "memlock", DOCTOR_CHECK_WARN, "could not be read");
  doctor_result_destroy(r);

  /* Fewer uverbs files than HCAs: some were not given to the container. */
  f->uverbs_count = 1;
  r = rederive(f, NULL);
  expect(r, "rdma-devices", DOCTOR_CHECK_WARN, "2 RDMA devices but 1 uverbs file(s)");
  doctor_result_destroy(r);

  /* The HCAs' NUMA nodes unknown (-1) read as node 0, as the GPUs' do. */
  f->hcas[0].numa = f->hcas[1].numa = -1;
  r = rederive(f, NULL);
  expect(r, "gpu-hca-numa", DOCTOR_CHECK_WARN, "GPU 1 (0000:98:00.0) on node 1");
  doctor_result_destroy(r);
  doctor_result_destroy(base);
}

/* Runs the binary on a fixture with one more argument; its exit status, stdout in out. */
static int run(const char *name, const char *arg, char *const *env, char **out) {
  char cmd[4096];
  const char *f = fixtures;
  snprintf(cmd, sizeof cmd,
           "'%s' doctor --sysfs-root '%s/%s/sys' --proc-root '%s/%s/proc' --dev-root '%s/%s/dev' "
           "--lib-root '%s/%s/lib' --ifaddrs '%s/%s/ifaddrs' %s 2>/dev/null",
           cohort_bin, f, name, f, name, f, name, f, name, f, name, arg);
  *out = NULL;
  pid_t pid;
  int pfd[2];
  if (pipe(pfd) != 0 || (pid = fork()) < 0) return -1;
  if (pid == 0) {
    dup2(pfd[1], 1);
    close(pfd[0]);
    execle("/bin/sh", "sh", "-c", cmd, (char *)NULL, env ? env : clean_env);
    _exit(127);
  }
  close(pfd[1]);
  size_t len = 0, cap = 65536;
  char *buf = malloc(cap);
  ssize_t n;
  while (buf != NULL && len + 1 < cap && (n = read(pfd[0], buf + len, cap - len - 1)) > 0)
    len += (size_t)n;
  close(pfd[0]);
  if (buf != NULL) buf[len] = '\0';
  *out = buf;
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_binary(void) {
  char *out;
  CHECK_EQ_INT(run("gpu_ib", "--check", NULL, &out), 0);
  CHECK(out && strstr(out, "ok    gpu-driver          driver 580.159.04, libcuda the same"));
  CHECK(out && strstr(out, "11 check(s): 0 failed, 0 warned, 8 ok, 3 not applicable\n"));
  free(out);

  /* One line per check, the failed ones first word "fail"; exit 1. */
  CHECK_EQ_INT(run("gpu_broken", "--check", NULL, &out), 1);
  size_t lines = 0, fails = 0;
  for (char *p = out; p && *p; p = strchr(p, '\n') + 1) {
    lines++;
    fails += strncmp(p, "fail  ", 6) == 0;
    if (strchr(p, '\n') == NULL) break;
  }
  CHECK_EQ_INT(lines, 12);
  CHECK_EQ_INT(fails, 3);
  CHECK(out && strstr(out, "fail  nccl-library        2 NVIDIA GPU(s) but no NCCL"));
  CHECK(out && strstr(out, "warn  gpu-hca-numa"));
  CHECK(out && strstr(out, "11 check(s): 3 failed, 1 warned, 4 ok, 3 not applicable\n"));
  free(out);

  /* Checks see the caller's environment. */
  char *env[] = {"PATH=/usr/bin:/bin", "NCCL_SOCKET_IFNAME=eth9", NULL};
  CHECK_EQ_INT(run("ib_hdr4", "--check", env, &out), 1);
  CHECK(out && strstr(out, "fail  nccl-socket-ifname  NCCL_SOCKET_IFNAME='eth9' selects no"));
  free(out);

  /* --json carries the same verdicts; the modes exclude each other. */
  CHECK_EQ_INT(run("gpu_broken", "--json", NULL, &out), 0);
  CHECK(out && strstr(out, "{\"name\": \"memlock\", \"status\": \"fail\", \"detail\": \"locked "
                           "memory limited to 64 KiB"));
  CHECK(out && strstr(out, "\"schema\": \"cohort-doctor/2\""));
  free(out);
  CHECK_EQ_INT(run("gpu_ib", "--check --json", NULL, &out), 2);
  free(out);
  CHECK_EQ_INT(run("gpu_ib", "--check --export", NULL, &out), 2);
  free(out);
}

/* Nonsense in every file the checks use: verdicts, each one line, no crash. */
static void test_garbage(void) {
  char root[] = "/tmp/cohort-doctor-check-XXXXXX";
  if (mkdtemp(root) == NULL) {
    CHECK(0);
    return;
  }
  fixture_put(root, "sys/devices/system/cpu/online", "0-1\n");
  fixture_put(root, "proc/driver/nvidia/gpus/0000:01:00.0/information", "GPU UUID: \t\n\n");
  fixture_put(root, "sys/bus/pci/devices/0000:01:00.0/numa_node", "seven\n");
  fixture_put(root, "proc/driver/nvidia/version", "NVRM version: no digits here\n");
  fixture_put(root, "sys/class/infiniband/mlx5_0/device/numa_node", "99999999999\n");
  fixture_put(root, "sys/class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n");
  fixture_put(root, "proc/meminfo", "MemTotal: -5 kB\n");
  fixture_put(root, "proc/self/limits", "Max locked memory 1024 1024 bytes\n");
  fixture_put(root, "dev/.keep", "");
  fixture_put(root, "lib/usr/lib/x86_64-linux-gnu/.keep", "");
  fixture_put(root, "ifaddrs", "eth0 10.0.0.1/24\n");
  char link[1100];
  snprintf(link, sizeof link, "%s/lib/usr/lib/x86_64-linux-gnu/libcuda.so.1", root);
  CHECK_EQ_INT(symlink("libcuda.so.\n580", link), 0); /* dangling, with a newline */
  char sys[512], proc[512], dev[512], lib[512], ifa[512];
  snprintf(sys, sizeof sys, "%s/sys", root);
  snprintf(proc, sizeof proc, "%s/proc", root);
  snprintf(dev, sizeof dev, "%s/dev", root);
  snprintf(lib, sizeof lib, "%s/lib", root);
  snprintf(ifa, sizeof ifa, "%s/ifaddrs", root);
  doctor_config cfg = {sys, proc, dev, lib, NULL, ifa, 0, 0, NULL};
  char *env[] = {"PATH=/bin",
                 "CUDA_VISIBLE_DEVICES=\n0",
                 "NCCL_IB_HCA=,:,=,^",
                 "NCCL_IB_GID_INDEX=",
                 "NCCL_SOCKET_IFNAME=",
                 "GLOO_SOCKET_IFNAME=,",
                 NULL};
  doctor_result *r = NULL;
  CHECK_EQ_INT(doctor_plan(&cfg, env, &r), 0);
  if (r != NULL) {
    well_formed(r);
    CHECK_EQ_INT(r->facts->hcas[0].numa, -1);
    CHECK_EQ_INT(r->facts->mem_total_known, 0);
    CHECK_STREQ(r->facts->cuda_lib_version, "");
    expect(r, "gpu-driver", DOCTOR_CHECK_FAIL, "gives no version");
    expect(r, "gpu-visible", DOCTOR_CHECK_FAIL, "CUDA_VISIBLE_DEVICES='?0' selects none");
    expect(r, "memlock", DOCTOR_CHECK_FAIL, "(unknown)");
    char *text = NULL;
    CHECK_EQ_INT(doctor_format_checks(r, &text), 0);
    size_t nl = 0;
    for (char *p = text; p && *p; p++) nl += *p == '\n';
    CHECK_EQ_INT(nl, r->nchecks + 1);
    free(text);
  }
  doctor_result_destroy(r);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  CHECK_EQ_INT(system(cmd), 0);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: test_doctor_check FIXTURES_DIR COHORT_BINARY\n");
    return 2;
  }
  fixtures = argv[1];
  cohort_bin = argv[2];
  test_gpu_ib_passes();
  test_fixtures_fail();
  test_environment();
  test_edited_facts();
  test_binary();
  test_garbage();
  return check_report();
}

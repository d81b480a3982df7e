/*
 * test_doctor.c - `cohort doctor` over the committed fixture trees
 * (tests/fixtures/doctor/), at the library level and through the binary, and
 * once on this real machine.
 *
 * usage: test_doctor FIXTURES_DIR COHORT_BINARY
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "doctor/doctor.h"
#include "doctor/internal.h"
#include "tests/check.h"
#include "tests/fixture_tree.h"

static const char *fixtures;
static const char *cohort_bin;

static char *clean_env[] = {"PATH=/usr/bin:/bin", NULL};

typedef struct fx_paths {
  char sys[512], proc[512], dev[512], lib[512], ifaddrs[512];
} fx_paths;

static void fx(const char *name, fx_paths *p) {
  snprintf(p->sys, sizeof p->sys, "%s/%s/sys", fixtures, name);
  snprintf(p->proc, sizeof p->proc, "%s/%s/proc", fixtures, name);
  snprintf(p->dev, sizeof p->dev, "%s/%s/dev", fixtures, name);
  snprintf(p->lib, sizeof p->lib, "%s/%s/lib", fixtures, name);
  snprintf(p->ifaddrs, sizeof p->ifaddrs, "%s/%s/ifaddrs", fixtures, name);
}

static int plan(const char *name, const char *master, int set_gid, char **envp,
                doctor_result **out) {
  fx_paths p;
  fx(name, &p);
  doctor_config cfg = {p.sys, p.proc, p.dev, p.lib, master, p.ifaddrs, set_gid, 0, NULL};
  int rc = doctor_plan(&cfg, envp ? envp : clean_env, out);
  if (rc != 0) fprintf(stderr, "doctor_plan(%s): %s\n", name, strerror(-rc));
  return rc;
}

/* Warnings other than the size of /dev/shm, which in a fixture tree is the
 * size of whatever file system holds the checkout. */
static size_t warnings_besides_shm(const doctor_result *r) {
  size_t n = 0;
  for (size_t i = 0; i < r->nwarnings; i++)
    if (strstr(r->warnings[i], "/dev/shm") == NULL) n++;
  return n;
}

static int has_text(char **list, size_t n, const char *needle) {
  for (size_t i = 0; i < n; i++)
    if (strstr(list[i], needle) != NULL) return 1;
  return 0;
}

static const char *kept_value(const doctor_result *r, const char *name) {
  for (size_t i = 0; i < r->nkept; i++)
    if (strcmp(r->kept[i].name, name) == 0) return r->kept[i].user_value;
  return NULL;
}

/* What the seed's one-liner would take from a GID table: the entries listed
 * in lexical order of file name (as the shell's glob sorts them). */
static int lexical_first_candidate(const doctor_port *p) {
  char best[16] = "";
  for (size_t i = 0; i < p->ngids; i++) {
    const doctor_gid *g = &p->gids[i];
    static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (g->type != DOCTOR_GID_ROCE_V2 || memcmp(g->raw, v4, 12) != 0) continue;
    char s[16];
    snprintf(s, sizeof s, "%d", g->index);
    if (best[0] == '\0' || strcmp(s, best) < 0) snprintf(best, sizeof best, "%s", s);
  }
  return best[0] ? atoi(best) : -1;
}

static void test_roce_bond(void) {
  doctor_result *r = NULL;
  CHECK_EQ_INT(plan("roce_bond", NULL, 0, NULL, &r), 0);
  if (r == NULL) return;
  const doctor_facts *f = r->facts;
  CHECK_EQ_INT(f->nhcas, 1);
  CHECK_STREQ(f->hcas[0].name, "mlx5_bond_0");
  CHECK_STREQ(f->hcas[0].pci, "0000:3b:00.0");
  CHECK_EQ_INT(f->hcas[0].nnetdevs, 1);
  CHECK_EQ_INT(f->hcas[0].nports, 1);
  const doctor_port *p = &f->hcas[0].ports[0];
  CHECK_EQ_INT(p->state, 4);
  CHECK_EQ_INT(p->phys_state, 5);
  CHECK_EQ_INT(p->link, DOCTOR_LINK_ETH);
  CHECK(p->rate_gbps == 100.0);
  CHECK_EQ_INT(p->ngids, 12); /* 16 slots, 4 all-zero ones skipped */
  CHECK_EQ_INT(p->gids[9].index, 9);
  CHECK_EQ_INT(p->gids[9].type, DOCTOR_GID_ROCE_V2);
  CHECK_STREQ(p->gids[9].ndev, "net1");
  CHECK_EQ_INT(p->gids[8].type, DOCTOR_GID_IB_ROCE_V1);
  CHECK_EQ_INT(f->memlock_unlimited, 1);
  CHECK_EQ_INT(f->dev_infiniband, 1);
  CHECK_EQ_INT(f->uverbs_count, 1);
  CHECK_EQ_INT(f->nccl_found, 1);
  CHECK_EQ_INT(f->nccl_major, 2);
  CHECK_EQ_INT(f->nccl_minor, 18);
  CHECK_EQ_INT(f->nccl_patch, 3);
  CHECK_STREQ(f->default_iface, "eth0");

  CHECK_STREQ(doctor_result_get(r, "NCCL_IB_HCA"), "mlx5_bond_0:1");
  /* 3 is RoCE v2 IPv4 too, but 192.168.10.21 lives on the host's bond0,
   * outside this pod: 9 is the pod's net1 address. */
  CHECK_STREQ(doctor_result_get(r, "NCCL_IB_GID_INDEX"), "9");
  CHECK_EQ_INT(lexical_first_candidate(p), 3);
  CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_IFNAME"), "eth0");
  CHECK_STREQ(doctor_result_get(r, "GLOO_SOCKET_IFNAME"), "eth0");
  CHECK_STREQ(doctor_result_get(r, "UCX_NET_DEVICES"), "mlx5_bond_0:1");
  CHECK(doctor_result_get(r, "NCCL_IB_DISABLE") == NULL);
  CHECK(doctor_result_get(r, "NCCL_SOCKET_NTHREADS") == NULL);
  CHECK_EQ_INT(r->nerrors, 0);
  CHECK_EQ_INT(warnings_besides_shm(r), 0);
  CHECK_STREQ(r->summary.link, "ethernet");
  CHECK_STREQ(r->summary.hca, "mlx5_bond_0:1");
  CHECK_EQ_INT(r->summary.gid_index, 9);
  for (size_t i = 0; i < r->nset; i++) CHECK(r->set[i].reason[0] != '\0');
  doctor_result_destroy(r);

  /* The master on the RoCE network: sockets follow it, and the GID reason says so. */
  CHECK_EQ_INT(plan("roce_bond", "10.20.0.1", 0, NULL, &r), 0);
  if (r == NULL) return;
  CHECK_STREQ(r->facts->route_iface, "net1");
  CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_IFNAME"), "net1");
  CHECK_STREQ(doctor_result_get(r, "NCCL_IB_GID_INDEX"), "9");
  const char *why = NULL;
  for (size_t i = 0; i < r->nset; i++)
    if (strcmp(r->set[i].name, "NCCL_IB_GID_INDEX") == 0) why = r->set[i].reason;
  CHECK(why != NULL && strstr(why, "reaches the master") != NULL);
  doctor_result_destroy(r);

  /* A master at this node's loopback (the Debian 127.0.1.1 host name):
   * sockets on the default route's interface, not lo. */
  CHECK_EQ_INT(plan("roce_bond", "127.0.1.1", 0, NULL, &r), 0);
  if (r == NULL) return;
  CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_IFNAME"), "eth0");
  CHECK(r->nset > 2 && strstr(r->set[2].reason, "loopback") != NULL);
  doctor_result_destroy(r);

  /* A master on the overlay network: sockets on eth0, GID still the pod's. */
  CHECK_EQ_INT(plan("roce_bond", "10.244.1.9", 0, NULL, &r), 0);
  if (r == NULL) return;
  CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_IFNAME"), "eth0");
  CHECK_STREQ(doctor_result_get(r, "NCCL_IB_GID_INDEX"), "9");
  doctor_result_destroy(r);

  /* pip's NCCL in the Python environment on PATH beside an older system
   * libnccl, as on the GPU node (torch's venv 2.28.9, the image's 2.28.3):
   * the newer is the one reported. */
  char *venv[] = {"PATH=/opt/venv/bin:/usr/bin:/bin", NULL};
  CHECK_EQ_INT(plan("roce_bond", NULL, 0, venv, &r), 0);
  if (r == NULL) return;
  CHECK_EQ_INT(r->facts->nccl_minor, 28);
  CHECK_EQ_INT(r->facts->nccl_patch, 9);
  CHECK(strstr(r->facts->nccl_path, "/opt/venv/lib/python3.12/site-packages/"
                                    "nvidia_nccl_cu13-2.28.9.dist-info") != NULL);
  doctor_result_destroy(r);
}

static void test_gid_many(void) {
  doctor_result *r = NULL;
  /* NCCL 2.21.5 is installed: it picks the GID itself; doctor only says which. */
  CHECK_EQ_INT(plan("gid_many", NULL, 0, NULL, &r), 0);
  if (r == NULL) return;
  CHECK_EQ_INT(r->facts->hcas[0].ports[0].ngids, 12);
  CHECK(doctor_result_get(r, "NCCL_IB_GID_INDEX") == NULL);
  CHECK(has_text(r->notes, r->nnotes, "NCCL 2.21.5"));
  CHECK(has_text(r->notes, r->nnotes, "would choose 3"));
  CHECK_EQ_INT(r->summary.gid_index, 3);
  /* The lexical order of the seed's one-liner would put 11 first. */
  CHECK_EQ_INT(lexical_first_candidate(&r->facts->hcas[0].ports[0]), 11);
  doctor_result_destroy(r);

  CHECK_EQ_INT(plan("gid_many", NULL, 1, NULL, &r), 0);
  if (r == NULL) return;
  CHECK_STREQ(doctor_result_get(r, "NCCL_IB_GID_INDEX"), "3");
  doctor_result_destroy(r);

  /* The master on VLAN 200: its GID (11) wins over the lower index 3. */
  CHECK_EQ_INT(plan("gid_many", "10.200.0.1", 1, NULL, &r), 0);
  if (r == NULL) return;
  CHECK_STREQ(doctor_result_get(r, "NCCL_IB_GID_INDEX"), "11");
  CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_IFNAME"), "eth2.200");
  CHECK_EQ_INT(r->summary.gid_index, 11);
  doctor_result_destroy(r);
}

static void test_roce_single_and_none(void) {
  doctor_result *r = NULL;
  CHECK_EQ_INT(plan("roce_single", NULL, 0, NULL, &r), 0);
  if (r == NULL) return;
  CHECK_STREQ(doctor_result_get(r, "NCCL_IB_GID_INDEX"), "1");
  CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_IFNAME"), "ens3");
  CHECK_EQ_INT(r->nerrors, 0);
  CHECK(has_text(r->warnings, r->nwarnings, "locked-memory limit is 64 KiB"));
  CHECK(has_text(r->warnings, r->nwarnings, "/dev/infiniband is missing"));
  CHECK_EQ_INT(warnings_besides_shm(r), 2);
  doctor_result_destroy(r);

  CHECK_EQ_INT(plan("roce_none", NULL, 0, NULL, &r), 0);
  if (r == NULL) return;
  CHECK(doctor_result_get(r, "NCCL_IB_GID_INDEX") == NULL);
  CHECK_EQ_INT(r->nerrors, 1);
  CHECK(has_text(r->errors, r->nerrors, "mlx5_0 port 1 (RoCE): no GID qualifies"));
  CHECK(has_text(r->errors, r->nerrors, "give its network device an IPv4 address (ens3)"));
  CHECK_EQ_INT(r->summary.gid_index, -1);
  /* IPv6-only host: the default route comes from ipv6_route. */
  CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_IFNAME"), "ens3");
  doctor_result_destroy(r);

  /* IPv6 masters are routed by net/ipv6_route: longest prefix first. */
  CHECK_EQ_INT(plan("roce_none", "fd00:99::1", 0, NULL, &r), 0);
  if (r == NULL) return;
  CHECK_STREQ(r->facts->route_iface, "ens9");
  doctor_result_destroy(r);
  CHECK_EQ_INT(plan("roce_none", "2001:db8::1", 0, NULL, &r), 0);
  if (r == NULL) return;
  CHECK_STREQ(r->facts->route_iface, "ens3"); /* the default route */
  CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_IFNAME"), "ens3");
  doctor_result_destroy(r);

  /* A master no route leads to is an error naming it. */
  CHECK_EQ_INT(plan("roce_none", "10.9.9.9", 0, NULL, &r), 0);
  if (r == NULL) return;
  CHECK(has_text(r->errors, r->nerrors, "no route to master 10.9.9.9"));
  CHECK(doctor_result_get(r, "NCCL_SOCKET_IFNAME") == NULL);
  doctor_result_destroy(r);
}

static void test_ib_and_port_down(void) {
  doctor_result *r = NULL;
  CHECK_EQ_INT(plan("ib_hdr4", NULL, 0, NULL, &r), 0);
  if (r == NULL) return;
  CHECK_EQ_INT(r->facts->nhcas, 4);
  CHECK_STREQ(r->facts->hcas[2].pci, "0000:2c:00.0");
  CHECK_EQ_INT(r->facts->hcas[3].ports[0].link, DOCTOR_LINK_IB);
  CHECK(r->facts->hcas[3].ports[0].rate_gbps == 200.0);
  CHECK_EQ_INT(r->facts->hcas[0].ports[0].ngids, 1);
  CHECK_EQ_INT(r->facts->hcas[0].ports[0].gids[0].ndev[0], '\0');
  CHECK_EQ_INT(r->facts->nccl_found, 0);
  CHECK_STREQ(doctor_result_get(r, "NCCL_IB_HCA"), "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1");
  CHECK_STREQ(doctor_result_get(r, "UCX_NET_DEVICES"), "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1");
  CHECK(doctor_result_get(r, "NCCL_IB_GID_INDEX") == NULL);
  CHECK(doctor_result_get(r, "NCCL_IB_DISABLE") == NULL);
  CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_IFNAME"), "eno1");
  CHECK_STREQ(r->summary.link, "infiniband");
  CHECK_EQ_INT(r->summary.gid_index, -1);
  CHECK_EQ_INT(r->nerrors, 0);
  CHECK_EQ_INT(warnings_besides_shm(r), 0);
  doctor_result_destroy(r);

  CHECK_EQ_INT(plan("port_down", NULL, 0, NULL, &r), 0);
  if (r == NULL) return;
  CHECK_STREQ(doctor_result_get(r, "NCCL_IB_HCA"), "mlx5_0:1");
  CHECK(has_text(r->warnings, r->nwarnings, "mlx5_1 port 1 is DOWN (physical state Polling)"));
  CHECK(has_text(r->warnings, r->nwarnings, "locked-memory limit is 64 KiB"));
  CHECK_EQ_INT(r->nerrors, 0);
  doctor_result_destroy(r);
}

/* The agent's nccl_if_needed: NCCL looked for on a machine with RoCE ports (the GID
 * choice depends on its version), not on one with InfiniBand only, where nothing derived
 * depends on it; either way the same settings as cohort doctor's full probe. */
static void test_nccl_if_needed(void) {
  static const char *names[] = {"roce_bond", "ib_hdr4"};
  fx_paths nccl_lib;
  fx("roce_bond", &nccl_lib); /* its lib/ holds libnccl.so.2.18.3 */
  for (int i = 0; i < 2; i++) {
    fx_paths p;
    fx(names[i], &p);
    doctor_result *full = NULL, *lazy = NULL;
    doctor_config cfg = {p.sys, p.proc, p.dev, nccl_lib.lib, NULL, p.ifaddrs, 0, 0, NULL};
    CHECK_EQ_INT(doctor_plan(&cfg, clean_env, &full), 0);
    cfg.nccl_if_needed = 1;
    CHECK_EQ_INT(doctor_plan(&cfg, clean_env, &lazy), 0);
    if (full == NULL || lazy == NULL) goto next;
    CHECK_EQ_INT(full->facts->nccl_probed, 1);
    CHECK_EQ_INT(full->facts->nccl_found, 1);
    CHECK_EQ_INT(lazy->facts->nccl_probed, i == 0);
    CHECK_EQ_INT(lazy->facts->nccl_found, i == 0);
    /* no "NCCL not found" for a search that did not happen */
    CHECK(!has_text(lazy->notes, lazy->nnotes, "NCCL not found"));
    CHECK_EQ_INT((int)lazy->nset, (int)full->nset);
    for (size_t k = 0; k < full->nset && k < lazy->nset; k++) {
      CHECK_STREQ(lazy->set[k].name, full->set[k].name);
      CHECK_STREQ(lazy->set[k].value, full->set[k].value);
    }
  next:
    doctor_result_destroy(full);
    doctor_result_destroy(lazy);
  }
}

static void test_no_rdma(void) {
  doctor_result *r = NULL;
  CHECK_EQ_INT(plan("no_rdma", NULL, 0, NULL, &r), 0);
  if (r == NULL) return;
  CHECK_EQ_INT(r->facts->nhcas, 0);
  CHECK_EQ_INT(r->facts->nifaces, 4); /* eth0 eth1 eth10 lo; bonding_masters is a file */
  CHECK_STREQ(r->facts->ifaces[2].name, "eth10");
  CHECK_STREQ(r->facts->ifaces[1].addrs ? "eth1" : "", "eth1");
  CHECK_STREQ(doctor_result_get(r, "NCCL_IB_DISABLE"), "1");
  CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_IFNAME"), "eth0");
  CHECK_STREQ(doctor_result_get(r, "GLOO_SOCKET_IFNAME"), "eth0");
  CHECK_STREQ(doctor_result_get(r, "UCX_NET_DEVICES"), "eth0");
  CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_NTHREADS"), "4");
  CHECK_STREQ(doctor_result_get(r, "NCCL_NSOCKS_PERTHREAD"), "8");
  CHECK(doctor_result_get(r, "NCCL_IB_HCA") == NULL);
  CHECK_STREQ(r->summary.link, "none");
  CHECK_EQ_INT(warnings_besides_shm(r), 0); /* no RDMA: no memlock or /dev/infiniband warning */
  doctor_result_destroy(r);

  /* eth1 is a prefix of eth10: NCCL needs "=eth1"; Gloo takes names exactly. */
  CHECK_EQ_INT(plan("no_rdma", "172.16.0.9", 0, NULL, &r), 0);
  if (r == NULL) return;
  CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_IFNAME"), "=eth1");
  CHECK_STREQ(doctor_result_get(r, "GLOO_SOCKET_IFNAME"), "eth1");
  CHECK_STREQ(doctor_result_get(r, "UCX_NET_DEVICES"), "eth1");
  doctor_result_destroy(r);

  /* Variables the user set are never overridden, and are reported as kept. */
  char *env[] = {"PATH=/bin", "NCCL_SOCKET_IFNAME=eth1", "NCCL_IB_DISABLE=0", NULL};
  CHECK_EQ_INT(plan("no_rdma", NULL, 0, env, &r), 0);
  if (r == NULL) return;
  CHECK(doctor_result_get(r, "NCCL_SOCKET_IFNAME") == NULL);
  CHECK(doctor_result_get(r, "NCCL_IB_DISABLE") == NULL);
  CHECK_STREQ(kept_value(r, "NCCL_SOCKET_IFNAME"), "eth1");
  CHECK_STREQ(kept_value(r, "NCCL_IB_DISABLE"), "0");
  CHECK_STREQ(doctor_result_get(r, "GLOO_SOCKET_IFNAME"), "eth0");
  for (size_t i = 0; i < r->nset; i++)
    for (char **e = env; *e; e++) CHECK(strncmp(*e, r->set[i].name, strlen(r->set[i].name)) != 0);
  doctor_result_destroy(r);
}

/* GPUs as the placement sees them: PCI order, the NUMA node (-1 read as 0)
 * and its CPUs, CUDA_VISIBLE_DEVICES, the driver; in the report. */
static void test_gpus(void) {
  doctor_result *r = NULL;
  CHECK_EQ_INT(plan("no_rdma", NULL, 0, NULL, &r), 0);
  if (r == NULL) return;
  const doctor_facts *f = r->facts;
  CHECK_STREQ(f->gpu_vendor, "nvidia");
  CHECK_EQ_INT(f->gpus_found, 2);
  CHECK_EQ_INT((int)f->ngpus, 2);
  CHECK_STREQ(f->gpus[0].pci, "0000:3b:00.0");
  CHECK_STREQ(f->gpus[0].uuid, "GPU-9ce285ff-0000");
  CHECK_EQ_INT(f->gpus[0].numa, 1);
  CHECK_STREQ(f->gpus[0].cpus, "2-3");
  CHECK_EQ_INT(f->gpus[1].numa, 0);
  CHECK_STREQ(f->gpus[1].cpus, "0-1");
  CHECK_STREQ(f->driver, "580.159.04");
  char *text = NULL;
  CHECK_EQ_INT(doctor_format_report(r, &text), 0);
  CHECK(text != NULL && strstr(text, "GPUs\n  0  0000:3b:00.0  GPU-9ce285ff-0000  NUMA node 1 "
                                     "(CPUs 2-3)\n") != NULL);
  CHECK(text != NULL && strstr(text, "  driver 580.159.04\n") != NULL);
  free(text);
  doctor_result_destroy(r);

  char *env[] = {"PATH=/usr/bin:/bin", "CUDA_VISIBLE_DEVICES=1", NULL};
  CHECK_EQ_INT(plan("no_rdma", NULL, 0, env, &r), 0);
  if (r == NULL) return;
  CHECK_EQ_INT((int)r->facts->ngpus, 1);
  CHECK_STREQ(r->facts->gpus[0].pci, "0000:86:00.0");
  CHECK_STREQ(r->facts->gpu_visible_var, "CUDA_VISIBLE_DEVICES");
  doctor_result_destroy(r);

  /* A tree without GPUs (nor CPUs): none found. */
  CHECK_EQ_INT(plan("roce_bond", NULL, 0, NULL, &r), 0);
  if (r == NULL) return;
  CHECK_EQ_INT(r->facts->gpus_found, 0);
  CHECK_EQ_INT(doctor_format_report(r, &text), 0);
  CHECK(text != NULL && strstr(text, "GPUs\n  none found\n") != NULL);
  free(text);
  doctor_result_destroy(r);
}

/* The user's own NCCL_IB_GID_INDEX is checked, and their NCCL_IB_HCA followed. */
static void test_user_settings(void) {
  doctor_result *r = NULL;
  char *one_liner_single[] = {"NCCL_IB_GID_INDEX=RoCE v2", NULL};
  CHECK_EQ_INT(plan("roce_bond", NULL, 0, one_liner_single, &r), 0);
  if (r == NULL) return;
  CHECK(doctor_result_get(r, "NCCL_IB_GID_INDEX") == NULL);
  CHECK_STREQ(kept_value(r, "NCCL_IB_GID_INDEX"), "RoCE v2");
  CHECK(has_text(r->warnings, r->nwarnings, "'RoCE v2' is not one number"));
  CHECK(has_text(r->warnings, r->nwarnings, "doctor would set 9"));
  CHECK_EQ_INT(r->summary.gid_index, -1);
  doctor_result_destroy(r);

  char *one_liner_many[] = {"NCCL_IB_GID_INDEX=11\n3", NULL};
  CHECK_EQ_INT(plan("gid_many", NULL, 0, one_liner_many, &r), 0);
  if (r == NULL) return;
  CHECK(has_text(r->warnings, r->nwarnings, "'11 3' is not one number"));
  doctor_result_destroy(r);

  char *v1[] = {"NCCL_IB_GID_INDEX=8", NULL};
  CHECK_EQ_INT(plan("roce_bond", NULL, 0, v1, &r), 0);
  if (r == NULL) return;
  CHECK(has_text(r->warnings, r->nwarnings, "NCCL_IB_GID_INDEX 8 is IB/RoCE v1 on mlx5_bond_0"));
  CHECK_EQ_INT(r->summary.gid_index, 8);
  doctor_result_destroy(r);

  char *empty[] = {"NCCL_IB_GID_INDEX=14", NULL};
  CHECK_EQ_INT(plan("roce_bond", NULL, 0, empty, &r), 0);
  if (r == NULL) return;
  CHECK(has_text(r->warnings, r->nwarnings, "NCCL_IB_GID_INDEX 14 is an empty entry"));
  doctor_result_destroy(r);

  char *v6[] = {"NCCL_IB_GID_INDEX=11", NULL};
  CHECK_EQ_INT(plan("roce_bond", NULL, 0, v6, &r), 0);
  if (r == NULL) return;
  CHECK(has_text(r->notes, r->nnotes, "11 is an IPv6 RoCE v2 entry"));
  CHECK_EQ_INT(warnings_besides_shm(r), 0);
  doctor_result_destroy(r);

  /* A good choice of the user's: no warning, and it is what the summary shows. */
  char *good[] = {"NCCL_IB_GID_INDEX=3", NULL};
  CHECK_EQ_INT(plan("roce_bond", NULL, 0, good, &r), 0);
  if (r == NULL) return;
  CHECK_EQ_INT(warnings_besides_shm(r), 0);
  CHECK_EQ_INT(r->nerrors, 0);
  CHECK_EQ_INT(r->summary.gid_index, 3);
  doctor_result_destroy(r);

  /* The user's own index silences the no-qualifying-GID error. */
  char *v6none[] = {"NCCL_IB_GID_INDEX=3", NULL};
  CHECK_EQ_INT(plan("roce_none", NULL, 0, v6none, &r), 0);
  if (r == NULL) return;
  CHECK_EQ_INT(r->nerrors, 0);
  CHECK(has_text(r->notes, r->nnotes, "3 is an IPv6 RoCE v2 entry"));
  doctor_result_destroy(r);

  char *hca[] = {"NCCL_IB_HCA=mlx5_0:1,mlx5_1", NULL};
  CHECK_EQ_INT(plan("ib_hdr4", NULL, 0, hca, &r), 0);
  if (r == NULL) return;
  CHECK_STREQ(r->summary.hca, "mlx5_0:1,mlx5_1:1");
  CHECK_STREQ(doctor_result_get(r, "UCX_NET_DEVICES"), "mlx5_0:1,mlx5_1:1");
  CHECK_STREQ(kept_value(r, "NCCL_IB_HCA"), "mlx5_0:1,mlx5_1");
  CHECK(has_text(r->notes, r->nnotes, "mlx5_3 port 1 is ACTIVE but your NCCL_IB_HCA"));
  doctor_result_destroy(r);

  char *excl[] = {"NCCL_IB_HCA=^mlx5_3", NULL};
  CHECK_EQ_INT(plan("ib_hdr4", NULL, 0, excl, &r), 0);
  if (r == NULL) return;
  CHECK_STREQ(r->summary.hca, "mlx5_0:1,mlx5_1:1,mlx5_2:1");
  doctor_result_destroy(r);

  char *none[] = {"NCCL_IB_HCA==mlx5", NULL};
  CHECK_EQ_INT(plan("ib_hdr4", NULL, 0, none, &r), 0);
  if (r == NULL) return;
  CHECK_STREQ(r->summary.hca, "");
  CHECK(has_text(r->warnings, r->nwarnings, "selects none of the 4 ACTIVE RDMA ports"));
  CHECK(doctor_result_get(r, "NCCL_IB_DISABLE") == NULL);
  CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_NTHREADS"), "4");
  doctor_result_destroy(r);
}

/* Derivations from facts changed by hand: cases no fixture holds. */
static void test_derive_edits(void) {
  fx_paths p;
  fx("ib_hdr4", &p);
  doctor_config cfg = {p.sys, p.proc, p.dev, p.lib, NULL, p.ifaddrs, 0, 0, NULL};
  doctor_facts *f = NULL;
  CHECK_EQ_INT(doctor_probe(&cfg, clean_env, &f), 0);
  if (f == NULL) return;
  doctor_result *r = NULL;

  f->hcas[3].ports[0].link = DOCTOR_LINK_ETH;
  CHECK_EQ_INT(doctor_derive(f, &cfg, clean_env, &r), 0);
  CHECK(r && has_text(r->warnings, r->nwarnings, "mix InfiniBand and Ethernet"));
  CHECK(r && strcmp(r->summary.link, "mixed") == 0);
  doctor_result_destroy(r);
  f->hcas[3].ports[0].link = DOCTOR_LINK_IB;

  for (size_t i = 0; i < f->nifaces; i++)
    if (strcmp(f->ifaces[i].name, "ib2") == 0) f->ifaces[i].mtu = 2044;
  CHECK_EQ_INT(doctor_derive(f, &cfg, clean_env, &r), 0);
  CHECK(r && has_text(r->warnings, r->nwarnings, "disagree on MTU"));
  CHECK(r && has_text(r->warnings, r->nwarnings, "ib2 2044"));
  doctor_result_destroy(r);

  f->shm_known = 1;
  f->shm_bytes = 64ull << 20;
  CHECK_EQ_INT(doctor_derive(f, &cfg, clean_env, &r), 0);
  CHECK(r && has_text(r->warnings, r->nwarnings, "/dev/shm is only 64 MiB"));
  doctor_result_destroy(r);
  f->shm_known = 0;
  CHECK_EQ_INT(doctor_derive(f, &cfg, clean_env, &r), 0);
  CHECK(r && has_text(r->warnings, r->nwarnings, "/dev/shm is missing"));
  doctor_result_destroy(r);
  f->shm_known = 1;
  f->shm_bytes = 8ull << 30;

  /* All ports down: IB disabled, TCP socket settings instead. */
  for (size_t i = 0; i < f->nhcas; i++) {
    f->hcas[i].ports[0].state = 1;
    snprintf(f->hcas[i].ports[0].state_name, sizeof f->hcas[i].ports[0].state_name, "DOWN");
  }
  CHECK_EQ_INT(doctor_derive(f, &cfg, clean_env, &r), 0);
  if (r) {
    CHECK_STREQ(doctor_result_get(r, "NCCL_IB_DISABLE"), "1");
    CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_NTHREADS"), "4");
    CHECK_STREQ(doctor_result_get(r, "UCX_NET_DEVICES"), "eno1");
    CHECK(has_text(r->warnings, r->nwarnings, "mlx5_3 port 1 is DOWN"));
  }
  doctor_result_destroy(r);
  doctor_facts_destroy(f);

  /* mlx5_1 active, mlx5_10 down: "mlx5_1:1" would also match mlx5_10. */
  fx("port_down", &p);
  doctor_config cfg2 = {p.sys, p.proc, p.dev, p.lib, NULL, p.ifaddrs, 0, 0, NULL};
  CHECK_EQ_INT(doctor_probe(&cfg2, clean_env, &f), 0);
  if (f == NULL) return;
  snprintf(f->hcas[0].name, sizeof f->hcas[0].name, "mlx5_1");
  snprintf(f->hcas[1].name, sizeof f->hcas[1].name, "mlx5_10");
  CHECK_EQ_INT(doctor_derive(f, &cfg2, clean_env, &r), 0);
  if (r) {
    CHECK_STREQ(doctor_result_get(r, "NCCL_IB_HCA"), "=mlx5_1:1");
    CHECK_STREQ(doctor_result_get(r, "UCX_NET_DEVICES"), "mlx5_1:1");
  }
  doctor_result_destroy(r);
  doctor_facts_destroy(f);

  /* Two RoCE ports whose IPv4 RoCE v2 entries sit at different indices. */
  fx("roce_single", &p);
  doctor_config cfg3 = {p.sys, p.proc, p.dev, p.lib, NULL, p.ifaddrs, 0, 0, NULL};
  CHECK_EQ_INT(doctor_probe(&cfg3, clean_env, &f), 0);
  if (f == NULL) return;
  doctor_hca *h = realloc(f->hcas, 2 * sizeof *h);
  if (h != NULL) {
    f->hcas = h;
    h[1] = h[0];
    snprintf(h[1].name, sizeof h[1].name, "mlx5_1");
    h[1].netdevs = NULL;
    h[1].nnetdevs = 0;
    h[1].nports = 0;
    h[1].ports = calloc(1, sizeof *h[1].ports);
    f->nhcas = 2;
    if (h[1].ports != NULL) {
      h[1].nports = 1;
      h[1].ports[0] = h[0].ports[0];
      h[1].ports[0].gids = calloc(2, sizeof(doctor_gid));
      h[1].ports[0].ngids = h[1].ports[0].gids ? 2 : 0;
      if (h[1].ports[0].gids != NULL) {
        memcpy(h[1].ports[0].gids, h[0].ports[0].gids, 2 * sizeof(doctor_gid));
        h[1].ports[0].gids[1].index = 5;
      }
      CHECK_EQ_INT(doctor_derive(f, &cfg3, clean_env, &r), 0);
      CHECK(r && has_text(r->errors, r->nerrors, "no single GID index"));
      CHECK(r && has_text(r->errors, r->nerrors, "mlx5_0:1 has 1; mlx5_1:1 has 5"));
      doctor_result_destroy(r);
      h[1].ports[0].gids[1].index = 1;
      CHECK_EQ_INT(doctor_derive(f, &cfg3, clean_env, &r), 0);
      if (r) CHECK_STREQ(doctor_result_get(r, "NCCL_IB_GID_INDEX"), "1");
      doctor_result_destroy(r);
    }
  }
  doctor_facts_destroy(f);
}

static void test_summary(void) {
  doctor_summary a = {"ethernet", "mlx5_0:1,mlx5_1:1", 3}, b, c;
  char text[DOCTOR_SUMMARY_MAX], msg[512];
  CHECK_EQ_INT(doctor_summary_format(&a, text, sizeof text), 0);
  CHECK_STREQ(text, "link=ethernet;hca=mlx5_0:1,mlx5_1:1;gid=3");
  CHECK_EQ_INT(doctor_summary_parse(text, &b), 0);
  CHECK_STREQ(b.link, "ethernet");
  CHECK_STREQ(b.hca, "mlx5_0:1,mlx5_1:1");
  CHECK_EQ_INT(b.gid_index, 3);
  CHECK_EQ_INT(doctor_summary_compare("node0", &a, "node1", &b, msg, sizeof msg), 0);
  CHECK_STREQ(msg, "");
  CHECK_EQ_INT(doctor_summary_parse("link=ethernet;hca=mlx5_0:1;gid=5", &c), 0);
  CHECK_EQ_INT(doctor_summary_compare("node0", &a, "node3", &c, msg, sizeof msg), 1);
  CHECK_STREQ(msg, "nodes node0 and node3 differ: HCA set mlx5_0:1,mlx5_1:1 vs mlx5_0:1; "
                   "GID index 3 vs 5");
  CHECK_EQ_INT(doctor_summary_parse("link=none;hca=;gid=none", &c), 0);
  CHECK_EQ_INT(c.gid_index, -1);
  CHECK_EQ_INT(doctor_summary_compare("a", &a, "b", &c, msg, sizeof msg), 1);
  CHECK_STREQ(msg, "nodes a and b differ: link layer ethernet vs none; HCA set "
                   "mlx5_0:1,mlx5_1:1 vs (none); GID index 3 vs none");
  CHECK_EQ_INT(doctor_summary_format(&a, text, 10), -ENOSPC);
  CHECK_EQ_INT(doctor_summary_parse("link=ethernet;hca=x", &c), -EINVAL);
  CHECK_EQ_INT(doctor_summary_parse("link=token;hca=x;gid=1", &c), -EINVAL);
  CHECK_EQ_INT(doctor_summary_parse("link=none;hca=;gid=-2", &c), -EINVAL);
  CHECK_EQ_INT(doctor_summary_parse("link=none;hca=;gid=1;extra=1", &c), -EINVAL);
  CHECK_EQ_INT(doctor_summary_parse("garbage", &c), -EINVAL);
  CHECK_EQ_INT(doctor_summary_compare(NULL, &a, "b", &b, msg, sizeof msg), -EINVAL);
}

static void test_natural_order(void) {
  CHECK(doctor_natural_cmp("mlx5_2", "mlx5_10") < 0);
  CHECK(doctor_natural_cmp("mlx5_10", "mlx5_2") > 0);
  CHECK(doctor_natural_cmp("3", "10") < 0);
  CHECK(doctor_natural_cmp("mlx5_1", "mlx5_1") == 0);
  CHECK(doctor_natural_cmp("mlx5_1", "mlx5_bond_0") < 0);
  CHECK(doctor_natural_cmp("eth1", "eth1.200") < 0);
}

static void test_bad_input(void) {
  doctor_config cfg = {"/nonexistent-sysfs-root", NULL, NULL, NULL, NULL, NULL, 0, 0, NULL};
  doctor_facts *f = (doctor_facts *)1;
  CHECK_EQ_INT(doctor_probe(&cfg, clean_env, &f), -ENOENT);
  CHECK(f == NULL);
  CHECK_EQ_INT(doctor_derive(NULL, NULL, NULL, NULL), -EINVAL);
  doctor_result_destroy(NULL);
  doctor_facts_destroy(NULL);

  /* A malformed address file is reported, not fatal. */
  fx_paths p;
  fx("no_rdma", &p);
  char bad[] = "/tmp/cohort-doctor-ifaddrs-XXXXXX";
  int fd = mkstemp(bad);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK(write(fd, "eth0 not-an-address\n", 20) == 20);
  close(fd);
  doctor_config c2 = {p.sys, p.proc, p.dev, p.lib, NULL, bad, 0, 0, NULL};
  doctor_result *r = NULL;
  CHECK_EQ_INT(doctor_plan(&c2, clean_env, &r), 0);
  CHECK(r && has_text(r->warnings, r->nwarnings, "expected 'IFNAME ADDRESS/PREFIX'"));
  doctor_result_destroy(r);
  unlink(bad);
}

/* A tree whose files hold nonsense: nothing crashes, nothing is invented. */
static void test_garbage_tree(void) {
  char root[] = "/tmp/cohort-doctor-garbage-XXXXXX";
  if (mkdtemp(root) == NULL) {
    CHECK(0);
    return;
  }
  const char *port = "sys/class/infiniband/mlx5_0/ports/1/";
  char rel[256];
#define PORTFILE(name, text)                                                                       \
  do {                                                                                             \
    snprintf(rel, sizeof rel, "%s%s", port, name);                                                 \
    fixture_put(root, rel, text);                                                                  \
  } while (0)
  PORTFILE("state", "garbage\n");
  PORTFILE("phys_state", "\n");
  PORTFILE("rate", "nan Gb/sec\n");
  PORTFILE("link_layer", "Token Ring\n");
  PORTFILE("gids/0", "not-a-gid\n");
  PORTFILE("gids/1", "fe80:0000:0000:0000:0000:0000:0000:0001:ffff\n");
  PORTFILE("gids/x", "fe80::1\n");
  PORTFILE("gids/2", "0000:0000:0000:0000:0000:ffff:0a00:0001\n");
  PORTFILE("gid_attrs/types/2", "RoCE v9\n");
  fixture_put(root, "sys/class/infiniband/mlx5_0/ports/notaport/state", "4: ACTIVE\n");
  fixture_put(root, "sys/class/infiniband/mlx5_1/device/uevent", "PCI_SLOT_NAME=\n");
  fixture_put(root, "sys/class/net/eth0/mtu", "-5\n");
  fixture_put(root, "proc/net/route", "Iface\tDestination\nbogus line\n");
  fixture_put(root, "proc/self/limits", "Max locked memory         lots lots bytes\n");
  fixture_put(root, "proc/meminfo", "HugePages_Total: x\n");
  fixture_put(root, "dev/.keep", "");
  fixture_put(root, "ifaddrs", "eth0 10.0.0.1/24\n");
  char sys[512], proc[512], dev[512], ifa[512];
  snprintf(sys, sizeof sys, "%s/sys", root);
  snprintf(proc, sizeof proc, "%s/proc", root);
  snprintf(dev, sizeof dev, "%s/dev", root);
  snprintf(ifa, sizeof ifa, "%s/ifaddrs", root);
  doctor_config cfg = {sys, proc, dev, root, "10.0.0.2", ifa, 0, 0, NULL};
  doctor_result *r = NULL;
  CHECK_EQ_INT(doctor_plan(&cfg, clean_env, &r), 0);
  if (r != NULL) {
    const doctor_facts *f = r->facts;
    CHECK_EQ_INT(f->nhcas, 2);
    CHECK_EQ_INT(f->hcas[0].nports, 1); /* "notaport" is not a port */
    CHECK_EQ_INT(f->hcas[0].ports[0].state, -1);
    CHECK(f->hcas[0].ports[0].rate_gbps == 0);
    CHECK_EQ_INT(f->hcas[0].ports[0].link, DOCTOR_LINK_UNKNOWN);
    CHECK_EQ_INT(f->hcas[0].ports[0].ngids, 1); /* only gids/2 parses */
    CHECK_EQ_INT(f->hcas[0].ports[0].gids[0].type, DOCTOR_GID_UNKNOWN);
    CHECK_STREQ(f->hcas[1].pci, "");
    CHECK_EQ_INT(f->ifaces[0].mtu, -1);
    CHECK_EQ_INT(f->memlock_known, 0);
    CHECK_EQ_INT(f->shm_known, 0);
    CHECK_STREQ(f->route_iface, "");
    CHECK(has_text(r->errors, r->nerrors, "no route to master 10.0.0.2"));
    CHECK(has_text(r->warnings, r->nwarnings, "/dev/shm is missing"));
    CHECK_STREQ(doctor_result_get(r, "NCCL_IB_DISABLE"), "1");
    char *text = NULL;
    CHECK_EQ_INT(doctor_format_json(r, &text), 0);
    CHECK(text && strstr(text, "\"state\": -1") != NULL);
    free(text);
    CHECK_EQ_INT(doctor_format_report(r, &text), 0);
    free(text);
  }
  doctor_result_destroy(r);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  CHECK_EQ_INT(system(cmd), 0);
}

static void test_export_quoting(void) {
  doctor_var v = {"X", "a'b c$HOME", "a reason\nwith a newline", NULL};
  doctor_result r = {0};
  r.set = &v;
  r.nset = 1;
  char *text = NULL;
  CHECK_EQ_INT(doctor_format_export(&r, &text), 0);
  CHECK_STREQ(text, "# a reason with a newline\nexport X='a'\\''b c$HOME'\n");
  free(text);
}

/* Runs the binary with args and env; returns its exit status (or -1) and
 * its standard output in out (malloc'd). Bounded by a 20 s deadline. */
static int run_cohort(char *const *args, char *const *env, char **out) {
  *out = NULL;
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(pfd[1], 1);
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, 2);
    execve(cohort_bin, args, env);
    _exit(127);
  }
  close(pfd[1]);
  base_buf b = {0};
  int64_t deadline = base_deadline_in(20000);
  for (;;) {
    struct pollfd pf = {pfd[0], POLLIN, 0};
    int left = base_deadline_left(deadline);
    if (left == 0 || poll(&pf, 1, left) <= 0) {
      kill(pid, SIGKILL);
      break;
    }
    char chunk[4096];
    ssize_t n = read(pfd[0], chunk, sizeof chunk);
    if (n <= 0) break;
    base_buf_printf(&b, "%.*s", (int)n, chunk);
  }
  close(pfd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (base_buf_take(&b, out, NULL) != 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int run_fixture(const char *name, const char *mode, const char *extra1, const char *extra2,
                       char *const *env, char **out) {
  fx_paths p;
  fx(name, &p);
  char *args[20];
  int n = 0;
  args[n++] = "cohort";
  args[n++] = "doctor";
  args[n++] = "--sysfs-root";
  args[n++] = p.sys;
  args[n++] = "--proc-root";
  args[n++] = p.proc;
  args[n++] = "--dev-root";
  args[n++] = p.dev;
  args[n++] = "--lib-root";
  args[n++] = p.lib;
  args[n++] = "--ifaddrs";
  args[n++] = p.ifaddrs;
  if (mode) args[n++] = (char *)mode;
  if (extra1) args[n++] = (char *)extra1;
  if (extra2) args[n++] = (char *)extra2;
  args[n] = NULL;
  return run_cohort(args, env ? env : clean_env, out);
}

static void test_binary(void) {
  char *out = NULL;
  CHECK_EQ_INT(run_fixture("roce_bond", "--export", NULL, NULL, NULL, &out), 0);
  CHECK(out && strstr(out, "export NCCL_IB_HCA='mlx5_bond_0:1'\n"));
  CHECK(out && strstr(out, "export NCCL_IB_GID_INDEX='9'\n"));
  CHECK(out && strstr(out, "export NCCL_SOCKET_IFNAME='eth0'\n"));
  CHECK(out && strstr(out, "export UCX_NET_DEVICES='mlx5_bond_0:1'\n"));
  CHECK(out && strstr(out, "NCCL_IB_DISABLE") == NULL);
  free(out);

  CHECK_EQ_INT(run_fixture("roce_bond", "--json", "--master", "10.20.0.1", NULL, &out), 0);
  CHECK(out && strstr(out, "\"name\": \"NCCL_IB_GID_INDEX\", \"value\": \"9\""));
  CHECK(out && strstr(out, "\"master_interface\": \"net1\""));
  CHECK(out && strstr(out, "\"text\": \"link=ethernet;hca=mlx5_bond_0:1;gid=9\""));
  free(out);

  CHECK_EQ_INT(run_fixture("gid_many", "--export", "--set-gid-index", NULL, NULL, &out), 0);
  CHECK(out && strstr(out, "export NCCL_IB_GID_INDEX='3'\n"));
  free(out);
  CHECK_EQ_INT(run_fixture("gid_many", "--export", NULL, NULL, NULL, &out), 0);
  CHECK(out && strstr(out, "NCCL_IB_GID_INDEX") == NULL);
  free(out);
  CHECK_EQ_INT(run_fixture("gid_many", "--json", NULL, NULL, NULL, &out), 0);
  CHECK(out && strstr(out, "\"gid_index\": 3"));
  CHECK(out && strstr(out, "\"version\": \"2.21.5\""));
  free(out);

  CHECK_EQ_INT(run_fixture("roce_single", "--export", NULL, NULL, NULL, &out), 0);
  CHECK(out && strstr(out, "export NCCL_IB_GID_INDEX='1'\n"));
  free(out);

  CHECK_EQ_INT(run_fixture("roce_none", "--json", NULL, NULL, NULL, &out), 1);
  CHECK(out && strstr(out, "\"ok\": false"));
  CHECK(out && strstr(out, "no GID qualifies"));
  CHECK(out && strstr(out, "\"gid_index\": null"));
  free(out);
  CHECK_EQ_INT(run_fixture("roce_none", NULL, NULL, NULL, NULL, &out), 1);
  CHECK(out && strstr(out, "error: mlx5_0 port 1 (RoCE): no GID qualifies"));
  free(out);

  CHECK_EQ_INT(run_fixture("ib_hdr4", "--export", NULL, NULL, NULL, &out), 0);
  CHECK(out && strstr(out, "export NCCL_IB_HCA='mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1'\n"));
  CHECK(out && strstr(out, "export NCCL_SOCKET_IFNAME='eno1'\n"));
  free(out);

  CHECK_EQ_INT(run_fixture("port_down", NULL, NULL, NULL, NULL, &out), 0);
  CHECK(out && strstr(out, "NCCL_IB_HCA=mlx5_0:1\n"));
  CHECK(out && strstr(out, "warning: mlx5_1 port 1 is DOWN"));
  free(out);

  CHECK_EQ_INT(run_fixture("no_rdma", "--export", "--master", "172.16.0.9", NULL, &out), 0);
  CHECK(out && strstr(out, "export NCCL_IB_DISABLE='1'\n"));
  CHECK(out && strstr(out, "export NCCL_SOCKET_IFNAME='=eth1'\n"));
  CHECK(out && strstr(out, "export GLOO_SOCKET_IFNAME='eth1'\n"));
  CHECK(out && strstr(out, "export NCCL_SOCKET_NTHREADS='4'\n"));
  CHECK(out && strstr(out, "export NCCL_NSOCKS_PERTHREAD='8'\n"));
  free(out);

  /* The caller's environment wins. */
  char *env[] = {"PATH=/usr/bin:/bin", "NCCL_SOCKET_IFNAME=eth1", NULL};
  CHECK_EQ_INT(run_fixture("no_rdma", "--export", NULL, NULL, env, &out), 0);
  CHECK(out && strstr(out, "NCCL_SOCKET_IFNAME") == NULL);
  CHECK(out && strstr(out, "export GLOO_SOCKET_IFNAME='eth0'\n"));
  free(out);
  CHECK_EQ_INT(run_fixture("no_rdma", NULL, NULL, NULL, env, &out), 0);
  CHECK(out && strstr(out, "Kept as you set them\n  NCCL_SOCKET_IFNAME=eth1\n"));
  free(out);

  /* Usage errors exit 2; --help exits 0. */
  CHECK_EQ_INT(run_fixture("no_rdma", "--bogus", NULL, NULL, NULL, &out), 2);
  free(out);
  CHECK_EQ_INT(run_fixture("no_rdma", "--export", "--json", NULL, NULL, &out), 2);
  free(out);
  CHECK_EQ_INT(run_fixture("no_rdma", "--master", NULL, NULL, NULL, &out), 2);
  free(out);
  char *a1[] = {"cohort", "doctor", "--sysfs-root", "/nonexistent-root", NULL};
  CHECK_EQ_INT(run_cohort(a1, clean_env, &out), 2);
  free(out);
  char *a2[] = {"cohort", "doctor", "--help", NULL};
  CHECK_EQ_INT(run_cohort(a2, clean_env, &out), 0);
  CHECK(out && strstr(out, "usage: cohort doctor"));
  free(out);
}

/* Whether this machine has an ACTIVE RDMA port (then the real-machine test
 * expects NCCL_IB_HCA instead of NCCL_IB_DISABLE). */
static int real_active_ports(void) {
  doctor_facts *f = NULL;
  if (doctor_probe(NULL, clean_env, &f) != 0) return -1;
  int n = 0;
  for (size_t i = 0; i < f->nhcas; i++)
    for (size_t p = 0; p < f->hcas[i].nports; p++) n += f->hcas[i].ports[p].state == 4;
  doctor_facts_destroy(f);
  return n;
}

static void test_real_machine(void) {
  int active = real_active_ports();
  CHECK(active >= 0);
  doctor_result *r = NULL;
  doctor_config cfg = {0};
  cfg.master = "127.0.0.1";
  CHECK_EQ_INT(doctor_plan(&cfg, clean_env, &r), 0);
  if (r == NULL) return;
  if (active == 0) {
    CHECK_STREQ(doctor_result_get(r, "NCCL_IB_DISABLE"), "1");
    CHECK_STREQ(r->summary.link, "none");
  } else {
    CHECK(doctor_result_get(r, "NCCL_IB_HCA") != NULL);
  }
  /* Loopback is reached through lo (the UDP connect() probe says so), but a
   * loopback master is this node: sockets take the default route's
   * interface when there is one. */
  CHECK_STREQ(r->facts->route_iface, "lo");
  CHECK_STREQ(r->facts->master_addr, "127.0.0.1");
  CHECK_STREQ(doctor_result_get(r, "NCCL_SOCKET_IFNAME"),
              r->facts->default_iface[0] ? r->facts->default_iface : "lo");
  CHECK(r->facts->memlock_known);
  CHECK(r->facts->nifaces >= 1);
  char *text = NULL;
  CHECK_EQ_INT(doctor_format_report(r, &text), 0);
  CHECK(text && strstr(text, "summary: link="));
  free(text);
  doctor_result_destroy(r);

  char *out = NULL;
  char *args[] = {"cohort", "doctor", "--export", NULL};
  CHECK_EQ_INT(run_cohort(args, clean_env, &out), 0);
  if (active == 0) CHECK(out && strstr(out, "export NCCL_IB_DISABLE='1'\n"));
  free(out);
  char *args2[] = {"cohort", "doctor", NULL};
  CHECK_EQ_INT(run_cohort(args2, clean_env, &out), 0);
  if (active == 0) CHECK(out && strstr(out, "NCCL_IB_DISABLE=1\n"));
  free(out);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: test_doctor FIXTURES_DIR COHORT_BINARY\n");
    return 2;
  }
  fixtures = argv[1];
  cohort_bin = argv[2];
  test_roce_bond();
  test_gid_many();
  test_roce_single_and_none();
  test_ib_and_port_down();
  test_no_rdma();
  test_nccl_if_needed();
  test_gpus();
  test_user_settings();
  test_derive_edits();
  test_summary();
  test_natural_order();
  test_bad_input();
  test_export_quoting();
  test_garbage_tree();
  test_binary();
  test_real_machine();
  return check_report();
}

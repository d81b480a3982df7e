/*
 * check.c - the verdicts of `cohort doctor --check`: each check looks at the
 * probed facts and the job's environment and says ok, n/a, warn or fail,
 * with one line that names what it found. docs/doctor.md lists the checks
 * and the failure each one stands for. A pure function of its inputs.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/base.h"
#include "doctor/internal.h"

#define PORT_ACTIVE 4

typedef struct check_ctx {
  const doctor_facts *f;
  char **envp;
  doctor_result *r;
  int rc;
} check_ctx;

static void verdict(check_ctx *c, const char *name, doctor_check_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void verdict(check_ctx *c, const char *name, doctor_check_status st, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  /* Facts come from files and the environment: keep the verdict one line. */
  for (char *p = line; *p; p++)
    if (iscntrl((unsigned char)*p)) *p = ' ';
  doctor_check *p = realloc(c->r->checks, (c->r->nchecks + 1) * sizeof *p);
  char *detail = strdup(line);
  if (p != NULL) c->r->checks = p;
  if (p == NULL || detail == NULL) {
    free(detail);
    if (c->rc == 0) c->rc = -ENOMEM;
    return;
  }
  p[c->r->nchecks++] = (doctor_check){name, st, detail};
}

/* A user's value as a verdict shows it: control characters out, at most 60 bytes. */
static void shown(const char *v, char *out, size_t len) {
  size_t k = 0;
  for (; *v && k + 4 < len && k < 60; v++) out[k++] = iscntrl((unsigned char)*v) ? '?' : *v;
  if (*v) out[k++] = '.', out[k++] = '.', out[k++] = '.';
  out[k] = '\0';
}

/* "major.minor.patch" compared as numbers, part by part. */
static int version_cmp(const char *a, const char *b) {
  while (*a || *b) {
    long x = strtol(a, (char **)&a, 10), y = strtol(b, (char **)&b, 10);
    if (x != y) return x < y ? -1 : 1;
    if (*a == '.') a++;
    if (*b == '.') b++;
    if ((*a && !isdigit((unsigned char)*a)) || (*b && !isdigit((unsigned char)*b)))
      return strcmp(a, b);
  }
  return 0;
}

static int user_disabled_ib(const check_ctx *c) {
  const char *v = doctor_env_get(c->envp, "NCCL_IB_DISABLE");
  return v != NULL && strcmp(v, "1") == 0;
}

static size_t active_ports(const doctor_facts *f) {
  size_t n = 0;
  for (size_t i = 0; i < f->nhcas; i++)
    for (size_t p = 0; p < f->hcas[i].nports; p++) n += f->hcas[i].ports[p].state == PORT_ACTIVE;
  return n;
}

/* gpu-driver: the kernel module tells its version, and libcuda is the same one. */
static void check_gpu_driver(check_ctx *c) {
  const doctor_facts *f = c->f;
  const char *n = "gpu-driver";
  if (strcmp(f->gpu_vendor, "nvidia") != 0) {
    verdict(c, n, DOCTOR_CHECK_NA, "%s",
            f->gpus_found ? "no NVIDIA GPU (AMD's driver is not checked)" : "no GPU found");
    return;
  }
  if (f->driver[0] == '\0') {
    verdict(c, n, DOCTOR_CHECK_FAIL,
            "%d NVIDIA GPU(s) but driver/nvidia/version under the proc root gives no version: "
            "the kernel module is not loaded (or /proc is not the host's), and CUDA cannot start",
            f->gpus_found);
    return;
  }
  if (f->cuda_lib[0] == '\0') {
    verdict(c, n, DOCTOR_CHECK_WARN,
            "driver %s, but no libcuda.so.1 in LD_LIBRARY_PATH or the system's library "
            "directories: a container started without the NVIDIA runtime (--gpus) has no CUDA",
            f->driver);
    return;
  }
  if (f->cuda_lib_version[0] == '\0') {
    verdict(c, n, DOCTOR_CHECK_WARN, "driver %s; %s does not tell its version in its file name",
            f->driver, f->cuda_lib);
    return;
  }
  int cmp = version_cmp(f->cuda_lib_version, f->driver);
  if (strstr(f->cuda_lib, "/compat/") != NULL) {
    /* CUDA's forward-compatibility package: a newer libcuda over an older module. */
    verdict(c, n, cmp >= 0 ? DOCTOR_CHECK_OK : DOCTOR_CHECK_FAIL,
            "driver %s with the forward-compatibility libcuda %s (%s)%s", f->driver,
            f->cuda_lib_version, f->cuda_lib,
            cmp >= 0 ? "" : ": older than the kernel module, which CUDA refuses");
    return;
  }
  if (cmp != 0)
    verdict(c, n, DOCTOR_CHECK_FAIL,
            "kernel module %s but libcuda %s (%s): CUDA cannot start and nvidia-smi says "
            "'Driver/library version mismatch' (a driver upgraded without reloading the module, "
            "or a container given another driver's libraries)",
            f->driver, f->cuda_lib_version, f->cuda_lib);
  else
    verdict(c, n, DOCTOR_CHECK_OK, "driver %s, libcuda the same (%s)", f->driver, f->cuda_lib);
}

/* gpu-visible: CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES) names GPUs the node has. */
static void check_gpu_visible(check_ctx *c) {
  const doctor_facts *f = c->f;
  const char *n = "gpu-visible";
  if (f->gpus_found == 0) {
    verdict(c, n, DOCTOR_CHECK_NA, "no GPU found");
    return;
  }
  if (f->gpu_visible_var[0] == '\0') {
    verdict(c, n, DOCTOR_CHECK_OK, "%d GPU(s), all visible", f->gpus_found);
    return;
  }
  const char *v = doctor_env_get(c->envp, f->gpu_visible_var);
  char val[72];
  shown(v ? v : "", val, sizeof val);
  size_t entries = 0;
  for (const char *p = v ? v : ""; *p;) {
    size_t l = strcspn(p, ",");
    entries += l > 0;
    p += l;
    if (*p == ',') p++;
  }
  if (f->ngpus == 0)
    verdict(c, n, DOCTOR_CHECK_FAIL, "%s='%s' selects none of the %d GPU(s): CUDA sees no device",
            f->gpu_visible_var, val, f->gpus_found);
  else if (f->ngpus < entries)
    verdict(c, n, DOCTOR_CHECK_FAIL,
            "%s='%s' lists %zu GPUs but selects %zu of the %d: CUDA drops the entries from the "
            "first that names no GPU or repeats one",
            f->gpu_visible_var, val, entries, f->ngpus, f->gpus_found);
  else
    verdict(c, n, DOCTOR_CHECK_OK, "%s='%s' selects %zu of the %d GPU(s)", f->gpu_visible_var, val,
            f->ngpus, f->gpus_found);
}

/* nccl-library: NVIDIA GPUs need NCCL for torch.distributed's nccl backend. */
static void check_nccl_library(check_ctx *c) {
  const doctor_facts *f = c->f;
  const char *n = "nccl-library";
  if (strcmp(f->gpu_vendor, "nvidia") != 0) {
    verdict(c, n, DOCTOR_CHECK_NA, "%s",
            f->gpus_found ? "AMD GPUs: RCCL is not looked for" : "no GPU: NCCL is not needed");
    return;
  }
  if (!f->nccl_found) {
    verdict(c, n, DOCTOR_CHECK_FAIL,
            "%d NVIDIA GPU(s) but no NCCL: none in the system's library directories, "
            "LD_LIBRARY_PATH or the Python environments on PATH (pip's nvidia-nccl wheel), so "
            "the nccl backend cannot start",
            f->gpus_found);
    return;
  }
  if (f->nccl_major < 0)
    verdict(c, n, DOCTOR_CHECK_OK, "NCCL of unknown version (%s)", f->nccl_path);
  else if (f->nccl_patch < 0)
    verdict(c, n, DOCTOR_CHECK_OK, "NCCL %d.%d (%s)", f->nccl_major, f->nccl_minor, f->nccl_path);
  else
    verdict(c, n, DOCTOR_CHECK_OK, "NCCL %d.%d.%d (%s)", f->nccl_major, f->nccl_minor,
            f->nccl_patch, f->nccl_path);
}

/* rdma-devices: the HCAs in sysfs can be opened (/dev/infiniband/uverbs*). */
static void check_rdma_devices(check_ctx *c) {
  const doctor_facts *f = c->f;
  const char *n = "rdma-devices";
  if (f->nhcas == 0 || user_disabled_ib(c)) {
    verdict(c, n, DOCTOR_CHECK_NA, "%s",
            f->nhcas == 0 ? "no RDMA device" : "NCCL_IB_DISABLE=1: RDMA is not used");
    return;
  }
  if (!f->dev_infiniband || f->uverbs_count == 0)
    verdict(c, n, DOCTOR_CHECK_FAIL,
            "%zu RDMA device(s) in sysfs but %s: NCCL cannot open them and falls back to TCP "
            "(a container started without --device=/dev/infiniband)",
            f->nhcas,
            f->dev_infiniband ? "no uverbs file in /dev/infiniband" : "no /dev/infiniband");
  else if ((size_t)f->uverbs_count < f->nhcas)
    verdict(c, n, DOCTOR_CHECK_WARN,
            "%zu RDMA devices but %d uverbs file(s) in /dev/infiniband: NCCL can open only the "
            "devices given to this container",
            f->nhcas, f->uverbs_count);
  else
    verdict(c, n, DOCTOR_CHECK_OK, "%zu RDMA device(s), %d uverbs file(s)", f->nhcas,
            f->uverbs_count);
}

/* rdma-ports: some RDMA port is ACTIVE, else NCCL silently uses TCP. */
static void check_rdma_ports(check_ctx *c) {
  const doctor_facts *f = c->f;
  const char *n = "rdma-ports";
  if (f->nhcas == 0 || user_disabled_ib(c)) {
    verdict(c, n, DOCTOR_CHECK_NA, "%s",
            f->nhcas == 0 ? "no RDMA device" : "NCCL_IB_DISABLE=1: RDMA is not used");
    return;
  }
  base_buf down = {0};
  size_t total = 0, act = active_ports(f);
  for (size_t i = 0; i < f->nhcas; i++)
    for (size_t p = 0; p < f->hcas[i].nports; p++) {
      const doctor_port *pt = &f->hcas[i].ports[p];
      total++;
      if (pt->state != PORT_ACTIVE)
        base_buf_printf(&down, "%s%s:%d %s", down.len ? ", " : "", f->hcas[i].name, pt->num,
                        pt->state_name[0] ? pt->state_name : "unreadable");
    }
  const char *d = down.oom || down.data == NULL ? "" : down.data;
  if (act == 0)
    verdict(c, n, DOCTOR_CHECK_FAIL,
            "none of the %zu port(s) of %zu RDMA device(s) is ACTIVE (%s): NCCL falls back to "
            "TCP sockets",
            total, f->nhcas, total ? d : "no port in sysfs");
  else
    verdict(c, n, DOCTOR_CHECK_OK, "%zu of %zu port(s) ACTIVE%s%s%s", act, total, d[0] ? " (" : "",
            d, d[0] ? " left out)" : "");
  free(down.data);
}

static void format_size(uint64_t v, char *out, size_t len) {
  if (v >= (1ull << 30))
    snprintf(out, len, "%.1f GiB", (double)v / (double)(1ull << 30));
  else if (v >= (1ull << 20))
    snprintf(out, len, "%.1f MiB", (double)v / (double)(1ull << 20));
  else
    snprintf(out, len, "%llu KiB", (unsigned long long)(v >> 10));
}

/* memlock: with RDMA in use, pinned buffers must never hit the limit. */
static void check_memlock(check_ctx *c) {
  const doctor_facts *f = c->f;
  const char *n = "memlock";
  if (active_ports(f) == 0 || user_disabled_ib(c)) {
    verdict(c, n, DOCTOR_CHECK_NA, "no ACTIVE RDMA port in use: nothing is pinned for RDMA");
    return;
  }
  char lim[32], mem[32];
  if (!f->memlock_known) {
    verdict(c, n, DOCTOR_CHECK_WARN, "the locked-memory limit could not be read");
    return;
  }
  if (f->memlock_unlimited) {
    verdict(c, n, DOCTOR_CHECK_OK, "locked memory unlimited");
    return;
  }
  format_size(f->memlock_bytes, lim, sizeof lim);
  if (f->mem_total_known && f->memlock_bytes >= f->mem_total_bytes) {
    format_size(f->mem_total_bytes, mem, sizeof mem);
    verdict(c, n, DOCTOR_CHECK_OK, "locked memory %s, not below the node's %s", lim, mem);
    return;
  }
  if (f->mem_total_known)
    format_size(f->mem_total_bytes, mem, sizeof mem);
  else
    snprintf(mem, sizeof mem, "(unknown)");
  verdict(c, n, DOCTOR_CHECK_FAIL,
          "locked memory limited to %s, below the node's memory %s: RDMA registration fails "
          "once NCCL's pinned buffers reach it; ulimit -l unlimited (docker --ulimit memlock=-1, "
          "LimitMEMLOCK=infinity)",
          lim, mem);
}

/* gpu-hca-numa: each GPU has an ACTIVE HCA on its NUMA node. */
static void check_gpu_hca_numa(check_ctx *c) {
  const doctor_facts *f = c->f;
  const char *n = "gpu-hca-numa";
  if (f->ngpus == 0 || active_ports(f) == 0 || user_disabled_ib(c)) {
    verdict(c, n, DOCTOR_CHECK_NA, "%s",
            f->ngpus == 0 ? "no visible GPU" : "no ACTIVE RDMA port in use");
    return;
  }
  base_buf far = {0}, hcas = {0};
  for (size_t i = 0; i < f->nhcas; i++) {
    int active = 0;
    for (size_t p = 0; p < f->hcas[i].nports; p++)
      active |= f->hcas[i].ports[p].state == PORT_ACTIVE;
    if (active)
      base_buf_printf(&hcas, "%s%s node %d", hcas.len ? ", " : "", f->hcas[i].name,
                      f->hcas[i].numa < 0 ? 0 : f->hcas[i].numa);
  }
  size_t nfar = 0;
  for (size_t g = 0; g < f->ngpus; g++) {
    int near = 0;
    for (size_t i = 0; i < f->nhcas && !near; i++) {
      int numa = f->hcas[i].numa < 0 ? 0 : f->hcas[i].numa; /* -1 read as 0, as for GPUs */
      for (size_t p = 0; p < f->hcas[i].nports; p++)
        near |= f->hcas[i].ports[p].state == PORT_ACTIVE && numa == f->gpus[g].numa;
    }
    if (near) continue;
    nfar++;
    base_buf_printf(&far, "%sGPU %zu (%s) on node %d", far.len ? ", " : "", g,
                    f->gpus[g].pci[0] ? f->gpus[g].pci : "pci ?", f->gpus[g].numa);
  }
  if (far.oom || hcas.oom)
    c->rc = -ENOMEM;
  else if (nfar > 0)
    verdict(c, n, DOCTOR_CHECK_WARN,
            "%s: no ACTIVE HCA on the same NUMA node (%s); NCCL does not use GPUDirect RDMA across "
            "the CPU interconnect by default, so that traffic is staged through host memory",
            far.data, hcas.data);
  else
    verdict(c, n, DOCTOR_CHECK_OK,
            "each of the %zu visible GPU(s) has an ACTIVE HCA on its NUMA "
            "node (%s)",
            f->ngpus, hcas.data);
  free(far.data);
  free(hcas.data);
}

/* The entries of an NCCL-style list: "^" excludes, "=" matches exactly. */
typedef struct name_list {
  char copy[512];
  int exclude, exact;
} name_list;

static char *list_open(name_list *l, const char *spec) {
  base_strlcpy(l->copy, spec, sizeof l->copy);
  char *s = l->copy;
  l->exclude = *s == '^';
  s += l->exclude;
  l->exact = *s == '=';
  return s + l->exact;
}

/* nccl-ib-hca: every entry of the user's NCCL_IB_HCA names a device (and port) the node has. */
static void check_nccl_ib_hca(check_ctx *c) {
  const doctor_facts *f = c->f;
  const char *n = "nccl-ib-hca", *spec = doctor_env_get(c->envp, "NCCL_IB_HCA");
  if (spec == NULL) {
    verdict(c, n, DOCTOR_CHECK_NA, "NCCL_IB_HCA not set");
    return;
  }
  char val[72];
  shown(spec, val, sizeof val);
  name_list l;
  base_buf bad = {0}, have = {0};
  for (size_t i = 0; i < f->nhcas; i++)
    base_buf_printf(&have, "%s%s", have.len ? ", " : "", f->hcas[i].name);
  char *save = NULL;
  for (char *e = strtok_r(list_open(&l, spec), ",", &save); e; e = strtok_r(NULL, ",", &save)) {
    char *colon = strchr(e, ':');
    int port = -1, dev = 0, port_ok = 0;
    if (colon != NULL) {
      *colon = '\0';
      if (base_parse_int(colon + 1, 0, 65535, &port) != 0) port = -2;
    }
    for (size_t i = 0; i < f->nhcas; i++) {
      const char *h = f->hcas[i].name;
      if (e[0] == '\0' || (l.exact ? strcmp(h, e) != 0 : strncmp(h, e, strlen(e)) != 0)) continue;
      dev = 1;
      for (size_t p = 0; p < f->hcas[i].nports; p++) port_ok |= f->hcas[i].ports[p].num == port;
    }
    if (!dev)
      base_buf_printf(&bad, "%s'%s' names no RDMA device", bad.len ? "; " : "", e);
    else if (port != -1 && !port_ok)
      base_buf_printf(&bad, "%s'%s' has no port %s", bad.len ? "; " : "", e, colon + 1);
  }
  if (bad.oom || have.oom)
    c->rc = -ENOMEM;
  else if (bad.len > 0)
    verdict(c, n, l.exclude ? DOCTOR_CHECK_WARN : DOCTOR_CHECK_FAIL,
            "NCCL_IB_HCA='%s': %s (the node has %s)%s", val, bad.data,
            have.len ? have.data : "no RDMA device",
            l.exclude ? "" : ": NCCL leaves those out, and with none left uses TCP sockets");
  else
    verdict(c, n, DOCTOR_CHECK_OK, "NCCL_IB_HCA='%s': every entry names a device the node has",
            val);
  free(bad.data);
  free(have.data);
}

static const doctor_gid *gid_at(const doctor_port *p, int index) {
  for (size_t i = 0; i < p->ngids; i++)
    if (p->gids[i].index == index) return &p->gids[i];
  return NULL;
}

/* nccl-ib-gid-index: the user's index is a RoCE v2 entry on every ACTIVE RoCE port NCCL uses. */
static void check_nccl_gid(check_ctx *c) {
  const doctor_facts *f = c->f;
  const char *n = "nccl-ib-gid-index", *v = doctor_env_get(c->envp, "NCCL_IB_GID_INDEX");
  const char *hca = doctor_env_get(c->envp, "NCCL_IB_HCA");
  if (v == NULL) {
    verdict(c, n, DOCTOR_CHECK_NA, "NCCL_IB_GID_INDEX not set");
    return;
  }
  char val[72];
  shown(v, val, sizeof val);
  int idx = -1, roce = 0;
  int number = base_parse_int(v, 0, 65535, &idx) == 0;
  base_buf bad = {0};
  doctor_check_status st = DOCTOR_CHECK_OK;
  for (size_t i = 0; i < f->nhcas; i++)
    for (size_t p = 0; p < f->hcas[i].nports; p++) {
      const doctor_port *pt = &f->hcas[i].ports[p];
      if (pt->state != PORT_ACTIVE || pt->link != DOCTOR_LINK_ETH ||
          !doctor_hca_selected(hca, f->hcas[i].name, pt->num))
        continue;
      roce++;
      const doctor_gid *g = number ? gid_at(pt, idx) : NULL;
      if (number && g != NULL && g->type == DOCTOR_GID_ROCE_V2) continue;
      if (number && g != NULL && st == DOCTOR_CHECK_OK) st = DOCTOR_CHECK_WARN;
      if (number && g == NULL) st = DOCTOR_CHECK_FAIL;
      if (number)
        base_buf_printf(&bad, "%s%s:%d %s", bad.len ? ", " : "", f->hcas[i].name, pt->num,
                        g == NULL ? "has no entry there" : "has RoCE v1 there (not routable)");
    }
  if (roce == 0) {
    verdict(c, n, DOCTOR_CHECK_NA, "NCCL_IB_GID_INDEX set, but no ACTIVE RoCE port is in use");
  } else if (!number) {
    verdict(c, n, DOCTOR_CHECK_FAIL,
            "NCCL_IB_GID_INDEX='%s' is not one number (what the GID one-liner in circulation "
            "leaves with one or more than ten matches): NCCL cannot use it",
            val);
  } else if (bad.oom) {
    c->rc = -ENOMEM;
  } else if (st != DOCTOR_CHECK_OK) {
    verdict(c, n, st, "NCCL_IB_GID_INDEX=%d: %s%s", idx, bad.data,
            st == DOCTOR_CHECK_FAIL ? ": NCCL fails to create its queue pairs" : "");
  } else {
    verdict(c, n, DOCTOR_CHECK_OK, "NCCL_IB_GID_INDEX=%d is RoCE v2 on the %d ACTIVE RoCE port(s)",
            idx, roce);
  }
  free(bad.data);
}

static const doctor_iface *iface_named(const doctor_facts *f, const char *name, int exact) {
  for (size_t i = 0; i < f->nifaces; i++)
    if (f->ifaces[i].naddrs > 0 && (exact ? strcmp(f->ifaces[i].name, name) == 0
                                          : strncmp(f->ifaces[i].name, name, strlen(name)) == 0))
      return &f->ifaces[i];
  return NULL;
}

/* NCCL_SOCKET_IFNAME: what of its entries names no interface with an address, into bad;
 * returns the number of interfaces it selects. */
static size_t nccl_ifname(const doctor_facts *f, const char *spec, base_buf *bad) {
  name_list l;
  size_t selected = 0;
  char *save = NULL;
  char *s = list_open(&l, spec);
  for (char *e = strtok_r(s, ",", &save); e; e = strtok_r(NULL, ",", &save))
    if (!l.exclude && iface_named(f, e, l.exact) == NULL)
      base_buf_printf(bad, "%s'%s' names no interface with an address", bad->len ? "; " : "", e);
  for (size_t i = 0; i < f->nifaces; i++) {
    if (f->ifaces[i].naddrs == 0) continue;
    int match = 0;
    base_strlcpy(l.copy, spec, sizeof l.copy);
    save = NULL;
    for (char *e = strtok_r(l.copy + l.exclude + l.exact, ",", &save); e && !match;
         e = strtok_r(NULL, ",", &save))
      match = l.exact ? strcmp(f->ifaces[i].name, e) == 0
                      : strncmp(f->ifaces[i].name, e, strlen(e)) == 0;
    selected += l.exclude ? !match : match;
  }
  return selected;
}

/* nccl-socket-ifname: NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME name interfaces that have an
 * address here. */
static void check_socket_ifname(check_ctx *c) {
  const doctor_facts *f = c->f;
  const char *n = "nccl-socket-ifname";
  const char *nccl = doctor_env_get(c->envp, "NCCL_SOCKET_IFNAME");
  const char *gloo = doctor_env_get(c->envp, "GLOO_SOCKET_IFNAME");
  if (nccl == NULL && gloo == NULL) {
    verdict(c, n, DOCTOR_CHECK_NA, "neither NCCL_SOCKET_IFNAME nor GLOO_SOCKET_IFNAME is set");
    return;
  }
  base_buf bad = {0}, have = {0};
  doctor_check_status st = DOCTOR_CHECK_OK;
  char val[72];
  if (nccl != NULL) {
    base_buf nb = {0};
    size_t sel = nccl_ifname(f, nccl, &nb);
    shown(nccl, val, sizeof val);
    if (sel == 0)
      base_buf_printf(&bad, "NCCL_SOCKET_IFNAME='%s' selects no interface with an address", val);
    else if (nb.len > 0)
      base_buf_printf(&bad, "NCCL_SOCKET_IFNAME='%s': %s", val, nb.data);
    if (sel == 0 || nb.len > 0) st = sel == 0 ? DOCTOR_CHECK_FAIL : DOCTOR_CHECK_WARN;
    bad.oom |= nb.oom;
    free(nb.data);
  }
  if (gloo != NULL) {
    /* Gloo takes a comma list of exact names and fails on one it cannot find. */
    char copy[512], *save = NULL;
    base_strlcpy(copy, gloo, sizeof copy);
    for (char *e = strtok_r(copy, ",", &save); e; e = strtok_r(NULL, ",", &save))
      if (iface_named(f, e, 1) == NULL) {
        shown(e, val, sizeof val);
        base_buf_printf(&bad, "%sGLOO_SOCKET_IFNAME: '%s' is no interface with an address",
                        bad.len ? "; " : "", val);
        st = DOCTOR_CHECK_FAIL;
      }
  }
  for (size_t i = 0; i < f->nifaces; i++)
    if (f->ifaces[i].naddrs > 0)
      base_buf_printf(&have, "%s%s", have.len ? ", " : "", f->ifaces[i].name);
  if (bad.oom || have.oom)
    c->rc = -ENOMEM;
  else if (st != DOCTOR_CHECK_OK)
    verdict(c, n, st, "%s (interfaces with an address: %s)%s", bad.data,
            have.len ? have.data : "none",
            st == DOCTOR_CHECK_FAIL ? ": the job fails at its first collective's set-up" : "");
  else
    verdict(c, n, DOCTOR_CHECK_OK, "%s%s%s name interfaces with an address",
            nccl ? "NCCL_SOCKET_IFNAME" : "", nccl && gloo ? " and " : "",
            gloo ? "GLOO_SOCKET_IFNAME" : "");
  free(bad.data);
  free(have.data);
}

/* settings: the derivation itself found no error (RoCE without a usable GID, no route to the
 * master). */
static void check_settings(check_ctx *c) {
  const doctor_result *r = c->r;
  if (r->nerrors == 0) {
    verdict(c, "settings", DOCTOR_CHECK_OK, "%zu setting(s) derived without error", r->nset);
    return;
  }
  base_buf b = {0};
  for (size_t i = 0; i < r->nerrors; i++) base_buf_printf(&b, "%s%s", i ? "; " : "", r->errors[i]);
  if (b.oom)
    c->rc = -ENOMEM;
  else
    verdict(c, "settings", DOCTOR_CHECK_FAIL, "%s", b.data);
  free(b.data);
}

int doctor_checks(const doctor_facts *f, char **envp, doctor_result *r) {
  check_ctx c = {f, envp, r, 0};
  check_gpu_driver(&c);
  check_gpu_visible(&c);
  check_nccl_library(&c);
  check_rdma_devices(&c);
  check_rdma_ports(&c);
  check_memlock(&c);
  check_gpu_hca_numa(&c);
  check_nccl_ib_hca(&c);
  check_nccl_gid(&c);
  check_socket_ifname(&c);
  check_settings(&c);
  return c.rc;
}

const char *doctor_check_status_name(doctor_check_status status) {
  switch (status) {
  case DOCTOR_CHECK_OK:
    return "ok";
  case DOCTOR_CHECK_NA:
    return "n/a";
  case DOCTOR_CHECK_WARN:
    return "warn";
  default:
    return "fail";
  }
}

size_t doctor_checks_failed(const doctor_result *r) {
  size_t n = 0;
  for (size_t i = 0; r != NULL && i < r->nchecks; i++)
    n += r->checks[i].status == DOCTOR_CHECK_FAIL;
  return n;
}

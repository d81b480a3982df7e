/*
 * format.c - renderings of a doctor result (report, shell exports, the
 * checks' verdicts, JSON with jansson) and the compact summary agents
 * exchange across nodes.
 */
#include "doctor/doctor.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/base.h"
#include "doctor/internal.h"

const char *doctor_link_name(doctor_link link) {
  switch (link) {
  case DOCTOR_LINK_IB:
    return "infiniband";
  case DOCTOR_LINK_ETH:
    return "ethernet";
  default:
    return "unknown";
  }
}

const char *doctor_gid_type_name(doctor_gid_type type) {
  switch (type) {
  case DOCTOR_GID_IB_ROCE_V1:
    return "IB/RoCE v1";
  case DOCTOR_GID_ROCE_V2:
    return "RoCE v2";
  default:
    return "unknown";
  }
}

/* ---- summary ---------------------------------------------------------- */

int doctor_summary_format(const doctor_summary *s, char *buf, size_t len) {
  if (s == NULL || buf == NULL) return -EINVAL;
  char gid[16];
  if (s->gid_index >= 0)
    snprintf(gid, sizeof gid, "%d", s->gid_index);
  else
    snprintf(gid, sizeof gid, "none");
  int n = snprintf(buf, len, "link=%s;hca=%s;gid=%s", s->link, s->hca, gid);
  if (n < 0 || (size_t)n >= len) return -ENOSPC;
  return 0;
}

int doctor_summary_parse(const char *text, doctor_summary *out) {
  if (text == NULL || out == NULL) return -EINVAL;
  doctor_summary s = {.gid_index = -1};
  int seen = 0;
  const char *p = text;
  while (*p != '\0') {
    size_t l = strcspn(p, ";");
    const char *eq = memchr(p, '=', l);
    if (eq == NULL) return -EINVAL;
    size_t kl = (size_t)(eq - p), vl = l - kl - 1;
    const char *v = eq + 1;
    if (kl == 4 && memcmp(p, "link", 4) == 0) {
      if (vl >= sizeof s.link) return -EINVAL;
      memcpy(s.link, v, vl);
      s.link[vl] = '\0';
      if (strcmp(s.link, "infiniband") != 0 && strcmp(s.link, "ethernet") != 0 &&
          strcmp(s.link, "mixed") != 0 && strcmp(s.link, "none") != 0)
        return -EINVAL;
      seen |= 1;
    } else if (kl == 3 && memcmp(p, "hca", 3) == 0) {
      if (vl >= sizeof s.hca) return -EINVAL;
      memcpy(s.hca, v, vl);
      s.hca[vl] = '\0';
      seen |= 2;
    } else if (kl == 3 && memcmp(p, "gid", 3) == 0) {
      char num[16];
      if (vl >= sizeof num) return -EINVAL;
      memcpy(num, v, vl);
      num[vl] = '\0';
      if (strcmp(num, "none") == 0)
        s.gid_index = -1;
      else if (base_parse_int(num, 0, 65535, &s.gid_index) != 0)
        return -EINVAL;
      seen |= 4;
    } else {
      return -EINVAL;
    }
    p += l;
    if (*p == ';') p++;
  }
  if (seen != 7) return -EINVAL;
  *out = s;
  return 0;
}

int doctor_summary_compare(const char *name_a, const doctor_summary *a, const char *name_b,
                           const doctor_summary *b, char *warning, size_t len) {
  if (name_a == NULL || a == NULL || name_b == NULL || b == NULL) return -EINVAL;
  base_buf d = {0};
  if (strcmp(a->link, b->link) != 0)
    base_buf_printf(&d, "%slink layer %s vs %s", d.len ? "; " : "", a->link, b->link);
  if (strcmp(a->hca, b->hca) != 0)
    base_buf_printf(&d, "%sHCA set %s vs %s", d.len ? "; " : "", a->hca[0] ? a->hca : "(none)",
                    b->hca[0] ? b->hca : "(none)");
  if (a->gid_index != b->gid_index) {
    char ga[16], gb[16];
    snprintf(ga, sizeof ga, "%d", a->gid_index);
    snprintf(gb, sizeof gb, "%d", b->gid_index);
    base_buf_printf(&d, "%sGID index %s vs %s", d.len ? "; " : "", a->gid_index >= 0 ? ga : "none",
                    b->gid_index >= 0 ? gb : "none");
  }
  int differ = d.len > 0;
  if (warning != NULL && len > 0) {
    if (differ)
      snprintf(warning, len, "nodes %s and %s differ: %s", name_a, name_b,
               d.oom ? "(out of memory)" : d.data);
    else
      warning[0] = '\0';
  }
  free(d.data);
  return differ;
}

/* ---- helpers ---------------------------------------------------------- */

static void addr_str(const doctor_addr *a, char *out, size_t len) {
  char t[INET6_ADDRSTRLEN];
  inet_ntop(a->family, a->addr, t, sizeof t);
  snprintf(out, len, "%s/%d", t, a->prefix);
}

static void gid_str(const doctor_gid *g, char *out, size_t len) {
  inet_ntop(AF_INET6, g->raw, out, (socklen_t)len);
}

static int gid_ipv4(const doctor_gid *g, char *out, size_t len) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (memcmp(g->raw, prefix, sizeof prefix) != 0) return 0;
  inet_ntop(AF_INET, g->raw + 12, out, (socklen_t)len);
  return 1;
}

static void human_bytes(uint64_t v, char *out, size_t len) {
  if (v >= (1ull << 30))
    snprintf(out, len, "%.1f GiB", (double)v / (double)(1ull << 30));
  else if (v >= (1ull << 20))
    snprintf(out, len, "%.1f MiB", (double)v / (double)(1ull << 20));
  else
    snprintf(out, len, "%.1f KiB", (double)v / 1024.0);
}

static void nccl_version(const doctor_facts *f, char *out, size_t len) {
  if (f->nccl_major < 0)
    snprintf(out, len, "unknown version");
  else if (f->nccl_patch < 0)
    snprintf(out, len, "%d.%d", f->nccl_major, f->nccl_minor);
  else
    snprintf(out, len, "%d.%d.%d", f->nccl_major, f->nccl_minor, f->nccl_patch);
}

/* ---- report ----------------------------------------------------------- */

/* GPUs: PCI address, UUID, NUMA node and its CPUs; the driver. */
static void format_gpus(base_buf *b, const doctor_facts *f) {
  base_buf_puts(b, "GPUs\n");
  if (f->gpus_found == 0) {
    base_buf_puts(b, "  none found\n");
    return;
  }
  for (size_t i = 0; i < f->ngpus; i++) {
    const doctor_gpu *g = &f->gpus[i];
    base_buf_printf(b, "  %zu  %s  %s  NUMA node %d (CPUs %s)\n", i, g->pci[0] ? g->pci : "pci ?",
                    g->uuid[0] ? g->uuid : "-", g->numa, g->cpus[0] ? g->cpus : "?");
  }
  if ((size_t)f->gpus_found != f->ngpus)
    base_buf_printf(b, "  %zu of %d visible (%s)\n", f->ngpus, f->gpus_found,
                    f->gpu_visible_var[0] ? f->gpu_visible_var : "?");
  if (strcmp(f->gpu_vendor, "nvidia") == 0) {
    base_buf_printf(b, "  driver %s\n", f->driver[0] ? f->driver : "unknown");
    if (f->cuda_lib[0])
      base_buf_printf(b, "  libcuda %s (%s)\n",
                      f->cuda_lib_version[0] ? f->cuda_lib_version : "version unknown",
                      f->cuda_lib);
    else
      base_buf_puts(b, "  libcuda not found\n");
  }
}

int doctor_format_report(const doctor_result *r, char **out) {
  if (r == NULL || out == NULL) return -EINVAL;
  base_buf b = {0};
  const doctor_facts *f = r->facts;
  char t[256];
  if (f != NULL) {
    base_buf_puts(&b, "RDMA devices\n");
    if (f->nhcas == 0) base_buf_puts(&b, "  none\n");
    for (size_t i = 0; i < f->nhcas; i++) {
      const doctor_hca *h = &f->hcas[i];
      base_buf_printf(&b, "  %s  pci %s  numa %s  net", h->name, h->pci[0] ? h->pci : "?",
                      h->numa >= 0 ? (snprintf(t, sizeof t, "%d", h->numa), t) : "?");
      for (size_t k = 0; k < h->nnetdevs; k++) base_buf_printf(&b, " %s", h->netdevs[k]);
      if (h->nnetdevs == 0) base_buf_puts(&b, " -");
      base_buf_puts(&b, "\n");
      for (size_t p = 0; p < h->nports; p++) {
        const doctor_port *pt = &h->ports[p];
        base_buf_printf(
            &b, "    port %d  %s  %s  %s  %s\n", pt->num, pt->state_name[0] ? pt->state_name : "?",
            pt->phys_state_name[0] ? pt->phys_state_name : "?", pt->rate[0] ? pt->rate : "rate ?",
            pt->link == DOCTOR_LINK_ETH  ? "Ethernet (RoCE)"
            : pt->link == DOCTOR_LINK_IB ? "InfiniBand"
                                         : "link layer ?");
        for (size_t g = 0; g < pt->ngids; g++) {
          gid_str(&pt->gids[g], t, sizeof t);
          base_buf_printf(&b, "      gid %-3d %-40s %-10s %s\n", pt->gids[g].index, t,
                          doctor_gid_type_name(pt->gids[g].type),
                          pt->gids[g].ndev[0] ? pt->gids[g].ndev : "-");
        }
      }
    }
    base_buf_puts(&b, "Interfaces\n");
    for (size_t i = 0; i < f->nifaces; i++) {
      const doctor_iface *it = &f->ifaces[i];
      base_buf_printf(&b, "  %-12s mtu %-5d %-8s", it->name, it->mtu,
                      it->operstate[0] ? it->operstate : "?");
      for (size_t k = 0; k < it->naddrs; k++) {
        addr_str(&it->addrs[k], t, sizeof t);
        base_buf_printf(&b, " %s", t);
      }
      base_buf_puts(&b, "\n");
    }
    base_buf_printf(&b, "Routes\n  default route via %s\n",
                    f->default_iface[0] ? f->default_iface : "(none)");
    if (f->master[0])
      base_buf_printf(&b, "  master %s (%s) via %s\n", f->master,
                      f->master_addr[0] ? f->master_addr : "unresolved",
                      f->route_iface[0] ? f->route_iface : "(unknown)");
    base_buf_puts(&b, "Limits\n");
    if (!f->memlock_known)
      base_buf_puts(&b, "  locked memory: unknown\n");
    else if (f->memlock_unlimited)
      base_buf_puts(&b, "  locked memory: unlimited\n");
    else {
      human_bytes(f->memlock_bytes, t, sizeof t);
      base_buf_printf(&b, "  locked memory: %s\n", t);
    }
    if (f->shm_known) {
      human_bytes(f->shm_bytes, t, sizeof t);
      base_buf_printf(&b, "  /dev/shm: %s\n", t);
    } else {
      base_buf_puts(&b, "  /dev/shm: missing\n");
    }
    base_buf_printf(&b, "  /dev/infiniband: %s (%d uverbs)\n",
                    f->dev_infiniband ? "present" : "missing", f->uverbs_count);
    if (f->hugepages_known)
      base_buf_printf(&b, "  hugepages: %ld of %ld KiB\n", f->hugepages_total, f->hugepage_kb);
    format_gpus(&b, f);
    nccl_version(f, t, sizeof t);
    if (f->nccl_found)
      base_buf_printf(&b, "NCCL\n  %s (%s)\n", t, f->nccl_path);
    else
      base_buf_puts(&b, "NCCL\n  not found\n");
  }
  base_buf_puts(&b, "\nSettings to add\n");
  if (r->nset == 0) base_buf_puts(&b, "  none\n");
  for (size_t i = 0; i < r->nset; i++)
    base_buf_printf(&b, "  %s=%s\n      %s\n", r->set[i].name, r->set[i].value, r->set[i].reason);
  if (r->nkept > 0) base_buf_puts(&b, "Kept as you set them\n");
  for (size_t i = 0; i < r->nkept; i++)
    base_buf_printf(&b, "  %s=%s\n      doctor would set '%s': %s\n", r->kept[i].name,
                    r->kept[i].user_value, r->kept[i].value, r->kept[i].reason);
  for (size_t i = 0; i < r->nnotes; i++) base_buf_printf(&b, "note: %s\n", r->notes[i]);
  for (size_t i = 0; i < r->nwarnings; i++) base_buf_printf(&b, "warning: %s\n", r->warnings[i]);
  for (size_t i = 0; i < r->nerrors; i++) base_buf_printf(&b, "error: %s\n", r->errors[i]);
  char sum[DOCTOR_SUMMARY_MAX];
  doctor_summary_format(&r->summary, sum, sizeof sum);
  base_buf_printf(&b, "summary: %s\n", sum);
  return base_buf_take(&b, out, NULL);
}

/* ---- checks ----------------------------------------------------------- */

int doctor_format_checks(const doctor_result *r, char **out) {
  if (r == NULL || out == NULL) return -EINVAL;
  base_buf b = {0};
  size_t count[DOCTOR_CHECK_FAIL + 1] = {0};
  for (size_t i = 0; i < r->nchecks; i++) {
    const doctor_check *k = &r->checks[i];
    base_buf_printf(&b, "%-5s %-19s %s\n", doctor_check_status_name(k->status), k->name, k->detail);
    count[k->status]++;
  }
  base_buf_printf(&b, "%zu check(s): %zu failed, %zu warned, %zu ok, %zu not applicable\n",
                  r->nchecks, count[DOCTOR_CHECK_FAIL], count[DOCTOR_CHECK_WARN],
                  count[DOCTOR_CHECK_OK], count[DOCTOR_CHECK_NA]);
  return base_buf_take(&b, out, NULL);
}

/* ---- export ----------------------------------------------------------- */

static void shell_quote(base_buf *b, const char *s) {
  base_buf_puts(b, "'");
  for (; *s; s++) {
    if (*s == '\'')
      base_buf_puts(b, "'\\''");
    else
      base_buf_printf(b, "%c", *s);
  }
  base_buf_puts(b, "'");
}

int doctor_format_export(const doctor_result *r, char **out) {
  if (r == NULL || out == NULL) return -EINVAL;
  base_buf b = {0};
  for (size_t i = 0; i < r->nset; i++) {
    /* A reason is one line; keep a stray newline from ending the comment. */
    base_buf_puts(&b, "# ");
    for (const char *p = r->set[i].reason; *p; p++)
      base_buf_printf(&b, "%c", *p == '\n' ? ' ' : *p);
    base_buf_printf(&b, "\nexport %s=", r->set[i].name);
    shell_quote(&b, r->set[i].value);
    base_buf_puts(&b, "\n");
  }
  return base_buf_take(&b, out, NULL);
}

/* ---- JSON (jansson) --------------------------------------------------- */

/*
 * A string value; NULL is null. Text that is not UTF-8 (sysfs and interface
 * names are bytes) is read as Latin-1, one character per byte, so that any
 * input gives a valid document.
 */
static json_t *jstr(const char *s) {
  if (s == NULL) return json_null();
  json_t *v = json_string(s);
  if (v != NULL) return v;
  size_t n = strlen(s), k = 0;
  char *u = malloc(2 * n + 1);
  if (u == NULL) return NULL;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p < 0x80) {
      u[k++] = (char)*p;
    } else {
      u[k++] = (char)(0xc0 | (*p >> 6));
      u[k++] = (char)(0x80 | (*p & 0x3f));
    }
  }
  u[k] = '\0';
  v = json_string(u);
  free(u);
  return v;
}

static const char *nonempty(const char *s) {
  return s != NULL && s[0] != '\0' ? s : NULL;
}

/* An integer, or null when unknown. */
static json_t *jint_or_null(int known, long long v) {
  return known ? json_integer(v) : json_null();
}

/* Appends v (a new reference, NULL after a failed allocation) to array a. */
static int append(json_t *a, json_t *v) {
  return json_array_append_new(a, v) == 0 ? 0 : -ENOMEM;
}

static json_t *js_strings(char *const *list, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; a != NULL && i < n; i++)
    if (append(a, jstr(list[i])) != 0) a = (json_decref(a), NULL);
  return a;
}

static json_t *js_vars(const doctor_var *v, size_t n, int kept) {
  json_t *a = json_array();
  for (size_t i = 0; a != NULL && i < n; i++) {
    json_t *o =
        kept ? json_pack("{s:o, s:o, s:o, s:o}", "name", jstr(v[i].name), "value", jstr(v[i].value),
                         "user_value", jstr(v[i].user_value), "reason", jstr(v[i].reason))
             : json_pack("{s:o, s:o, s:o}", "name", jstr(v[i].name), "value", jstr(v[i].value),
                         "reason", jstr(v[i].reason));
    if (append(a, o) != 0) a = (json_decref(a), NULL);
  }
  return a;
}

static json_t *js_gid(const doctor_gid *g) {
  char t[INET6_ADDRSTRLEN], v4[INET_ADDRSTRLEN];
  gid_str(g, t, sizeof t);
  return json_pack("{s:i, s:o, s:s, s:o, s:o}", "index", g->index, "gid", jstr(t), "type",
                   doctor_gid_type_name(g->type), "ndev", jstr(nonempty(g->ndev)), "ipv4",
                   jstr(gid_ipv4(g, v4, sizeof v4) ? v4 : NULL));
}

static json_t *js_port(const doctor_port *pt) {
  json_t *gids = json_array();
  for (size_t g = 0; gids != NULL && g < pt->ngids; g++)
    if (append(gids, js_gid(&pt->gids[g])) != 0) gids = (json_decref(gids), NULL);
  /* One decimal, as the rate is read ("100 Gb/sec"); see the precision in doctor_format_json. */
  double gbps = round(pt->rate_gbps * 10.0) / 10.0;
  return json_pack("{s:i, s:i, s:o, s:i, s:o, s:o, s:f, s:s, s:b, s:o}", "port", pt->num, "state",
                   pt->state, "state_name", jstr(pt->state_name), "phys_state", pt->phys_state,
                   "phys_state_name", jstr(pt->phys_state_name), "rate", jstr(pt->rate),
                   "rate_gbps", gbps, "link_layer", doctor_link_name(pt->link), "active",
                   pt->state == 4, "gids", gids);
}

static json_t *js_hca(const doctor_hca *h) {
  json_t *netdevs = json_array(), *ports = json_array();
  for (size_t k = 0; netdevs != NULL && k < h->nnetdevs; k++)
    if (append(netdevs, jstr(h->netdevs[k])) != 0) netdevs = (json_decref(netdevs), NULL);
  for (size_t p = 0; ports != NULL && p < h->nports; p++)
    if (append(ports, js_port(&h->ports[p])) != 0) ports = (json_decref(ports), NULL);
  return json_pack("{s:o, s:o, s:o, s:o, s:o}", "name", jstr(h->name), "pci",
                   jstr(nonempty(h->pci)), "numa_node", jint_or_null(h->numa >= 0, h->numa),
                   "netdevs", netdevs, "ports", ports);
}

static json_t *js_iface(const doctor_iface *it) {
  json_t *addrs = json_array();
  for (size_t k = 0; addrs != NULL && k < it->naddrs; k++) {
    char t[INET6_ADDRSTRLEN + 8];
    addr_str(&it->addrs[k], t, sizeof t);
    if (append(addrs, jstr(t)) != 0) addrs = (json_decref(addrs), NULL);
  }
  return json_pack("{s:o, s:o, s:o, s:o}", "name", jstr(it->name), "mtu",
                   jint_or_null(it->mtu >= 0, it->mtu), "operstate", jstr(nonempty(it->operstate)),
                   "addresses", addrs);
}

static json_t *js_limits(const doctor_facts *f) {
  /* The byte counts fit json_int_t: no file system or limit reaches 2^63. */
  json_t *memlock = !f->memlock_known      ? json_null()
                    : f->memlock_unlimited ? json_string("unlimited")
                                           : json_integer((json_int_t)f->memlock_bytes);
  return json_pack("{s:o, s:o, s:b, s:i, s:o, s:o, s:o}", "memlock", memlock, "shm_bytes",
                   jint_or_null(f->shm_known, (long long)f->shm_bytes), "dev_infiniband",
                   f->dev_infiniband, "uverbs", f->uverbs_count, "hugepages_total",
                   jint_or_null(f->hugepages_known, f->hugepages_total), "hugepage_kb",
                   jint_or_null(f->hugepages_known, f->hugepage_kb), "mem_total_bytes",
                   jint_or_null(f->mem_total_known, (long long)f->mem_total_bytes));
}

/* The GPUs: each visible one, and the driver that runs them all. */
static json_t *js_gpus(const doctor_facts *f) {
  json_t *devices = json_array();
  for (size_t i = 0; devices != NULL && i < f->ngpus; i++) {
    const doctor_gpu *g = &f->gpus[i];
    json_t *o = json_pack("{s:i, s:o, s:o, s:o, s:i, s:o, s:o}", "index", (int)i, "vendor",
                          jstr(f->gpu_vendor), "pci", jstr(nonempty(g->pci)), "uuid",
                          jstr(nonempty(g->uuid)), "numa_node", g->numa, "cpus",
                          jstr(nonempty(g->cpus)), "driver", jstr(nonempty(f->driver)));
    if (append(devices, o) != 0) devices = (json_decref(devices), NULL);
  }
  json_t *lib = f->cuda_lib[0] == '\0' ? json_null()
                                       : json_pack("{s:o, s:o}", "path", jstr(f->cuda_lib),
                                                   "version", jstr(nonempty(f->cuda_lib_version)));
  return json_pack("{s:o, s:i, s:o, s:o, s:o, s:o}", "vendor", jstr(nonempty(f->gpu_vendor)),
                   "found", f->gpus_found, "visible_variable", jstr(nonempty(f->gpu_visible_var)),
                   "driver", jstr(nonempty(f->driver)), "cuda_library", lib, "devices", devices);
}

static json_t *js_checks(const doctor_result *r) {
  json_t *a = json_array();
  for (size_t i = 0; a != NULL && i < r->nchecks; i++) {
    const doctor_check *k = &r->checks[i];
    json_t *o = json_pack("{s:s, s:s, s:o}", "name", k->name, "status",
                          doctor_check_status_name(k->status), "detail", jstr(k->detail));
    if (append(a, o) != 0) a = (json_decref(a), NULL);
  }
  return a;
}

/* The facts' members, added to the document o. */
static int js_facts(json_t *o, const doctor_facts *f) {
  json_t *rdma = json_array(), *ifaces = json_array();
  for (size_t i = 0; rdma != NULL && i < f->nhcas; i++)
    if (append(rdma, js_hca(&f->hcas[i])) != 0) rdma = (json_decref(rdma), NULL);
  for (size_t i = 0; ifaces != NULL && i < f->nifaces; i++)
    if (append(ifaces, js_iface(&f->ifaces[i])) != 0) ifaces = (json_decref(ifaces), NULL);
  json_t *routes =
      json_pack("{s:o, s:o, s:o, s:o}", "default_interface", jstr(nonempty(f->default_iface)),
                "master", jstr(nonempty(f->master)), "master_address",
                jstr(nonempty(f->master_addr)), "master_interface", jstr(nonempty(f->route_iface)));
  char version[64];
  nccl_version(f, version, sizeof version);
  json_t *nccl = json_pack("{s:b, s:o, s:o}", "found", f->nccl_found, "version",
                           jstr(f->nccl_found && f->nccl_major >= 0 ? version : NULL), "path",
                           jstr(f->nccl_found ? f->nccl_path : NULL));
  json_t *facts =
      json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "rdma", rdma, "interfaces", ifaces, "routes",
                routes, "limits", js_limits(f), "nccl", nccl, "gpus", js_gpus(f));
  int rc = facts != NULL && json_object_update(o, facts) == 0 ? 0 : -ENOMEM;
  json_decref(facts);
  return rc;
}

int doctor_format_json(const doctor_result *r, char **out) {
  if (r == NULL || out == NULL) return -EINVAL;
  char sum[DOCTOR_SUMMARY_MAX];
  doctor_summary_format(&r->summary, sum, sizeof sum);
  json_t *summary =
      json_pack("{s:o, s:o, s:o, s:o}", "link", jstr(r->summary.link), "hca", jstr(r->summary.hca),
                "gid_index", jint_or_null(r->summary.gid_index >= 0, r->summary.gid_index), "text",
                jstr(sum));
  json_t *doc =
      json_pack("{s:s, s:b, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "schema", "cohort-doctor/2", "ok",
                r->nerrors == 0, "settings", js_vars(r->set, r->nset, 0), "kept",
                js_vars(r->kept, r->nkept, 1), "notes", js_strings(r->notes, r->nnotes), "warnings",
                js_strings(r->warnings, r->nwarnings), "errors", js_strings(r->errors, r->nerrors),
                "summary", summary, "checks", js_checks(r));
  int rc = doc != NULL ? 0 : -ENOMEM;
  if (rc == 0 && r->facts != NULL) rc = js_facts(doc, r->facts);
  /* One line, ASCII only (escapes beyond it); "name": value pairs apart by ", ". */
  char *text = rc == 0 ? json_dumps(doc, JSON_ENSURE_ASCII | JSON_REAL_PRECISION(15)) : NULL;
  json_decref(doc);
  if (text == NULL) return -ENOMEM;
  /* A newline ends the document, as every line the command prints. */
  size_t n = strlen(text);
  char *line = realloc(text, n + 2);
  if (line == NULL) {
    free(text);
    return -ENOMEM;
  }
  memcpy(line + n, "\n", 2);
  *out = line;
  return 0;
}

/*
 * format.c - renderings of a doctor result (report, shell exports, JSON) and
 * the compact summary agents exchange across nodes.
 */
#include "doctor/doctor.h"

#include <arpa/inet.h>
#include <errno.h>
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
  doctor_buf d = {0};
  if (strcmp(a->link, b->link) != 0)
    doctor_buf_printf(&d, "%slink layer %s vs %s", d.len ? "; " : "", a->link, b->link);
  if (strcmp(a->hca, b->hca) != 0)
    doctor_buf_printf(&d, "%sHCA set %s vs %s", d.len ? "; " : "", a->hca[0] ? a->hca : "(none)",
                      b->hca[0] ? b->hca : "(none)");
  if (a->gid_index != b->gid_index) {
    char ga[16], gb[16];
    snprintf(ga, sizeof ga, "%d", a->gid_index);
    snprintf(gb, sizeof gb, "%d", b->gid_index);
    doctor_buf_printf(&d, "%sGID index %s vs %s", d.len ? "; " : "",
                      a->gid_index >= 0 ? ga : "none", b->gid_index >= 0 ? gb : "none");
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

int doctor_format_report(const doctor_result *r, char **out) {
  if (r == NULL || out == NULL) return -EINVAL;
  doctor_buf b = {0};
  const doctor_facts *f = r->facts;
  char t[256];
  if (f != NULL) {
    doctor_buf_puts(&b, "RDMA devices\n");
    if (f->nhcas == 0) doctor_buf_puts(&b, "  none\n");
    for (size_t i = 0; i < f->nhcas; i++) {
      const doctor_hca *h = &f->hcas[i];
      doctor_buf_printf(&b, "  %s  pci %s  net", h->name, h->pci[0] ? h->pci : "?");
      for (size_t k = 0; k < h->nnetdevs; k++) doctor_buf_printf(&b, " %s", h->netdevs[k]);
      if (h->nnetdevs == 0) doctor_buf_puts(&b, " -");
      doctor_buf_puts(&b, "\n");
      for (size_t p = 0; p < h->nports; p++) {
        const doctor_port *pt = &h->ports[p];
        doctor_buf_printf(
            &b, "    port %d  %s  %s  %s  %s\n", pt->num, pt->state_name[0] ? pt->state_name : "?",
            pt->phys_state_name[0] ? pt->phys_state_name : "?", pt->rate[0] ? pt->rate : "rate ?",
            pt->link == DOCTOR_LINK_ETH  ? "Ethernet (RoCE)"
            : pt->link == DOCTOR_LINK_IB ? "InfiniBand"
                                         : "link layer ?");
        for (size_t g = 0; g < pt->ngids; g++) {
          gid_str(&pt->gids[g], t, sizeof t);
          doctor_buf_printf(&b, "      gid %-3d %-40s %-10s %s\n", pt->gids[g].index, t,
                            doctor_gid_type_name(pt->gids[g].type),
                            pt->gids[g].ndev[0] ? pt->gids[g].ndev : "-");
        }
      }
    }
    doctor_buf_puts(&b, "Interfaces\n");
    for (size_t i = 0; i < f->nifaces; i++) {
      const doctor_iface *it = &f->ifaces[i];
      doctor_buf_printf(&b, "  %-12s mtu %-5d %-8s", it->name, it->mtu,
                        it->operstate[0] ? it->operstate : "?");
      for (size_t k = 0; k < it->naddrs; k++) {
        addr_str(&it->addrs[k], t, sizeof t);
        doctor_buf_printf(&b, " %s", t);
      }
      doctor_buf_puts(&b, "\n");
    }
    doctor_buf_printf(&b, "Routes\n  default route via %s\n",
                      f->default_iface[0] ? f->default_iface : "(none)");
    if (f->master[0])
      doctor_buf_printf(&b, "  master %s (%s) via %s\n", f->master,
                        f->master_addr[0] ? f->master_addr : "unresolved",
                        f->route_iface[0] ? f->route_iface : "(unknown)");
    doctor_buf_puts(&b, "Limits\n");
    if (!f->memlock_known)
      doctor_buf_puts(&b, "  locked memory: unknown\n");
    else if (f->memlock_unlimited)
      doctor_buf_puts(&b, "  locked memory: unlimited\n");
    else {
      human_bytes(f->memlock_bytes, t, sizeof t);
      doctor_buf_printf(&b, "  locked memory: %s\n", t);
    }
    if (f->shm_known) {
      human_bytes(f->shm_bytes, t, sizeof t);
      doctor_buf_printf(&b, "  /dev/shm: %s\n", t);
    } else {
      doctor_buf_puts(&b, "  /dev/shm: missing\n");
    }
    doctor_buf_printf(&b, "  /dev/infiniband: %s (%d uverbs)\n",
                      f->dev_infiniband ? "present" : "missing", f->uverbs_count);
    if (f->hugepages_known)
      doctor_buf_printf(&b, "  hugepages: %ld of %ld KiB\n", f->hugepages_total, f->hugepage_kb);
    nccl_version(f, t, sizeof t);
    if (f->nccl_found)
      doctor_buf_printf(&b, "NCCL\n  %s (%s)\n", t, f->nccl_path);
    else
      doctor_buf_puts(&b, "NCCL\n  not found\n");
  }
  doctor_buf_puts(&b, "\nSettings to add\n");
  if (r->nset == 0) doctor_buf_puts(&b, "  none\n");
  for (size_t i = 0; i < r->nset; i++)
    doctor_buf_printf(&b, "  %s=%s\n      %s\n", r->set[i].name, r->set[i].value, r->set[i].reason);
  if (r->nkept > 0) doctor_buf_puts(&b, "Kept as you set them\n");
  for (size_t i = 0; i < r->nkept; i++)
    doctor_buf_printf(&b, "  %s=%s\n      doctor would set '%s': %s\n", r->kept[i].name,
                      r->kept[i].user_value, r->kept[i].value, r->kept[i].reason);
  for (size_t i = 0; i < r->nnotes; i++) doctor_buf_printf(&b, "note: %s\n", r->notes[i]);
  for (size_t i = 0; i < r->nwarnings; i++) doctor_buf_printf(&b, "warning: %s\n", r->warnings[i]);
  for (size_t i = 0; i < r->nerrors; i++) doctor_buf_printf(&b, "error: %s\n", r->errors[i]);
  char sum[DOCTOR_SUMMARY_MAX];
  doctor_summary_format(&r->summary, sum, sizeof sum);
  doctor_buf_printf(&b, "summary: %s\n", sum);
  return doctor_buf_take(&b, out);
}

/* ---- export ----------------------------------------------------------- */

static void shell_quote(doctor_buf *b, const char *s) {
  doctor_buf_puts(b, "'");
  for (; *s; s++) {
    if (*s == '\'')
      doctor_buf_puts(b, "'\\''");
    else
      doctor_buf_printf(b, "%c", *s);
  }
  doctor_buf_puts(b, "'");
}

int doctor_format_export(const doctor_result *r, char **out) {
  if (r == NULL || out == NULL) return -EINVAL;
  doctor_buf b = {0};
  for (size_t i = 0; i < r->nset; i++) {
    /* A reason is one line; keep a stray newline from ending the comment. */
    doctor_buf_puts(&b, "# ");
    for (const char *p = r->set[i].reason; *p; p++)
      doctor_buf_printf(&b, "%c", *p == '\n' ? ' ' : *p);
    doctor_buf_printf(&b, "\nexport %s=", r->set[i].name);
    shell_quote(&b, r->set[i].value);
    doctor_buf_puts(&b, "\n");
  }
  return doctor_buf_take(&b, out);
}

/* ---- JSON ------------------------------------------------------------- */

static void js(doctor_buf *b, const char *s) {
  if (s == NULL) {
    doctor_buf_puts(b, "null");
    return;
  }
  doctor_buf_puts(b, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"')
      doctor_buf_puts(b, "\\\"");
    else if (*p == '\\')
      doctor_buf_puts(b, "\\\\");
    else if (*p == '\n')
      doctor_buf_puts(b, "\\n");
    else if (*p == '\t')
      doctor_buf_puts(b, "\\t");
    /* Control bytes and bytes above ASCII (sysfs text is ASCII; anything
     * else must not make the document invalid UTF-8) become escapes. */
    else if (*p < 0x20 || *p >= 0x7f)
      doctor_buf_printf(b, "\\u%04x", *p);
    else
      doctor_buf_printf(b, "%c", *p);
  }
  doctor_buf_puts(b, "\"");
}

static const char *nonempty(const char *s) {
  return s != NULL && s[0] != '\0' ? s : NULL;
}

static void js_strings(doctor_buf *b, char *const *list, size_t n) {
  doctor_buf_puts(b, "[");
  for (size_t i = 0; i < n; i++) {
    if (i) doctor_buf_puts(b, ", ");
    js(b, list[i]);
  }
  doctor_buf_puts(b, "]");
}

static void js_vars(doctor_buf *b, const doctor_var *v, size_t n, int kept) {
  doctor_buf_puts(b, "[");
  for (size_t i = 0; i < n; i++) {
    doctor_buf_puts(b, i ? ",\n    {\"name\": " : "\n    {\"name\": ");
    js(b, v[i].name);
    doctor_buf_puts(b, ", \"value\": ");
    js(b, v[i].value);
    if (kept) {
      doctor_buf_puts(b, ", \"user_value\": ");
      js(b, v[i].user_value);
    }
    doctor_buf_puts(b, ", \"reason\": ");
    js(b, v[i].reason);
    doctor_buf_puts(b, "}");
  }
  doctor_buf_puts(b, n ? "\n  ]" : "]");
}

static void js_facts(doctor_buf *b, const doctor_facts *f) {
  char t[256];
  doctor_buf_puts(b, ",\n  \"rdma\": [");
  for (size_t i = 0; i < f->nhcas; i++) {
    const doctor_hca *h = &f->hcas[i];
    doctor_buf_puts(b, i ? ",\n    {\"name\": " : "\n    {\"name\": ");
    js(b, h->name);
    doctor_buf_puts(b, ", \"pci\": ");
    js(b, nonempty(h->pci));
    doctor_buf_puts(b, ", \"netdevs\": [");
    for (size_t k = 0; k < h->nnetdevs; k++) {
      if (k) doctor_buf_puts(b, ", ");
      js(b, h->netdevs[k]);
    }
    doctor_buf_puts(b, "], \"ports\": [");
    for (size_t p = 0; p < h->nports; p++) {
      const doctor_port *pt = &h->ports[p];
      doctor_buf_printf(b, "%s\n      {\"port\": %d, \"state\": %d, \"state_name\": ", p ? "," : "",
                        pt->num, pt->state);
      js(b, pt->state_name);
      doctor_buf_printf(b, ", \"phys_state\": %d, \"phys_state_name\": ", pt->phys_state);
      js(b, pt->phys_state_name);
      doctor_buf_puts(b, ", \"rate\": ");
      js(b, pt->rate);
      doctor_buf_printf(b, ", \"rate_gbps\": %.1f, \"link_layer\": \"%s\", \"active\": %s,",
                        pt->rate_gbps, doctor_link_name(pt->link),
                        pt->state == 4 ? "true" : "false");
      doctor_buf_puts(b, "\n       \"gids\": [");
      for (size_t g = 0; g < pt->ngids; g++) {
        const doctor_gid *gd = &pt->gids[g];
        gid_str(gd, t, sizeof t);
        doctor_buf_printf(b, "%s\n         {\"index\": %d, \"gid\": ", g ? "," : "", gd->index);
        js(b, t);
        doctor_buf_printf(b, ", \"type\": \"%s\", \"ndev\": ", doctor_gid_type_name(gd->type));
        js(b, nonempty(gd->ndev));
        char v4[INET_ADDRSTRLEN];
        doctor_buf_puts(b, ", \"ipv4\": ");
        js(b, gid_ipv4(gd, v4, sizeof v4) ? v4 : NULL);
        doctor_buf_puts(b, "}");
      }
      doctor_buf_puts(b, pt->ngids ? "]}" : "]}");
    }
    doctor_buf_puts(b, "]}");
  }
  doctor_buf_puts(b, f->nhcas ? "\n  ]" : "]");

  doctor_buf_puts(b, ",\n  \"interfaces\": [");
  for (size_t i = 0; i < f->nifaces; i++) {
    const doctor_iface *it = &f->ifaces[i];
    doctor_buf_puts(b, i ? ",\n    {\"name\": " : "\n    {\"name\": ");
    js(b, it->name);
    if (it->mtu >= 0)
      doctor_buf_printf(b, ", \"mtu\": %d", it->mtu);
    else
      doctor_buf_puts(b, ", \"mtu\": null");
    doctor_buf_puts(b, ", \"operstate\": ");
    js(b, nonempty(it->operstate));
    doctor_buf_puts(b, ", \"addresses\": [");
    for (size_t k = 0; k < it->naddrs; k++) {
      addr_str(&it->addrs[k], t, sizeof t);
      if (k) doctor_buf_puts(b, ", ");
      js(b, t);
    }
    doctor_buf_puts(b, "]}");
  }
  doctor_buf_puts(b, f->nifaces ? "\n  ]" : "]");

  doctor_buf_puts(b, ",\n  \"routes\": {\"default_interface\": ");
  js(b, nonempty(f->default_iface));
  doctor_buf_puts(b, ", \"master\": ");
  js(b, nonempty(f->master));
  doctor_buf_puts(b, ", \"master_address\": ");
  js(b, nonempty(f->master_addr));
  doctor_buf_puts(b, ", \"master_interface\": ");
  js(b, nonempty(f->route_iface));
  doctor_buf_puts(b, "}");

  doctor_buf_puts(b, ",\n  \"limits\": {\"memlock\": ");
  if (!f->memlock_known)
    doctor_buf_puts(b, "null");
  else if (f->memlock_unlimited)
    doctor_buf_puts(b, "\"unlimited\"");
  else
    doctor_buf_printf(b, "%llu", (unsigned long long)f->memlock_bytes);
  doctor_buf_puts(b, ", \"shm_bytes\": ");
  if (f->shm_known)
    doctor_buf_printf(b, "%llu", (unsigned long long)f->shm_bytes);
  else
    doctor_buf_puts(b, "null");
  doctor_buf_printf(b, ", \"dev_infiniband\": %s, \"uverbs\": %d, \"hugepages_total\": ",
                    f->dev_infiniband ? "true" : "false", f->uverbs_count);
  if (f->hugepages_known)
    doctor_buf_printf(b, "%ld, \"hugepage_kb\": %ld}", f->hugepages_total, f->hugepage_kb);
  else
    doctor_buf_puts(b, "null, \"hugepage_kb\": null}");

  doctor_buf_printf(
      b, ",\n  \"nccl\": {\"found\": %s, \"version\": ", f->nccl_found ? "true" : "false");
  nccl_version(f, t, sizeof t);
  js(b, f->nccl_found && f->nccl_major >= 0 ? t : NULL);
  doctor_buf_puts(b, ", \"path\": ");
  js(b, f->nccl_found ? f->nccl_path : NULL);
  doctor_buf_puts(b, "}");
}

int doctor_format_json(const doctor_result *r, char **out) {
  if (r == NULL || out == NULL) return -EINVAL;
  doctor_buf b = {0};
  char sum[DOCTOR_SUMMARY_MAX];
  doctor_summary_format(&r->summary, sum, sizeof sum);
  doctor_buf_printf(&b, "{\n  \"schema\": \"cohort-doctor/1\",\n  \"ok\": %s,\n  \"settings\": ",
                    r->nerrors == 0 ? "true" : "false");
  js_vars(&b, r->set, r->nset, 0);
  doctor_buf_puts(&b, ",\n  \"kept\": ");
  js_vars(&b, r->kept, r->nkept, 1);
  doctor_buf_puts(&b, ",\n  \"notes\": ");
  js_strings(&b, r->notes, r->nnotes);
  doctor_buf_puts(&b, ",\n  \"warnings\": ");
  js_strings(&b, r->warnings, r->nwarnings);
  doctor_buf_puts(&b, ",\n  \"errors\": ");
  js_strings(&b, r->errors, r->nerrors);
  doctor_buf_puts(&b, ",\n  \"summary\": {\"link\": ");
  js(&b, r->summary.link);
  doctor_buf_puts(&b, ", \"hca\": ");
  js(&b, r->summary.hca);
  if (r->summary.gid_index >= 0)
    doctor_buf_printf(&b, ", \"gid_index\": %d", r->summary.gid_index);
  else
    doctor_buf_puts(&b, ", \"gid_index\": null");
  doctor_buf_puts(&b, ", \"text\": ");
  js(&b, sum);
  doctor_buf_puts(&b, "}");
  if (r->facts != NULL) js_facts(&b, r->facts);
  doctor_buf_puts(&b, "\n}\n");
  return doctor_buf_take(&b, out);
}

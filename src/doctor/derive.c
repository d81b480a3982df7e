/*
 * derive.c - from probed facts to NCCL / UCX / Gloo settings, each with the
 * reason it was chosen, plus warnings and errors. A pure function: nothing
 * here touches the machine.
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

#define PORT_ACTIVE 4 /* IB_PORT_ACTIVE in ports/N/state */
#define PORT_INIT 2   /* IB_PORT_INIT: link up, not configured by a subnet manager */
#define SHM_MIN_BYTES (1ull << 30)
/* NCCL 2.21 picks the RoCE GID itself (NCCL_IB_GID_INDEX defaults to auto). */
#define NCCL_AUTO_GID_MAJOR 2
#define NCCL_AUTO_GID_MINOR 21

typedef struct active_port {
  const doctor_hca *hca;
  const doctor_port *port;
} active_port;

typedef struct derive_ctx {
  const doctor_facts *f;
  char **envp;
  doctor_result *r;
  int rc; /* first allocation failure */
} derive_ctx;

static void note(derive_ctx *c, char ***list, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void note(derive_ctx *c, char ***list, size_t *n, const char *fmt, ...) {
  char tmp[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (doctor_list_add(list, n, "%s", tmp) != 0 && c->rc == 0) c->rc = -ENOMEM;
}

#define WARN(c, ...) note(c, &(c)->r->warnings, &(c)->r->nwarnings, __VA_ARGS__)
#define ERROR(c, ...) note(c, &(c)->r->errors, &(c)->r->nerrors, __VA_ARGS__)
#define NOTE(c, ...) note(c, &(c)->r->notes, &(c)->r->nnotes, __VA_ARGS__)

static char *dup_or_fail(derive_ctx *c, const char *s) {
  char *d = strdup(s);
  if (d == NULL && c->rc == 0) c->rc = -ENOMEM;
  return d;
}

/* Adds a derived variable: to `set`, or to `kept` when the user set it. */
static void setvar(derive_ctx *c, const char *name, const char *value, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void setvar(derive_ctx *c, const char *name, const char *value, const char *fmt, ...) {
  char reason[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  const char *user = doctor_env_get(c->envp, name);
  doctor_var **list = user ? &c->r->kept : &c->r->set;
  size_t *n = user ? &c->r->nkept : &c->r->nset;
  doctor_var *p = realloc(*list, (*n + 1) * sizeof *p);
  if (p == NULL) {
    if (c->rc == 0) c->rc = -ENOMEM;
    return;
  }
  *list = p;
  doctor_var *v = &p[(*n)++];
  *v = (doctor_var){dup_or_fail(c, name), dup_or_fail(c, value), dup_or_fail(c, reason),
                    user ? dup_or_fail(c, user) : NULL};
}

static int is_v4mapped(const uint8_t *g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(g, prefix, sizeof prefix) == 0;
}

static int is_loopback(const char *addr) {
  uint8_t a[16];
  static const uint8_t v6lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  if (inet_pton(AF_INET, addr, a) == 1) return a[0] == 127;
  if (inet_pton(AF_INET6, addr, a) == 1) return memcmp(a, v6lo, 16) == 0;
  return 0;
}

static const doctor_iface *find_iface(const doctor_facts *f, const char *name) {
  for (size_t i = 0; i < f->nifaces; i++)
    if (strcmp(f->ifaces[i].name, name) == 0) return &f->ifaces[i];
  return NULL;
}

static const char *owner_of_v4(const doctor_facts *f, const uint8_t *v4) {
  for (size_t i = 0; i < f->nifaces; i++)
    for (size_t k = 0; k < f->ifaces[i].naddrs; k++)
      if (f->ifaces[i].addrs[k].family == AF_INET && memcmp(f->ifaces[i].addrs[k].addr, v4, 4) == 0)
        return f->ifaces[i].name;
  return NULL;
}

static const doctor_gid *gid_at(const doctor_port *p, int index) {
  for (size_t i = 0; i < p->ngids; i++)
    if (p->gids[i].index == index) return &p->gids[i];
  return NULL;
}

static int qualifies(const doctor_gid *g) {
  return g != NULL && g->type == DOCTOR_GID_ROCE_V2 && is_v4mapped(g->raw);
}

/* Whether `name` is a proper prefix of a name in `names` that is not listed:
 * NCCL matches its lists by prefix, so "mlx5_1" would also select mlx5_10. */
static int prefix_clash(const char *name, const char *const *others, size_t n) {
  size_t l = strlen(name);
  for (size_t i = 0; i < n; i++)
    if (strlen(others[i]) > l && strncmp(others[i], name, l) == 0) return 1;
  return 0;
}

int doctor_hca_selected(const char *spec, const char *dev, int port) {
  if (spec == NULL) return 1;
  int exclude = 0, exact = 0;
  if (*spec == '^') {
    exclude = 1;
    spec++;
  }
  if (*spec == '=') {
    exact = 1;
    spec++;
  }
  int match = 0;
  while (*spec != '\0' && !match) {
    size_t len = strcspn(spec, ",");
    char entry[128];
    if (len < sizeof entry) {
      memcpy(entry, spec, len);
      entry[len] = '\0';
      char *colon = strchr(entry, ':');
      int want_port = -1;
      if (colon != NULL) {
        *colon = '\0';
        if (base_parse_int(colon + 1, 0, 65535, &want_port) != 0) want_port = -2;
      }
      size_t nl = strlen(entry);
      int name_ok = nl > 0 && (exact ? strcmp(dev, entry) == 0 : strncmp(dev, entry, nl) == 0);
      if (name_ok && (want_port == -1 || want_port == port)) match = 1;
    }
    spec += len;
    if (*spec == ',') spec++;
  }
  return exclude ? !match : match;
}

/*
 * Checks the NCCL_IB_GID_INDEX the user set against the active RoCE ports:
 * the seed's one-liner can leave "RoCE v2" or several lines in it. Returns
 * the index when it is a number, else -1.
 */
static int check_user_gid(derive_ctx *c, const active_port *eth, size_t neth, const char *user,
                          int derived) {
  char would[48] = "";
  if (derived >= 0) snprintf(would, sizeof would, "; doctor would set %d", derived);
  int idx;
  if (base_parse_int(user, 0, 65535, &idx) != 0) {
    char shown[64];
    size_t k = 0;
    for (const char *p = user; *p && k + 1 < sizeof shown; p++) shown[k++] = *p == '\n' ? ' ' : *p;
    shown[k] = '\0';
    WARN(c,
         "your NCCL_IB_GID_INDEX '%s' is not one number (the one-liner in circulation yields "
         "text or several lines when one or more than ten entries match)%s",
         shown, would);
    return -1;
  }
  for (size_t i = 0; i < neth; i++) {
    const doctor_gid *g = gid_at(eth[i].port, idx);
    if (g == NULL)
      WARN(c, "your NCCL_IB_GID_INDEX %d is an empty entry of %s port %d%s", idx, eth[i].hca->name,
           eth[i].port->num, would);
    else if (g->type != DOCTOR_GID_ROCE_V2)
      WARN(c, "your NCCL_IB_GID_INDEX %d is %s on %s port %d, not RoCE v2 (routable)%s", idx,
           doctor_gid_type_name(g->type), eth[i].hca->name, eth[i].port->num, would);
    else if (!is_v4mapped(g->raw))
      NOTE(c,
           "your NCCL_IB_GID_INDEX %d is an IPv6 RoCE v2 entry on %s port %d: the peers must "
           "use IPv6 RoCE too",
           idx, eth[i].hca->name, eth[i].port->num);
  }
  return idx;
}

/* Every port has some qualifying GID; else errors name what each lacks (unless quiet). */
static int ports_qualify(derive_ctx *c, const active_port *eth, size_t neth, int quiet) {
  int bad = 0;
  for (size_t i = 0; i < neth; i++) {
    const doctor_port *p = eth[i].port;
    size_t v2 = 0, v4 = 0;
    int any = 0;
    for (size_t k = 0; k < p->ngids; k++) {
      v2 += p->gids[k].type == DOCTOR_GID_ROCE_V2;
      v4 += is_v4mapped(p->gids[k].raw);
      any |= qualifies(&p->gids[k]);
    }
    if (any) continue;
    const char *ndev = p->ngids > 0 && p->gids[0].ndev[0] ? p->gids[0].ndev : NULL;
    char dev[DOCTOR_NAME_MAX + 4] = "";
    if (ndev) snprintf(dev, sizeof dev, " (%s)", ndev);
    if (!quiet)
      ERROR(c,
            "%s port %d (RoCE): no GID qualifies for NCCL_IB_GID_INDEX: of %zu entries %zu are "
            "RoCE v2 and %zu carry an IPv4 address (::ffff:a.b.c.d), none both; %s%s",
            eth[i].hca->name, p->num, p->ngids, v2, v4,
            v4 == 0 ? "give its network device an IPv4 address" : "enable RoCE v2 on the device",
            dev);
    bad = 1;
  }
  return !bad;
}

/* The best index that qualifies on every port (see choose_gid), its rank (0 on ref, 1 on some
 * interface, 2 on none) and its GID on the best port; -1 when none qualifies everywhere. */
static int best_common_gid(const doctor_facts *f, const active_port *eth, size_t neth,
                           const char *ref, int *best_rank, const doctor_gid **best_gid) {
  int best = -1;
  *best_rank = 3;
  const doctor_port *p0 = eth[0].port;
  for (size_t k = 0; k < p0->ngids; k++) {
    int idx = p0->gids[k].index;
    int rank = 3, everywhere = 1;
    const doctor_gid *g0 = NULL;
    for (size_t i = 0; i < neth && everywhere; i++) {
      const doctor_gid *g = gid_at(eth[i].port, idx);
      if (!qualifies(g)) {
        everywhere = 0;
        break;
      }
      const char *owner = owner_of_v4(f, g->raw + 12);
      int r = owner == NULL ? 2 : (ref != NULL && strcmp(owner, ref) == 0) ? 0 : 1;
      if (r < rank) {
        rank = r;
        g0 = g;
      }
    }
    if (!everywhere) continue;
    if (rank < *best_rank || (rank == *best_rank && idx < best)) {
      best = idx;
      *best_rank = rank;
      *best_gid = g0;
    }
  }
  return best;
}

static void no_common_gid(derive_ctx *c, const active_port *eth, size_t neth) {
  base_buf b = {0};
  for (size_t i = 0; i < neth; i++) {
    base_buf_printf(&b, "%s%s:%d has", i ? "; " : "", eth[i].hca->name, eth[i].port->num);
    for (size_t k = 0; k < eth[i].port->ngids; k++)
      if (qualifies(&eth[i].port->gids[k])) base_buf_printf(&b, " %d", eth[i].port->gids[k].index);
  }
  ERROR(c,
        "no single GID index is RoCE v2 with an IPv4 address on every active RoCE port (%s): "
        "limit NCCL_IB_HCA to ports that agree",
        b.data ? b.data : "");
  free(b.data);
}

/*
 * Chooses NCCL_IB_GID_INDEX for the active RoCE ports: an index whose entry
 * is RoCE v2 with an IPv4-mapped address on every such port; among those,
 * first one whose IPv4 address is on the reference interface (the one that
 * reaches the master, else the default route's), then one whose address is
 * on any interface of this network namespace, then any; ties go to the
 * numerically lowest index. Returns the index or -1 (errors recorded
 * unless quiet: the user chose the index, and it is checked instead).
 */
static int choose_gid(derive_ctx *c, const active_port *eth, size_t neth, const char *ref,
                      int via_master, int quiet, char *why, size_t whylen) {
  const doctor_facts *f = c->f;
  if (!ports_qualify(c, eth, neth, quiet)) return -1;
  int best_rank;
  const doctor_gid *best_gid = NULL;
  int best = best_common_gid(f, eth, neth, ref, &best_rank, &best_gid);
  if (best < 0) {
    if (!quiet) no_common_gid(c, eth, neth);
    return -1;
  }
  char addr[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, best_gid->raw + 12, addr, sizeof addr);
  const char *owner = owner_of_v4(f, best_gid->raw + 12);
  if (best_rank == 0)
    snprintf(why, whylen, "RoCE v2 entry with IPv4 %s, the address of %s, which %s", addr, owner,
             via_master ? "reaches the master" : "carries the default route");
  else if (best_rank == 1)
    snprintf(why, whylen, "RoCE v2 entry with IPv4 %s (on %s)", addr, owner);
  else
    snprintf(why, whylen, "RoCE v2 entry with IPv4 %s", addr);
  if (best_rank == 2 && !quiet)
    WARN(c,
         "GID index %d carries %s, which no interface of this network namespace has: RDMA "
         "traffic may not reach the peers (a pod without its RoCE interface?)",
         best, addr);
  return best;
}

static void format_bytes(uint64_t v, char *out, size_t len) {
  if (v >= (1ull << 30) && v % (1ull << 30) == 0)
    snprintf(out, len, "%llu GiB", (unsigned long long)(v >> 30));
  else if (v >= (1ull << 20))
    snprintf(out, len, "%.0f MiB", (double)v / (1 << 20));
  else if (v >= 1024)
    snprintf(out, len, "%.0f KiB", (double)v / 1024);
  else
    snprintf(out, len, "%llu bytes", (unsigned long long)v);
}

static void check_mtus(derive_ctx *c, const active_port *act, size_t nact) {
  /* The network devices behind the active ports: device/net entries and GID ndevs. */
  const char *names[64];
  size_t n = 0;
  for (size_t i = 0; i < nact; i++) {
    for (size_t k = 0; k < act[i].hca->nnetdevs; k++) {
      const char *nm = act[i].hca->netdevs[k];
      int dup = 0;
      for (size_t j = 0; j < n; j++) dup |= strcmp(names[j], nm) == 0;
      if (!dup && n < BASE_ARRAY_LEN(names)) names[n++] = nm;
    }
    for (size_t k = 0; k < act[i].port->ngids; k++) {
      const char *nm = act[i].port->gids[k].ndev;
      if (nm[0] == '\0') continue;
      int dup = 0;
      for (size_t j = 0; j < n; j++) dup |= strcmp(names[j], nm) == 0;
      if (!dup && n < BASE_ARRAY_LEN(names)) names[n++] = nm;
    }
  }
  int first = -1, mismatch = 0;
  base_buf b = {0};
  for (size_t j = 0; j < n; j++) {
    const doctor_iface *i = find_iface(c->f, names[j]);
    if (i == NULL || i->mtu < 0) continue;
    base_buf_printf(&b, "%s%s %d", b.len ? ", " : "", names[j], i->mtu);
    if (first < 0)
      first = i->mtu;
    else if (i->mtu != first)
      mismatch = 1;
  }
  if (mismatch)
    WARN(c,
         "the RDMA network devices disagree on MTU (%s): a path MTU smaller than the RDMA MTU "
         "drops large messages; give them one MTU (and the switches too)",
         b.data);
  free(b.data);
}

/* The RDMA ports of the facts, sorted into what derive uses; the rest held for the steps below. */
typedef struct port_sets {
  size_t nports;    /* every port of every HCA */
  active_port *act; /* ACTIVE and selected by the user's NCCL_IB_HCA, if any */
  active_port *eth; /* those of them with an Ethernet link layer (RoCE) */
  size_t nact, neth, nib, nexcluded;
  const char *user_hca; /* the user's NCCL_IB_HCA, or NULL */
  base_buf hcas;        /* "mlx5_0:1,mlx5_1:1" */
  int exact;            /* a listed name prefixes one left out: NCCL must match exactly */
} port_sets;

static int ports_alloc(const doctor_facts *f, port_sets *ps) {
  for (size_t i = 0; i < f->nhcas; i++) ps->nports += f->hcas[i].nports;
  ps->act = calloc(ps->nports ? ps->nports : 1, sizeof *ps->act);
  ps->eth = calloc(ps->nports ? ps->nports : 1, sizeof *ps->eth);
  return ps->act == NULL || ps->eth == NULL ? -ENOMEM : 0;
}

static void ports_free(port_sets *ps) {
  free(ps->act);
  free(ps->eth);
  free(ps->hcas.data);
}

/* Sorts every port: left out by the user, active (Ethernet or InfiniBand), or down (a warning). */
static void select_ports(derive_ctx *c, port_sets *ps) {
  const doctor_facts *f = c->f;
  ps->user_hca = doctor_env_get(c->envp, "NCCL_IB_HCA");
  for (size_t i = 0; i < f->nhcas; i++) {
    for (size_t p = 0; p < f->hcas[i].nports; p++) {
      const doctor_port *pt = &f->hcas[i].ports[p];
      if (pt->state == PORT_ACTIVE &&
          !doctor_hca_selected(ps->user_hca, f->hcas[i].name, pt->num)) {
        /* The user's NCCL_IB_HCA narrows what NCCL uses: follow it. */
        ps->nexcluded++;
        NOTE(c, "%s port %d is ACTIVE but your NCCL_IB_HCA '%s' leaves it out", f->hcas[i].name,
             pt->num, ps->user_hca);
        continue;
      }
      if (pt->state == PORT_ACTIVE) {
        ps->act[ps->nact++] = (active_port){&f->hcas[i], pt};
        if (pt->link == DOCTOR_LINK_ETH)
          ps->eth[ps->neth++] = (active_port){&f->hcas[i], pt};
        else
          ps->nib++; /* kernels without link_layer files predate RoCE: InfiniBand */
        continue;
      }
      WARN(c, "%s port %d is %s (physical state %s): left out of NCCL_IB_HCA; %s", f->hcas[i].name,
           pt->num, pt->state_name[0] ? pt->state_name : "unreadable",
           pt->phys_state_name[0] ? pt->phys_state_name : "unknown",
           pt->state == PORT_INIT ? "the link is up but no subnet manager has configured it"
                                  : "check the cable and the switch port");
    }
  }
}

/* The HCA list, and whether a listed name prefixes a device left out (it would select it too). */
static void list_hcas(derive_ctx *c, port_sets *ps) {
  const doctor_facts *f = c->f;
  for (size_t i = 0; i < ps->nact; i++) {
    base_buf_printf(&ps->hcas, "%s%s:%d", i ? "," : "", ps->act[i].hca->name, ps->act[i].port->num);
    for (size_t h = 0; h < f->nhcas; h++) {
      const char *other = f->hcas[h].name;
      int listed = 0;
      for (size_t k = 0; k < ps->nact; k++) listed |= ps->act[k].hca == &f->hcas[h];
      if (!listed && prefix_clash(ps->act[i].hca->name, &other, 1)) ps->exact = 1;
    }
  }
  if (ps->hcas.oom) c->rc = -ENOMEM;
  doctor_result *r = c->r;
  base_strlcpy(r->summary.hca, ps->hcas.data ? ps->hcas.data : "", sizeof r->summary.hca);
  base_strlcpy(r->summary.link,
               ps->nact == 0           ? "none"
               : (ps->neth && ps->nib) ? "mixed"
               : ps->neth              ? "ethernet"
               : ps->nib               ? "infiniband"
                                       : "mixed",
               sizeof r->summary.link);
}

/* NCCL_IB_DISABLE or NCCL_IB_HCA. */
static void derive_hca(derive_ctx *c, const port_sets *ps) {
  const char *hcas = ps->hcas.data ? ps->hcas.data : "";
  if (ps->nact == 0 && ps->nexcluded > 0)
    WARN(c, "your NCCL_IB_HCA '%s' selects none of the %zu ACTIVE RDMA ports: NCCL will use TCP",
         ps->user_hca, ps->nexcluded);
  if (ps->nact == 0 && ps->nexcluded == 0) {
    if (c->f->nhcas == 0)
      setvar(c, "NCCL_IB_DISABLE", "1",
             "no RDMA device under class/infiniband: NCCL must use TCP sockets");
    else
      setvar(c, "NCCL_IB_DISABLE", "1",
             "none of the %zu RDMA ports is ACTIVE: NCCL must use TCP sockets", ps->nports);
  } else if (ps->nact > 0) {
    char val[sizeof c->r->summary.hca + 1];
    snprintf(val, sizeof val, "%s%s", ps->exact ? "=" : "", hcas);
    const char *rate = ps->act[0].port->rate[0] ? ps->act[0].port->rate : "rate unknown";
    char left_out[64] = "";
    if (ps->nports > ps->nact + ps->nexcluded)
      snprintf(left_out, sizeof left_out, "; %zu not ACTIVE left out",
               ps->nports - ps->nact - ps->nexcluded);
    if (ps->nact == 1)
      setvar(c, "NCCL_IB_HCA", val, "the only ACTIVE RDMA port, %s%s%s", rate, left_out,
             ps->exact ? "; '=' makes NCCL match the name exactly, not as a prefix" : "");
    else
      setvar(c, "NCCL_IB_HCA", val, "all %zu ACTIVE RDMA ports, the first at %s%s%s", ps->nact,
             rate, left_out,
             ps->exact ? "; '=' makes NCCL match the names exactly, not as prefixes" : "");
  }
  if (ps->neth && ps->nib)
    WARN(c,
         "the active ports mix InfiniBand and Ethernet (RoCE) link layers: peers must share one; "
         "limit NCCL_IB_HCA to the ports of the fabric the other nodes are on");
}

/* NCCL_IB_GID_INDEX for the RoCE ports (or the note that NCCL picks it itself). */
static void derive_gid(derive_ctx *c, const port_sets *ps, const char *ref, int via_master,
                       int set_gid) {
  const doctor_facts *f = c->f;
  char why[256];
  const char *user_gid = doctor_env_get(c->envp, "NCCL_IB_GID_INDEX");
  int g = choose_gid(c, ps->eth, ps->neth, ref, via_master, user_gid != NULL, why, sizeof why);
  /* The summary is what NCCL will use: the user's index when they set one. */
  c->r->summary.gid_index = user_gid ? check_user_gid(c, ps->eth, ps->neth, user_gid, g) : g;
  int auto_gid = f->nccl_found && f->nccl_major >= 0 &&
                 (f->nccl_major > NCCL_AUTO_GID_MAJOR ||
                  (f->nccl_major == NCCL_AUTO_GID_MAJOR && f->nccl_minor >= NCCL_AUTO_GID_MINOR));
  if (g < 0) return;
  char val[16], version[32];
  snprintf(val, sizeof val, "%d", g);
  if (f->nccl_patch >= 0)
    snprintf(version, sizeof version, "%d.%d.%d", f->nccl_major, f->nccl_minor, f->nccl_patch);
  else
    snprintf(version, sizeof version, "%d.%d", f->nccl_major, f->nccl_minor);
  if (auto_gid && !set_gid && user_gid == NULL) {
    NOTE(c,
         "NCCL %s (%s) selects the RoCE GID itself: NCCL_IB_GID_INDEX left unset "
         "(doctor would choose %d, the %s; --set-gid-index sets it)",
         version, f->nccl_path, g, why);
  } else {
    setvar(c, "NCCL_IB_GID_INDEX", val, "%s%s", why,
           auto_gid && set_gid ? " (asked for with --set-gid-index)"
           : auto_gid          ? ""
           : f->nccl_found     ? ""
                               : "; NCCL not found, so it may not pick one itself");
  }
}

/* The socket interface settings (NCCL, Gloo, UCX without RDMA) on interface sock. */
static void derive_socket(derive_ctx *c, const port_sets *ps, const char *sock, int via_master,
                          int given) {
  const doctor_facts *f = c->f;
  char because[512];
  if (given)
    snprintf(because, sizeof because, "the interface cohort run reached node 0 on");
  else if (via_master)
    snprintf(because, sizeof because, "the interface that reaches the master %s (%s)", f->master,
             f->master_addr);
  else if (f->master[0])
    snprintf(because, sizeof because,
             "the master %s (%s) is this node's loopback: the default route's interface serves "
             "this node and reaches the others",
             f->master, f->master_addr);
  else
    snprintf(because, sizeof because, "the interface of the default route");
  const char *names[256];
  size_t nn = 0;
  for (size_t i = 0; i < f->nifaces && nn < BASE_ARRAY_LEN(names); i++)
    names[nn++] = f->ifaces[i].name;
  int clash = prefix_clash(sock, names, nn);
  char val[DOCTOR_NAME_MAX + 1];
  snprintf(val, sizeof val, "%s%s", clash ? "=" : "", sock);
  setvar(c, "NCCL_SOCKET_IFNAME", val, "%s%s", because,
         clash ? "; '=' makes NCCL match the name exactly, not as a prefix" : "");
  setvar(c, "GLOO_SOCKET_IFNAME", sock, "%s", because);
  if (ps->nact == 0) setvar(c, "UCX_NET_DEVICES", sock, "no active RDMA port: %s", because);
}

/* UCX's devices and the TCP-only socket tuning. */
static void derive_transport(derive_ctx *c, const port_sets *ps) {
  if (ps->nact > 0)
    setvar(c, "UCX_NET_DEVICES", ps->hcas.data ? ps->hcas.data : "",
           "UCX's names for the same ACTIVE RDMA ports");
  if (ps->nact == 0) {
    setvar(c, "NCCL_SOCKET_NTHREADS", "4",
           "TCP only: 4 helper threads per peer connection, each with 8 sockets (the seeds' "
           "values), raise socket bandwidth; NCCL caps threads x sockets at 64");
    setvar(c, "NCCL_NSOCKS_PERTHREAD", "8",
           "TCP only: more sockets per thread spread the traffic (4 x 8 = 32 sockets per peer)");
  }
}

/* Limits that break RDMA and NCCL at run time, the probe's notes, NCCL's presence. */
static void check_limits(derive_ctx *c, const port_sets *ps) {
  const doctor_facts *f = c->f;
  char size[32];
  if (ps->nact > 0 && f->memlock_known && !f->memlock_unlimited) {
    format_bytes(f->memlock_bytes, size, sizeof size);
    WARN(c,
         "the locked-memory limit is %s: RDMA pins NCCL's buffers and registration fails "
         "beyond it; raise it (ulimit -l unlimited, docker --ulimit memlock=-1, "
         "LimitMEMLOCK=infinity)",
         size);
  }
  if (!f->shm_known)
    WARN(c, "/dev/shm is missing or cannot be measured: NCCL's shared-memory transport and "
            "PyTorch's DataLoader workers need it");
  else if (f->shm_bytes < SHM_MIN_BYTES) {
    format_bytes(f->shm_bytes, size, sizeof size);
    WARN(c,
         "/dev/shm is only %s (under 1 GiB): NCCL's shared-memory transport and DataLoader "
         "workers fail with bus errors; docker --shm-size=8g or --ipc=host",
         size);
  }
  if (f->nhcas > 0 && (!f->dev_infiniband || f->uverbs_count == 0))
    WARN(c,
         "RDMA devices are in sysfs but %s: the container was started without "
         "--device=/dev/infiniband, so NCCL cannot open the HCAs and falls back to TCP",
         f->dev_infiniband ? "/dev/infiniband has no uverbs files" : "/dev/infiniband is missing");
  if (ps->nact > 0) check_mtus(c, ps->act, ps->nact);
  for (size_t i = 0; i < f->nnotes; i++) WARN(c, "%s", f->notes[i]);
  if (f->nccl_probed && !f->nccl_found)
    NOTE(c, "NCCL not found under the library root (a PyTorch wheel may carry its own)");
}

int doctor_derive(const doctor_facts *f, const doctor_config *cfg, char **envp,
                  doctor_result **out) {
  if (f == NULL || out == NULL) return -EINVAL;
  *out = NULL;
  doctor_result *r = calloc(1, sizeof *r);
  if (r == NULL) return -ENOMEM;
  derive_ctx cx = {f, envp, r, 0}, *c = &cx;
  r->summary.gid_index = -1;
  port_sets ps = {0};
  c->rc = ports_alloc(f, &ps);
  if (c->rc == 0) {
    select_ports(c, &ps);
    /*
     * A master at a loopback address is this node (Debian maps the host name
     * to 127.0.1.1): "lo" would serve only this node, so the default route's
     * interface is used, which serves this node and reaches the others too.
     */
    int master_loop = is_loopback(f->master_addr);
    int via_master = f->master[0] && !(master_loop && f->default_iface[0]);
    const char *ref = via_master ? (f->route_iface[0] ? f->route_iface : NULL)
                                 : (f->default_iface[0] ? f->default_iface : NULL);
    const char *given = cfg != NULL && cfg->socket_iface != NULL && cfg->socket_iface[0] != '\0'
                            ? cfg->socket_iface
                            : NULL;
    const char *sock = given ? given : via_master ? f->route_iface : f->default_iface;
    if (f->master_error[0]) ERROR(c, "%s", f->master_error);
    list_hcas(c, &ps);
    derive_hca(c, &ps);
    if (ps.neth > 0) derive_gid(c, &ps, ref, via_master, cfg != NULL && cfg->set_gid_index);
    if (sock != NULL && sock[0] != '\0')
      derive_socket(c, &ps, sock, via_master, given != NULL);
    else if (!f->master_error[0])
      WARN(c, "no default route and no --master: NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME not "
              "derived; pass --master HOST");
    derive_transport(c, &ps);
    check_limits(c, &ps);
    if (c->rc == 0) c->rc = doctor_checks(f, envp, r);
  }
  ports_free(&ps);
  if (c->rc != 0) {
    doctor_result_destroy(r);
    return c->rc;
  }
  *out = r;
  return 0;
}

int doctor_plan(const doctor_config *cfg, char **envp, doctor_result **out) {
  if (out == NULL) return -EINVAL;
  *out = NULL;
  doctor_facts *f;
  int rc = doctor_probe(cfg, envp, &f);
  if (rc != 0) return rc;
  rc = doctor_derive(f, cfg, envp, out);
  if (rc != 0) {
    doctor_facts_destroy(f);
    return rc;
  }
  (*out)->facts = f;
  return 0;
}

static void free_vars(doctor_var *v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(v[i].name);
    free(v[i].value);
    free(v[i].reason);
    free(v[i].user_value);
  }
  free(v);
}

void doctor_result_destroy(doctor_result *r) {
  if (r == NULL) return;
  free_vars(r->set, r->nset);
  free_vars(r->kept, r->nkept);
  doctor_list_free(r->notes, r->nnotes);
  doctor_list_free(r->warnings, r->nwarnings);
  doctor_list_free(r->errors, r->nerrors);
  for (size_t i = 0; i < r->nchecks; i++) free(r->checks[i].detail);
  free(r->checks);
  doctor_facts_destroy(r->facts);
  free(r);
}

const char *doctor_result_get(const doctor_result *r, const char *name) {
  if (r == NULL || name == NULL) return NULL;
  for (size_t i = 0; i < r->nset; i++)
    if (strcmp(r->set[i].name, name) == 0) return r->set[i].value;
  return NULL;
}

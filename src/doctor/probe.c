/*
 * probe.c - reads RDMA devices, interfaces, routes, limits and the NCCL
 * installation into a doctor_facts. Every file is read relative to a root
 * from the config, so a fixture tree can stand in for the machine.
 */
#include "doctor/doctor.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "doctor/internal.h"
#include "doctor/topo.h"

typedef struct probe_roots {
  const char *sys, *proc, *dev, *lib;
} probe_roots;

/* "4: ACTIVE" -> 4 and "ACTIVE". */
static void parse_numbered(const char *text, int *num, char *name, size_t namelen) {
  char *end;
  long v = strtol(text, &end, 10);
  if (end == text || v < 0 || v > 1000) {
    *num = -1;
    base_strlcpy(name, text, namelen);
    return;
  }
  *num = (int)v;
  while (*end == ':' || *end == ' ') end++;
  base_strlcpy(name, end, namelen);
}

static int probe_port(const char *portdir, int num, doctor_port *p) {
  char text[256];
  p->num = num;
  p->state = -1;
  p->phys_state = -1;
  if (doctor_read_textf(text, sizeof text, "%s/state", portdir) == 0)
    parse_numbered(text, &p->state, p->state_name, sizeof p->state_name);
  if (doctor_read_textf(text, sizeof text, "%s/phys_state", portdir) == 0)
    parse_numbered(text, &p->phys_state, p->phys_state_name, sizeof p->phys_state_name);
  if (doctor_read_textf(p->rate, sizeof p->rate, "%s/rate", portdir) == 0) {
    double v = strtod(p->rate, NULL);
    p->rate_gbps = v >= 0 && v < 1e7 ? v : 0; /* also keeps NaN out of the JSON */
  }
  if (doctor_read_textf(text, sizeof text, "%s/link_layer", portdir) == 0) {
    if (strcasecmp(text, "InfiniBand") == 0)
      p->link = DOCTOR_LINK_IB;
    else if (strcasecmp(text, "Ethernet") == 0)
      p->link = DOCTOR_LINK_ETH;
  }

  char path[PATH_MAX];
  char **names;
  size_t nnames;
  if (doctor_pathf(path, sizeof path, "%s/gids", portdir) != 0) return 0;
  if (doctor_list_dir(path, &names, &nnames) == -ENOMEM) return -ENOMEM;
  int rc = 0;
  if (nnames > 0) {
    p->gids = calloc(nnames, sizeof *p->gids);
    if (p->gids == NULL) rc = -ENOMEM;
  }
  for (size_t i = 0; rc == 0 && i < nnames; i++) {
    if (!doctor_is_number(names[i]) || strlen(names[i]) > 6) continue;
    doctor_gid g = {0};
    g.index = atoi(names[i]);
    if (doctor_read_textf(text, sizeof text, "%s/gids/%s", portdir, names[i]) != 0) continue;
    if (inet_pton(AF_INET6, text, g.raw) != 1) continue;
    static const uint8_t zero[16];
    /* The kernel shows unused table slots as the all-zero GID. */
    if (memcmp(g.raw, zero, sizeof zero) == 0) continue;
    if (doctor_read_textf(text, sizeof text, "%s/gid_attrs/types/%s", portdir, names[i]) == 0) {
      if (strcasecmp(text, "RoCE v2") == 0)
        g.type = DOCTOR_GID_ROCE_V2;
      else if (strcasecmp(text, "IB/RoCE v1") == 0 || strcasecmp(text, "RoCE v1") == 0)
        g.type = DOCTOR_GID_IB_ROCE_V1;
    }
    /* Reading ndevs fails with EINVAL for entries without a net device (IB). */
    if (doctor_read_textf(g.ndev, sizeof g.ndev, "%s/gid_attrs/ndevs/%s", portdir, names[i]) != 0)
      g.ndev[0] = '\0';
    p->gids[p->ngids++] = g;
  }
  doctor_list_free(names, nnames);
  return rc;
}

static int probe_hca(const char *devdir, const char *name, doctor_hca *h) {
  base_strlcpy(h->name, name, sizeof h->name);
  char text[2048], path[PATH_MAX];

  /* PCI address: the device's uevent names it; a real sysfs also has it as
   * the last component of the device link. */
  if (doctor_read_textf(text, sizeof text, "%s/device/uevent", devdir) == 0) {
    char *line = strstr(text, "PCI_SLOT_NAME=");
    if (line != NULL) {
      line += strlen("PCI_SLOT_NAME=");
      size_t l = strcspn(line, "\n");
      if (l < sizeof h->pci) {
        memcpy(h->pci, line, l);
        h->pci[l] = '\0';
      }
    }
  }
  if (h->pci[0] == '\0') {
    char real[PATH_MAX];
    if (doctor_pathf(path, sizeof path, "%s/device", devdir) == 0 && realpath(path, real) != NULL) {
      const char *base = strrchr(real, '/');
      base = base ? base + 1 : real;
      if (strchr(base, ':') != NULL && strchr(base, '.') != NULL)
        base_strlcpy(h->pci, base, sizeof h->pci);
    }
  }

  /* The device's NUMA node (sysfs says -1 when the platform does not tell). */
  h->numa = -1;
  if (doctor_read_textf(text, sizeof text, "%s/device/numa_node", devdir) == 0 &&
      base_parse_int(text, -1, 1 << 16, &h->numa) != 0)
    h->numa = -1;

  char **names;
  size_t n;
  if (doctor_pathf(path, sizeof path, "%s/device/net", devdir) != 0) return 0;
  if (doctor_list_dir(path, &names, &n) == -ENOMEM) return -ENOMEM;
  if (n > 0) {
    h->netdevs = calloc(n, sizeof *h->netdevs);
    if (h->netdevs == NULL) {
      doctor_list_free(names, n);
      return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) base_strlcpy(h->netdevs[i], names[i], DOCTOR_NAME_MAX);
    h->nnetdevs = n;
  }
  doctor_list_free(names, n);

  if (doctor_pathf(path, sizeof path, "%s/ports", devdir) != 0) return 0;
  if (doctor_list_dir(path, &names, &n) == -ENOMEM) return -ENOMEM;
  int rc = 0;
  if (n > 0) {
    h->ports = calloc(n, sizeof *h->ports);
    if (h->ports == NULL) rc = -ENOMEM;
  }
  for (size_t i = 0; rc == 0 && i < n; i++) {
    if (!doctor_is_number(names[i]) || strlen(names[i]) > 4) continue;
    if (doctor_pathf(path, sizeof path, "%s/ports/%s", devdir, names[i]) != 0) continue;
    rc = probe_port(path, atoi(names[i]), &h->ports[h->nports]);
    h->nports++;
  }
  doctor_list_free(names, n);
  return rc;
}

static int probe_hcas(const probe_roots *r, doctor_facts *f) {
  char dir[PATH_MAX];
  int rc = doctor_join(dir, sizeof dir, r->sys, "class/infiniband");
  if (rc != 0) return rc;
  char **names;
  size_t n;
  rc = doctor_list_dir(dir, &names, &n);
  if (rc == -ENOMEM) return rc;
  rc = 0;
  if (n > 0) {
    f->hcas = calloc(n, sizeof *f->hcas);
    if (f->hcas == NULL) rc = -ENOMEM;
  }
  for (size_t i = 0; rc == 0 && i < n; i++) {
    char devdir[PATH_MAX];
    if (doctor_pathf(devdir, sizeof devdir, "%s/%s", dir, names[i]) != 0) continue;
    rc = probe_hca(devdir, names[i], &f->hcas[f->nhcas]);
    f->nhcas++;
  }
  doctor_list_free(names, n);
  return rc;
}

static doctor_iface *find_iface(doctor_facts *f, const char *name) {
  for (size_t i = 0; i < f->nifaces; i++)
    if (strcmp(f->ifaces[i].name, name) == 0) return &f->ifaces[i];
  return NULL;
}

static doctor_iface *add_iface(doctor_facts *f, const char *name) {
  doctor_iface *p = realloc(f->ifaces, (f->nifaces + 1) * sizeof *p);
  if (p == NULL) return NULL;
  f->ifaces = p;
  doctor_iface *i = &p[f->nifaces++];
  memset(i, 0, sizeof *i);
  base_strlcpy(i->name, name, sizeof i->name);
  i->mtu = -1;
  return i;
}

static int iface_add_addr(doctor_iface *i, const doctor_addr *a) {
  for (size_t k = 0; k < i->naddrs; k++)
    if (i->addrs[k].family == a->family && memcmp(i->addrs[k].addr, a->addr, 16) == 0) return 0;
  doctor_addr *p = realloc(i->addrs, (i->naddrs + 1) * sizeof *p);
  if (p == NULL) return -ENOMEM;
  i->addrs = p;
  p[i->naddrs++] = *a;
  return 0;
}

static int probe_ifaces(const probe_roots *r, doctor_facts *f) {
  char dir[PATH_MAX];
  int rc = doctor_join(dir, sizeof dir, r->sys, "class/net");
  if (rc != 0) return rc;
  char **names;
  size_t n;
  if (doctor_list_dir(dir, &names, &n) == -ENOMEM) return -ENOMEM;
  for (size_t k = 0; k < n; k++) {
    /* class/net also holds plain files (bonding_masters): interfaces are
     * directories (links to them on a real system). */
    char path[PATH_MAX];
    struct stat st;
    if (doctor_pathf(path, sizeof path, "%s/%s", dir, names[k]) != 0 || stat(path, &st) != 0 ||
        !S_ISDIR(st.st_mode))
      continue;
    doctor_iface *i = add_iface(f, names[k]);
    if (i == NULL) {
      rc = -ENOMEM;
      break;
    }
    char text[64];
    if (doctor_read_textf(text, sizeof text, "%s/%s/mtu", dir, names[k]) == 0) {
      int mtu;
      if (base_parse_int(text, 0, 1 << 20, &mtu) == 0) i->mtu = mtu;
    }
    if (doctor_read_textf(text, sizeof text, "%s/%s/operstate", dir, names[k]) == 0)
      base_strlcpy(i->operstate, text, sizeof i->operstate);
  }
  doctor_list_free(names, n);
  return rc;
}

static int prefix_len(const uint8_t *mask, size_t bytes) {
  int bits = 0;
  for (size_t i = 0; i < bytes; i++)
    for (int b = 7; b >= 0; b--) bits += (mask[i] >> b) & 1;
  return bits;
}

static int live_addrs(doctor_facts *f) {
  struct ifaddrs *ifa;
  if (getifaddrs(&ifa) != 0) return -errno;
  int rc = 0;
  for (struct ifaddrs *p = ifa; p != NULL && rc == 0; p = p->ifa_next) {
    if (p->ifa_addr == NULL || p->ifa_name == NULL) continue;
    doctor_addr a = {0};
    a.family = p->ifa_addr->sa_family;
    if (a.family == AF_INET) {
      memcpy(a.addr, &((struct sockaddr_in *)(void *)p->ifa_addr)->sin_addr, 4);
      if (p->ifa_netmask)
        a.prefix = prefix_len(
            (const uint8_t *)&((struct sockaddr_in *)(void *)p->ifa_netmask)->sin_addr, 4);
    } else if (a.family == AF_INET6) {
      memcpy(a.addr, &((struct sockaddr_in6 *)(void *)p->ifa_addr)->sin6_addr, 16);
      if (p->ifa_netmask)
        a.prefix = prefix_len(
            (const uint8_t *)&((struct sockaddr_in6 *)(void *)p->ifa_netmask)->sin6_addr, 16);
    } else {
      continue;
    }
    doctor_iface *i = find_iface(f, p->ifa_name);
    if (i == NULL) i = add_iface(f, p->ifa_name);
    if (i == NULL)
      rc = -ENOMEM;
    else
      rc = iface_add_addr(i, &a);
  }
  freeifaddrs(ifa);
  return rc;
}

/* Parses "10.0.0.5/24" or "fe80::1/64" (no prefix: a host address). */
static int parse_cidr(const char *s, doctor_addr *a) {
  char tmp[80];
  if (base_strlcpy(tmp, s, sizeof tmp) >= sizeof tmp) return -EINVAL;
  char *slash = strchr(tmp, '/');
  if (slash) *slash = '\0';
  memset(a, 0, sizeof *a);
  if (inet_pton(AF_INET, tmp, a->addr) == 1) {
    a->family = AF_INET;
    a->prefix = 32;
  } else if (inet_pton(AF_INET6, tmp, a->addr) == 1) {
    a->family = AF_INET6;
    a->prefix = 128;
  } else {
    return -EINVAL;
  }
  if (slash && base_parse_int(slash + 1, 0, a->family == AF_INET ? 32 : 128, &a->prefix) != 0)
    return -EINVAL;
  return 0;
}

static int file_addrs(const char *file, doctor_facts *f) {
  FILE *fp = fopen(file, "re");
  if (fp == NULL) return -errno;
  char line[512];
  int rc = 0, lineno = 0;
  while (rc == 0 && fgets(line, sizeof line, fp) != NULL) {
    lineno++;
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char name[DOCTOR_NAME_MAX + 1], cidr[128];
    int fields = sscanf(line, "%64s %127s", name, cidr);
    if (fields <= 0) continue;
    doctor_addr a;
    if (fields != 2 || strlen(name) >= DOCTOR_NAME_MAX || parse_cidr(cidr, &a) != 0) {
      rc = -EINVAL;
      doctor_list_add(&f->notes, &f->nnotes, "%s:%d: expected 'IFNAME ADDRESS/PREFIX'", file,
                      lineno);
      break;
    }
    doctor_iface *i = find_iface(f, name);
    if (i == NULL) i = add_iface(f, name);
    rc = i == NULL ? -ENOMEM : iface_add_addr(i, &a);
  }
  fclose(fp);
  return rc;
}

typedef struct route4 {
  char iface[DOCTOR_NAME_MAX];
  uint32_t dest, mask; /* network order, as /proc/net/route prints them */
  unsigned flags;
  long metric;
} route4;

/* The IPv4 routes of PROC_ROOT/net/route that are up. */
static int read_routes(const probe_roots *r, route4 **out, size_t *n) {
  *out = NULL;
  *n = 0;
  char path[PATH_MAX];
  int rc = doctor_join(path, sizeof path, r->proc, "net/route");
  if (rc != 0) return rc;
  FILE *fp = fopen(path, "re");
  if (fp == NULL) return -errno;
  char line[512];
  rc = 0;
  if (fgets(line, sizeof line, fp) == NULL) goto out; /* the header */
  while (fgets(line, sizeof line, fp) != NULL) {
    route4 rt = {0};
    char iface[DOCTOR_NAME_MAX + 1];
    unsigned dest, gw, flags, mask;
    int refcnt, use;
    long metric;
    if (sscanf(line, "%64s %x %x %x %d %d %ld %x", iface, &dest, &gw, &flags, &refcnt, &use,
               &metric, &mask) != 8)
      continue;
    if (!(flags & 0x1)) continue; /* RTF_UP */
    base_strlcpy(rt.iface, iface, sizeof rt.iface);
    rt.dest = dest;
    rt.mask = mask;
    rt.flags = flags;
    rt.metric = metric;
    route4 *p = realloc(*out, (*n + 1) * sizeof *p);
    if (p == NULL) {
      rc = -ENOMEM;
      break;
    }
    *out = p;
    p[(*n)++] = rt;
  }
out:
  fclose(fp);
  return rc;
}

/* Longest matching prefix, then lowest metric; NULL when none matches. */
static const route4 *route_lookup(const route4 *rt, size_t n, uint32_t addr) {
  const route4 *best = NULL;
  int best_len = -1;
  for (size_t i = 0; i < n; i++) {
    if ((addr & rt[i].mask) != (rt[i].dest & rt[i].mask)) continue;
    int len = prefix_len((const uint8_t *)&rt[i].mask, 4);
    if (len > best_len || (len == best_len && rt[i].metric < best->metric)) {
      best = &rt[i];
      best_len = len;
    }
  }
  return best;
}

static int hex16(const char *hex, uint8_t *out) {
  if (strlen(hex) != 32) return -EINVAL;
  for (int i = 0; i < 16; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -EINVAL;
    out[i] = (uint8_t)v;
  }
  return 0;
}

static int prefix_match(const uint8_t *a, const uint8_t *b, unsigned bits) {
  unsigned full = bits / 8, rest = bits % 8;
  if (memcmp(a, b, full) != 0) return 0;
  if (rest == 0) return 1;
  uint8_t mask = (uint8_t)(0xff << (8 - rest));
  return (a[full] & mask) == (b[full] & mask);
}

/*
 * IPv6 routes of PROC_ROOT/net/ipv6_route: with addr NULL the interface of
 * the default route (not lo), else the longest prefix matching addr
 * (lowest metric on ties). Up routes only, reject routes skipped.
 */
static void route6_lookup(const probe_roots *r, const uint8_t *addr, char *iface, size_t len) {
  char path[PATH_MAX];
  if (doctor_join(path, sizeof path, r->proc, "net/ipv6_route") != 0) return;
  FILE *fp = fopen(path, "re");
  if (fp == NULL) return;
  char line[512];
  int best_len = -1;
  unsigned best_metric = 0;
  while (fgets(line, sizeof line, fp) != NULL) {
    char dest[40], src[40], hop[40], name[DOCTOR_NAME_MAX + 1];
    unsigned dlen, slen, metric, refcnt, use, flags;
    uint8_t d[16];
    if (sscanf(line, "%39s %x %39s %x %39s %x %x %x %x %64s", dest, &dlen, src, &slen, hop, &metric,
               &refcnt, &use, &flags, name) != 10 ||
        dlen > 128 || hex16(dest, d) != 0)
      continue;
    if (!(flags & 0x1) || (flags & 0x200)) continue; /* RTF_UP, RTF_REJECT */
    if (addr == NULL) {
      if (dlen != 0 || strcmp(name, "lo") == 0) continue;
    } else if (!prefix_match(d, addr, dlen)) {
      continue;
    }
    if ((int)dlen > best_len || ((int)dlen == best_len && metric < best_metric)) {
      best_len = (int)dlen;
      best_metric = metric;
      base_strlcpy(iface, name, len);
    }
  }
  fclose(fp);
}

/* Which local interface owns address a (4 or 16 bytes of family). */
static const char *iface_of_addr(const doctor_facts *f, int family, const void *addr) {
  size_t len = family == AF_INET ? 4 : 16;
  for (size_t i = 0; i < f->nifaces; i++)
    for (size_t k = 0; k < f->ifaces[i].naddrs; k++)
      if (f->ifaces[i].addrs[k].family == family &&
          memcmp(f->ifaces[i].addrs[k].addr, addr, len) == 0)
        return f->ifaces[i].name;
  return NULL;
}

static void probe_routes(const probe_roots *r, const doctor_config *cfg, doctor_facts *f) {
  route4 *rt = NULL;
  size_t nrt = 0;
  if (read_routes(r, &rt, &nrt) == 0) {
    const route4 *def = NULL;
    for (size_t i = 0; i < nrt; i++)
      if (rt[i].mask == 0 && (def == NULL || rt[i].metric < def->metric)) def = &rt[i];
    if (def) base_strlcpy(f->default_iface, def->iface, sizeof f->default_iface);
  }
  if (f->default_iface[0] == '\0')
    route6_lookup(r, NULL, f->default_iface, sizeof f->default_iface);

  if (cfg->master == NULL || cfg->master[0] == '\0') goto out;
  base_strlcpy(f->master, cfg->master, sizeof f->master);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  int gai = getaddrinfo(cfg->master, NULL, &hints, &res);
  if (gai != 0 || res == NULL) {
    snprintf(f->master_error, sizeof f->master_error, "cannot resolve master '%s': %s", cfg->master,
             gai_strerror(gai));
    goto out;
  }
  /* Prefer IPv4, as NCCL's bootstrap and the store do. */
  struct addrinfo *ai = res;
  for (struct addrinfo *p = res; p != NULL; p = p->ai_next)
    if (p->ai_family == AF_INET) {
      ai = p;
      break;
    }
  base_sockaddr_str(ai->ai_addr, f->master_addr, sizeof f->master_addr, NULL);

  if (cfg->ifaddrs_file == NULL) {
    /* Connecting a UDP socket sends nothing; it makes the kernel choose the
     * route and the source address, which getsockname() then reveals. */
    struct sockaddr_storage ss = {0};
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    if (ss.ss_family == AF_INET)
      ((struct sockaddr_in *)&ss)->sin_port = htons(9);
    else
      ((struct sockaddr_in6 *)&ss)->sin6_port = htons(9);
    int fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&ss, ai->ai_addrlen) != 0) {
      snprintf(f->master_error, sizeof f->master_error, "no route to master %s (%s): %s",
               cfg->master, f->master_addr, strerror(errno));
    } else {
      struct sockaddr_storage local = {0};
      socklen_t sl = sizeof local;
      const char *name = NULL;
      if (getsockname(fd, (struct sockaddr *)&local, &sl) == 0) {
        if (local.ss_family == AF_INET)
          name = iface_of_addr(f, AF_INET, &((struct sockaddr_in *)&local)->sin_addr);
        else if (local.ss_family == AF_INET6)
          name = iface_of_addr(f, AF_INET6, &((struct sockaddr_in6 *)&local)->sin6_addr);
      }
      if (name)
        base_strlcpy(f->route_iface, name, sizeof f->route_iface);
      else
        snprintf(f->master_error, sizeof f->master_error,
                 "the local address used to reach master %s belongs to no interface", cfg->master);
    }
    if (fd >= 0) close(fd);
  } else if (ai->ai_family == AF_INET) {
    uint32_t a;
    memcpy(&a, &((struct sockaddr_in *)(void *)ai->ai_addr)->sin_addr, 4);
    const route4 *best = route_lookup(rt, nrt, a);
    if (best)
      base_strlcpy(f->route_iface, best->iface, sizeof f->route_iface);
    else
      snprintf(f->master_error, sizeof f->master_error, "no route to master %s (%s) in net/route",
               cfg->master, f->master_addr);
  } else {
    route6_lookup(r, ((struct sockaddr_in6 *)(void *)ai->ai_addr)->sin6_addr.s6_addr,
                  f->route_iface, sizeof f->route_iface);
    if (f->route_iface[0] == '\0')
      snprintf(f->master_error, sizeof f->master_error,
               "no route to master %s (%s) in net/ipv6_route", cfg->master, f->master_addr);
  }
  freeaddrinfo(res);
out:
  free(rt);
}

static void probe_limits(const probe_roots *r, const doctor_config *cfg, doctor_facts *f) {
  char path[PATH_MAX];
  if (doctor_join(path, sizeof path, r->proc, "self/limits") == 0) {
    FILE *fp = fopen(path, "re");
    if (fp != NULL) {
      char line[256];
      while (fgets(line, sizeof line, fp) != NULL) {
        if (strncmp(line, "Max locked memory", 17) != 0) continue;
        char soft[64];
        if (sscanf(line + 17, "%63s", soft) != 1) break;
        if (strcmp(soft, "unlimited") == 0) {
          f->memlock_known = 1;
          f->memlock_unlimited = 1;
        } else {
          int64_t v;
          if (base_parse_i64(soft, 0, INT64_MAX, &v) == 0) {
            f->memlock_known = 1;
            f->memlock_bytes = (uint64_t)v;
          }
        }
        break;
      }
      fclose(fp);
    }
  }
  if (!f->memlock_known && cfg->ifaddrs_file == NULL) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
      f->memlock_known = 1;
      if (rl.rlim_cur == RLIM_INFINITY)
        f->memlock_unlimited = 1;
      else
        f->memlock_bytes = (uint64_t)rl.rlim_cur;
    }
  }

  struct statvfs sv;
  if (doctor_join(path, sizeof path, r->dev, "shm") == 0 && statvfs(path, &sv) == 0) {
    f->shm_known = 1;
    f->shm_bytes = (uint64_t)sv.f_blocks * (uint64_t)sv.f_frsize;
  }

  struct stat st;
  if (doctor_join(path, sizeof path, r->dev, "infiniband") == 0 && stat(path, &st) == 0 &&
      S_ISDIR(st.st_mode)) {
    f->dev_infiniband = 1;
    char **names;
    size_t n;
    if (doctor_list_dir(path, &names, &n) == 0) {
      for (size_t i = 0; i < n; i++)
        if (strncmp(names[i], "uverbs", 6) == 0) f->uverbs_count++;
      doctor_list_free(names, n);
    }
  }

  if (doctor_join(path, sizeof path, r->proc, "meminfo") == 0) {
    FILE *fp = fopen(path, "re");
    if (fp != NULL) {
      char line[256];
      long v;
      while (fgets(line, sizeof line, fp) != NULL) {
        if (sscanf(line, "HugePages_Total: %ld", &v) == 1) {
          f->hugepages_total = v;
          f->hugepages_known = 1;
        } else if (sscanf(line, "Hugepagesize: %ld", &v) == 1) {
          f->hugepage_kb = v;
        } else if (sscanf(line, "MemTotal: %ld kB", &v) == 1 && v > 0 && v < (1L << 50)) {
          f->mem_total_known = 1;
          f->mem_total_bytes = (uint64_t)v * 1024;
        }
      }
      fclose(fp);
    }
  }
}

/* "2.21.5" at the start of s (two or three numbers). */
static int parse_version(const char *s, int *maj, int *min, int *pat) {
  int a, b, c = -1, used = 0;
  if (sscanf(s, "%d.%d%n", &a, &b, &used) != 2) return -EINVAL;
  if (s[used] == '.' && isdigit((unsigned char)s[used + 1])) c = atoi(s + used + 1);
  *maj = a;
  *min = b;
  *pat = c;
  return 0;
}

static int version_cmp(int a1, int a2, int a3, int b1, int b2, int b3) {
  if (a1 != b1) return a1 < b1 ? -1 : 1;
  if (a2 != b2) return a2 < b2 ? -1 : 1;
  if (a3 != b3) return a3 < b3 ? -1 : 1;
  return 0;
}

static void nccl_consider(doctor_facts *f, const char *path, int maj, int min, int pat) {
  if (!f->nccl_found ||
      (maj >= 0 && (f->nccl_major < 0 ||
                    version_cmp(maj, min, pat, f->nccl_major, f->nccl_minor, f->nccl_patch) > 0))) {
    f->nccl_found = 1;
    f->nccl_major = maj;
    f->nccl_minor = min;
    f->nccl_patch = pat;
    base_strlcpy(f->nccl_path, path, sizeof f->nccl_path);
  }
}

/* What one path found by the search says about the NCCL version. */
static void nccl_inspect(doctor_facts *f, const char *path) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  int maj = -1, min = -1, pat = -1;
  if (strncmp(base, "libnccl.so", 10) == 0) {
    if (base[10] == '.' && parse_version(base + 11, &maj, &min, &pat) == 0) {
      nccl_consider(f, path, maj, min, pat);
      return;
    }
    /* libnccl.so or libnccl.so.2: the link target usually carries the version. */
    char target[PATH_MAX];
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n > 0) {
      target[n] = '\0';
      const char *tb = strrchr(target, '/');
      tb = tb ? tb + 1 : target;
      if (strncmp(tb, "libnccl.so.", 11) == 0 && parse_version(tb + 11, &maj, &min, &pat) == 0) {
        nccl_consider(f, path, maj, min, pat);
        return;
      }
    }
    nccl_consider(f, path, -1, -1, -1);
  } else if (strcmp(base, "nccl.h") == 0) {
    FILE *fp = fopen(path, "re");
    if (fp == NULL) return;
    char line[256];
    while (fgets(line, sizeof line, fp) != NULL) {
      int v;
      if (sscanf(line, "#define NCCL_MAJOR %d", &v) == 1)
        maj = v;
      else if (sscanf(line, "#define NCCL_MINOR %d", &v) == 1)
        min = v;
      else if (sscanf(line, "#define NCCL_PATCH %d", &v) == 1)
        pat = v;
    }
    fclose(fp);
    if (maj >= 0 && min >= 0) nccl_consider(f, path, maj, min, pat);
  } else {
    /* pip's nvidia_nccl_cu12-2.21.5.dist-info */
    const char *dash = strchr(base, '-');
    if (dash && parse_version(dash + 1, &maj, &min, &pat) == 0)
      nccl_consider(f, path, maj, min, pat);
  }
}

/* Each absolute directory of the colon-separated variable VAR ("NAME=") in
 * envp, less the suffix STRIP (entries without it are skipped) when given,
 * followed by the glob pattern TAIL, under the lib root: each path found
 * goes to inspect, in the order of the variable. */
typedef void (*inspect_fn)(doctor_facts *f, const char *path);

static void search_var(const probe_roots *r, char **envp, const char *var, const char *strip,
                       const char *tail, inspect_fn inspect, doctor_facts *f) {
  size_t vlen = strlen(var), slen = strip ? strlen(strip) : 0;
  for (char **e = envp; e != NULL && *e != NULL; e++) {
    if (strncmp(*e, var, vlen) != 0) continue;
    char dirs[4096];
    base_strlcpy(dirs, *e + vlen, sizeof dirs);
    char *save = NULL;
    for (char *d = strtok_r(dirs, ":", &save); d != NULL; d = strtok_r(NULL, ":", &save)) {
      size_t dlen = strlen(d);
      if (d[0] != '/') continue;
      if (strip != NULL) {
        if (dlen <= slen || strcmp(d + dlen - slen, strip) != 0) continue;
        d[dlen - slen] = '\0';
      }
      char rel[PATH_MAX], path[PATH_MAX];
      if (doctor_pathf(rel, sizeof rel, "%s%s", d, tail) != 0) continue;
      if (doctor_join(path, sizeof path, r->lib, rel) != 0) continue;
      glob_t g;
      if (glob(path, GLOB_NOSORT, NULL, &g) == 0)
        for (size_t k = 0; k < g.gl_pathc; k++) inspect(f, g.gl_pathv[k]);
      globfree(&g);
    }
  }
}

/* Whether any RDMA port has the Ethernet link layer (RoCE). */
static int has_roce(const doctor_facts *f) {
  for (size_t i = 0; i < f->nhcas; i++)
    for (size_t p = 0; p < f->hcas[i].nports; p++)
      if (f->hcas[i].ports[p].link == DOCTOR_LINK_ETH) return 1;
  return 0;
}

static void probe_nccl(const probe_roots *r, char **envp, doctor_facts *f) {
  f->nccl_probed = 1;
  static const char *patterns[] = {
      "usr/lib/libnccl.so*",
      "usr/lib64/libnccl.so*",
      "usr/lib/*-linux-gnu/libnccl.so*",
      "usr/local/lib/libnccl.so*",
      "usr/local/lib64/libnccl.so*",
      "usr/local/cuda*/lib*/libnccl.so*",
      "usr/local/cuda*/targets/*/lib/libnccl.so*",
      "usr/local/nccl*/lib/libnccl.so*",
      "opt/nccl*/lib/libnccl.so*",
      "usr/include/nccl.h",
      "usr/local/include/nccl.h",
      "usr/local/cuda*/include/nccl.h",
      "usr/lib/python3*/*-packages/nvidia_nccl_cu*.dist-info",
      "usr/local/lib/python3*/*-packages/nvidia_nccl_cu*.dist-info",
      "opt/conda/lib/python3*/site-packages/nvidia_nccl_cu*.dist-info",
  };
  char path[PATH_MAX];
  for (size_t i = 0; i < BASE_ARRAY_LEN(patterns); i++) {
    if (doctor_join(path, sizeof path, r->lib, patterns[i]) != 0) continue;
    glob_t g;
    if (glob(path, GLOB_NOSORT, NULL, &g) == 0) {
      for (size_t k = 0; k < g.gl_pathc; k++) nccl_inspect(f, g.gl_pathv[k]);
    }
    globfree(&g);
  }
  /* The loader also looks in LD_LIBRARY_PATH; and a worker's Python is one
   * on PATH, with pip's NCCL in its environment (a venv or conda prefix:
   * DIR/bin on PATH, DIR/lib/python3.X/site-packages), as on GPU images. */
  search_var(r, envp, "LD_LIBRARY_PATH=", NULL, "/libnccl.so*", nccl_inspect, f);
  search_var(r, envp, "PATH=", "/bin", "/lib/python3*/*-packages/nvidia_nccl_cu*.dist-info",
             nccl_inspect, f);
}

/* The NVIDIA driver's version: the first token that starts with a digit and
 * holds a dot in PROC/driver/nvidia/version's first line ("NVRM version:
 * NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..."). */
static void probe_driver(const probe_roots *r, doctor_facts *f) {
  char path[PATH_MAX], line[512];
  if (doctor_join(path, sizeof path, r->proc, "driver/nvidia/version") != 0) return;
  FILE *fp = fopen(path, "re");
  if (fp == NULL) return;
  if (fgets(line, sizeof line, fp) != NULL) {
    char *save = NULL;
    for (char *w = strtok_r(line, " \t\n", &save); w != NULL; w = strtok_r(NULL, " \t\n", &save))
      if (w[0] >= '0' && w[0] <= '9' && strchr(w, '.') != NULL) {
        base_strlcpy(f->driver, w, sizeof f->driver);
        break;
      }
  }
  fclose(fp);
}

/* A libcuda.so.1 found: the first one is the loader's; its version is the
 * name of the file the link resolves to ("libcuda.so.580.159.04"). */
static void cuda_inspect(doctor_facts *f, const char *path) {
  if (f->cuda_lib[0] != '\0') return;
  base_strlcpy(f->cuda_lib, path, sizeof f->cuda_lib);
  char real[PATH_MAX];
  if (realpath(path, real) == NULL) return;
  const char *base = strrchr(real, '/');
  base = base ? base + 1 : real;
  const char *v = base + strlen("libcuda.so.");
  if (strncmp(base, "libcuda.so.", strlen("libcuda.so.")) == 0 && isdigit((unsigned char)*v) &&
      strchr(v, '.') != NULL && strspn(v, "0123456789.") == strlen(v))
    base_strlcpy(f->cuda_lib_version, v, sizeof f->cuda_lib_version);
}

/* The CUDA driver library, in the loader's order: LD_LIBRARY_PATH, then the
 * system's directories (those ldconfig knows on Debian, Ubuntu and RHEL, and
 * where GKE mounts the driver). */
static void probe_cuda_lib(const probe_roots *r, char **envp, doctor_facts *f) {
  search_var(r, envp, "LD_LIBRARY_PATH=", NULL, "/libcuda.so.1", cuda_inspect, f);
  static const char *patterns[] = {
      "usr/lib/*-linux-gnu/libcuda.so.1",
      "usr/lib64/libcuda.so.1",
      "usr/lib/libcuda.so.1",
      "usr/local/nvidia/lib64/libcuda.so.1",
      "usr/local/nvidia/lib/libcuda.so.1",
  };
  char path[PATH_MAX];
  for (size_t i = 0; i < BASE_ARRAY_LEN(patterns) && f->cuda_lib[0] == '\0'; i++) {
    if (doctor_join(path, sizeof path, r->lib, patterns[i]) != 0) continue;
    glob_t g;
    if (glob(path, 0, NULL, &g) == 0)
      for (size_t k = 0; k < g.gl_pathc; k++) cuda_inspect(f, g.gl_pathv[k]);
    globfree(&g);
  }
}

/* The GPUs, through the placement's own probe (topo.h); a tree without CPUs
 * (the RDMA fixtures) has no GPU facts either. */
static int probe_gpus(const probe_roots *r, char **envp, doctor_facts *f) {
  topo *t = calloc(1, sizeof *t);
  if (t == NULL) return -ENOMEM;
  topo_config tc = {r->sys, r->proc, r->dev, envp};
  char err[160];
  if (topo_probe(&tc, t, err, sizeof err) == 0 && t->vendor != TOPO_NO_GPU) {
    base_strlcpy(f->gpu_vendor, t->vendor == TOPO_NVIDIA ? "nvidia" : "amd", sizeof f->gpu_vendor);
    f->gpus_found = t->nfound;
    base_strlcpy(f->gpu_visible_var, t->visible_var, sizeof f->gpu_visible_var);
    for (int i = 0; i < t->ngpu && f->ngpus < DOCTOR_MAX_GPUS; i++) {
      doctor_gpu *g = &f->gpus[f->ngpus++];
      base_strlcpy(g->pci, t->gpu[i].pci, sizeof g->pci);
      base_strlcpy(g->uuid, t->gpu[i].uuid, sizeof g->uuid);
      g->numa = t->gpu[i].numa < 0 ? 0 : t->gpu[i].numa;
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int c = 0; c < t->ncpu; c++)
        if (t->cpu[c].numa == g->numa) CPU_SET(t->cpu[c].id, &set);
      topo_format_cpulist(&set, g->cpus, sizeof g->cpus);
    }
    if (t->vendor == TOPO_NVIDIA) {
      probe_driver(r, f);
      probe_cuda_lib(r, envp, f);
    }
  }
  free(t);
  return 0;
}

static int check_dir(const char *root) {
  struct stat st;
  if (stat(root, &st) != 0) return -errno;
  return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

int doctor_probe(const doctor_config *cfg_in, char **envp, doctor_facts **out) {
  if (out == NULL) return -EINVAL;
  *out = NULL;
  doctor_config cfg = cfg_in ? *cfg_in : (doctor_config){0};
  probe_roots r = {cfg.sysfs_root ? cfg.sysfs_root : "/sys",
                   cfg.proc_root ? cfg.proc_root : "/proc", cfg.dev_root ? cfg.dev_root : "/dev",
                   cfg.lib_root ? cfg.lib_root : "/"};
  int rc;
  if ((rc = check_dir(r.sys)) != 0 || (rc = check_dir(r.proc)) != 0 ||
      (rc = check_dir(r.dev)) != 0 || (rc = check_dir(r.lib)) != 0)
    return rc;
  doctor_facts *f = calloc(1, sizeof *f);
  if (f == NULL) return -ENOMEM;
  f->nccl_major = f->nccl_minor = f->nccl_patch = -1;

  if ((rc = probe_hcas(&r, f)) != 0) goto fail;
  if ((rc = probe_ifaces(&r, f)) != 0) goto fail;
  if (cfg.ifaddrs_file == NULL)
    rc = live_addrs(f);
  else
    rc = file_addrs(cfg.ifaddrs_file, f);
  if (rc == -ENOMEM) goto fail;
  if (rc != 0) {
    if (cfg.ifaddrs_file != NULL && f->nnotes == 0)
      doctor_list_add(&f->notes, &f->nnotes, "cannot read %s: %s", cfg.ifaddrs_file, strerror(-rc));
    else if (cfg.ifaddrs_file == NULL)
      doctor_list_add(&f->notes, &f->nnotes, "getifaddrs failed: %s", strerror(-rc));
    rc = 0;
  }
  if (f->nifaces > 1) {
    /* Addresses may have added interfaces: keep the natural order. */
    for (size_t i = 1; i < f->nifaces; i++) {
      doctor_iface t = f->ifaces[i];
      size_t j = i;
      while (j > 0 && doctor_natural_cmp(f->ifaces[j - 1].name, t.name) > 0) {
        f->ifaces[j] = f->ifaces[j - 1];
        j--;
      }
      f->ifaces[j] = t;
    }
  }
  probe_routes(&r, &cfg, f);
  probe_limits(&r, &cfg, f);
  if (!cfg.nccl_if_needed || has_roce(f)) probe_nccl(&r, envp, f);
  if ((rc = probe_gpus(&r, envp, f)) != 0) goto fail;
  *out = f;
  return 0;
fail:
  doctor_facts_destroy(f);
  return rc;
}

void doctor_facts_destroy(doctor_facts *f) {
  if (f == NULL) return;
  for (size_t i = 0; i < f->nhcas; i++) {
    for (size_t p = 0; p < f->hcas[i].nports; p++) free(f->hcas[i].ports[p].gids);
    free(f->hcas[i].ports);
    free(f->hcas[i].netdevs);
  }
  free(f->hcas);
  for (size_t i = 0; i < f->nifaces; i++) free(f->ifaces[i].addrs);
  free(f->ifaces);
  doctor_list_free(f->notes, f->nnotes);
  free(f);
}

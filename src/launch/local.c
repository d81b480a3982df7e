/*
 * local.c - is a host of the list this machine? Its agent then runs here
 * without ssh, as mpirun runs the ranks of its own node: one ssh
 * connection, key exchange and login fewer, and usually the first host's,
 * which hosts the store the others wait for.
 */
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "launch/launch.h"

/* 1 when a is a loopback address or one of this machine's interfaces'. */
static int address_is_local(const struct sockaddr *a, const struct ifaddrs *ifs) {
  if (a->sa_family == AF_INET) {
    const struct in_addr *v4 = &((const struct sockaddr_in *)a)->sin_addr;
    if ((ntohl(v4->s_addr) >> 24) == 127) return 1;
  } else if (a->sa_family == AF_INET6) {
    if (IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr)) return 1;
  } else {
    return 0;
  }
  for (const struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
    const struct sockaddr *b = i->ifa_addr;
    if (b == NULL || b->sa_family != a->sa_family) continue;
    if (a->sa_family == AF_INET && ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
                                       ((const struct sockaddr_in *)b)->sin_addr.s_addr)
      return 1;
    if (a->sa_family == AF_INET6 &&
        memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
               &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0)
      return 1;
  }
  return 0;
}

/* 1 when name (no user@) resolves to an address of this machine. */
static int name_is_local(const char *name, const struct ifaddrs *ifs) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(name, NULL, &hints, &res) != 0) return 0;
  int local = 0;
  for (const struct addrinfo *r = res; r != NULL && !local; r = r->ai_next)
    local = address_is_local(r->ai_addr, ifs);
  freeaddrinfo(res);
  return local;
}

long launch_local_host(const launch_hosts *h) {
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) return -1;
  long found = -1;
  for (size_t i = 0; i < h->n && found < 0; i++)
    if (strchr(h->v[i].name, '@') == NULL && name_is_local(h->v[i].name, ifs)) found = (long)i;
  freeifaddrs(ifs);
  return found;
}

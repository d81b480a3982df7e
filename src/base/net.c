/* net.c - TCP helpers with deadlines. */
#include "base/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"

int base_split_hostport(const char *s, char *host, size_t hostlen, int *port, int allow_zero) {
  if (s == NULL) return -EINVAL;
  const char *colon;
  const char *hbeg = s;
  size_t hlen;
  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (close == NULL || close[1] != ':') return -EINVAL;
    hbeg = s + 1;
    hlen = (size_t)(close - hbeg);
    colon = close + 1;
  } else {
    colon = strrchr(s, ':');
    if (colon == NULL) return -EINVAL;
    /* An unbracketed IPv6 literal is ambiguous: refuse it. */
    if (memchr(s, ':', (size_t)(colon - s)) != NULL) return -EINVAL;
    hlen = (size_t)(colon - s);
  }
  if (hlen >= hostlen) return -EINVAL;
  int p;
  if (base_parse_int(colon + 1, allow_zero ? 0 : 1, 65535, &p) != 0) return -EINVAL;
  memcpy(host, hbeg, hlen);
  host[hlen] = '\0';
  *port = p;
  return 0;
}

void base_join_hostport(const char *host, int port, char *out, size_t outlen) {
  if (strchr(host, ':') != NULL)
    snprintf(out, outlen, "[%s]:%d", host, port);
  else
    snprintf(out, outlen, "%s:%d", host, port);
}

int base_set_nonblock(int fd, int on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -errno;
  fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, fl) < 0) return -errno;
  return 0;
}

int base_tcp_listen(const char *host, int port, int backlog, int *out_fd, int *out_port) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  const char *node = (host == NULL || host[0] == '\0') ? "0.0.0.0" : host;
  int gai = getaddrinfo(node, portstr, &hints, &res);
  if (gai != 0) return gai == EAI_SYSTEM ? -errno : -EADDRNOTAVAIL;
  int rc = -EADDRNOTAVAIL;
  for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      rc = -errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, backlog) != 0) {
      rc = -errno;
      close(fd);
      continue;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    int bound = 0;
    base_sockaddr_str((struct sockaddr *)&ss, NULL, 0, &bound);
    *out_fd = fd;
    if (out_port) *out_port = bound;
    rc = 0;
    break;
  }
  freeaddrinfo(res);
  return rc;
}

int base_free_port(const char *host, int *out_port) {
  int fd;
  int rc = base_tcp_listen(host, 0, 1, &fd, out_port);
  if (rc == 0) close(fd);
  return rc;
}

static int connect_one(const struct addrinfo *ai, int64_t deadline_ms, int *out_fd) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -errno;
  int rc = 0;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      rc = -errno;
      goto out;
    }
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    for (;;) {
      int n = poll(&p, 1, base_deadline_left(deadline_ms));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        rc = -errno;
        goto out;
      }
      if (n == 0) {
        rc = -ETIMEDOUT;
        goto out;
      }
      break;
    }
    int err = 0;
    socklen_t el = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err != 0) {
      rc = -err;
      goto out;
    }
  }
  base_set_nonblock(fd, 0);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  *out_fd = fd;
  return 0;
out:
  close(fd);
  return rc;
}

int base_tcp_connect(const char *host, int port, int64_t deadline_ms, int *out_fd) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  int gai = getaddrinfo(host, portstr, &hints, &res);
  if (gai != 0) {
    if (gai == EAI_SYSTEM) return -errno;
    /* A name that does not resolve (yet) is reported like a host that is down. */
    return -EHOSTUNREACH;
  }
  int rc = -EHOSTUNREACH;
  for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
    rc = connect_one(ai, deadline_ms, out_fd);
    if (rc == 0 || rc == -ETIMEDOUT) break;
  }
  freeaddrinfo(res);
  return rc;
}

static int wait_fd(int fd, short events, int64_t deadline_ms) {
  struct pollfd p = {.fd = fd, .events = events};
  for (;;) {
    int n = poll(&p, 1, base_deadline_left(deadline_ms));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) return -ETIMEDOUT;
    return 0;
  }
}

int base_read_full(int fd, void *buf, size_t len, int64_t deadline_ms) {
  char *p = buf;
  while (len > 0) {
    int rc = wait_fd(fd, POLLIN, deadline_ms);
    if (rc != 0) return rc;
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return -errno;
    }
    if (n == 0) return -ECONNRESET;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int base_write_full(int fd, const void *buf, size_t len, int64_t deadline_ms) {
  const char *p = buf;
  while (len > 0) {
    int rc = wait_fd(fd, POLLOUT, deadline_ms);
    if (rc != 0) return rc;
    ssize_t n = send(fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return -errno;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int base_sockaddr_str(const struct sockaddr *sa, char *host, size_t hostlen, int *port) {
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    if (host && inet_ntop(AF_INET, &in->sin_addr, host, (socklen_t)hostlen) == NULL) return -errno;
    if (port) *port = ntohs(in->sin_port);
    return 0;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    if (host && inet_ntop(AF_INET6, &in6->sin6_addr, host, (socklen_t)hostlen) == NULL)
      return -errno;
    if (port) *port = ntohs(in6->sin6_port);
    return 0;
  }
  return -EAFNOSUPPORT;
}

int base_route_addrs(const char *host, int port, char *local, size_t locallen, char *remote,
                     size_t remotelen) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV;
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  if (getaddrinfo(host, portstr, &hints, &res) != 0) return -EHOSTUNREACH;
  int rc = -EHOSTUNREACH;
  for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      struct sockaddr_storage ss;
      socklen_t sl = sizeof ss;
      if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
          base_sockaddr_str((struct sockaddr *)&ss, local, locallen, NULL) == 0 &&
          base_sockaddr_str(ai->ai_addr, remote, remotelen, NULL) == 0)
        rc = 0;
    }
    close(fd);
    if (rc == 0) break;
  }
  freeaddrinfo(res);
  return rc;
}

int base_iface_of_addr(const char *addr, char *name, size_t namelen) {
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) return -errno;
  int rc = -ENOENT;
  for (struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
    if (i->ifa_addr == NULL) continue;
    char a[BASE_HOST_MAX];
    if (base_sockaddr_str(i->ifa_addr, a, sizeof a, NULL) != 0) continue;
    if (strcmp(a, addr) == 0) {
      base_strlcpy(name, i->ifa_name, namelen);
      rc = 0;
      break;
    }
  }
  freeifaddrs(ifs);
  return rc;
}

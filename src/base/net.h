/*
 * net.h - sockets and addresses with deadlines.
 *
 * All descriptors are created O_CLOEXEC. Functions return 0 or -errno
 * (-ETIMEDOUT when the deadline, an absolute base_now_ms() value, passes).
 */
#ifndef COHORT_BASE_NET_H
#define COHORT_BASE_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define BASE_HOST_MAX 256

/*
 * Splits "host:port", "[v6addr]:port" or ":port" (host empty) into parts.
 * Returns -EINVAL for anything else (missing port, port out of 1..65535
 * unless allow_zero).
 */
int base_split_hostport(const char *s, char *host, size_t hostlen, int *port, int allow_zero);

/* Formats host and port as "host:port", bracketing IPv6 literals. */
void base_join_hostport(const char *host, int port, char *out, size_t outlen);

/*
 * Listens on host:port (host NULL or "" means all IPv4 addresses, "::" all
 * IPv6; port 0 picks a free one). *out_port receives the bound port.
 */
int base_tcp_listen(const char *host, int port, int backlog, int *out_fd, int *out_port);

/*
 * Connects to host:port, trying every address the name resolves to, until
 * the deadline. One attempt per address; the caller retries. Returns the
 * connected blocking socket (TCP_NODELAY set) in *out_fd.
 */
int base_tcp_connect(const char *host, int port, int64_t deadline_ms, int *out_fd);

/* Returns a port that was free a moment ago on host (0.0.0.0 if NULL). */
int base_free_port(const char *host, int *out_port);

int base_set_nonblock(int fd, int on);

/* Reads or writes exactly len bytes before the deadline (poll-based). */
int base_read_full(int fd, void *buf, size_t len, int64_t deadline_ms);
int base_write_full(int fd, const void *buf, size_t len, int64_t deadline_ms);

/* Numeric text of a socket address ("10.0.0.1" / "fe80::1"); port optional. */
int base_sockaddr_str(const struct sockaddr *sa, char *host, size_t hostlen, int *port);

/*
 * Which local address routes to host:port, and host's numeric address: a
 * UDP socket is connect()ed (no packet is sent) and asked for both ends.
 */
int base_route_addrs(const char *host, int port, char *local, size_t locallen, char *remote,
                     size_t remotelen);

/* Name of the interface that holds the numeric address addr ("lo", "eth0"). */
int base_iface_of_addr(const char *addr, char *name, size_t namelen);

#endif

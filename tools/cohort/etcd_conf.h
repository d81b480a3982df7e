/*
 * etcd_conf.h - etcd's endpoints and --rdzv-conf settings as the command
 * lines give them, shared by `cohort run` and the commands that find a
 * running job (status, stop, stacks), so both read them the same way.
 */
#ifndef COHORT_TOOLS_ETCD_CONF_H
#define COHORT_TOOLS_ETCD_CONF_H

#include <stddef.h>

#include "rdzv/etcd.h"

/* etcd's --rdzv-conf settings (etcd_conf.c); strings in static storage. */
typedef struct etcd_conf {
  int https; /* protocol=https */
  const char *cacert, *cert, *key, *user, *password_file;
} etcd_conf;

/* One --rdzv-conf KEY=VALUE of etcd's: 0 taken, 1 not one of etcd's keys, -1 a bad value. */
int etcd_conf_pair(etcd_conf *c, const char *key, const char *value);
/*
 * "HOST[:PORT],..." as "HOST:PORT,..." (2379 when left out, IPv6 in
 * brackets) into out: the one spelling every node and command derives the
 * job id from. -1 when an item is not HOST[:PORT] or out is too small.
 */
int etcd_conf_endpoints(const char *list, char *out, size_t cap);
/*
 * The client's options from c for endpoints (kept by pointer): HTTPS when
 * asked, cert with key, user with password_file, the password read into
 * pw (STORE_TOKEN_MAX + 2 bytes). CLI_OK, or the usage error's status
 * after one line as who.
 */
int etcd_conf_opts(const char *who, const etcd_conf *c, const char *endpoints, char *pw,
                   size_t pwlen, etcd_opts *o);

#endif

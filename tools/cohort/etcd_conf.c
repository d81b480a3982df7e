/* etcd_conf.c - etcd's --rdzv-conf keys and endpoint lists (etcd_conf.h). */
#include "tools/cohort/etcd_conf.h"

#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "base/net.h"
#include "store/auth.h"
#include "tools/cli.h"
#include "tools/cohort/cmd.h"

int etcd_conf_pair(etcd_conf *c, const char *key, const char *value) {
  static char store[5][1024];
  static const char *const keys[] = {"cacert", "cert", "key", "user", "password_file"};
  const char **slots[] = {&c->cacert, &c->cert, &c->key, &c->user, &c->password_file};
  if (strcmp(key, "protocol") == 0) {
    if (strcmp(value, "https") != 0 && strcmp(value, "http") != 0) return -1;
    c->https = strcmp(value, "https") == 0;
    return 0;
  }
  for (int i = 0; i < 5; i++) {
    if (strcmp(key, keys[i]) != 0) continue;
    if (value[0] == '\0' || strlen(value) >= sizeof store[i]) return -1;
    memcpy(store[i], value, strlen(value) + 1);
    *slots[i] = store[i];
    return 0;
  }
  return 1;
}

/* One endpoint, HOST[:PORT] (2379 when left out), appended to out. */
static int list_item(const char *item, size_t n, char *out, size_t cap) {
  char one[BASE_HOST_MAX + 16], host[BASE_HOST_MAX], joined[BASE_HOST_MAX + 32];
  int port = 2379;
  if (n == 0 || n >= sizeof one - 8) return -1;
  memcpy(one, item, n);
  one[n] = '\0';
  if (base_split_hostport(one, host, sizeof host, &port, 0) != 0) {
    snprintf(joined, sizeof joined, "%s:2379", one);
    if (base_split_hostport(joined, host, sizeof host, &port, 0) != 0) return -1;
  }
  if (host[0] == '\0') return -1;
  base_join_hostport(host, port, joined, sizeof joined);
  size_t at = strlen(out);
  if (at + strlen(joined) + 2 > cap) return -1;
  snprintf(out + at, cap - at, "%s%s", at ? "," : "", joined);
  return 0;
}

int etcd_conf_endpoints(const char *list, char *out, size_t cap) {
  if (cap == 0) return -1;
  out[0] = '\0';
  for (const char *p = list; *p != '\0';) {
    size_t n = strcspn(p, ",");
    if (list_item(p, n, out, cap) != 0) return -1;
    p += n;
    if (*p == ',') p++;
  }
  return out[0] != '\0' ? 0 : -1;
}

int etcd_conf_opts(const char *who, const etcd_conf *c, const char *endpoints, char *pw,
                   size_t pwlen, etcd_opts *o) {
  *o = (etcd_opts){
      .endpoints = endpoints, .cacert = c->cacert, .cert = c->cert, .key = c->key, .user = c->user};
  if (c->https && o->cacert == NULL) o->cacert = "";
  if ((c->cert == NULL) != (c->key == NULL))
    return cli_usage_error(who, "--rdzv-conf cert and key go together");
  if ((c->user == NULL) != (c->password_file == NULL))
    return cli_usage_error(who, "--rdzv-conf user and password_file go together");
  if (c->password_file != NULL) {
    int rc = cmd_secret_file(who, "password", c->password_file, pw, pwlen);
    if (rc != CLI_OK) return rc;
    o->password = pw;
  }
  return CLI_OK;
}

/* where.c - where a job's store is, from the command lines' options (where.h). */
#include "rdzv/where.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "base/net.h"

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (errlen > 0) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -EINVAL;
}

static int parse_bool(const char *v, int *out) {
  static const char *const yes[] = {"1", "true", "True", "yes", "on"};
  static const char *const no[] = {"0", "false", "False", "no", "off"};
  for (size_t i = 0; i < BASE_ARRAY_LEN(yes); i++) {
    if (strcmp(v, yes[i]) == 0) return *out = 1, 0;
    if (strcmp(v, no[i]) == 0) return *out = 0, 0;
  }
  return -1;
}

/* One KEY=VALUE: 0 taken, 1 not a key of cohort's, -1 a bad value. */
static int conf_pair(rdzv_conf *c, const char *key, const char *value) {
  static const char *const strs[] = {"cacert", "cert", "key", "user", "password_file"};
  const char **slots[] = {&c->cacert, &c->cert, &c->key, &c->user, &c->password_file};
  if (strcmp(key, "join_timeout") == 0)
    return base_parse_seconds(value, 86400, &c->join_timeout_ms) == 0 && c->join_timeout_ms >= 1
               ? 0
               : -1;
  if (strcmp(key, "last_call_timeout") == 0)
    return base_parse_seconds(value, 3600, &c->last_call_ms) == 0 ? 0 : -1;
  if (strcmp(key, "is_host") == 0) return parse_bool(value, &c->is_host);
  if (strcmp(key, "protocol") == 0) {
    if (strcmp(value, "https") != 0 && strcmp(value, "http") != 0) return -1;
    c->https = strcmp(value, "https") == 0;
    return 0;
  }
  for (size_t i = 0; i < BASE_ARRAY_LEN(strs); i++) {
    if (strcmp(key, strs[i]) != 0) continue;
    if (value[0] == '\0') return -1;
    *slots[i] = value;
    return 0;
  }
  return 1;
}

int rdzv_conf_parse(const char *conf, rdzv_conf *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->join_timeout_ms = out->last_call_ms = -1;
  out->is_host = -1;
  if (strlen(conf) >= sizeof out->text) return fail(err, errlen, "--rdzv-conf is too long");
  memcpy(out->text, conf, strlen(conf) + 1);
  char *save = NULL;
  for (char *kv = strtok_r(out->text, ",", &save); kv != NULL; kv = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(kv, '=');
    if (eq == NULL || eq == kv)
      return fail(err, errlen, "--rdzv-conf '%s': KEY=VALUE,... expected", conf);
    *eq = '\0';
    int rc = conf_pair(out, kv, eq + 1);
    if (rc < 0) return fail(err, errlen, "--rdzv-conf %s: bad value '%s'", kv, eq + 1);
    size_t at = strlen(out->unused);
    if (rc == 1) snprintf(out->unused + at, sizeof out->unused - at, "%s%s", at ? "," : "", kv);
  }
  return 0;
}

/* One endpoint, HOST[:PORT] (2379 when left out), appended to out. */
static int etcd_item(const char *item, size_t n, char *out, size_t cap) {
  char one[BASE_HOST_MAX + 16], host[BASE_HOST_MAX], joined[BASE_HOST_MAX + 32];
  int port = 2379;
  if (n == 0 || n >= sizeof one - 8) return -EINVAL;
  memcpy(one, item, n);
  one[n] = '\0';
  if (base_split_hostport(one, host, sizeof host, &port, 0) != 0) {
    snprintf(joined, sizeof joined, "%s:2379", one);
    if (base_split_hostport(joined, host, sizeof host, &port, 0) != 0) return -EINVAL;
  }
  if (host[0] == '\0') return -EINVAL;
  base_join_hostport(host, port, joined, sizeof joined);
  size_t at = strlen(out);
  if (at + strlen(joined) + 2 > cap) return -EINVAL;
  snprintf(out + at, cap - at, "%s%s", at ? "," : "", joined);
  return 0;
}

int rdzv_etcd_endpoints(const char *list, char *out, size_t cap) {
  if (cap == 0) return -EINVAL;
  out[0] = '\0';
  for (const char *p = list; *p != '\0';) {
    size_t n = strcspn(p, ",");
    if (etcd_item(p, n, out, cap) != 0) return -EINVAL;
    p += n;
    if (*p == ',') p++;
  }
  return out[0] != '\0' ? 0 : -EINVAL;
}

/* etcd: the endpoints, and TLS and credentials from --rdzv-conf. */
static int where_etcd(const rdzv_where_in *in, rdzv_where *out, char *err, size_t errlen) {
  const char *list = in->endpoint != NULL ? in->endpoint : in->master;
  if (list == NULL)
    return fail(err, errlen, "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT[,...]");
  if (rdzv_etcd_endpoints(list, out->master, sizeof out->master) != 0)
    return fail(err, errlen, "etcd endpoints '%s': each must be HOST[:PORT]", list);
  out->method = RDZV_ETCD;
  out->etcd.endpoints = out->master;
  const rdzv_conf *c = in->conf;
  if (c == NULL) return 0;
  if ((c->cert == NULL) != (c->key == NULL))
    return fail(err, errlen, "--rdzv-conf cert and key go together");
  if ((c->user == NULL) != (c->password_file == NULL))
    return fail(err, errlen, "--rdzv-conf user and password_file go together");
  out->etcd.cacert = c->https && c->cacert == NULL ? "" : c->cacert;
  out->etcd.cert = c->cert;
  out->etcd.key = c->key;
  out->etcd.user = c->user;
  return 0;
}

/* The built-in store at --rdzv-endpoint HOST[:PORT], 29400 when left out. */
static int where_store(const rdzv_where_in *in, rdzv_where *out, char *err, size_t errlen) {
  const char *ep = in->endpoint != NULL ? in->endpoint : in->endpoint_dflt;
  if (ep == NULL) return fail(err, errlen, "--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT]");
  if (strchr(ep, ',') != NULL)
    return fail(err, errlen, "a list of endpoints is for --rdzv-backend etcd");
  char host[BASE_HOST_MAX], with_port[BASE_HOST_MAX + 16];
  int port = RDZV_DEFAULT_PORT;
  if (base_split_hostport(ep, host, sizeof host, &port, in->port0_ok) != 0) {
    snprintf(with_port, sizeof with_port, "%s:%d", ep, RDZV_DEFAULT_PORT);
    if (base_split_hostport(with_port, host, sizeof host, &port, 0) != 0)
      return fail(err, errlen, "--rdzv-endpoint '%s' is not HOST[:PORT]", ep);
  }
  if (host[0] == '\0') return fail(err, errlen, "--rdzv-endpoint '%s' is not HOST[:PORT]", ep);
  if (port == 0) {
    out->port0 = 1; /* a free port on this node: cohort run's one-node job */
    return 0;
  }
  base_join_hostport(host, port, out->master, sizeof out->master);
  out->method = RDZV_STATIC;
  return 0;
}

int rdzv_where_resolve(const rdzv_where_in *in, rdzv_where *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->method = RDZV_AUTO;
  if (in->backend == RDZV_BACKEND_ETCD || in->discover == RDZV_ETCD)
    return where_etcd(in, out, err, errlen);
  if (in->backend == RDZV_BACKEND_C10D || in->endpoint != NULL)
    return where_store(in, out, err, errlen);
  return 0;
}

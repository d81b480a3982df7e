/* network.c - cohort doctor's derived settings for the workers. */
#include "agent/network.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

extern char **environ;

/* The probe's roots under COHORT_DOCTOR_ROOT (fixture trees in tests, or a
 * container that mounts the host's /sys elsewhere). */
typedef struct doctor_roots {
  char sys[4096], proc[4096], dev[4096], lib[4096], ifaddrs[4096];
} doctor_roots;

static void use_roots(doctor_config *dc, doctor_roots *r, const char *root) {
  snprintf(r->sys, sizeof r->sys, "%s/sys", root);
  snprintf(r->proc, sizeof r->proc, "%s/proc", root);
  snprintf(r->dev, sizeof r->dev, "%s/dev", root);
  snprintf(r->lib, sizeof r->lib, "%s/lib", root);
  snprintf(r->ifaddrs, sizeof r->ifaddrs, "%s/ifaddrs", root);
  dc->sysfs_root = r->sys;
  dc->proc_root = r->proc;
  dc->dev_root = r->dev;
  dc->lib_root = r->lib;
  dc->ifaddrs_file = r->ifaddrs;
}

/* Across nodes, what was added is worth a line in every agent's output. */
static void print_added(const doctor_result *net) {
  char line[1024] = "";
  size_t off = 0;
  for (size_t i = 0; i < net->nset && off < sizeof line; i++)
    off += (size_t)snprintf(line + off, sizeof line - off, "%s%s=%s", i ? " " : "",
                            net->set[i].name, net->set[i].value);
  if (off > 0) fprintf(stderr, "cohort: network settings added: %s\n", line);
}

doctor_result *agent_network_derive(int multinode, const char *master, const char *iface) {
  doctor_config dc;
  memset(&dc, 0, sizeof dc);
  dc.master = master;
  dc.nccl_if_needed = 1;
  dc.socket_iface = iface;
  doctor_roots roots;
  const char *droot = getenv("COHORT_DOCTOR_ROOT");
  if (droot != NULL && droot[0] != '\0') use_roots(&dc, &roots, droot);
  doctor_result *net = NULL;
  int rc = doctor_plan(&dc, environ, &net);
  if (rc != 0) {
    base_log(BASE_LOG_WARN, "cannot derive network settings: %s", cohort_strerror(rc));
    return NULL;
  }
  for (size_t i = 0; i < net->nwarnings; i++)
    base_log(multinode ? BASE_LOG_WARN : BASE_LOG_INFO, "network: %s", net->warnings[i]);
  if (multinode) print_added(net);
  return net;
}

/*
 * cmd_doctor.c - `cohort doctor`: argument parsing and output; the probing
 * and derivation live in src/doctor.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "doctor/doctor.h"
#include "tools/cohort/cmd.h"

extern char **environ;

static void usage(FILE *f) {
  fprintf(f, "usage: cohort doctor [--master HOST] [--export | --json] [--set-gid-index]\n"
             "                     [--sysfs-root DIR] [--proc-root DIR] [--dev-root DIR]\n"
             "                     [--lib-root DIR] [--ifaddrs FILE]\n"
             "\n"
             "Reads this node's RDMA devices, network interfaces and limits, and derives the\n"
             "NCCL, UCX and Gloo settings a training job needs here (NCCL_IB_HCA,\n"
             "NCCL_IB_GID_INDEX, NCCL_SOCKET_IFNAME, ...), each with its reason. A variable\n"
             "already set in the environment is never overridden.\n"
             "\n"
             "  --master HOST     the rendezvous master: the interface that reaches it is used\n"
             "                    for sockets (default: the interface of the default route)\n"
             "  --export          print shell export lines: eval \"$(cohort doctor --export)\"\n"
             "  --json            print a JSON document (docs/doctor.schema.json)\n"
             "  --set-gid-index   set NCCL_IB_GID_INDEX even when NCCL >= 2.21 picks it itself\n"
             "  --sysfs-root DIR  read DIR instead of /sys\n"
             "  --proc-root DIR   read DIR instead of /proc (net/route, self/limits, meminfo)\n"
             "  --dev-root DIR    read DIR instead of /dev (infiniband/, shm)\n"
             "  --lib-root DIR    look for NCCL under DIR instead of /\n"
             "  --ifaddrs FILE    take interface addresses from FILE ('IFNAME ADDR/PREFIX' lines)\n"
             "                    instead of the system, and routes from PROC_ROOT/net/route\n"
             "                    and net/ipv6_route\n"
             "                    (for fixture trees and captured machines)\n"
             "\n"
             "exit status: 0 fine (warnings go to the report), 1 an error (e.g. RoCE without a\n"
             "usable GID, master unreachable), 2 usage\n");
}

int cmd_doctor(int argc, char **argv) {
  doctor_config cfg = {0};
  int mode = 0; /* 0 report, 1 export, 2 json */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char **dst = NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--export") == 0) {
      if (mode == 2) goto both;
      mode = 1;
      continue;
    } else if (strcmp(a, "--json") == 0) {
      if (mode == 1) goto both;
      mode = 2;
      continue;
    } else if (strcmp(a, "--set-gid-index") == 0) {
      cfg.set_gid_index = 1;
      continue;
    } else if (strcmp(a, "--master") == 0)
      dst = &cfg.master;
    else if (strcmp(a, "--sysfs-root") == 0)
      dst = &cfg.sysfs_root;
    else if (strcmp(a, "--proc-root") == 0)
      dst = &cfg.proc_root;
    else if (strcmp(a, "--dev-root") == 0)
      dst = &cfg.dev_root;
    else if (strcmp(a, "--lib-root") == 0)
      dst = &cfg.lib_root;
    else if (strcmp(a, "--ifaddrs") == 0)
      dst = &cfg.ifaddrs_file;
    else {
      fprintf(stderr, "cohort doctor: unknown option '%s'; see 'cohort doctor --help'\n", a);
      return 2;
    }
    if (i + 1 >= argc || argv[i + 1][0] == '\0') {
      fprintf(stderr, "cohort doctor: %s needs a value; see 'cohort doctor --help'\n", a);
      return 2;
    }
    *dst = argv[++i];
  }

  doctor_result *r = NULL;
  int rc = doctor_plan(&cfg, environ, &r);
  if (rc == -ENOENT || rc == -ENOTDIR) {
    fprintf(stderr, "cohort doctor: a root directory (--sysfs-root, --proc-root, --dev-root, "
                    "--lib-root) does not exist or is not a directory\n");
    return 2;
  }
  if (rc != 0) {
    fprintf(stderr, "cohort doctor: %s\n", cohort_strerror(rc));
    return 1;
  }
  char *text = NULL;
  if (mode == 1)
    rc = doctor_format_export(r, &text);
  else if (mode == 2)
    rc = doctor_format_json(r, &text);
  else
    rc = doctor_format_report(r, &text);
  if (rc != 0) {
    fprintf(stderr, "cohort doctor: %s\n", cohort_strerror(rc));
    doctor_result_destroy(r);
    return 1;
  }
  fputs(text, stdout);
  free(text);
  if (mode == 1) {
    /* The exports are for eval: findings go to stderr where a person sees them. */
    for (size_t i = 0; i < r->nnotes; i++)
      fprintf(stderr, "cohort doctor: note: %s\n", r->notes[i]);
    for (size_t i = 0; i < r->nwarnings; i++)
      fprintf(stderr, "cohort doctor: warning: %s\n", r->warnings[i]);
    for (size_t i = 0; i < r->nerrors; i++)
      fprintf(stderr, "cohort doctor: error: %s\n", r->errors[i]);
  }
  int status = r->nerrors > 0 ? 1 : 0;
  doctor_result_destroy(r);
  if (fflush(stdout) != 0) return 1;
  return status;
both:
  fprintf(stderr, "cohort doctor: --export and --json exclude each other\n");
  return 2;
}

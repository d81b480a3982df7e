/*
 * cmd_doctor.c - `cohort doctor`: argument parsing and output; the probing
 * and derivation live in src/doctor.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "doctor/doctor.h"
#include "tools/cli.h"
#include "tools/cohort/cmd.h"

extern char **environ;

static const char doctor_usage[] =
    "usage: cohort doctor [--master HOST] [--export | --json | --check] [--set-gid-index]\n"
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
    "  --check           one line per check (GPU driver, NCCL, RDMA, limits, your NCCL\n"
    "                    variables against this node): exit 1 when one fails\n"
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
    "usable GID, master unreachable; with --check: a check failed), 2 usage\n";

static const char prog[] = "cohort doctor";

typedef struct doctor_args {
  doctor_config cfg;
  int export_lines, json, check;
} doctor_args;

#define AT(FIELD) CLI_AT(doctor_args, FIELD, const char *)

static const cli_opt doctor_opts[] = {
    {"--help", 'h', .kind = CLI_HELP_OPT},
    {"--master", 0, CLI_STR, .at = AT(cfg.master), .what = "a host", .flags = CLI_NONEMPTY},
    {"--export", 0, CLI_FLAG, .at = CLI_AT(doctor_args, export_lines, int)},
    {"--json", 0, CLI_FLAG, .at = CLI_AT(doctor_args, json, int)},
    {"--check", 0, CLI_FLAG, .at = CLI_AT(doctor_args, check, int)},
    {"--set-gid-index", 0, CLI_FLAG, .at = CLI_AT(doctor_args, cfg.set_gid_index, int)},
    {"--sysfs-root", 0, CLI_STR, .at = AT(cfg.sysfs_root), .what = "a directory",
     .flags = CLI_NONEMPTY},
    {"--proc-root", 0, CLI_STR, .at = AT(cfg.proc_root), .what = "a directory",
     .flags = CLI_NONEMPTY},
    {"--dev-root", 0, CLI_STR, .at = AT(cfg.dev_root), .what = "a directory",
     .flags = CLI_NONEMPTY},
    {"--lib-root", 0, CLI_STR, .at = AT(cfg.lib_root), .what = "a directory",
     .flags = CLI_NONEMPTY},
    {"--ifaddrs", 0, CLI_STR, .at = AT(cfg.ifaddrs_file), .what = "a file", .flags = CLI_NONEMPTY},
};

static const cli_cmd doctor_cmd = {
    prog, doctor_usage, doctor_opts, BASE_ARRAY_LEN(doctor_opts), CLI_NO_OPERANDS, 0};

/* The exports are for eval: findings go to stderr where a person sees them. */
static void print_findings(const doctor_result *r) {
  for (size_t i = 0; i < r->nnotes; i++) fprintf(stderr, "%s: note: %s\n", prog, r->notes[i]);
  for (size_t i = 0; i < r->nwarnings; i++)
    fprintf(stderr, "%s: warning: %s\n", prog, r->warnings[i]);
  for (size_t i = 0; i < r->nerrors; i++) fprintf(stderr, "%s: error: %s\n", prog, r->errors[i]);
}

/* Prints the result in the chosen form; returns the exit status. */
static int print_result(const doctor_args *a, const doctor_result *r) {
  char *text = NULL;
  int rc;
  if (a->export_lines)
    rc = doctor_format_export(r, &text);
  else if (a->json)
    rc = doctor_format_json(r, &text);
  else if (a->check)
    rc = doctor_format_checks(r, &text);
  else
    rc = doctor_format_report(r, &text);
  if (rc != 0) return cli_error(prog, 1, "%s", cohort_strerror(rc));
  fputs(text, stdout);
  free(text);
  if (a->export_lines) print_findings(r);
  if (fflush(stdout) != 0) return 1;
  if (a->check) return doctor_checks_failed(r) > 0 ? 1 : 0;
  return r->nerrors > 0 ? 1 : 0;
}

int cmd_doctor(int argc, char **argv) {
  doctor_args a = {0};
  cli_args none;
  int rc = cli_parse(&doctor_cmd, argc, argv, &a, &none);
  if (rc != CLI_OK) return rc == CLI_HELP ? 0 : rc;
  if (a.export_lines + a.json + a.check > 1)
    return cli_usage_error(prog, "--export, --json and --check exclude each other");
  doctor_result *r = NULL;
  rc = doctor_plan(&a.cfg, environ, &r);
  if (rc == -ENOENT || rc == -ENOTDIR)
    return cli_usage_error(prog, "a root directory (--sysfs-root, --proc-root, --dev-root, "
                                 "--lib-root) does not exist or is not a directory");
  if (rc != 0) return cli_error(prog, 1, "%s", cohort_strerror(rc));
  int status = print_result(&a, r);
  doctor_result_destroy(r);
  return status;
}

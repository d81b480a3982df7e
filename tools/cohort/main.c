/*
 * main.c - the `cohort` command: dispatches to one subcommand per file.
 *
 * Subcommands are found through weak references, so that a subcommand is
 * offered only when its file is part of the build.
 */
#include <stdio.h>
#include <string.h>

#include "cohort/cohort.h"
#include "tools/cohort/cmd.h"

typedef struct subcommand {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *summary;
} subcommand;

static subcommand subcommands[] = {
    {"run", cmd_run, "start and supervise the workers of a job on this node"},
    {"launch", cmd_launch, "start a job's agents on a list of hosts over ssh"},
    {"doctor", cmd_doctor, "derive and check RDMA, NCCL, UCX and Gloo settings"},
    {"bench", cmd_bench, "collective bandwidth table (nccl-tests style)"},
    {"store", cmd_store, "host or query a rendezvous store"},
    {"manifest", cmd_manifest, "job templates: Kubernetes (4 kinds), Slurm, docker"},
    {"plot", cmd_plot, "SVG plot of a training metrics file"},
    {"token", cmd_token, "print a fresh random job token"},
    {"status", cmd_status, "nodes and ranks of a running job"},
    {"stop", cmd_stop, "stop a running job on every node"},
    {"stacks", cmd_stacks, "every rank's stack of a running job, by place"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: cohort <command> [options]\n\n"
             "multi-node distributed training without the glue\n\ncommands:\n");
  for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++) {
    if (subcommands[i].fn != NULL)
      fprintf(f, "  %-9s %s\n", subcommands[i].name, subcommands[i].summary);
  }
  fprintf(f, "\n'cohort <command> --help' describes a command; 'cohort --version' prints "
             "the version.\n");
}

/* The last component of a path. */
static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash != NULL ? slash + 1 : path;
}

int main(int argc, char **argv) {
  /* Installed as a link named torchrun (make install-torchrun): `cohort run` as torchrun. */
  if (argc >= 1 && cmd_torchrun != NULL && strcmp(base_name(argv[0]), "torchrun") == 0)
    return cmd_torchrun(argc, argv);
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *name = argv[1];
  if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(name, "--version") == 0 || strcmp(name, "-V") == 0) {
    printf("cohort %s\n", COHORT_VERSION_STRING);
    return 0;
  }
  for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++) {
    if (subcommands[i].fn != NULL && strcmp(subcommands[i].name, name) == 0)
      return subcommands[i].fn(argc - 1, argv + 1);
  }
  fprintf(stderr, "cohort: unknown command '%s'; 'cohort --help' lists the commands\n", name);
  return 2;
}

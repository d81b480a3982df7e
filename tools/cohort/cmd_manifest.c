/*
 * cmd_manifest.c - `cohort manifest k8s|slurm|docker`: print a job template
 * that starts `cohort run` on every node. Argument parsing only; the
 * templates are built by src/manifest.
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "manifest/manifest.h"
#include "tools/cohort/cmd.h"

static const char manifest_usage[] =
    "usage: cohort manifest <kind> [options] -- COMMAND [ARG...]\n"
    "\n"
    "Prints a job template that runs `cohort run ... -- COMMAND` on every node.\n"
    "\n"
    "kinds:\n"
    "  k8s     Kubernetes Indexed Job and headless Service (YAML)\n"
    "  slurm   sbatch script starting one agent per node with srun\n"
    "  docker  one `docker run` line per node\n"
    "\n"
    "'cohort manifest <kind> --help' lists the options of a kind.\n";

static const char k8s_usage[] =
    "usage: cohort manifest k8s --name NAME --nodes N --nproc-per-node G --image IMAGE\n"
    "                           [options] -- COMMAND [ARG...]\n"
    "\n"
    "Prints a Kubernetes Indexed Job (one pod per node) and the headless Service\n"
    "that gives pod 0 the DNS name NAME-0.NAME, where its agent hosts the\n"
    "rendezvous; each pod runs `cohort run` with its completion index as node rank.\n"
    "\n"
    "options:\n"
    "  --name NAME           Job and Service name (DNS label)\n"
    "  --nodes N             number of pods (nodes)\n"
    "  --nproc-per-node G    workers per pod\n"
    "  --image IMAGE         container image; must have `cohort` on its PATH\n"
    "  --gpus G              nvidia.com/gpu resources per pod (default: none)\n"
    "  --rdma roce|ib        request rdma/rdma and IPC_LOCK; roce also attaches the\n"
    "                        kube-system/roce network\n"
    "  --shm SIZE            size limit of the memory-backed /dev/shm (e.g. 8G)\n"
    "  --token-secret NAME   Secret whose key \"token\" becomes COHORT_TOKEN\n"
    "  --port PORT           rendezvous port of pod 0 (default 29400)\n"
    "  -h, --help            show this help\n";

static const char slurm_usage[] =
    "usage: cohort manifest slurm --nodes N --nproc-per-node G [options] -- COMMAND [ARG...]\n"
    "\n"
    "Prints an sbatch script that starts one `cohort run` agent per node with srun;\n"
    "the agents take the rendezvous from Slurm's environment.\n"
    "\n"
    "options:\n"
    "  --nodes N             number of nodes\n"
    "  --nproc-per-node G    workers per node\n"
    "  --gpus-per-node G     #SBATCH --gpus-per-node (default: none)\n"
    "  --time T              time limit (M, H:M:S, D-H:M:S, ...)\n"
    "  --partition P         partition\n"
    "  --job-name J          job name\n"
    "  -h, --help            show this help\n";

static const char docker_usage[] =
    "usage: cohort manifest docker --nodes N --nproc-per-node G --image IMAGE\n"
    "                              --master-addr HOST [options] -- COMMAND [ARG...]\n"
    "\n"
    "Prints one `docker run` line per node (run line i on node i) with host\n"
    "networking, the host's IPC namespace (or --shm), unlimited locked memory, and\n"
    "`cohort run` joining node 0.\n"
    "\n"
    "options:\n"
    "  --nodes N             number of nodes\n"
    "  --nproc-per-node G    workers per node\n"
    "  --image IMAGE         container image; must have `cohort` on its PATH\n"
    "  --master-addr HOST    address of node 0, where the rendezvous is hosted\n"
    "  --port PORT           rendezvous port on node 0 (default 29400)\n"
    "  --gpus VALUE          docker's --gpus value (e.g. all)\n"
    "  --shm SIZE            a private /dev/shm of SIZE (e.g. 8G) instead of --ipc host\n"
    "  --rdma                pass /dev/infiniband and add IPC_LOCK\n"
    "  -h, --help            show this help\n";

enum {
  OPT_NAME = 1000,
  OPT_NODES,
  OPT_NPROC,
  OPT_IMAGE,
  OPT_GPUS,
  OPT_GPUS_PER_NODE,
  OPT_RDMA,
  OPT_SHM,
  OPT_TOKEN_SECRET,
  OPT_PORT,
  OPT_TIME,
  OPT_PARTITION,
  OPT_JOB_NAME,
  OPT_MASTER_ADDR,
};

typedef struct manifest_args {
  const char *kind;
  const char *name, *image, *time, *partition, *job_name, *master_addr, *gpus_str, *token_secret;
  int nodes, nproc, gpus, gpus_per_node, port, rdma_flag;
  manifest_rdma rdma;
  uint64_t shm;
} manifest_args;

static int usage_error(const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int usage_error(const char *kind, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "cohort manifest %s: %s; see 'cohort manifest %s --help'\n", kind, msg, kind);
  return 2;
}

static int parse_count(const char *kind, const char *flag, const char *v, int min, int max,
                       int *out) {
  if (base_parse_int(v, min, max, out) != 0) {
    char range[64];
    snprintf(range, sizeof range, "an integer in %d..%d", min, max);
    fprintf(stderr, "cohort manifest %s: %s must be %s, got '%s'\n", kind, flag, range, v);
    return 2;
  }
  return 0;
}

static int write_all(const manifest_buf *b) {
  if (fwrite(b->data, 1, b->len, stdout) != b->len || fflush(stdout) != 0) {
    fprintf(stderr, "cohort manifest: writing the output failed: %s\n", strerror(errno));
    return 1;
  }
  return 0;
}

int cmd_manifest(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "cohort manifest: missing kind (k8s, slurm or docker); see 'cohort manifest "
                    "--help'\n");
    return 2;
  }
  const char *kind = argv[1];
  if (strcmp(kind, "-h") == 0 || strcmp(kind, "--help") == 0) {
    fputs(manifest_usage, stdout);
    return 0;
  }
  const char *help;
  if (strcmp(kind, "k8s") == 0)
    help = k8s_usage;
  else if (strcmp(kind, "slurm") == 0)
    help = slurm_usage;
  else if (strcmp(kind, "docker") == 0)
    help = docker_usage;
  else {
    fprintf(stderr, "cohort manifest: unknown kind '%s'; expected k8s, slurm or docker\n", kind);
    return 2;
  }

  /* Each kind accepts only its own flags. */
  static const struct option k8s_opts[] = {
      {"name", required_argument, NULL, OPT_NAME},
      {"nodes", required_argument, NULL, OPT_NODES},
      {"nproc-per-node", required_argument, NULL, OPT_NPROC},
      {"image", required_argument, NULL, OPT_IMAGE},
      {"gpus", required_argument, NULL, OPT_GPUS},
      {"rdma", required_argument, NULL, OPT_RDMA},
      {"shm", required_argument, NULL, OPT_SHM},
      {"token-secret", required_argument, NULL, OPT_TOKEN_SECRET},
      {"port", required_argument, NULL, OPT_PORT},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  static const struct option slurm_opts[] = {
      {"nodes", required_argument, NULL, OPT_NODES},
      {"nproc-per-node", required_argument, NULL, OPT_NPROC},
      {"gpus-per-node", required_argument, NULL, OPT_GPUS_PER_NODE},
      {"time", required_argument, NULL, OPT_TIME},
      {"partition", required_argument, NULL, OPT_PARTITION},
      {"job-name", required_argument, NULL, OPT_JOB_NAME},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  static const struct option docker_opts[] = {
      {"nodes", required_argument, NULL, OPT_NODES},
      {"nproc-per-node", required_argument, NULL, OPT_NPROC},
      {"image", required_argument, NULL, OPT_IMAGE},
      {"master-addr", required_argument, NULL, OPT_MASTER_ADDR},
      {"port", required_argument, NULL, OPT_PORT},
      {"gpus", required_argument, NULL, OPT_GPUS},
      {"shm", required_argument, NULL, OPT_SHM},
      {"rdma", no_argument, NULL, OPT_RDMA},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const struct option *opts = kind[0] == 'k' ? k8s_opts : kind[0] == 's' ? slurm_opts : docker_opts;

  manifest_args a = {.kind = kind, .port = MANIFEST_DEFAULT_PORT};
  int sub_argc = argc - 1;
  char **sub_argv = argv + 1;
  optind = 0; /* full reset of getopt's state */
  opterr = 0;
  int c;
  /* '+': stop at the first non-option, so that the command is never parsed. */
  while ((c = getopt_long(sub_argc, sub_argv, "+:h", opts, NULL)) != -1) {
    int rc = 0;
    switch (c) {
    case 'h':
      fputs(help, stdout);
      return 0;
    case OPT_NAME:
      a.name = optarg;
      break;
    case OPT_IMAGE:
      a.image = optarg;
      break;
    case OPT_TIME:
      a.time = optarg;
      break;
    case OPT_PARTITION:
      a.partition = optarg;
      break;
    case OPT_JOB_NAME:
      a.job_name = optarg;
      break;
    case OPT_MASTER_ADDR:
      a.master_addr = optarg;
      break;
    case OPT_TOKEN_SECRET:
      a.token_secret = optarg;
      break;
    case OPT_NODES:
      rc = parse_count(kind, "--nodes", optarg, 1, MANIFEST_MAX_NODES, &a.nodes);
      break;
    case OPT_NPROC:
      rc = parse_count(kind, "--nproc-per-node", optarg, 1, MANIFEST_MAX_NPROC, &a.nproc);
      break;
    case OPT_GPUS_PER_NODE:
      rc = parse_count(kind, "--gpus-per-node", optarg, 0, MANIFEST_MAX_NPROC, &a.gpus_per_node);
      break;
    case OPT_PORT:
      rc = parse_count(kind, "--port", optarg, 1, 65535, &a.port);
      break;
    case OPT_GPUS:
      if (kind[0] == 'k')
        rc = parse_count(kind, "--gpus", optarg, 0, MANIFEST_MAX_NPROC, &a.gpus);
      else
        a.gpus_str = optarg;
      break;
    case OPT_RDMA:
      if (kind[0] == 'd') {
        a.rdma_flag = 1;
      } else if (strcmp(optarg, "roce") == 0) {
        a.rdma = MANIFEST_RDMA_ROCE;
      } else if (strcmp(optarg, "ib") == 0) {
        a.rdma = MANIFEST_RDMA_IB;
      } else {
        return usage_error(kind, "--rdma must be roce or ib, got '%s'", optarg);
      }
      break;
    case OPT_SHM:
      if (manifest_parse_size(optarg, &a.shm) != 0)
        return usage_error(kind, "--shm must be a size such as 8G or 512M, got '%s'", optarg);
      break;
    case ':':
      return usage_error(kind, "%s needs a value", sub_argv[optind - 1]);
    default:
      if (optopt > 0 && optopt < 256) return usage_error(kind, "unknown option '-%c'", optopt);
      return usage_error(kind, "unknown option '%s'", sub_argv[optind - 1]);
    }
    if (rc != 0) return rc;
  }
  if (optind >= sub_argc || strcmp(sub_argv[optind - 1], "--") != 0) {
    if (optind < sub_argc)
      return usage_error(kind, "unexpected argument '%s' (the command goes after '--')",
                         sub_argv[optind]);
    return usage_error(kind, "no command: give the training command after '--'");
  }
  char *const *cmd = sub_argv + optind;
  size_t ncmd = (size_t)(sub_argc - optind);
  if (a.nodes == 0) return usage_error(kind, "--nodes is required");
  if (a.nproc == 0) return usage_error(kind, "--nproc-per-node is required");

  manifest_buf out;
  manifest_buf_init(&out);
  char err[512] = "";
  int rc;
  if (kind[0] == 'k') {
    if (a.name == NULL) return usage_error(kind, "--name is required");
    if (a.image == NULL) return usage_error(kind, "--image is required");
    manifest_k8s_opts o = {.name = a.name,
                           .image = a.image,
                           .nodes = a.nodes,
                           .nproc_per_node = a.nproc,
                           .gpus = a.gpus,
                           .port = a.port,
                           .rdma = a.rdma,
                           .shm_bytes = a.shm,
                           .token_secret = a.token_secret,
                           .cmd = cmd,
                           .ncmd = ncmd};
    rc = manifest_k8s(&o, &out, err, sizeof err);
  } else if (kind[0] == 's') {
    manifest_slurm_opts o = {.nodes = a.nodes,
                             .nproc_per_node = a.nproc,
                             .gpus_per_node = a.gpus_per_node,
                             .time = a.time,
                             .partition = a.partition,
                             .job_name = a.job_name,
                             .cmd = cmd,
                             .ncmd = ncmd};
    rc = manifest_slurm(&o, &out, err, sizeof err);
  } else {
    if (a.image == NULL) return usage_error(kind, "--image is required");
    if (a.master_addr == NULL) return usage_error(kind, "--master-addr is required");
    manifest_docker_opts o = {.nodes = a.nodes,
                              .nproc_per_node = a.nproc,
                              .image = a.image,
                              .master_addr = a.master_addr,
                              .port = a.port,
                              .gpus = a.gpus_str,
                              .shm_bytes = a.shm,
                              .rdma = a.rdma_flag,
                              .cmd = cmd,
                              .ncmd = ncmd};
    rc = manifest_docker(&o, &out, err, sizeof err);
  }
  if (rc != 0) {
    manifest_buf_free(&out);
    if (rc == -ENOMEM) {
      fprintf(stderr, "cohort manifest %s: %s\n", kind, err);
      return 1;
    }
    fprintf(stderr, "cohort manifest %s: %s\n", kind, err);
    return 2;
  }
  rc = write_all(&out);
  manifest_buf_free(&out);
  return rc;
}

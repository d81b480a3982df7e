/*
 * cmd_manifest.c - `cohort manifest k8s|jobset|trainjob|pytorchjob|slurm|docker`: print a job
 * template that starts `cohort run` on every node. Argument parsing only; the templates are built
 * by src/manifest.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "manifest/manifest.h"
#include "store/auth.h"
#include "tools/cli.h"
#include "tools/cohort/cmd.h"

static const char manifest_usage[] =
    "usage: cohort manifest <kind> [options] -- COMMAND [ARG...]\n"
    "\n"
    "Prints a job template that runs `cohort run ... -- COMMAND` on every node.\n"
    "\n"
    "kinds:\n"
    "  k8s         Kubernetes Indexed Job and headless Service (YAML)\n"
    "  jobset      JobSet (jobset.x-k8s.io) of one Indexed Job\n"
    "  trainjob    Kubeflow Trainer v2 TrainJob and its TrainingRuntime\n"
    "  pytorchjob  Kubeflow Training Operator v1 PyTorchJob\n"
    "  slurm       sbatch script starting one agent per node with srun\n"
    "  docker      one `docker run` line per node\n"
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
    "  --token-secret NAME   existing Secret whose key \"token\" becomes COHORT_TOKEN\n"
    "                        (default: the output holds a Secret NAME-token with a\n"
    "                        token generated now; keep the file private)\n"
    "  --port PORT           rendezvous port of pod 0 (default 29400)\n"
    "  --hang-timeout SEC    pass --hang-timeout SEC to cohort run (default: off)\n"
    "  --metrics-port PORT   cohort run --metrics-port PORT: Prometheus metrics on that\n"
    "                        port of every pod, with prometheus.io scrape annotations\n"
    "  --pod-monitor         also print a PodMonitor of that port (Prometheus Operator)\n"
    "  -h, --help            show this help\n";

/* The options every Kubernetes kind shares. */
#define KUBE_OPTIONS                                                                               \
  "options:\n"                                                                                     \
  "  --name NAME           the job's name (DNS label)\n"                                           \
  "  --nodes N             number of pods (nodes)\n"                                               \
  "  --nproc-per-node G    workers per pod\n"                                                      \
  "  --image IMAGE         container image; must have `cohort` on its PATH\n"                      \
  "  --gpus G              nvidia.com/gpu resources per pod (default: none)\n"                     \
  "  --rdma roce|ib        request rdma/rdma and IPC_LOCK; roce also attaches the\n"               \
  "                        kube-system/roce network\n"                                             \
  "  --shm SIZE            size limit of the memory-backed /dev/shm (e.g. 8G)\n"                   \
  "  --token-secret NAME   existing Secret whose key \"token\" becomes COHORT_TOKEN\n"             \
  "                        (default: the output holds a Secret NAME-token with a\n"                \
  "                        token generated now; keep the file private)\n"                          \
  "  --hang-timeout SEC    pass --hang-timeout SEC to cohort run (default: off)\n"                 \
  "  --metrics-port PORT   cohort run --metrics-port PORT: Prometheus metrics on that\n"           \
  "                        port of every pod, with prometheus.io scrape annotations\n"             \
  "  --pod-monitor         also print a PodMonitor of that port (Prometheus Operator)\n"           \
  "  -h, --help            show this help\n"

static const char jobset_usage[] =
    "usage: cohort manifest jobset --name NAME --nodes N --nproc-per-node G --image IMAGE\n"
    "                              [options] -- COMMAND [ARG...]\n"
    "\n"
    "Prints a JobSet (jobset.x-k8s.io/v1alpha2) of one Indexed Job of N pods; JobSet\n"
    "names pod 0 NAME-node-0-0.NAME, where its agent hosts the rendezvous.\n"
    "\n" KUBE_OPTIONS "  --port PORT           rendezvous port of pod 0 (default 29400)\n";

static const char trainjob_usage[] =
    "usage: cohort manifest trainjob --name NAME --nodes N --nproc-per-node G --image IMAGE\n"
    "                                [options] -- COMMAND [ARG...]\n"
    "\n"
    "Prints a Kubeflow Trainer v2 TrainJob and the TrainingRuntime NAME-cohort it runs\n"
    "on. The torch plugin sets PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and\n"
    "PET_MASTER_PORT (29400) in every pod, which `cohort run` reads as torchrun does.\n"
    "\n" KUBE_OPTIONS;

static const char pytorchjob_usage[] =
    "usage: cohort manifest pytorchjob --name NAME --nodes N --nproc-per-node G --image IMAGE\n"
    "                                  [options] -- COMMAND [ARG...]\n"
    "\n"
    "Prints a Kubeflow Training Operator v1 PyTorchJob (one Master, N-1 Workers). The\n"
    "operator sets PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT in\n"
    "every pod, which `cohort run` reads as torchrun does.\n"
    "\n" KUBE_OPTIONS
    "  --port PORT           the Master's port, pytorchjob-port (default 29400)\n";

static const char slurm_usage[] =
    "usage: cohort manifest slurm --nodes N --nproc-per-node G [options] -- COMMAND [ARG...]\n"
    "\n"
    "Prints an sbatch script that starts one `cohort run` agent per node with srun;\n"
    "the agents take the rendezvous from Slurm's environment. The job's token is\n"
    "the exported COHORT_TOKEN, or a fresh one the script makes (cohort token).\n"
    "\n"
    "options:\n"
    "  --nodes N             number of nodes\n"
    "  --nproc-per-node G    workers per node\n"
    "  --gpus-per-node G     #SBATCH --gpus-per-node (default: none)\n"
    "  --time T              time limit (M, H:M:S, D-H:M:S, ...)\n"
    "  --partition P         partition\n"
    "  --job-name J          job name\n"
    "  --hang-timeout SEC    pass --hang-timeout SEC to cohort run (default: off)\n"
    "  -h, --help            show this help\n";

static const char docker_usage[] =
    "usage: cohort manifest docker --nodes N --nproc-per-node G --image IMAGE\n"
    "                              --master-addr HOST [options] -- COMMAND [ARG...]\n"
    "\n"
    "Prints one `docker run` line per node (run line i on node i) with host\n"
    "networking, the host's IPC namespace (or --shm), unlimited locked memory, and\n"
    "`cohort run` joining node 0. The lines read COHORT_TOKEN from the env file\n"
    "cohort-job.env, which the first line writes with a token generated now: run\n"
    "it once and copy the file to every node.\n"
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
    "  --hang-timeout SEC    pass --hang-timeout SEC to cohort run (default: off)\n"
    "  -h, --help            show this help\n";

typedef struct manifest_args {
  const char *name, *image, *time, *partition, *job_name, *master_addr, *gpus_str, *token_secret;
  int nodes, nproc, gpus, gpus_per_node, port, rdma_flag, rdma, hang_timeout, metrics_port,
      pod_monitor;
  uint64_t shm;
} manifest_args;

#define AT(FIELD, CTYPE) CLI_AT(manifest_args, FIELD, CTYPE)

static int set_shm(void *settings, const char *v) {
  return manifest_parse_size(v, &((manifest_args *)settings)->shm) == 0 ? 0 : -1;
}

static const cli_choice rdma_kinds[] = {
    {"roce", MANIFEST_RDMA_ROCE}, {"ib", MANIFEST_RDMA_IB}, {NULL, 0}};

/* The rows every kind shares. */
#define HELP_ROW                                                                                   \
  { "--help", 'h', .kind = CLI_HELP_OPT }
#define NODES_ROW                                                                                  \
  {                                                                                                \
    "--nodes", 0, CLI_INT, .at = AT(nodes, int), .min = 1, .max = MANIFEST_MAX_NODES,              \
                           .flags = CLI_REQUIRED                                                   \
  }
#define NPROC_ROW                                                                                  \
  {                                                                                                \
    "--nproc-per-node", 0, CLI_INT, .at = AT(nproc, int), .min = 1, .max = MANIFEST_MAX_NPROC,     \
                                    .flags = CLI_REQUIRED                                          \
  }
#define IMAGE_ROW                                                                                  \
  { "--image", 0, CLI_STR, .at = AT(image, const char *), .flags = CLI_REQUIRED }
#define PORT_ROW                                                                                   \
  { "--port", 0, CLI_INT, .at = AT(port, int), .min = 1, .max = 65535 }
#define HANG_ROW                                                                                   \
  { "--hang-timeout", 0, CLI_INT, .at = AT(hang_timeout, int), .min = 1, .max = 86400 * 7 }
#define SHM_ROW                                                                                    \
  { "--shm", 0, CLI_CUSTOM, .fn = set_shm, .what = "a size such as 8G or 512M" }

static const cli_opt k8s_opts[] = {
    HELP_ROW,
    {"--name", 0, CLI_STR, .at = AT(name, const char *), .flags = CLI_REQUIRED},
    NODES_ROW,
    NPROC_ROW,
    IMAGE_ROW,
    {"--gpus", 0, CLI_INT, .at = AT(gpus, int), .min = 0, .max = MANIFEST_MAX_NPROC},
    {"--rdma", 0, CLI_CHOICE, .at = AT(rdma, int), .choices = rdma_kinds},
    SHM_ROW,
    {"--token-secret", 0, CLI_STR, .at = AT(token_secret, const char *)},
    PORT_ROW,
    HANG_ROW,
    {"--metrics-port", 0, CLI_INT, .at = AT(metrics_port, int), .min = 1, .max = 65535},
    {"--pod-monitor", 0, CLI_FLAG, .at = AT(pod_monitor, int)},
};

static const cli_opt slurm_opts[] = {
    HELP_ROW,
    NODES_ROW,
    NPROC_ROW,
    {"--gpus-per-node", 0, CLI_INT, .at = AT(gpus_per_node, int), .min = 0,
     .max = MANIFEST_MAX_NPROC},
    {"--time", 0, CLI_STR, .at = AT(time, const char *)},
    {"--partition", 0, CLI_STR, .at = AT(partition, const char *)},
    {"--job-name", 0, CLI_STR, .at = AT(job_name, const char *)},
    HANG_ROW,
};

static const cli_opt docker_opts[] = {
    HELP_ROW,
    NODES_ROW,
    NPROC_ROW,
    IMAGE_ROW,
    {"--master-addr", 0, CLI_STR, .at = AT(master_addr, const char *), .flags = CLI_REQUIRED},
    PORT_ROW,
    {"--gpus", 0, CLI_STR, .at = AT(gpus_str, const char *)},
    SHM_ROW,
    {"--rdma", 0, CLI_FLAG, .at = AT(rdma_flag, int)},
    HANG_ROW,
};

typedef int (*build_fn)(const manifest_args *a, const cli_args *cmd, base_buf *out, char *err,
                        size_t errlen);

/* A fresh job token for the templates that carry one. */
static int new_token(char token[STORE_TOKEN_NEW_LEN + 1], char *err, size_t errlen) {
  if (store_token_new(token) == 0) return 0;
  snprintf(err, errlen, "no random bytes for the job token");
  return -EIO;
}

/* The Kubernetes kinds: one set of options, one renderer each. */
static int build_kube(int (*render)(const manifest_k8s_opts *, base_buf *, char *, size_t),
                      const manifest_args *a, const cli_args *cmd, base_buf *out, char *err,
                      size_t errlen) {
  char token[STORE_TOKEN_NEW_LEN + 1] = "";
  if (a->token_secret == NULL && new_token(token, err, errlen) != 0) return -EIO;
  manifest_k8s_opts o = {.name = a->name,
                         .image = a->image,
                         .nodes = a->nodes,
                         .nproc_per_node = a->nproc,
                         .gpus = a->gpus,
                         .port = a->port,
                         .rdma = (manifest_rdma)a->rdma,
                         .shm_bytes = a->shm,
                         .token_secret = a->token_secret,
                         .token = token,
                         .hang_timeout = a->hang_timeout,
                         .metrics_port = a->metrics_port,
                         .pod_monitor = a->pod_monitor,
                         .cmd = cmd->argv,
                         .ncmd = (size_t)cmd->argc};
  return render(&o, out, err, errlen);
}

static int build_k8s(const manifest_args *a, const cli_args *cmd, base_buf *out, char *err,
                     size_t errlen) {
  return build_kube(manifest_k8s, a, cmd, out, err, errlen);
}

static int build_jobset(const manifest_args *a, const cli_args *cmd, base_buf *out, char *err,
                        size_t errlen) {
  return build_kube(manifest_jobset, a, cmd, out, err, errlen);
}

static int build_trainjob(const manifest_args *a, const cli_args *cmd, base_buf *out, char *err,
                          size_t errlen) {
  return build_kube(manifest_trainjob, a, cmd, out, err, errlen);
}

static int build_pytorchjob(const manifest_args *a, const cli_args *cmd, base_buf *out, char *err,
                            size_t errlen) {
  return build_kube(manifest_pytorchjob, a, cmd, out, err, errlen);
}

static int build_slurm(const manifest_args *a, const cli_args *cmd, base_buf *out, char *err,
                       size_t errlen) {
  manifest_slurm_opts o = {.nodes = a->nodes,
                           .nproc_per_node = a->nproc,
                           .gpus_per_node = a->gpus_per_node,
                           .time = a->time,
                           .partition = a->partition,
                           .job_name = a->job_name,
                           .hang_timeout = a->hang_timeout,
                           .cmd = cmd->argv,
                           .ncmd = (size_t)cmd->argc};
  return manifest_slurm(&o, out, err, errlen);
}

static int build_docker(const manifest_args *a, const cli_args *cmd, base_buf *out, char *err,
                        size_t errlen) {
  char token[STORE_TOKEN_NEW_LEN + 1];
  if (new_token(token, err, errlen) != 0) return -EIO;
  manifest_docker_opts o = {.nodes = a->nodes,
                            .nproc_per_node = a->nproc,
                            .image = a->image,
                            .master_addr = a->master_addr,
                            .port = a->port,
                            .gpus = a->gpus_str,
                            .shm_bytes = a->shm,
                            .rdma = a->rdma_flag,
                            .token = token,
                            .hang_timeout = a->hang_timeout,
                            .cmd = cmd->argv,
                            .ncmd = (size_t)cmd->argc};
  return manifest_docker(&o, out, err, errlen);
}

/* Each kind accepts only its own options. */
typedef struct manifest_kind {
  const char *name;
  cli_cmd cli;
  build_fn build;
} manifest_kind;

#define KIND(NAME, USAGE, OPTS, BUILD)                                                             \
  {                                                                                                \
    NAME, {"cohort manifest " NAME, USAGE, OPTS, BASE_ARRAY_LEN(OPTS), CLI_AFTER_DASHDASH, 1},     \
        BUILD                                                                                      \
  }

static const manifest_kind kinds[] = {
    KIND("k8s", k8s_usage, k8s_opts, build_k8s),
    KIND("jobset", jobset_usage, k8s_opts, build_jobset),
    KIND("trainjob", trainjob_usage, k8s_opts, build_trainjob),
    KIND("pytorchjob", pytorchjob_usage, k8s_opts, build_pytorchjob),
    KIND("slurm", slurm_usage, slurm_opts, build_slurm),
    KIND("docker", docker_usage, docker_opts, build_docker),
};

static int write_all(const base_buf *b) {
  if (fwrite(b->data, 1, b->len, stdout) != b->len || fflush(stdout) != 0)
    return cli_error("cohort manifest", 1, "writing the output failed: %s", strerror(errno));
  return 0;
}

/* Parses the options of kind k and prints its template. */
static int manifest_run(const manifest_kind *k, int argc, char **argv) {
  manifest_args a = {.port = MANIFEST_DEFAULT_PORT};
  cli_args cmd;
  int rc = cli_parse(&k->cli, argc, argv, &a, &cmd);
  if (rc != CLI_OK) return rc == CLI_HELP ? 0 : rc;
  base_buf out;
  base_buf_init(&out);
  char err[512] = "";
  rc = k->build(&a, &cmd, &out, err, sizeof err);
  if (rc != 0) {
    base_buf_free(&out);
    /* Out of memory or random bytes is a failure; anything else the templates refuse is bad input.
     */
    return cli_error(k->cli.prog, rc == -ENOMEM || rc == -EIO ? 1 : CLI_USAGE, "%s", err);
  }
  rc = write_all(&out);
  base_buf_free(&out);
  return rc;
}

int cmd_manifest(int argc, char **argv) {
  const char *prog = "cohort manifest";
  if (argc < 2)
    return cli_usage_error(prog,
                           "missing kind (k8s, jobset, trainjob, pytorchjob, slurm or docker)");
  const char *kind = argv[1];
  if (strcmp(kind, "-h") == 0 || strcmp(kind, "--help") == 0) {
    fputs(manifest_usage, stdout);
    return 0;
  }
  for (size_t i = 0; i < BASE_ARRAY_LEN(kinds); i++)
    if (strcmp(kind, kinds[i].name) == 0) return manifest_run(&kinds[i], argc - 1, argv + 1);
  return cli_usage_error(
      prog, "unknown kind '%s'; expected k8s, jobset, trainjob, pytorchjob, slurm or docker", kind);
}

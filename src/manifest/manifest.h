/*
 * manifest.h - job templates for Kubernetes (a Job, JobSet, Kubeflow TrainJob
 * or PyTorchJob), Slurm and docker that start `cohort run` on every node of a
 * job.
 *
 * The renderers are pure functions: they validate their options, append the
 * text to a growable buffer and return 0, or return a negative code and write
 * a one-line reason (without the program name) into err. Nothing is printed.
 *
 * Quoting contract: every user-supplied string reaches the generated file
 * quoted for its target, so the command each node runs is exactly the argv
 * given after `--`:
 *  - YAML: double-quoted scalars with escapes; in Kubernetes command lists
 *    every '$' of the user's command is doubled because the kubelet expands
 *    $(VAR) references and turns "$$" back into "$".
 *  - shell (Slurm script, docker lines): POSIX single quotes.
 *
 * Job tokens: every template authenticates its job without the user doing
 * anything. The renderers take a token the caller generated (store_token_new)
 * where the template carries one (a Kubernetes Secret, docker's env file);
 * the Slurm script makes its own at run time unless one is exported.
 *
 * Thread safety: no shared state; a buffer belongs to one thread.
 */
#ifndef COHORT_MANIFEST_MANIFEST_H
#define COHORT_MANIFEST_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

/* The rendezvous port of node 0's agent when none is given. */
#define MANIFEST_DEFAULT_PORT 29400
/* Upper bounds accepted for counts (far above any real job). */
#define MANIFEST_MAX_NODES 100000
#define MANIFEST_MAX_NPROC 1024

/* Appends s as a YAML double-quoted scalar. s must be valid UTF-8;
 * returns -EINVAL (appending nothing) otherwise. When dollar_escape is set,
 * every '$' is written as "$$" (Kubernetes command/args expansion). */
int manifest_yaml_quote(base_buf *b, const char *s, int dollar_escape);

/* Appends s quoted for a POSIX shell: unchanged when it is made only of
 * characters no shell treats specially, otherwise in single quotes. */
void manifest_shell_quote(base_buf *b, const char *s);

/*
 * Parses a size such as "8G", "512Mi", "1073741824" (suffixes K, M, G, T,
 * optionally followed by "i" or "iB"/"B", all powers of 1024) into bytes.
 * Returns 0, -EINVAL or -ERANGE. Zero is rejected.
 */
int manifest_parse_size(const char *s, uint64_t *bytes);

typedef enum manifest_rdma {
  MANIFEST_RDMA_NONE = 0,
  MANIFEST_RDMA_ROCE, /* RoCE through the Multus "kube-system/roce" network */
  MANIFEST_RDMA_IB    /* InfiniBand HCA from the RDMA device plugin */
} manifest_rdma;

typedef struct manifest_k8s_opts {
  const char *name;         /* Job and Service name: DNS-1123 label */
  const char *image;        /* container image, must contain `cohort` on PATH */
  int nodes;                /* pods, one agent each */
  int nproc_per_node;       /* workers per pod */
  int gpus;                 /* nvidia.com/gpu per pod, 0 for none */
  int port;                 /* rendezvous port of pod 0 */
  manifest_rdma rdma;       /* RDMA resource, annotation and IPC_LOCK */
  uint64_t shm_bytes;       /* sizeLimit of /dev/shm, 0 for no limit */
  const char *token_secret; /* existing Secret with key "token", or NULL */
  const char *token;        /* without token_secret: the token of the Secret NAME-token
                               that the output then holds (printable ASCII) */
  int hang_timeout;         /* cohort run --hang-timeout in seconds, 0 to leave it off */
  int metrics_port;         /* cohort run --metrics-port, a container port and the pods'
                               prometheus.io scrape annotations; 0 for none */
  int pod_monitor;          /* also a PodMonitor (monitoring.coreos.com/v1) of the pods'
                               metrics port, for the Prometheus Operator; needs metrics_port */
  char *const *cmd;         /* the training command, ncmd >= 1 */
  size_t ncmd;
} manifest_k8s_opts;

/*
 * The Kubernetes kinds, each with the Secret holding the job's token unless
 * token_secret names one. Every pod runs `cohort run` (and the root cause of
 * a failure becomes its container's termination message):
 *  - manifest_k8s: an Indexed Job plus the headless Service that names its
 *    pods; pod 0 (NAME-0.NAME) hosts the rendezvous.
 *  - manifest_jobset: a JobSet (jobset.x-k8s.io/v1alpha2) of one replicated
 *    Job "node"; JobSet names pod i NAME-node-0-i.NAME.
 *  - manifest_trainjob: a Kubeflow Trainer v2 TrainJob
 *    (trainer.kubeflow.org/v1alpha1) and the TrainingRuntime NAME-cohort it
 *    runs on (the pod's /dev/shm, capabilities, ports and annotations, which
 *    a TrainJob cannot set); the torch plugin's PET_* variables give the
 *    agents their shape. Its port is the plugin's 29400.
 *  - manifest_pytorchjob: a Training Operator v1 PyTorchJob
 *    (kubeflow.org/v1), Master and Worker replicas; the agents read the
 *    operator's PET_* variables.
 */
int manifest_k8s(const manifest_k8s_opts *o, base_buf *out, char *err, size_t errlen);
int manifest_jobset(const manifest_k8s_opts *o, base_buf *out, char *err, size_t errlen);
int manifest_trainjob(const manifest_k8s_opts *o, base_buf *out, char *err, size_t errlen);
int manifest_pytorchjob(const manifest_k8s_opts *o, base_buf *out, char *err, size_t errlen);

/* The rendezvous port Kubeflow Trainer's torch plugin gives PET_MASTER_PORT. */
#define MANIFEST_TRAINER_PORT 29400

typedef struct manifest_slurm_opts {
  int nodes;
  int nproc_per_node;
  int gpus_per_node;     /* #SBATCH --gpus-per-node, 0 for none */
  const char *time;      /* Slurm time limit ("HH:MM:SS", "D-HH", ...) or NULL */
  const char *partition; /* or NULL */
  int hang_timeout;      /* cohort run --hang-timeout in seconds, 0 to leave it off */
  const char *job_name;  /* or NULL */
  char *const *cmd;
  size_t ncmd;
} manifest_slurm_opts;

/* An sbatch script that starts one agent per node with srun, with a fresh
 * token (`cohort token`) unless COHORT_TOKEN is exported to it. */
int manifest_slurm(const manifest_slurm_opts *o, base_buf *out, char *err, size_t errlen);

typedef struct manifest_docker_opts {
  int nodes;
  int nproc_per_node;
  const char *image;
  const char *master_addr; /* host name or address of node 0 */
  int port;                /* rendezvous port on node 0 */
  const char *gpus;        /* value of docker's --gpus, or NULL */
  uint64_t shm_bytes;      /* --shm-size, 0 to leave docker's default */
  int rdma;                /* pass /dev/infiniband and IPC_LOCK */
  int hang_timeout;        /* cohort run --hang-timeout in seconds, 0 to leave it off */
  const char *token;       /* the job's token, written into the env file MANIFEST_DOCKER_ENV */
  char *const *cmd;
  size_t ncmd;
} manifest_docker_opts;

/* The env file every docker line reads the job's token from. */
#define MANIFEST_DOCKER_ENV "cohort-job.env"

/* The command that writes the env file, then one `docker run` line per node
 * (node i runs line i). */
int manifest_docker(const manifest_docker_opts *o, base_buf *out, char *err, size_t errlen);

#endif

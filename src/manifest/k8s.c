/*
 * k8s.c - the Kubernetes templates: an Indexed Job with its headless Service,
 * a JobSet, a Kubeflow Trainer v2 TrainJob on a TrainingRuntime of cohort's,
 * and a Training Operator v1 PyTorchJob. They share one pod template (the
 * container running `cohort run`, /dev/shm, RDMA, the metrics port, the
 * termination message) and differ in the objects around it and in who gives
 * the agents the job's shape: the command line (Job, JobSet) or the
 * controller's PET_* variables (TrainJob, PyTorchJob), which `cohort run`
 * reads as torchrun does.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "manifest/internal.h"
#include "manifest/manifest.h"

/* A line of `in` spaces, then the formatted text. */
static void line(base_buf *b, int in, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void line(base_buf *b, int in, const char *fmt, ...) {
  char text[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  base_buf_printf(b, "%*s%s\n", in, "", text);
}

/* "key: value" with the value as a double-quoted scalar. */
static void kv(base_buf *b, int in, const char *key, const char *value) {
  base_buf_printf(b, "%*s%s: ", in, "", key);
  manifest_yaml_quote(b, value, 0);
  base_buf_puts(b, "\n");
}

/* "- value" with the value quoted; dollar_escape for the kubelet's $(VAR). */
static void item(base_buf *b, int in, const char *value, int dollar_escape) {
  base_buf_printf(b, "%*s- ", in, "");
  manifest_yaml_quote(b, value, dollar_escape);
  base_buf_puts(b, "\n");
}

/* What differs between the kinds' pods. */
typedef struct pod_parts {
  const char *container; /* the container's name, as the controller looks for it */
  int job_fields;        /* the container holds the command, env and resources itself
                            (a TrainJob holds them in spec.trainer instead) */
  const char *master;    /* node 0's HOST:PORT on the command line with --nnodes and
                            --node-rank $(JOB_COMPLETION_INDEX); NULL where the
                            controller sets PET_* */
  const char *port_name; /* the rendezvous containerPort's name; NULL where the
                            controller adds it */
  int subdomain;         /* set the pod's subdomain to the job's name (plain Job) */
} pod_parts;

/* The container's command: `cohort run [shape] [options] -- COMMAND`. */
static void cohort_command(base_buf *b, int in, const char *key, const manifest_k8s_opts *o,
                           const char *master) {
  line(b, in, "%s:", key);
  item(b, in, "cohort", 0);
  item(b, in, "run", 0);
  char num[32];
  if (master != NULL) {
    item(b, in, "--nnodes", 0);
    snprintf(num, sizeof num, "%d", o->nodes);
    item(b, in, num, 0);
    item(b, in, "--nproc-per-node", 0);
    snprintf(num, sizeof num, "%d", o->nproc_per_node);
    item(b, in, num, 0);
    item(b, in, "--master", 0);
    item(b, in, master, 0);
    item(b, in, "--node-rank", 0);
    item(b, in, "$(JOB_COMPLETION_INDEX)", 0); /* expanded by the kubelet */
  }
  if (o->hang_timeout > 0) {
    item(b, in, "--hang-timeout", 0);
    snprintf(num, sizeof num, "%d", o->hang_timeout);
    item(b, in, num, 0);
  }
  if (o->metrics_port > 0) {
    item(b, in, "--metrics-port", 0);
    snprintf(num, sizeof num, "%d", o->metrics_port);
    item(b, in, num, 0);
  }
  item(b, in, "--", 0);
  for (size_t i = 0; i < o->ncmd; i++) item(b, in, o->cmd[i], 1);
}

static void token_env(base_buf *b, int in, const char *secret) {
  line(b, in, "env:");
  line(b, in, "- name: COHORT_TOKEN");
  line(b, in + 2, "valueFrom:");
  line(b, in + 4, "secretKeyRef:");
  kv(b, in + 6, "name", secret);
  line(b, in + 6, "key: token");
}

/* GPUs and the RDMA device as limits under `key`. */
static void resources(base_buf *b, int in, const char *key, const manifest_k8s_opts *o) {
  if (o->gpus == 0 && o->rdma == MANIFEST_RDMA_NONE) return;
  line(b, in, "%s:", key);
  line(b, in + 2, "limits:");
  if (o->gpus > 0) line(b, in + 4, "nvidia.com/gpu: %d", o->gpus);
  if (o->rdma != MANIFEST_RDMA_NONE) line(b, in + 4, "rdma/rdma: 1");
}

/* The fields of the container after its name, at `in`. */
static void container(base_buf *b, int in, const manifest_k8s_opts *o, const pod_parts *p,
                      const char *secret) {
  kv(b, in, "image", o->image);
  if (p->job_fields) {
    cohort_command(b, in, "command", o, p->master);
    token_env(b, in, secret);
  }
  if (p->port_name != NULL || o->metrics_port > 0) {
    line(b, in, "ports:");
    if (p->port_name != NULL) {
      line(b, in, "- name: %s", p->port_name);
      line(b, in + 2, "containerPort: %d", o->port);
      line(b, in + 2, "protocol: TCP");
    }
    if (o->metrics_port > 0) {
      line(b, in, "- name: metrics");
      line(b, in + 2, "containerPort: %d", o->metrics_port);
      line(b, in + 2, "protocol: TCP");
    }
  }
  if (p->job_fields) resources(b, in, "resources", o);
  if (o->rdma != MANIFEST_RDMA_NONE) {
    line(b, in, "securityContext:");
    line(b, in + 2, "# RDMA registers (pins) memory, which needs IPC_LOCK.");
    line(b, in + 2, "capabilities:");
    line(b, in + 4, "add:");
    line(b, in + 4, "- IPC_LOCK");
  }
  line(b, in, "# The agent writes a failed job's root cause here: kubectl describe pod");
  line(b, in, "# shows it as the container's last state message.");
  line(b, in, "terminationMessagePath: /dev/termination-log");
  line(b, in, "terminationMessagePolicy: FallbackToLogsOnError");
  line(b, in, "volumeMounts:");
  line(b, in, "- name: dshm");
  line(b, in + 2, "mountPath: /dev/shm");
}

/* A PodTemplateSpec's metadata and spec at `in`. */
static void pod_template(base_buf *b, int in, const manifest_k8s_opts *o, const pod_parts *p,
                         const char *secret) {
  line(b, in, "metadata:");
  line(b, in + 2, "labels:");
  kv(b, in + 4, "cohort.job", o->name);
  if (o->rdma == MANIFEST_RDMA_ROCE || o->metrics_port > 0) {
    line(b, in + 2, "annotations:");
    if (o->rdma == MANIFEST_RDMA_ROCE)
      line(b, in + 4, "k8s.v1.cni.cncf.io/networks: \"kube-system/roce\"");
    if (o->metrics_port > 0) {
      line(b, in + 4, "# Prometheus' usual pod discovery keeps pods annotated so (docs/k8s.md).");
      line(b, in + 4, "prometheus.io/scrape: \"true\"");
      line(b, in + 4, "prometheus.io/port: \"%d\"", o->metrics_port);
      line(b, in + 4, "prometheus.io/path: \"/metrics\"");
    }
  }
  line(b, in, "spec:");
  if (p->subdomain) {
    line(b, in + 2, "# With the Service's name as subdomain, pod i (hostname <job>-i) is");
    line(b, in + 2, "# reachable as <job>-i.<service>.");
    kv(b, in + 2, "subdomain", o->name);
  }
  line(b, in + 2, "restartPolicy: Never");
  line(b, in + 2, "containers:");
  line(b, in + 2, "- name: %s", p->container);
  container(b, in + 4, o, p, secret);
  line(b, in + 2, "volumes:");
  line(b, in + 2, "- name: dshm");
  line(b, in + 4, "# Shared-memory transports need more than the runtime's 64 MiB.");
  line(b, in + 4, "emptyDir:");
  line(b, in + 6, "medium: Memory");
  if (o->shm_bytes > 0) {
    static const char *const units[4] = {"Ti", "Gi", "Mi", "Ki"};
    char num[32];
    manifest_size_str(o->shm_bytes, units, num, sizeof num);
    kv(b, in + 6, "sizeLimit", num);
  }
}

/* ---- checks, the Secret, the head ---- */

/*
 * The options every kind checks. The longest pod host name is the name plus
 * `suffix` plus the last index, which must stay a DNS label (63 characters).
 */
static int kube_check(const manifest_k8s_opts *o, const char *suffix, int last_index, char *err,
                      size_t errlen) {
  int rc = manifest_common_checks(o->nodes, o->nproc_per_node, o->cmd, o->ncmd, err, errlen);
  if (rc != 0) return rc;
  if (o->name == NULL) return manifest_seterr(err, errlen, "--name is required");
  char last[32];
  int room = 63 - (int)strlen(suffix) - snprintf(last, sizeof last, "%d", last_index);
  if (!manifest_dns_label_ok(o->name, (size_t)room))
    return manifest_seterr(err, errlen,
                           "--name '%s' must be lower-case letters, digits and '-', start and "
                           "end with a letter or digit, at most %d characters",
                           o->name, room);
  if (!manifest_token_ok(o->image))
    return manifest_seterr(err, errlen, "--image must be a non-empty image reference");
  if (o->gpus < 0 || o->gpus > MANIFEST_MAX_NPROC)
    return manifest_seterr(err, errlen, "--gpus must be in 0..%d", MANIFEST_MAX_NPROC);
  if (o->port < 1 || o->port > 65535)
    return manifest_seterr(err, errlen, "--port must be in 1..65535");
  if (o->metrics_port < 0 || o->metrics_port > 65535 || o->metrics_port == o->port)
    return manifest_seterr(err, errlen,
                           "--metrics-port must be in 1..65535 and differ from --port");
  if (o->pod_monitor && o->metrics_port == 0)
    return manifest_seterr(err, errlen, "--pod-monitor needs --metrics-port");
  if (o->token_secret != NULL && !manifest_dns_subdomain_ok(o->token_secret))
    return manifest_seterr(err, errlen, "--token-secret '%s' is not a valid Secret name",
                           o->token_secret);
  if (o->token_secret == NULL && !manifest_token_ok(o->token))
    return manifest_seterr(err, errlen, "no job token for the generated Secret");
  return 0;
}

/* The Secret that holds a generated job token. */
static void kube_secret(base_buf *b, const char *job, const char *secret, const char *token) {
  base_buf_puts(b, "---\napiVersion: v1\nkind: Secret\nmetadata:\n");
  kv(b, 2, "name", secret);
  base_buf_puts(b, "  labels:\n");
  kv(b, 4, "cohort.job", job);
  base_buf_puts(b, "type: Opaque\nstringData:\n");
  kv(b, 2, "token", token);
}

/* The opening comment (`what`: how the pods find each other), the token's
 * comment and the Secret with a generated token; the Secret's name in secret. */
static void kube_head(base_buf *b, const manifest_k8s_opts *o, const char *kind, const char *what,
                      char *secret, size_t secretlen) {
  if (o->token_secret != NULL)
    snprintf(secret, secretlen, "%s", o->token_secret);
  else
    snprintf(secret, secretlen, "%s-token", o->name);
  base_buf_printf(b, "# Generated by `cohort manifest %s`. Apply with: kubectl apply -f FILE\n",
                  kind);
  base_buf_puts(b, what);
  if (o->token_secret != NULL)
    base_buf_printf(b,
                    "# The job token is the key \"token\" of Secret %s, e.g.\n"
                    "#   kubectl create secret generic %s --from-literal=token=$(cohort token)\n",
                    o->token_secret, o->token_secret);
  else
    base_buf_printf(b,
                    "# The job token, generated with this file, is the key \"token\" of Secret "
                    "%s below:\n"
                    "# keep the file private, since whoever has the token can join or stop "
                    "the job.\n",
                    secret);
  if (o->metrics_port > 0)
    base_buf_printf(b,
                    "# Every agent serves Prometheus metrics on port %d (/metrics); the pods "
                    "carry\n# the prometheus.io/scrape annotations.\n",
                    o->metrics_port);
  if (o->token_secret == NULL) kube_secret(b, o->name, secret, o->token);
}

static void object_head(base_buf *b, const char *api, const char *kind, const char *name,
                        const char *job) {
  base_buf_printf(b, "---\napiVersion: %s\nkind: %s\nmetadata:\n", api, kind);
  kv(b, 2, "name", name);
  base_buf_puts(b, "  labels:\n");
  kv(b, 4, "cohort.job", job);
}

/* The Prometheus Operator's PodMonitor of the pods' "metrics" port, when
 * asked; then the end of every kind's output. */
static int kube_finish(const manifest_k8s_opts *o, base_buf *out, char *err, size_t errlen) {
  if (o->pod_monitor) {
    object_head(out, "monitoring.coreos.com/v1", "PodMonitor", o->name, o->name);
    base_buf_puts(out, "spec:\n  selector:\n    matchLabels:\n");
    kv(out, 6, "cohort.job", o->name);
    base_buf_puts(out, "  podTargetLabels:\n  - cohort.job\n"
                       "  podMetricsEndpoints:\n  - port: metrics\n    path: /metrics\n");
  }
  return manifest_finish(out, err, errlen);
}

/* ---- an Indexed Job and its headless Service ---- */

/* The headless Service that gives pod i the name NAME-i.NAME. */
static void k8s_service(base_buf *b, const manifest_k8s_opts *o) {
  object_head(b, "v1", "Service", o->name, o->name);
  base_buf_puts(b, "spec:\n  clusterIP: None\n"
                   "  # Publish pod addresses before readiness so that the agents can find\n"
                   "  # pod 0 as soon as it runs.\n"
                   "  publishNotReadyAddresses: true\n"
                   "  selector:\n");
  kv(b, 4, "cohort.job", o->name);
  base_buf_printf(b, "  ports:\n  - name: rendezvous\n    port: %d\n    protocol: TCP\n", o->port);
}

int manifest_k8s(const manifest_k8s_opts *o, base_buf *out, char *err, size_t errlen) {
  int rc = kube_check(o, "-", o->nodes - 1, err, errlen);
  if (rc != 0) return rc;
  char master[320], secret[300], what[512];
  snprintf(master, sizeof master, "%s-0.%s:%d", o->name, o->name, o->port);
  snprintf(what, sizeof what,
           "# The headless Service gives pod 0 the DNS name %s-0.%s, where its agent hosts\n"
           "# the rendezvous; every pod's agent joins it with its completion index as node "
           "rank.\n",
           o->name, o->name);
  kube_head(out, o, "k8s", what, secret, sizeof secret);
  k8s_service(out, o);
  object_head(out, "batch/v1", "Job", o->name, o->name);
  base_buf_printf(out,
                  "spec:\n  completionMode: Indexed\n  completions: %d\n  parallelism: %d\n"
                  "  # A failed worker stops the agents on every node, so the Job fails as a "
                  "whole\n  # instead of restarting one pod into a finished rendezvous.\n"
                  "  backoffLimit: 0\n  template:\n",
                  o->nodes, o->nodes);
  pod_parts p = {.container = "cohort",
                 .job_fields = 1,
                 .master = master,
                 .port_name = "rendezvous",
                 .subdomain = 1};
  pod_template(out, 4, o, &p, secret);
  return kube_finish(o, out, err, errlen);
}

/* ---- JobSet ---- */

/* The spec of the Indexed Job of N pods a JobSet (or Trainer's runtime) replicates, at `in`. */
static void indexed_job_spec(base_buf *b, int in, const manifest_k8s_opts *o, const pod_parts *p,
                             const char *secret, int counts) {
  line(b, in, "completionMode: Indexed");
  if (counts) {
    line(b, in, "completions: %d", o->nodes);
    line(b, in, "parallelism: %d", o->nodes);
  }
  line(b, in, "backoffLimit: 0");
  line(b, in, "template:");
  pod_template(b, in + 2, o, p, secret);
}

int manifest_jobset(const manifest_k8s_opts *o, base_buf *out, char *err, size_t errlen) {
  int rc = kube_check(o, "-node-0-", o->nodes - 1, err, errlen);
  if (rc != 0) return rc;
  char master[320], secret[300], what[512];
  snprintf(master, sizeof master, "%s-node-0-0.%s:%d", o->name, o->name, o->port);
  snprintf(what, sizeof what,
           "# JobSet names pod i %s-node-0-i in the headless Service %s: pod 0's agent\n"
           "# hosts the rendezvous; every pod's agent joins it with its completion index as\n"
           "# node rank. Needs the JobSet controller (jobset.x-k8s.io).\n",
           o->name, o->name);
  kube_head(out, o, "jobset", what, secret, sizeof secret);
  object_head(out, "jobset.x-k8s.io/v1alpha2", "JobSet", o->name, o->name);
  base_buf_puts(out, "spec:\n"
                     "  # A failed worker stops the agents on every node: the JobSet fails "
                     "as a whole.\n"
                     "  failurePolicy:\n    maxRestarts: 0\n"
                     "  network:\n    enableDNSHostnames: true\n"
                     "    publishNotReadyAddresses: true\n"
                     "  replicatedJobs:\n  - name: node\n    replicas: 1\n    template:\n"
                     "      spec:\n");
  pod_parts p = {
      .container = "cohort", .job_fields = 1, .master = master, .port_name = "rendezvous"};
  indexed_job_spec(out, 8, o, &p, secret, 1);
  return kube_finish(o, out, err, errlen);
}

/* ---- Kubeflow Trainer v2: TrainingRuntime and TrainJob ---- */

/* The runtime: a JobSet template whose pods the TrainJob fills in. */
static void trainer_runtime(base_buf *b, const manifest_k8s_opts *o, const char *runtime,
                            const char *secret) {
  object_head(b, "trainer.kubeflow.org/v1alpha1", "TrainingRuntime", runtime, o->name);
  base_buf_puts(b, "    trainer.kubeflow.org/framework: torch\n"
                   "spec:\n  mlPolicy:\n");
  /* The TrainJob's numProcPerNode becomes PET_NPROC_PER_NODE. */
  base_buf_printf(b, "    numNodes: %d\n    torch: {}\n", o->nodes);
  base_buf_puts(b, "  template:\n    spec:\n"
                   "      failurePolicy:\n        maxRestarts: 0\n"
                   "      network:\n        publishNotReadyAddresses: true\n"
                   "      replicatedJobs:\n      - name: node\n        template:\n"
                   "          metadata:\n            labels:\n"
                   "              trainer.kubeflow.org/trainjob-ancestor-step: trainer\n"
                   "          spec:\n");
  /* The container is "node", where the torch plugin puts PET_* and its port. */
  pod_parts p = {.container = "node"};
  indexed_job_spec(b, 12, o, &p, secret, 0);
}

int manifest_trainjob(const manifest_k8s_opts *o, base_buf *out, char *err, size_t errlen) {
  int rc = kube_check(o, "-node-0-", o->nodes - 1, err, errlen);
  if (rc != 0) return rc;
  if (o->port != MANIFEST_TRAINER_PORT)
    return manifest_seterr(err, errlen,
                           "--port: Kubeflow Trainer's torch plugin sets the rendezvous port "
                           "(PET_MASTER_PORT) to %d",
                           MANIFEST_TRAINER_PORT);
  char secret[300], runtime[300];
  snprintf(runtime, sizeof runtime, "%s-cohort", o->name);
  kube_head(out, o, "trainjob",
            "# A Kubeflow Trainer v2 TrainJob on the TrainingRuntime below. The torch plugin\n"
            "# gives every pod PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR\n"
            "# (pod 0) and PET_MASTER_PORT, which `cohort run` reads as torchrun does.\n",
            secret, sizeof secret);
  trainer_runtime(out, o, runtime, secret);
  object_head(out, "trainer.kubeflow.org/v1alpha1", "TrainJob", o->name, o->name);
  base_buf_puts(out, "spec:\n  runtimeRef:\n    apiGroup: trainer.kubeflow.org\n"
                     "    kind: TrainingRuntime\n");
  kv(out, 4, "name", runtime);
  base_buf_puts(out, "  trainer:\n");
  kv(out, 4, "image", o->image);
  cohort_command(out, 4, "command", o, NULL);
  base_buf_printf(out, "    numNodes: %d\n    numProcPerNode: %d\n", o->nodes, o->nproc_per_node);
  token_env(out, 4, secret);
  resources(out, 4, "resourcesPerNode", o);
  return kube_finish(o, out, err, errlen);
}

/* ---- Training Operator v1: PyTorchJob ---- */

static void pytorch_replica(base_buf *b, const char *type, int replicas, const manifest_k8s_opts *o,
                            const char *secret) {
  base_buf_printf(b, "    %s:\n      replicas: %d\n      restartPolicy: Never\n      template:\n",
                  type, replicas);
  /* The operator looks for the container "pytorch" and its port "pytorchjob-port". */
  pod_parts p = {.container = "pytorch", .job_fields = 1, .port_name = "pytorchjob-port"};
  pod_template(b, 8, o, &p, secret);
}

int manifest_pytorchjob(const manifest_k8s_opts *o, base_buf *out, char *err, size_t errlen) {
  int rc = kube_check(o, "-worker-", o->nodes - 1, err, errlen);
  if (rc != 0) return rc;
  char secret[300];
  kube_head(out, o, "pytorchjob",
            "# A Training Operator v1 PyTorchJob: the operator gives every pod PET_NNODES,\n"
            "# PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR (the Master's Service) and\n"
            "# PET_MASTER_PORT, which `cohort run` reads as torchrun does; it ignores the\n"
            "# RANK and WORLD_SIZE the operator sets beside them, as torchrun does.\n",
            secret, sizeof secret);
  object_head(out, "kubeflow.org/v1", "PyTorchJob", o->name, o->name);
  base_buf_printf(out,
                  "spec:\n  nprocPerNode: \"%d\"\n  runPolicy:\n"
                  "    # A failed worker stops the agents on every node: no pod is retried.\n"
                  "    backoffLimit: 0\n  pytorchReplicaSpecs:\n",
                  o->nproc_per_node);
  pytorch_replica(out, "Master", 1, o, secret);
  if (o->nodes > 1) pytorch_replica(out, "Worker", o->nodes - 1, o, secret);
  return kube_finish(o, out, err, errlen);
}

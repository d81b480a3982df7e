/* cmd_run.c - `cohort run`: argument parsing for the node agent. */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/launcher.h"
#include "base/base.h"
#include "base/net.h"
#include "cohort/cohort.h"
#include "rdzv/where.h"
#include "store/auth.h"
#include "store/store.h"
#include "tools/cli.h"
#include "tools/cohort/cmd.h"
#include "tools/cohort/cmd_run.h"

#define RUN_USAGE_OPTIONS                                                                          \
  "options:\n"                                                                                     \
  "  --nproc-per-node N|cpu|gpu|auto  workers on this node (default 1, at most 1024); cpu:\n"      \
  "                       one per CPU; gpu: one per GPU ($CUDA_VISIBLE_DEVICES honoured);\n"       \
  "                       auto: gpu when the node shows one, else cpu\n"                           \
  "  --numa-binding node|socket|exclusive|core-complex  bind local rank N to CPUs near\n"          \
  "                       GPU N: its NUMA node, its socket, an exclusive share of the node's\n"    \
  "                       cores, or one core complex (last-level cache) of the node\n"             \
  "  --cpu-bind none|cores|numa  without GPUs: give each local rank its own even slice of\n"       \
  "                       the node's CPUs (whole cores; numa: within one NUMA node each),\n"       \
  "                       with OMP_NUM_THREADS its size unless set (default none)\n"               \
  "  --max-restarts K     restart the whole group up to K times after a failure (default 0)\n"     \
  "  --on-failure restart|reform  on a lost rank or node: stop and restart every worker\n"         \
  "                       (restart, the default), or keep the survivors running and re-form\n"     \
  "                       the job without the lost ones (reform; docs/reform.md)\n"                \
  "  --reform-timeout SEC  a re-form not done within SEC fails the job (default 60)\n"             \
  "  --log-dir DIR        also write DIR/attempt<K>/rank<R>.log per worker; without -r/-t the\n"   \
  "                       console then gets nothing\n"                                             \
  "  -r, --redirects S    streams to the files only: 1 stdout, 2 stderr, 3 both, 0 none; or\n"     \
  "                       per local rank, 0:3,1:2; files in --log-dir, else a new directory\n"     \
  "                       under $TMPDIR (printed)\n"                                               \
  "  -t, --tee S          streams to the files and the console, as -r\n"                           \
  "  --local-ranks-filter R,...  only these local ranks' lines reach the console\n"                \
  "  --duplicate-stdout-filters S,...  also write every stdout line holding one of these\n"        \
  "                       strings (\",,\" stands for a comma) to\n"                                \
  "                       DIR/attempt<K>/filtered_stdout.log (--log-dir, else a new directory)\n"  \
  "  --duplicate-stderr-filters S,...  the same for stderr (filtered_stderr.log)\n"                \
  "  --virtual-local-rank  every worker gets LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES naming its\n"   \
  "                       own GPU (the local rank's entry of the list, else its number)\n"         \
  "  --grace SECONDS      time between SIGTERM and SIGKILL when stopping (default 5); also\n"      \
  "                       --shutdown-timeout\n"                                                    \
  "  --run-id ID          job id, [A-Za-z0-9._-]{1,64} (default: random on one node;\n"            \
  "                       on several, derived from the store address); also --rdzv-id\n"           \
  "  --role NAME          ROLE_NAME of the workers (default \"default\")\n"                        \
  "  --token SECRET       job token (default: $COHORT_TOKEN, else random); with it every\n"        \
  "                       store connection and multicast datagram is authenticated\n"              \
  "  --token-file FILE    read the token from FILE (default: $COHORT_TOKEN_FILE), which\n"         \
  "                       only its owner may read; unlike --token, not shown by ps\n"              \
  "  --require-token      refuse to run a multi-node job without a token (also\n"                  \
  "                       COHORT_REQUIRE_TOKEN=1) instead of warning\n"                            \
  "  -m, --module         run the program as a Python module (python3 -u -m MODULE)\n"             \
  "  --no-python          run the program itself, not through Python\n"                            \
  "  --run-path           run the script with Python's runpy.run_path\n"                           \
  "\n"                                                                                             \
  "multi-node (run one agent per node):\n"                                                         \
  "  --nnodes N|MIN:MAX   number of nodes (elastic range: start with MIN, wait --last-call\n"      \
  "                       seconds for more up to MAX)\n"                                           \
  "  --node-rank R        this node's rank (default: the scheduler's index, else join order)\n"    \
  "  --master HOST:PORT   node 0's agent (a DNS name may resolve late; retried until\n"            \
  "                       --join-timeout); node 0 hosts the rendezvous store on PORT\n"            \
  "  --master-addr HOST  torchrun's static form of --master (default 127.0.0.1; used\n"            \
  "                       with --nnodes above 1, --node-rank or --master-port)\n"                  \
  "  --master-port PORT   the port of --master-addr (default 29500)\n"                             \
  "  --rdzv-backend static|c10d|etcd  c10d: the same command on every node; the node\n"            \
  "                       owning --rdzv-endpoint's address hosts the store; etcd: the job\n"       \
  "                       meets in etcd at --rdzv-endpoint HOST:PORT,... (2379 when left\n"        \
  "                       out) and outlives any node; also --discover etcd\n"                      \
  "  --rdzv-endpoint HOST[:PORT]  the store (port 29400 when left out; port 0: a free one,\n"      \
  "                       one node only)\n"                                                        \
  "  --rdzv-conf K=V,...  join_timeout, last_call_timeout (seconds), is_host (true: this\n"        \
  "                       node hosts the store); etcd: protocol=https, cacert, cert, key,\n"       \
  "                       user and password_file (a file only its owner reads); other\n"           \
  "                       keys are noted as without effect\n"                                      \
  "  --standalone         one node with a private store (any --rdzv-* given is ignored)\n"         \
  "  --discover METHOD    auto (default: scheduler environment, else --master), static,\n"         \
  "                       mcast (UDP multicast, needs --job), file (needs --rdzv-file), env,\n"    \
  "                       etcd (needs --rdzv-endpoint)\n"                                          \
  "  --job ID             job id (same as --run-id; separates concurrent jobs)\n"                  \
  "  --iface NAME         interface for multicast (default: the default route's)\n"                \
  "  --mcast-group A:P    multicast group and port (default: derived from the job id)\n"           \
  "  --rdzv-file PATH     rendezvous file on a shared filesystem\n"                                \
  "  --local-addr ADDR    this node's address for the others: written to the rendezvous\n"         \
  "                       file or announced, MASTER_ADDR when node 0 (default: found)\n"           \
  "  --join-timeout SEC   give up the rendezvous after SEC seconds (default 300)\n"                \
  "  --last-call SEC      elastic: extra wait for nodes beyond MIN (default 3)\n"                  \
  "  --heartbeat-timeout SEC  a node silent this long is lost (default 5)\n"                       \
  "  --hang-timeout SEC   a rank that prints nothing and reports no progress ($COHORT_PROGRESS)\n" \
  "                       for SEC makes the job hung: every rank's stack is taken, the\n"          \
  "                       report names the rank to blame, exit status 5 (default: off)\n"          \
  "  --hang-start-timeout SEC  the same limit before a rank's first line or beat (start-up:\n"     \
  "                       imports, loading data; default: --hang-timeout's)\n"                     \
  "  --straggler-factor F  report (on node 0, once per episode) a rank whose step time, from\n"    \
  "                       the step numbers it writes to $COHORT_PROGRESS, is above F times\n"      \
  "                       the other ranks' median (default 1.5; 0: off); never stops the job\n"    \
  "  --metrics-port PORT  serve Prometheus metrics (per rank step, beat age, hang; per node\n"     \
  "                       round, members, restarts, store) on PORT at /metrics\n"                  \
  "  --metrics-file PATH  also write them to PATH (node-exporter's textfile collector)\n"          \
  "  --termination-log PATH  write a failed job's root cause to PATH if it exists\n"               \
  "                       (default /dev/termination-log: Kubernetes' termination message)\n"       \
  "  --net auto|off       add the NCCL/UCX/Gloo settings `cohort doctor` derives for this\n"       \
  "                       node (never overriding what you set; default auto)\n"                    \
  "  --sysfs-root DIR, --proc-root DIR, --dev-root DIR  read GPUs and the CPU topology\n"          \
  "                       there instead of /sys, /proc and /dev (fixture trees)\n"                 \
  "  --launcher-stdin     standard input is the connection to `cohort launch` (it passes\n"        \
  "                       this): the version goes to stdout first, the token is stdin's\n"         \
  "                       first line, then a 'stop' line stops the job, end of file fails it\n"    \
  "  -h, --help           this text\n"                                                             \
  "\n"                                                                                             \
  "Every option also takes --opt=value, the underscore spelling (--nproc_per_node) and,\n"         \
  "as in torchrun, its PET_ variable (PET_NPROC_PER_NODE). Accepted without effect, with a\n"      \
  "note: --monitor-interval, --start-method, --event-log-handler, --logs-specs,\n"                 \
  "--signals-to-handle. docs/torchrun.md lists the differences from torchrun.\n"                   \
  "\n"                                                                                             \
  "exit status:\n"                                                                                 \
  "  0        every worker succeeded\n"                                                            \
  "  1        a worker failed (the report names it)\n"                                             \
  "  2        usage error (a required token missing too)\n"                                        \
  "  3        internal error of the agent\n"                                                       \
  "  4        stopped by cohort stop\n"                                                            \
  "  5        hung (--hang-timeout)\n"                                                             \
  "  6        the rendezvous never completed (no worker ran): the nodes did not all\n"             \
  "           come within --join-timeout, the store never answered, or it refused\n"               \
  "           the token\n"                                                                         \
  "  126      command not executable\n"                                                            \
  "  127      command not found\n"                                                                 \
  "  128+N    stopped by signal N\n"

static const char run_usage[] =
    "usage: cohort run [options] -- CMD [ARGS...]\n"
    "       cohort run [options] SCRIPT.py [ARGS...]   (torchrun's form: python3 -u SCRIPT.py)\n"
    "\n"
    "Starts one worker per slot on this node with the environment torchrun gives\n"
    "(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), relays their\n"
    "output with a rank prefix, and stops them all when one fails. The program is\n"
    "run through $PYTHON_EXEC (else python3 on PATH) unless it follows '--' or\n"
    "--no-python is given.\n"
    "\n" RUN_USAGE_OPTIONS;

static const char torchrun_usage[] =
    "usage: torchrun [options] SCRIPT.py [ARGS...]\n"
    "\n"
    "This torchrun is cohort (`cohort run` under torchrun's name): the same command\n"
    "line as PyTorch's torchrun (docs/torchrun.md lists the differences), with\n"
    "cohort's rendezvous, rank-prefixed output, fail-together and root-cause report. The\n"
    "program is run through $PYTHON_EXEC (else python3 on PATH) unless --no-python\n"
    "is given.\n"
    "\n" RUN_USAGE_OPTIONS;

/*
 * The settings the table fills: the agent's configuration, the choices that
 * are enums there (an int here, converted after parsing), and torchrun's
 * options, turned into the configuration by torchrun_meaning().
 */
typedef struct run_args {
  agent_config cfg;
  int method;
  const char *token_file;
  int nnodes_given;
  int backend;
  const char *endpoint;    /* --rdzv-endpoint, NULL: none */
  const char *master_addr; /* --master-addr, NULL: not given (127.0.0.1) */
  int master_port;         /* --master-port, -1: not given (29500) */
  int node_rank_given;
  const rdzv_conf *conf; /* --rdzv-conf, NULL: not given */
  int standalone, module, no_python, run_path;
  int std_given;    /* -r or -t given */
  int numa_binding; /* torchrun's --numa-binding, AGENT_BIND_NONE: not given */
  int cpu_bind;     /* cohort's --cpu-bind */
  char master_buf[BASE_HOST_MAX + 16];
} run_args;

#define AT(FIELD, CTYPE) CLI_AT(run_args, FIELD, CTYPE)

static int set_nnodes(void *settings, const char *v) {
  run_args *a = settings;
  const char *colon = strchr(v, ':');
  int lo, hi;
  if (colon == NULL) {
    if (base_parse_int(v, 1, 4096, &lo) != 0) return -1;
    hi = lo;
  } else {
    char minbuf[16];
    size_t ml = (size_t)(colon - v);
    if (ml == 0 || ml >= sizeof minbuf) return -1;
    memcpy(minbuf, v, ml);
    minbuf[ml] = '\0';
    if (base_parse_int(minbuf, 1, 4096, &lo) != 0 || base_parse_int(colon + 1, 1, 4096, &hi) != 0 ||
        hi < lo)
      return -1;
  }
  a->cfg.rdzv.nnodes_min = lo;
  a->cfg.rdzv.nnodes_max = hi;
  a->nnodes_given = 1;
  return 0;
}

/* N, or torchrun's cpu, gpu and auto: counted on the node when the agent starts (place.h). */
static int set_nproc(void *settings, const char *v) {
  static const cli_choice kinds[] = {
      {"cpu", AGENT_NPROC_CPU}, {"gpu", AGENT_NPROC_GPU}, {"auto", AGENT_NPROC_AUTO}, {NULL, 0}};
  agent_config *c = &((run_args *)settings)->cfg;
  for (int i = 0; kinds[i].name != NULL; i++)
    if (strcmp(v, kinds[i].name) == 0) return c->nproc_kind = (agent_nproc)kinds[i].value, 0;
  c->nproc_kind = AGENT_NPROC_NUMBER;
  return base_parse_int(v, 1, AGENT_MAX_NPROC, &c->nproc);
}

static int set_node_rank(void *settings, const char *v) {
  run_args *a = settings;
  a->node_rank_given = 1;
  return base_parse_int(v, 0, 4095, &a->cfg.rdzv.node_rank);
}

static int set_master(void *settings, const char *v) {
  char host[BASE_HOST_MAX];
  int port;
  if (base_split_hostport(v, host, sizeof host, &port, 0) != 0 || host[0] == '\0') return -1;
  ((run_args *)settings)->cfg.rdzv.master = v;
  return 0;
}

/* HOST[:PORT], port 0 allowed (a free one), or a list for etcd (checked by etcd_meaning). */
static int set_endpoint(void *settings, const char *v) {
  char host[BASE_HOST_MAX], with_port[BASE_HOST_MAX + 16];
  int port;
  if (strchr(v, ',') != NULL) {
    ((run_args *)settings)->endpoint = v;
    return 0;
  }
  snprintf(with_port, sizeof with_port, "%s:%d", v, RDZV_DEFAULT_PORT);
  if (base_split_hostport(v, host, sizeof host, &port, 1) != 0 &&
      base_split_hostport(with_port, host, sizeof host, &port, 1) != 0)
    return -1;
  if (host[0] == '\0') return -1;
  ((run_args *)settings)->endpoint = v;
  return 0;
}

static int set_mcast_group(void *settings, const char *v) {
  char host[BASE_HOST_MAX];
  int port;
  if (base_split_hostport(v, host, sizeof host, &port, 0) != 0) return -1;
  ((run_args *)settings)->cfg.rdzv.mcast_group = v;
  return 0;
}

/* --run-id, --job and --rdzv-id: one id under three names. */
static int set_run_id(void *settings, const char *v) {
  if (!rdzv_job_id_valid(v)) return -1;
  ((run_args *)settings)->cfg.run_id = v;
  return 0;
}

static int set_iface(void *settings, const char *v) {
  if (v[0] == '\0' || strlen(v) >= 16) return -1;
  ((run_args *)settings)->cfg.rdzv.iface = v;
  return 0;
}

/* torchrun's Std values for --redirects/--tee: one for every local rank, or LR:V,... */
static int set_redirects(void *settings, const char *v) {
  run_args *a = settings;
  a->std_given = 1;
  return agent_std_parse(v, &a->cfg.redirects);
}

static int set_tee(void *settings, const char *v) {
  run_args *a = settings;
  a->std_given = 1;
  return agent_std_parse(v, &a->cfg.tee);
}

/* --local-ranks-filter: a comma-separated list of local ranks ("" for all). */
static int set_ranks_filter(void *settings, const char *v) {
  agent_config *c = &((run_args *)settings)->cfg;
  char buf[1024];
  c->nshown = 0;
  if (strlen(v) >= sizeof buf) return -1;
  memcpy(buf, v, strlen(v) + 1);
  char *save = NULL;
  for (char *item = strtok_r(buf, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save))
    if (c->nshown == AGENT_STD_MAX ||
        base_parse_int(item, 0, AGENT_MAX_NPROC - 1, &c->shown[c->nshown++]) != 0)
      return -1;
  return v[0] != '\0' && c->nshown == 0 ? -1 : 0;
}

/*
 * torchrun's comma-separated filters, ",," standing for a comma; empty items
 * are dropped (an empty list duplicates nothing). The strings live in store.
 */
static int parse_filters(const char *v, agent_filters *f, char *store, size_t storelen) {
  size_t len = strlen(v);
  if (len >= storelen) return -1;
  f->n = 0;
  char *item = store;
  for (size_t i = 0, o = 0; i <= len; i++) {
    if (i < len && !(v[i] == ',' && v[i + 1] != ',')) {
      store[o++] = v[i];
      if (v[i] == ',') i++; /* ",," is one comma */
      continue;
    }
    store[o++] = '\0';
    if (item[0] != '\0') {
      if (f->n == AGENT_FILTERS_MAX) return -1;
      f->f[f->n++] = item;
    }
    item = store + o;
  }
  return 0;
}

static int set_dup_stdout(void *settings, const char *v) {
  static char store[4096];
  return parse_filters(v, &((run_args *)settings)->cfg.dup[0], store, sizeof store);
}

static int set_dup_stderr(void *settings, const char *v) {
  static char store[4096];
  return parse_filters(v, &((run_args *)settings)->cfg.dup[1], store, sizeof store);
}

/* --rdzv-conf (rdzv/where.h); keys cohort has no use for get a note. */
static int set_rdzv_conf(void *settings, const char *v) {
  static rdzv_conf conf;
  run_args *a = settings;
  char err[256];
  if (rdzv_conf_parse(v, &conf, err, sizeof err) != 0) return -1;
  if (conf.join_timeout_ms >= 0) a->cfg.join_timeout_ms = conf.join_timeout_ms;
  if (conf.last_call_ms >= 0) a->cfg.last_call_ms = conf.last_call_ms;
  if (conf.unused[0] != '\0')
    fprintf(stderr, "cohort run: note: --rdzv-conf %s has no effect\n", conf.unused);
  a->conf = &conf;
  return 0;
}

/* --straggler-factor: 0 (off), or above 1 (a rank as slow as the others is no straggler). */
static int set_straggler_factor(void *settings, const char *v) {
  run_args *a = settings;
  char *end = NULL;
  double f = strtod(v, &end);
  if (end == v || *end != '\0' || !(f == 0 || (f > 1 && f <= 1000))) return -1;
  a->cfg.straggler_factor = f;
  return 0;
}

static const cli_choice discover_methods[] = {
    {"auto", RDZV_AUTO}, {"static", RDZV_STATIC}, {"dns", RDZV_STATIC}, {"mcast", RDZV_MCAST},
    {"file", RDZV_FILE}, {"env", RDZV_ENV},       {"etcd", RDZV_ETCD},  {NULL, 0}};
static const cli_choice failure_modes[] = {{"restart", 0}, {"reform", 1}, {NULL, 0}};
static const cli_choice net_modes[] = {{"auto", 1}, {"off", 0}, {NULL, 0}};
static const cli_choice numa_modes[] = {{"node", AGENT_BIND_GPU_NODE},
                                        {"socket", AGENT_BIND_GPU_SOCKET},
                                        {"exclusive", AGENT_BIND_GPU_EXCLUSIVE},
                                        {"core-complex", AGENT_BIND_GPU_CORE_COMPLEX},
                                        {NULL, 0}};
static const cli_choice cpu_modes[] = {
    {"none", AGENT_BIND_NONE}, {"cores", AGENT_BIND_CORES}, {"numa", AGENT_BIND_NUMA}, {NULL, 0}};
static const cli_choice backends[] = {{"static", RDZV_BACKEND_STATIC},
                                      {"c10d", RDZV_BACKEND_C10D},
                                      {"etcd", RDZV_BACKEND_ETCD},
                                      {"etcd-v2", RDZV_BACKEND_ETCD},
                                      {NULL, 0}};

#define RUN_ID_WHAT "1 to 64 characters of [A-Za-z0-9._-]"
#define STD_WHAT "0, 1, 2 or 3, or LOCAL_RANK:VALUE,... (e.g. 0:3,1:1)"

/* torchrun's options, with their PET_ variables, then cohort's own. */
static const cli_opt run_opts[] = {
    {"--help", 'h', .kind = CLI_HELP_OPT},
    {"--nnodes", 0, CLI_CUSTOM, .fn = set_nnodes,
     .what = "N or MIN:MAX with 1 <= MIN <= MAX <= 4096", .env = "PET_NNODES"},
    {"--nproc-per-node|--nproc_per_node", 0, CLI_CUSTOM, .fn = set_nproc,
     .what = "a whole number from 1 to 1024, cpu, gpu or auto", .env = "PET_NPROC_PER_NODE"},
    {"--rdzv-backend|--rdzv_backend", 0, CLI_CHOICE, .at = AT(backend, int), .choices = backends,
     .what = "static, c10d, etcd or etcd-v2", .env = "PET_RDZV_BACKEND"},
    {"--rdzv-endpoint|--rdzv_endpoint", 0, CLI_CUSTOM, .fn = set_endpoint,
     .what = "HOST[:PORT] (IPv6 as [ADDR]:PORT)", .env = "PET_RDZV_ENDPOINT"},
    {"--rdzv-id|--rdzv_id", 0, CLI_CUSTOM, .fn = set_run_id, .what = RUN_ID_WHAT,
     .env = "PET_RDZV_ID"},
    {"--rdzv-conf|--rdzv_conf", 0, CLI_CUSTOM, .fn = set_rdzv_conf,
     .what = "KEY=VALUE,... (timeouts in seconds, is_host true|false, protocol http|https)",
     .env = "PET_RDZV_CONF"},
    {"--standalone", 0, CLI_FLAG, .at = AT(standalone, int), .env = "PET_STANDALONE"},
    {"--max-restarts|--max_restarts", 0, CLI_INT, .at = AT(cfg.max_restarts, int), .min = 0,
     .max = 1000000, .env = "PET_MAX_RESTARTS"},
    {"--on-failure|--on_failure", 0, CLI_CHOICE, .at = AT(cfg.reform, int),
     .choices = failure_modes, .env = "PET_ON_FAILURE"},
    {"--reform-timeout", 0, CLI_SECONDS, .at = AT(cfg.reform_timeout_ms, int64_t), .min = 1000,
     .max = 86400000},
    {"--monitor-interval|--monitor_interval", 0, CLI_NOTE,
     .what = "cohort learns of a worker's exit at once", .env = "PET_MONITOR_INTERVAL"},
    {"--start-method|--start_method", 0, CLI_NOTE,
     .what = "every worker is a new process, as with spawn", .env = "PET_START_METHOD"},
    {"--event-log-handler|--event_log_handler", 0, CLI_NOTE, .what = "cohort reports events itself",
     .env = "PET_EVENT_LOG_HANDLER"},
    {"--role", 0, CLI_STR, .at = AT(cfg.role, const char *), .what = "a name", .env = "PET_ROLE",
     .flags = CLI_NONEMPTY},
    {"--module", 'm', CLI_FLAG, .at = AT(module, int), .env = "PET_MODULE"},
    {"--no-python|--no_python", 0, CLI_FLAG, .at = AT(no_python, int), .env = "PET_NO_PYTHON"},
    {"--run-path|--run_path", 0, CLI_FLAG, .at = AT(run_path, int), .env = "PET_RUN_PATH"},
    {"--log-dir|--log_dir", 0, CLI_STR, .at = AT(cfg.log_dir, const char *), .what = "a directory",
     .env = "PET_LOG_DIR", .flags = CLI_NONEMPTY},
    {"--redirects", 'r', CLI_CUSTOM, .fn = set_redirects, .what = STD_WHAT, .env = "PET_REDIRECTS"},
    {"--tee", 't', CLI_CUSTOM, .fn = set_tee, .what = STD_WHAT, .env = "PET_TEE"},
    {"--local-ranks-filter|--local_ranks_filter", 0, CLI_CUSTOM, .fn = set_ranks_filter,
     .what = "local ranks separated by commas (e.g. 0,1)", .env = "PET_LOCAL_RANKS_FILTER"},
    {"--duplicate-stdout-filters|--duplicate_stdout_filters", 0, CLI_CUSTOM, .fn = set_dup_stdout,
     .what = "strings separated by commas (at most 32, 4095 bytes)",
     .env = "PET_DUPLICATE_STDOUT_FILTERS"},
    {"--duplicate-stderr-filters|--duplicate_stderr_filters", 0, CLI_CUSTOM, .fn = set_dup_stderr,
     .what = "strings separated by commas (at most 32, 4095 bytes)",
     .env = "PET_DUPLICATE_STDERR_FILTERS"},
    {"--virtual-local-rank|--virtual_local_rank", 0, CLI_FLAG,
     .at = AT(cfg.virtual_local_rank, int), .env = "PET_VIRTUAL_LOCAL_RANK"},
    {"--shutdown-timeout|--shutdown_timeout", 0, CLI_SECONDS, .at = AT(cfg.grace_ms, int64_t),
     .min = 0, .max = 3600000, .env = "PET_SHUTDOWN_TIMEOUT"},
    {"--numa-binding|--numa_binding", 0, CLI_CHOICE, .at = AT(numa_binding, int),
     .choices = numa_modes, .env = "PET_NUMA_BINDING"},
    {"--node-rank|--node_rank", 0, CLI_CUSTOM, .fn = set_node_rank,
     .what = "a whole number from 0 to 4095", .env = "PET_NODE_RANK"},
    {"--master-addr|--master_addr", 0, CLI_STR, .at = AT(master_addr, const char *),
     .what = "a host name or address", .env = "PET_MASTER_ADDR", .flags = CLI_NONEMPTY},
    {"--master-port|--master_port", 0, CLI_INT, .at = AT(master_port, int), .min = 1, .max = 65535,
     .env = "PET_MASTER_PORT"},
    {"--local-addr|--local_addr", 0, CLI_STR, .at = AT(cfg.rdzv.local_addr, const char *),
     .what = "this node's address", .env = "PET_LOCAL_ADDR", .flags = CLI_NONEMPTY},
    {"--logs-specs|--logs_specs", 0, CLI_NOTE, .what = "cohort's log files are fixed"},
    {"--signals-to-handle|--signals_to_handle", 0, CLI_NOTE,
     .what = "SIGTERM, SIGINT, SIGHUP and SIGQUIT stop the workers",
     .env = "PET_SIGNALS_TO_HANDLE"},
    {"--grace", 0, CLI_SECONDS, .at = AT(cfg.grace_ms, int64_t), .min = 0, .max = 3600000},
    {"--run-id|--run_id", 0, CLI_CUSTOM, .fn = set_run_id, .what = RUN_ID_WHAT},
    {"--token", 0, CLI_STR, .at = AT(cfg.token, const char *), .env = "COHORT_TOKEN"},
    {"--token-file", 0, CLI_STR, .at = AT(token_file, const char *), .what = "a file",
     .env = "COHORT_TOKEN_FILE", .flags = CLI_NONEMPTY},
    {"--require-token", 0, CLI_FLAG, .at = AT(cfg.require_token, int)},
    {"--master", 0, CLI_CUSTOM, .fn = set_master, .what = "HOST:PORT (IPv6 as [ADDR]:PORT)"},
    {"--discover", 0, CLI_CHOICE, .at = AT(method, int), .choices = discover_methods},
    {"--job", 0, CLI_CUSTOM, .fn = set_run_id, .what = RUN_ID_WHAT},
    {"--iface", 0, CLI_CUSTOM, .fn = set_iface, .what = "an interface name"},
    {"--mcast-group", 0, CLI_CUSTOM, .fn = set_mcast_group, .what = "ADDR:PORT"},
    {"--rdzv-file", 0, CLI_STR, .at = AT(cfg.rdzv.rdzv_file, const char *), .what = "a path",
     .flags = CLI_NONEMPTY},
    {"--join-timeout", 0, CLI_SECONDS, .at = AT(cfg.join_timeout_ms, int64_t), .min = 1,
     .max = 86400000},
    {"--last-call", 0, CLI_SECONDS, .at = AT(cfg.last_call_ms, int64_t), .min = 0, .max = 3600000},
    {"--heartbeat-timeout", 0, CLI_SECONDS, .at = AT(cfg.lost_after_ms, int64_t), .min = 500,
     .max = 3600000},
    {"--hang-timeout", 0, CLI_SECONDS, .at = AT(cfg.hang_timeout_ms, int64_t), .min = 1000,
     .max = 86400000LL * 7},
    {"--straggler-factor", 0, CLI_CUSTOM, .fn = set_straggler_factor,
     .what = "0 (off) or a factor above 1, up to 1000"},
    {"--hang-start-timeout", 0, CLI_SECONDS, .at = AT(cfg.hang_start_ms, int64_t), .min = 1000,
     .max = 86400000LL * 7},
    {"--metrics-port", 0, CLI_INT, .at = AT(cfg.metrics_port, int), .min = 1, .max = 65535},
    {"--metrics-file", 0, CLI_STR, .at = AT(cfg.metrics_file, const char *), .what = "a path",
     .flags = CLI_NONEMPTY},
    {"--termination-log", 0, CLI_STR, .at = AT(cfg.termination_log, const char *), .what = "a path",
     .flags = CLI_NONEMPTY},
    {"--net", 0, CLI_CHOICE, .at = AT(cfg.net_auto, int), .choices = net_modes},
    {"--cpu-bind", 0, CLI_CHOICE, .at = AT(cpu_bind, int), .choices = cpu_modes},
    {"--sysfs-root", 0, CLI_STR, .at = AT(cfg.sysfs_root, const char *), .what = "a directory",
     .flags = CLI_NONEMPTY},
    {"--proc-root", 0, CLI_STR, .at = AT(cfg.proc_root, const char *), .what = "a directory",
     .flags = CLI_NONEMPTY},
    {"--dev-root", 0, CLI_STR, .at = AT(cfg.dev_root, const char *), .what = "a directory",
     .flags = CLI_NONEMPTY},
    {"--launcher-stdin", 0, CLI_FLAG, .at = AT(cfg.launcher_stdin, int)},
};

static const cli_cmd run_cmd = {"cohort run", run_usage, run_opts, BASE_ARRAY_LEN(run_opts),
                                CLI_COMMAND,  0};
static const cli_cmd torchrun_cmd = {
    "torchrun", torchrun_usage, run_opts, BASE_ARRAY_LEN(run_opts), CLI_COMMAND, 0};

/* Where the store is, as rdzv_where_resolve decides for every command; a usage error otherwise. */
static int store_where(const cli_cmd *cmd, const run_args *a, rdzv_where *w) {
  rdzv_where_in in = {.backend = (rdzv_backend_opt)a->backend,
                      .discover = (rdzv_method)a->method,
                      .master = a->cfg.rdzv.master,
                      .endpoint = a->endpoint,
                      .endpoint_dflt = "localhost",
                      .port0_ok = 1,
                      .conf = a->conf};
  char err[256];
  if (rdzv_where_resolve(&in, w, err, sizeof err) != 0)
    return cli_usage_error(cmd->prog, "%s", err);
  return CLI_OK;
}

/* --rdzv-endpoint as the store of a c10d job (or torchrun's static one); port 0 (a free one)
 * means this node alone. */
static int c10d_meaning(const cli_cmd *cmd, run_args *a) {
  rdzv_where w;
  int rc = store_where(cmd, a, &w);
  if (rc != CLI_OK) return rc;
  if (w.port0) {
    if (a->cfg.rdzv.nnodes_max > 1)
      return cli_usage_error(cmd->prog, "--rdzv-endpoint with port 0 is for one node only");
    return CLI_OK; /* one node: cohort's own store on a free port */
  }
  base_strlcpy(a->master_buf, w.master, sizeof a->master_buf);
  a->cfg.rdzv.master = a->master_buf;
  a->cfg.rdzv.method = RDZV_STATIC;
  /* The node that owns the address hosts (discover.c); is_host=true says so outright. */
  if (a->conf != NULL && a->conf->is_host == 1 && !a->node_rank_given) a->cfg.rdzv.node_rank = 0;
  return CLI_OK;
}

/* torchrun's static rendezvous: --master-addr:--master-port (or the endpoint) and the node rank. */
static int static_meaning(const cli_cmd *cmd, run_args *a) {
  int many = a->cfg.rdzv.nnodes_max > 1;
  if (!many && a->endpoint == NULL && a->master_addr == NULL && a->master_port < 0 &&
      !a->node_rank_given)
    return CLI_OK; /* one node: cohort's own store on a free port */
  if (a->endpoint != NULL) {
    rdzv_where w;
    int rc = store_where(cmd, a, &w);
    if (rc != CLI_OK) return rc;
    if (w.port0)
      return cli_usage_error(cmd->prog, "--rdzv-endpoint with port 0 is for --rdzv-backend c10d");
    base_strlcpy(a->master_buf, w.master, sizeof a->master_buf);
  } else {
    const char *addr = a->master_addr != NULL ? a->master_addr : "127.0.0.1";
    base_join_hostport(addr, a->master_port > 0 ? a->master_port : 29500, a->master_buf,
                       sizeof a->master_buf);
  }
  a->cfg.rdzv.master = a->master_buf;
  a->cfg.rdzv.method = RDZV_STATIC;
  if (!a->node_rank_given) a->cfg.rdzv.node_rank = 0; /* torchrun's default */
  return CLI_OK;
}

/* Whether any local rank's stream goes to a file under -r/-t. */
static int std_files(const agent_std *s) {
  int any = s->all;
  for (int i = 0; i < s->n; i++) any |= s->v[i];
  return any != 0;
}

/*
 * Where the output goes. cohort's own: --log-dir alone sends everything to
 * the files only. torchrun's -r/-t without --log-dir: see make_log_dir.
 */
static int output_meaning(run_args *a) {
  if (!a->std_given && a->cfg.log_dir != NULL) a->cfg.redirects.all = 3;
  return CLI_OK;
}

/*
 * torchrun's -r/-t that send a stream to files, or its duplicate filters, without --log-dir: a new
 * directory under $TMPDIR, as torchrun's, named on stderr. Not in the parse,
 * which creates nothing.
 */
static int make_log_dir(const char *prog, agent_config *cfg) {
  int filtered = cfg->dup[0].n > 0 || cfg->dup[1].n > 0;
  if (cfg->log_dir != NULL || (!std_files(&cfg->redirects) && !std_files(&cfg->tee) && !filtered))
    return 0;
  static char dir[4096];
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/cohort-logs-XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
  if (mkdtemp(dir) == NULL)
    return cli_error(prog, 1, "cannot make a log directory %s: %s", dir, strerror(errno));
  fprintf(stderr, "%s: worker output files in %s (no --log-dir given)\n", prog, dir);
  cfg->log_dir = dir;
  return 0;
}

/*
 * Whether cohort's own options already say how to find the store (--master,
 * --rdzv-file, --discover): then a --node-rank alone keeps cohort's meaning
 * instead of torchrun's static default of 127.0.0.1:29500.
 */
static int cohort_discovery(const run_args *a) {
  return a->cfg.rdzv.master != NULL || a->cfg.rdzv.rdzv_file != NULL || a->method != RDZV_AUTO;
}

/*
 * torchrun's --rdzv-backend etcd (and cohort's --discover etcd): the
 * endpoints from --rdzv-endpoint (or --master), TLS and credentials from
 * --rdzv-conf; --nnodes defaults to 1 as in torchrun.
 */
static int etcd_meaning(const cli_cmd *cmd, run_args *a) {
  static rdzv_where w;
  static char password[STORE_TOKEN_MAX + 2];
  int rc = store_where(cmd, a, &w);
  if (rc != CLI_OK) return rc;
  a->cfg.rdzv.master = w.master;
  a->cfg.rdzv.method = RDZV_ETCD;
  a->cfg.etcd = w.etcd;
  if (a->conf != NULL && a->conf->password_file != NULL) {
    rc = cmd_secret_file(cmd->prog, "password", a->conf->password_file, password, sizeof password);
    if (rc != CLI_OK) return rc;
    a->cfg.etcd.password = password;
  }
  if (!a->nnodes_given) a->cfg.rdzv.nnodes_min = a->cfg.rdzv.nnodes_max = 1;
  return output_meaning(a);
}

/* Turns torchrun's options into the agent's configuration. */
static int torchrun_meaning(const cli_cmd *cmd, run_args *a) {
  if (!a->standalone && (a->backend == RDZV_BACKEND_ETCD || a->method == RDZV_ETCD))
    return etcd_meaning(cmd, a);
  if (a->endpoint != NULL && strchr(a->endpoint, ',') != NULL)
    return cli_usage_error(cmd->prog, "a list of endpoints is for --rdzv-backend etcd");
  if (a->standalone) {
    /* torchrun: a private store on a free port; the --rdzv-* options are ignored. */
    a->cfg.rdzv.nnodes_min = a->cfg.rdzv.nnodes_max = 0;
    a->nnodes_given = 0;
  } else if (a->backend == RDZV_BACKEND_C10D || a->endpoint != NULL || a->master_addr != NULL ||
             a->master_port >= 0 || (a->node_rank_given && !cohort_discovery(a))) {
    /* torchrun's line: --nnodes defaults to 1. */
    if (!a->nnodes_given) a->cfg.rdzv.nnodes_min = a->cfg.rdzv.nnodes_max = 1;
    int rc = a->backend == RDZV_BACKEND_C10D ? c10d_meaning(cmd, a) : static_meaning(cmd, a);
    if (rc != CLI_OK) return rc;
  } else if (a->nnodes_given && a->cfg.rdzv.nnodes_max > 1 && a->cfg.rdzv.master == NULL &&
             a->method == RDZV_AUTO && cmd == &torchrun_cmd) {
    return static_meaning(cmd, a); /* torchrun --nnodes 2: master 127.0.0.1:29500 */
  }
  /* One node and no store named: cohort's single-node job (the agent's choice for no --nnodes). */
  if (a->cfg.rdzv.nnodes_max == 1 && a->cfg.rdzv.master == NULL && a->method == RDZV_AUTO &&
      a->cfg.rdzv.rdzv_file == NULL)
    a->cfg.rdzv.nnodes_min = a->cfg.rdzv.nnodes_max = 0;
  return output_meaning(a);
}

/* --numa-binding and --cpu-bind: one binding at most. */
static int binding_meaning(const cli_cmd *cmd, run_args *a) {
  if (a->numa_binding != AGENT_BIND_NONE && a->cpu_bind != AGENT_BIND_NONE)
    return cli_usage_error(cmd->prog, "give --numa-binding or --cpu-bind, not both");
  a->cfg.bind = (agent_bind)(a->numa_binding != AGENT_BIND_NONE ? a->numa_binding : a->cpu_bind);
  return CLI_OK;
}

/* Checks across options, once all are known. */
static int check_combination(const cli_cmd *cmd, agent_config *cfg) {
  const char *prog = cmd->prog;
  if (cfg->rdzv.method == RDZV_FILE && cfg->rdzv.rdzv_file == NULL)
    return cli_usage_error(prog, "--discover file needs --rdzv-file PATH");
  if (cfg->rdzv.rdzv_file != NULL && cfg->rdzv.method == RDZV_AUTO) cfg->rdzv.method = RDZV_FILE;
  if (cfg->rdzv.method == RDZV_MCAST && cfg->run_id == NULL)
    return cli_usage_error(prog, "--discover mcast needs --job ID (the same on every node)");
  if (cfg->rdzv.node_rank >= 0 && cfg->rdzv.nnodes_max > 0 &&
      cfg->rdzv.node_rank >= cfg->rdzv.nnodes_max)
    return cli_usage_error(prog, "--node-rank must be below --nnodes");
  if (cfg->token != NULL && (cfg->token[0] == '\0' || strlen(cfg->token) > 256))
    return cli_usage_error(prog, "the job token must have 1 to 256 characters");
  return CLI_OK;
}

/*
 * The token from --token-file (or COHORT_TOKEN_FILE) when no --token was
 * given. The token outlives the parse: it is kept in static storage.
 */
static int load_token_file(const cli_cmd *cmd, run_args *a) {
  static char token[STORE_TOKEN_MAX + 2];
  const char *prog = cmd->prog, *f = a->token_file;
  if (f == NULL) return CLI_OK;
  if (a->cfg.token != NULL) return cli_usage_error(prog, "give --token or --token-file, not both");
  int rc = cmd_token_file(prog, f, token, sizeof token);
  if (rc != CLI_OK) return rc;
  a->cfg.token = token;
  return CLI_OK;
}

/* COHORT_REQUIRE_TOKEN: 1 requires a token as --require-token does, 0 or empty not. */
static int require_token_env(const cli_cmd *cmd, agent_config *cfg) {
  const char *v = getenv("COHORT_REQUIRE_TOKEN");
  if (v == NULL || v[0] == '\0' || strcmp(v, "0") == 0) return CLI_OK;
  if (strcmp(v, "1") != 0)
    return cli_usage_error(cmd->prog, "COHORT_REQUIRE_TOKEN must be 1 or 0, not '%s'", v);
  cfg->require_token = 1;
  return CLI_OK;
}

/*
 * The worker command: after "--" (cohort's form, not under the name torchrun)
 * the words themselves; else torchrun's: the script through Python
 * ($PYTHON_EXEC, else python3), -m a module, --run-path through runpy,
 * --no-python the program itself. The array lives until the next call.
 */
static int program(const cli_cmd *cmd, const run_args *a, const cli_args *words,
                   char *const **out) {
  static char **built;
  static char run_path_code[] =
      "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], "
      "run_name='__main__')";
  if (a->module && a->no_python && !a->run_path)
    return cli_usage_error(cmd->prog, "--module and --no-python exclude each other");
  if ((words->dashdash && cmd == &run_cmd) || (a->no_python && !a->run_path)) {
    *out = words->argv;
    return CLI_OK;
  }
  char **v = realloc(built, sizeof *v * ((size_t)words->argc + 5));
  if (v == NULL) return cli_error(cmd->prog, AGENT_EXIT_INTERNAL, "out of memory");
  built = v;
  const char *py = getenv("PYTHON_EXEC");
  int n = 0;
  v[n++] = (char *)(py != NULL && py[0] != '\0' ? py : "python3");
  v[n++] = (char *)"-u";
  if (a->run_path) {
    v[n++] = (char *)"-c";
    v[n++] = run_path_code;
  } else if (a->module) {
    v[n++] = (char *)"-m";
  }
  for (int i = 0; i < words->argc; i++) v[n++] = words->argv[i];
  v[n] = NULL;
  *out = v;
  return CLI_OK;
}

static int parse(const cli_cmd *cmd, int argc, char **argv, agent_config *out) {
  run_args a = {
      .cfg =
          {
              .nproc = 1,
              .grace_ms = 5000,
              .role = "default",
              .rdzv = {.node_rank = -1, .settle_ms = 1000},
              .join_timeout_ms = 300000,
              .last_call_ms = 3000,
              .lost_after_ms = 5000,
              .reform_timeout_ms = 60000,
              .straggler_factor = 1.5,
              .net_auto = 1,
              .termination_log = "/dev/termination-log",
          },
      .method = RDZV_AUTO,
      .master_port = -1,
  };
  cli_args words;
  int rc = cli_parse(cmd, argc, argv, &a, &words);
  if (rc != CLI_OK) return rc;
  a.cfg.rdzv.method = (rdzv_method)a.method;
  rc = torchrun_meaning(cmd, &a);
  if (rc == CLI_OK) rc = binding_meaning(cmd, &a);
  if (rc != CLI_OK) return rc;
  /* A node is lost after five missed heartbeats, and heartbeats come at least twice a second. */
  a.cfg.heartbeat_ms = a.cfg.lost_after_ms / 5 < 500 ? a.cfg.lost_after_ms / 5 : 500;
  if ((rc = load_token_file(cmd, &a)) != CLI_OK || (rc = require_token_env(cmd, &a.cfg)) != CLI_OK)
    return rc;
  rc = check_combination(cmd, &a.cfg);
  if (rc != CLI_OK) return rc;
  rc = program(cmd, &a, &words, &a.cfg.argv);
  if (rc != CLI_OK) return rc;
  *out = a.cfg;
  /* The master address lives in run_args: keep it with the configuration. */
  if (a.cfg.rdzv.master == a.master_buf) {
    static char master[sizeof a.master_buf];
    memcpy(master, a.master_buf, sizeof master);
    out->rdzv.master = master;
  }
  return CLI_OK;
}

int cmd_run_parse(int argc, char **argv, agent_config *out) {
  return parse(&run_cmd, argc, argv, out);
}

int cmd_torchrun_parse(int argc, char **argv, agent_config *out) {
  return parse(&torchrun_cmd, argc, argv, out);
}

/*
 * `cohort launch`'s handshake (docs/launch.md). With --launcher-stdin among
 * the options, the first line on stdout is this version, written before
 * anything is parsed, so that options another version would refuse cannot
 * hide the answer; keep it so in every version.
 */
static void launcher_answer(int argc, char **argv) {
  for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
    if (strcmp(argv[i], "--launcher-stdin") == 0) {
      printf("cohort %s\n", COHORT_VERSION_STRING);
      fflush(stdout);
      return;
    }
}

/* Then the token, the launcher's go-ahead, on stdin; without it nothing starts. */
static int launcher_token(const cli_cmd *cmd, agent_config *cfg) {
  static char token[STORE_TOKEN_MAX + 2];
  int rc = agent_launcher_read_token(0, token, sizeof token);
  if (rc == -ENODATA) {
    fprintf(stderr, "cohort: the launcher's connection ended before the job started; nothing "
                    "was started\n");
    return 128 + SIGHUP;
  }
  if (rc != 0)
    return cli_usage_error(cmd->prog,
                           "--launcher-stdin: the first line of standard input must "
                           "be the job's token (1 to %d characters)",
                           STORE_TOKEN_MAX);
  cfg->token = token;
  return CLI_OK;
}

static int run_with(const cli_cmd *cmd, int argc, char **argv) {
  agent_config cfg;
  launcher_answer(argc, argv);
  int rc = parse(cmd, argc, argv, &cfg);
  if (rc == CLI_HELP) return 0;
  if (rc != CLI_OK) return rc;
  if (cfg.launcher_stdin && (rc = launcher_token(cmd, &cfg)) != CLI_OK) return rc;
  if ((rc = make_log_dir(cmd->prog, &cfg)) != 0) return rc;
  return agent_run(&cfg);
}

int cmd_run(int argc, char **argv) {
  return run_with(&run_cmd, argc, argv);
}

int cmd_torchrun(int argc, char **argv) {
  return run_with(&torchrun_cmd, argc, argv);
}

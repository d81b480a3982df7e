/* cmd_run.c - `cohort run`: argument parsing for the node agent. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "base/base.h"
#include "base/net.h"
#include "store/auth.h"
#include "store/store.h"
#include "tools/cli.h"
#include "tools/cohort/cmd.h"
#include "tools/cohort/cmd_run.h"

static const char run_usage[] =
    "usage: cohort run [options] -- CMD [ARGS...]\n"
    "\n"
    "Starts one worker per slot on this node with the environment torchrun gives\n"
    "(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), relays their\n"
    "output with a rank prefix, and stops them all when one fails.\n"
    "\n"
    "options:\n"
    "  --nproc-per-node N   workers on this node (default 1, at most 1024)\n"
    "  --max-restarts K     restart the whole group up to K times after a failure (default 0)\n"
    "  --log-dir DIR        also write DIR/attempt<K>/rank<R>.log per worker; the console\n"
    "                       then gets the output only with --tee\n"
    "  --tee                with --log-dir, relay the output to the console as well\n"
    "  --grace SECONDS      time between SIGTERM and SIGKILL when stopping (default 5)\n"
    "  --run-id ID          job id, [A-Za-z0-9._-]{1,64} (default: random on one node;\n"
    "                       on several, derived from the store address)\n"
    "  --role NAME          ROLE_NAME of the workers (default \"default\")\n"
    "  --token SECRET       job token (default: $COHORT_TOKEN, else random); with it every\n"
    "                       store connection and multicast datagram is authenticated\n"
    "  --token-file FILE    read the token from FILE (default: $COHORT_TOKEN_FILE), which\n"
    "                       only its owner may read; unlike --token, not shown by ps\n"
    "  --require-token      refuse to run a multi-node job without a token (also\n"
    "                       COHORT_REQUIRE_TOKEN=1) instead of warning\n"
    "\n"
    "multi-node (run one agent per node):\n"
    "  --nnodes N|MIN:MAX   number of nodes (elastic range: start with MIN, wait --last-call\n"
    "                       seconds for more up to MAX)\n"
    "  --node-rank R        this node's rank (default: the scheduler's index, else join order)\n"
    "  --master HOST:PORT   node 0's agent (a DNS name may resolve late; retried until\n"
    "                       --join-timeout); node 0 hosts the rendezvous store on PORT\n"
    "  --discover METHOD    auto (default: scheduler environment, else --master), static,\n"
    "                       mcast (UDP multicast, needs --job), file (needs --rdzv-file), env\n"
    "  --job ID             job id (same as --run-id; separates concurrent jobs)\n"
    "  --iface NAME         interface for multicast (default: the default route's)\n"
    "  --mcast-group A:P    multicast group and port (default: derived from the job id)\n"
    "  --rdzv-file PATH     rendezvous file on a shared filesystem\n"
    "  --join-timeout SEC   give up the rendezvous after SEC seconds (default 300)\n"
    "  --last-call SEC      elastic: extra wait for nodes beyond MIN (default 3)\n"
    "  --heartbeat-timeout SEC  a node silent this long is lost (default 5)\n"
    "  --net auto|off       add the NCCL/UCX/Gloo settings `cohort doctor` derives for this\n"
    "                       node (never overriding what you set; default auto)\n"
    "  -h, --help           this text\n"
    "\n"
    "exit status: 0 every worker succeeded; 1 a worker failed (a report names it);\n"
    "2 usage error; 3 internal error; 126 command not executable; 127 command not\n"
    "found; 128+N stopped by signal N.\n";

/*
 * The settings the table fills: the agent's configuration, and the choices
 * that are enums there (an int here, converted after parsing).
 */
typedef struct run_args {
  agent_config cfg;
  int method;
  const char *token_file;
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
  return 0;
}

static int set_master(void *settings, const char *v) {
  char host[BASE_HOST_MAX];
  int port;
  if (base_split_hostport(v, host, sizeof host, &port, 0) != 0 || host[0] == '\0') return -1;
  ((run_args *)settings)->cfg.rdzv.master = v;
  return 0;
}

static int set_mcast_group(void *settings, const char *v) {
  char host[BASE_HOST_MAX];
  int port;
  if (base_split_hostport(v, host, sizeof host, &port, 0) != 0) return -1;
  ((run_args *)settings)->cfg.rdzv.mcast_group = v;
  return 0;
}

/* --run-id and --job: one id under two names. */
static int set_run_id(void *settings, const char *v) {
  if (!agent_run_id_valid(v)) return -1;
  ((run_args *)settings)->cfg.run_id = v;
  return 0;
}

static int set_iface(void *settings, const char *v) {
  if (v[0] == '\0' || strlen(v) >= 16) return -1;
  ((run_args *)settings)->cfg.rdzv.iface = v;
  return 0;
}

static const cli_choice discover_methods[] = {{"auto", RDZV_AUTO},
                                              {"static", RDZV_STATIC},
                                              {"dns", RDZV_STATIC},
                                              {"mcast", RDZV_MCAST},
                                              {"file", RDZV_FILE},
                                              {"env", RDZV_ENV},
                                              {NULL, 0}};
static const cli_choice net_modes[] = {{"auto", 1}, {"off", 0}, {NULL, 0}};

#define RUN_ID_WHAT "1 to 64 characters of [A-Za-z0-9._-]"

static const cli_opt run_opts[] = {
    {"--help", 'h', .kind = CLI_HELP_OPT},
    {"--nproc-per-node|--nproc_per_node", 0, CLI_INT, .at = AT(cfg.nproc, int), .min = 1,
     .max = AGENT_MAX_NPROC},
    {"--max-restarts|--max_restarts", 0, CLI_INT, .at = AT(cfg.max_restarts, int), .min = 0,
     .max = 1000000},
    {"--log-dir|--log_dir", 0, CLI_STR, .at = AT(cfg.log_dir, const char *), .what = "a directory",
     .flags = CLI_NONEMPTY},
    {"--tee", 0, CLI_FLAG, .at = AT(cfg.tee, int)},
    {"--grace", 0, CLI_SECONDS, .at = AT(cfg.grace_ms, int64_t), .min = 0, .max = 3600000},
    {"--run-id|--run_id", 0, CLI_CUSTOM, .fn = set_run_id, .what = RUN_ID_WHAT},
    {"--role", 0, CLI_STR, .at = AT(cfg.role, const char *), .what = "a name",
     .flags = CLI_NONEMPTY},
    {"--token", 0, CLI_STR, .at = AT(cfg.token, const char *), .env = "COHORT_TOKEN"},
    {"--token-file", 0, CLI_STR, .at = AT(token_file, const char *), .what = "a file",
     .env = "COHORT_TOKEN_FILE", .flags = CLI_NONEMPTY},
    {"--require-token", 0, CLI_FLAG, .at = AT(cfg.require_token, int)},
    {"--nnodes", 0, CLI_CUSTOM, .fn = set_nnodes,
     .what = "N or MIN:MAX with 1 <= MIN <= MAX <= 4096"},
    {"--node-rank|--node_rank", 0, CLI_INT, .at = AT(cfg.rdzv.node_rank, int), .min = 0,
     .max = 4095},
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
    {"--net", 0, CLI_CHOICE, .at = AT(cfg.net_auto, int), .choices = net_modes},
};

static const cli_cmd run_cmd = {"cohort run",       run_usage, run_opts, BASE_ARRAY_LEN(run_opts),
                                CLI_AFTER_DASHDASH, 0};

/* Checks across options, once all are known. */
static int check_combination(agent_config *cfg) {
  const char *prog = run_cmd.prog;
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
static int load_token_file(run_args *a) {
  static char token[STORE_TOKEN_MAX + 2];
  const char *prog = run_cmd.prog, *f = a->token_file;
  if (f == NULL) return CLI_OK;
  if (a->cfg.token != NULL) return cli_usage_error(prog, "give --token or --token-file, not both");
  int rc = store_token_read_file(f, token, sizeof token);
  if (rc == -EPERM)
    return cli_usage_error(prog,
                           "token file %s may be read by others (or is not a regular file): "
                           "run chmod 600 %s",
                           f, f);
  if (rc == -E2BIG || rc == -ENODATA)
    return cli_usage_error(prog, "token file %s: %s", f,
                           rc == -E2BIG ? "the token is longer than 256 bytes"
                                        : "no token on its first line");
  if (rc != 0) return cli_usage_error(prog, "cannot read token file %s: %s", f, strerror(-rc));
  a->cfg.token = token;
  return CLI_OK;
}

/* COHORT_REQUIRE_TOKEN: 1 requires a token as --require-token does, 0 or empty not. */
static int require_token_env(agent_config *cfg) {
  const char *v = getenv("COHORT_REQUIRE_TOKEN");
  if (v == NULL || v[0] == '\0' || strcmp(v, "0") == 0) return CLI_OK;
  if (strcmp(v, "1") != 0)
    return cli_usage_error(run_cmd.prog, "COHORT_REQUIRE_TOKEN must be 1 or 0, not '%s'", v);
  cfg->require_token = 1;
  return CLI_OK;
}

int cmd_run_parse(int argc, char **argv, agent_config *out) {
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
              .net_auto = 1,
          },
      .method = RDZV_AUTO,
  };
  cli_args command;
  int rc = cli_parse(&run_cmd, argc, argv, &a, &command);
  if (rc != CLI_OK) return rc;
  a.cfg.rdzv.method = (rdzv_method)a.method;
  /* A node is lost after five missed heartbeats, and heartbeats come at least twice a second. */
  a.cfg.heartbeat_ms = a.cfg.lost_after_ms / 5 < 500 ? a.cfg.lost_after_ms / 5 : 500;
  if ((rc = load_token_file(&a)) != CLI_OK || (rc = require_token_env(&a.cfg)) != CLI_OK) return rc;
  rc = check_combination(&a.cfg);
  if (rc != CLI_OK) return rc;
  a.cfg.argv = command.argv;
  *out = a.cfg;
  return CLI_OK;
}

int cmd_run(int argc, char **argv) {
  agent_config cfg;
  int rc = cmd_run_parse(argc, argv, &cfg);
  if (rc == CLI_HELP) return 0;
  if (rc != CLI_OK) return rc;
  return agent_run(&cfg);
}

/* cmd_run.c - `cohort run`: argument parsing for the node agent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "base/base.h"
#include "base/net.h"
#include "tools/cohort/cmd.h"

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

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "cohort run: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "; see 'cohort run --help'\n");
  return AGENT_EXIT_USAGE;
}

/* Accepts both --flag VALUE and --flag=VALUE, and torchrun's underscores. */
static int match(const char *arg, const char *name, const char *alt, const char **inline_val) {
  const char *names[2] = {name, alt};
  for (int i = 0; i < 2; i++) {
    if (names[i] == NULL) continue;
    size_t n = strlen(names[i]);
    if (strncmp(arg, names[i], n) == 0) {
      if (arg[n] == '\0') {
        *inline_val = NULL;
        return 1;
      }
      if (arg[n] == '=') {
        *inline_val = arg + n + 1;
        return 1;
      }
    }
  }
  return 0;
}

/*
 * Parses `cohort run`'s arguments into *out. Returns 0 when the job should
 * start, 1 when --help was printed, or AGENT_EXIT_USAGE after printing a
 * one-line error. Starts nothing (fuzz/fuzz_cli.c runs it on random argv).
 */
int cmd_run_parse(int argc, char **argv, agent_config *out);
int cmd_run_parse(int argc, char **argv, agent_config *out) {
  agent_config cfg = {
      .nproc = 1,
      .max_restarts = 0,
      .log_dir = NULL,
      .tee = 0,
      .grace_ms = 5000,
      .run_id = NULL,
      .role = "default",
      .argv = NULL,
      .token = getenv("COHORT_TOKEN"),
      .rdzv = {.method = RDZV_AUTO, .node_rank = -1, .settle_ms = 1000},
      .join_timeout_ms = 300000,
      .last_call_ms = 3000,
      .heartbeat_ms = 500,
      .lost_after_ms = 5000,
      .net_auto = 1,
  };
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    const char *v = NULL;
    if (strcmp(a, "--") == 0) break;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      fputs(run_usage, stdout);
      return 1;
    }
    if (strcmp(a, "--tee") == 0) {
      cfg.tee = 1;
      continue;
    }
#define TAKE_VALUE()                                                                               \
  do {                                                                                             \
    if (v == NULL) {                                                                               \
      if (i + 1 >= argc) return usage_error("option %s needs a value", a);                         \
      v = argv[++i];                                                                               \
    }                                                                                              \
  } while (0)
    if (match(a, "--nproc-per-node", "--nproc_per_node", &v)) {
      TAKE_VALUE();
      if (base_parse_int(v, 1, AGENT_MAX_NPROC, &cfg.nproc) != 0)
        return usage_error("--nproc-per-node takes a whole number from 1 to 1024, not '%s'", v);
    } else if (match(a, "--max-restarts", "--max_restarts", &v)) {
      TAKE_VALUE();
      if (base_parse_int(v, 0, 1000000, &cfg.max_restarts) != 0)
        return usage_error("--max-restarts takes a whole number from 0 to 1000000, not '%s'", v);
    } else if (match(a, "--log-dir", "--log_dir", &v)) {
      TAKE_VALUE();
      if (v[0] == '\0') return usage_error("--log-dir needs a directory%s", "");
      cfg.log_dir = v;
    } else if (match(a, "--grace", NULL, &v)) {
      TAKE_VALUE();
      if (base_parse_seconds(v, 3600, &cfg.grace_ms) != 0)
        return usage_error("--grace takes seconds from 0 to 3600, not '%s'", v);
    } else if (match(a, "--run-id", "--run_id", &v)) {
      TAKE_VALUE();
      if (!agent_run_id_valid(v))
        return usage_error("--run-id takes 1 to 64 characters of [A-Za-z0-9._-], not '%s'", v);
      cfg.run_id = v;
    } else if (match(a, "--role", NULL, &v)) {
      TAKE_VALUE();
      if (v[0] == '\0') return usage_error("--role needs a name%s", "");
      cfg.role = v;
    } else if (match(a, "--token", NULL, &v)) {
      TAKE_VALUE();
      cfg.token = v;
    } else if (match(a, "--nnodes", NULL, &v)) {
      TAKE_VALUE();
      const char *colon = strchr(v, ':');
      int lo, hi;
      if (colon == NULL) {
        if (base_parse_int(v, 1, 4096, &lo) != 0)
          return usage_error("--nnodes takes N or MIN:MAX with 1 <= MIN <= MAX <= 4096, not '%s'",
                             v);
        hi = lo;
      } else {
        char minbuf[16];
        size_t ml = (size_t)(colon - v);
        if (ml == 0 || ml >= sizeof minbuf)
          return usage_error("--nnodes takes N or MIN:MAX with 1 <= MIN <= MAX <= 4096, not '%s'",
                             v);
        memcpy(minbuf, v, ml);
        minbuf[ml] = '\0';
        if (base_parse_int(minbuf, 1, 4096, &lo) != 0 ||
            base_parse_int(colon + 1, 1, 4096, &hi) != 0 || hi < lo)
          return usage_error("--nnodes takes N or MIN:MAX with 1 <= MIN <= MAX <= 4096, not '%s'",
                             v);
      }
      cfg.rdzv.nnodes_min = lo;
      cfg.rdzv.nnodes_max = hi;
    } else if (match(a, "--node-rank", "--node_rank", &v)) {
      TAKE_VALUE();
      if (base_parse_int(v, 0, 4095, &cfg.rdzv.node_rank) != 0)
        return usage_error("--node-rank takes a whole number from 0 to 4095, not '%s'", v);
    } else if (match(a, "--master", NULL, &v)) {
      TAKE_VALUE();
      char host[BASE_HOST_MAX];
      int port;
      if (base_split_hostport(v, host, sizeof host, &port, 0) != 0 || host[0] == '\0')
        return usage_error("--master takes HOST:PORT (IPv6 as [ADDR]:PORT), not '%s'", v);
      cfg.rdzv.master = v;
    } else if (match(a, "--discover", NULL, &v)) {
      TAKE_VALUE();
      if (strcmp(v, "auto") == 0)
        cfg.rdzv.method = RDZV_AUTO;
      else if (strcmp(v, "static") == 0 || strcmp(v, "dns") == 0)
        cfg.rdzv.method = RDZV_STATIC;
      else if (strcmp(v, "mcast") == 0)
        cfg.rdzv.method = RDZV_MCAST;
      else if (strcmp(v, "file") == 0)
        cfg.rdzv.method = RDZV_FILE;
      else if (strcmp(v, "env") == 0)
        cfg.rdzv.method = RDZV_ENV;
      else
        return usage_error("--discover takes auto, static, dns, mcast, file or env, not '%s'", v);
    } else if (match(a, "--job", NULL, &v)) {
      TAKE_VALUE();
      if (!agent_run_id_valid(v))
        return usage_error("--job takes 1 to 64 characters of [A-Za-z0-9._-], not '%s'", v);
      cfg.run_id = v;
    } else if (match(a, "--iface", NULL, &v)) {
      TAKE_VALUE();
      if (v[0] == '\0' || strlen(v) >= 16)
        return usage_error("--iface takes an interface name, not '%s'", v);
      cfg.rdzv.iface = v;
    } else if (match(a, "--mcast-group", NULL, &v)) {
      TAKE_VALUE();
      char host[BASE_HOST_MAX];
      int port;
      if (base_split_hostport(v, host, sizeof host, &port, 0) != 0)
        return usage_error("--mcast-group takes ADDR:PORT, not '%s'", v);
      cfg.rdzv.mcast_group = v;
    } else if (match(a, "--rdzv-file", NULL, &v)) {
      TAKE_VALUE();
      if (v[0] == '\0') return usage_error("--rdzv-file needs a path%s", "");
      cfg.rdzv.rdzv_file = v;
    } else if (match(a, "--join-timeout", NULL, &v)) {
      TAKE_VALUE();
      if (base_parse_seconds(v, 86400, &cfg.join_timeout_ms) != 0 || cfg.join_timeout_ms <= 0)
        return usage_error("--join-timeout takes seconds from 0 to 86400, not '%s'", v);
    } else if (match(a, "--last-call", NULL, &v)) {
      TAKE_VALUE();
      if (base_parse_seconds(v, 3600, &cfg.last_call_ms) != 0)
        return usage_error("--last-call takes seconds from 0 to 3600, not '%s'", v);
    } else if (match(a, "--heartbeat-timeout", NULL, &v)) {
      TAKE_VALUE();
      if (base_parse_seconds(v, 3600, &cfg.lost_after_ms) != 0 || cfg.lost_after_ms < 500)
        return usage_error("--heartbeat-timeout takes seconds from 0.5 to 3600, not '%s'", v);
      cfg.heartbeat_ms = cfg.lost_after_ms / 5 < 500 ? cfg.lost_after_ms / 5 : 500;
    } else if (match(a, "--net", NULL, &v)) {
      TAKE_VALUE();
      if (strcmp(v, "auto") == 0)
        cfg.net_auto = 1;
      else if (strcmp(v, "off") == 0)
        cfg.net_auto = 0;
      else
        return usage_error("--net takes auto or off, not '%s'", v);
    } else if (a[0] != '-') {
      return usage_error("missing '--' before the command '%s'", a);
    } else {
      return usage_error("unknown option '%s'", a);
    }
#undef TAKE_VALUE
  }
  if (i >= argc) return usage_error("missing '--' before the command%s", "");
  if (i + 1 >= argc) return usage_error("no command after '--'%s", "");
  if (cfg.rdzv.method == RDZV_FILE && cfg.rdzv.rdzv_file == NULL)
    return usage_error("--discover file needs --rdzv-file PATH%s", "");
  if (cfg.rdzv.rdzv_file != NULL && cfg.rdzv.method == RDZV_AUTO) cfg.rdzv.method = RDZV_FILE;
  if (cfg.rdzv.method == RDZV_MCAST && cfg.run_id == NULL)
    return usage_error("--discover mcast needs --job ID (the same on every node)%s", "");
  if (cfg.rdzv.node_rank >= 0 && cfg.rdzv.nnodes_max > 0 &&
      cfg.rdzv.node_rank >= cfg.rdzv.nnodes_max)
    return usage_error("--node-rank must be below --nnodes%s", "");
  if (cfg.token != NULL && (cfg.token[0] == '\0' || strlen(cfg.token) > 256))
    return usage_error("the job token must have 1 to 256 characters%s", "");
  cfg.argv = argv + i + 1;
  *out = cfg;
  return 0;
}

int cmd_run(int argc, char **argv) {
  agent_config cfg;
  int rc = cmd_run_parse(argc, argv, &cfg);
  if (rc == 1) return 0;
  if (rc != 0) return rc;
  return agent_run(&cfg);
}

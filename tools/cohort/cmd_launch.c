/*
 * cmd_launch.c - `cohort launch`: argument parsing for a job started over
 * ssh (src/launch does the work). Options of its own go through its table;
 * every other option before "--" is `cohort run`'s, checked here with run's
 * own parser and passed to every agent unchanged.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "agent/agent.h"
#include "base/base.h"
#include "base/net.h"
#include "cohort/cohort.h"
#include "launch/launch.h"
#include "tools/cli.h"
#include "tools/cohort/cmd.h"
#include "tools/cohort/cmd_run.h"

static const char launch_usage[] =
    "usage: cohort launch (--hosts H1[:SLOTS],H2... | --hostfile FILE) [options]\n"
    "                     [cohort run options] -- CMD [ARGS...]\n"
    "\n"
    "Starts one `cohort run` agent per host over ssh: node 0 is the first host and\n"
    "hosts the rendezvous store. Every host's output comes to this terminal with\n"
    "its rank prefixes, the job's root cause is printed once, and the exit status\n"
    "is the job's. Ctrl-C or SIGTERM stops the job on every host; an agent whose\n"
    "ssh connection drops stops its workers and fails the job. Before anything\n"
    "starts, every host must answer over ssh and run this cohort version: one ssh\n"
    "session per host does both.\n"
    "\n"
    "options:\n"
    "  --hosts LIST         H1[:SLOTS],H2,... ([user@]host, as mpirun --host)\n"
    "  --hostfile FILE      one host per line, 'HOST [slots=N]', '#' comments (the\n"
    "                       format of mpirun and DeepSpeed)\n"
    "  --include LIST       only these hosts of the list (comma-separated names)\n"
    "  --exclude LIST       all hosts of the list but these\n"
    "  --nproc-per-node N   workers on every host (default: each host's slots, else 1)\n"
    "  --master HOST:PORT   node 0's store as the other hosts reach it (default: the\n"
    "                       first host's name, port 29400)\n"
    "  --job ID             job id, [A-Za-z0-9._-]{1,64} (default: random)\n"
    "  --ssh-opts \"OPTS\"    options for every ssh, split at blanks (e.g. \"-p 2222\n"
    "                       -F cluster_ssh_config\"); ssh always runs with BatchMode=yes\n"
    "  --connect-timeout SEC  ssh's ConnectTimeout (default 10); every host gets that\n"
    "                       plus 20 s to answer with its version\n"
    "  --fanout N           ssh connections being made at once (default 32): more\n"
    "                       hosts are connected to as the first ones answer\n"
    "  --ssh-self           reach this machine over ssh too when it is in the list (by\n"
    "                       default its agent runs here without ssh, as mpirun does)\n"
    "  --cohort PATH        cohort on the hosts (default: this binary's absolute path)\n"
    "  -h, --help           this text\n"
    "\n"
    "Other options before '--' are `cohort run`'s (see 'cohort run --help') and go to\n"
    "every agent; launch sets --nnodes, --node-rank, --master, --job and the token\n"
    "itself (the token travels over ssh's standard input, never a command line).\n"
    "The hosts' login shell must be a POSIX one (sh, bash, zsh).\n"
    "\n"
    "exit status: 0 every worker succeeded; 1 the job failed (a report names the\n"
    "cause), or a host failed the version check and nothing was started; 2 usage\n"
    "error; 3 internal error; 128+N stopped by signal N; otherwise the failing\n"
    "agent's `cohort run` status.\n";

typedef struct launch_args {
  const char *hosts, *hostfile, *include, *exclude, *ssh_opts, *cohort, *master, *job;
  int nproc, fanout, ssh_self;
  int64_t connect_timeout_ms;
} launch_args;

#define AT(FIELD, CTYPE) CLI_AT(launch_args, FIELD, CTYPE)

static int set_master(void *settings, const char *v) {
  char host[BASE_HOST_MAX];
  int port;
  if (base_split_hostport(v, host, sizeof host, &port, 0) != 0 || host[0] == '\0') return -1;
  ((launch_args *)settings)->master = v;
  return 0;
}

static int set_job(void *settings, const char *v) {
  if (!rdzv_job_id_valid(v)) return -1;
  ((launch_args *)settings)->job = v;
  return 0;
}

static const cli_opt launch_opts[] = {
    {"--help", 'h', .kind = CLI_HELP_OPT},
    {"--hosts", 0, CLI_STR, .at = AT(hosts, const char *), .flags = CLI_NONEMPTY},
    {"--hostfile", 0, CLI_STR, .at = AT(hostfile, const char *), .what = "a file",
     .flags = CLI_NONEMPTY},
    {"--include", 0, CLI_STR, .at = AT(include, const char *), .flags = CLI_NONEMPTY},
    {"--exclude", 0, CLI_STR, .at = AT(exclude, const char *), .flags = CLI_NONEMPTY},
    {"--nproc-per-node|--nproc_per_node", 0, CLI_INT, .at = AT(nproc, int), .min = 1,
     .max = AGENT_MAX_NPROC},
    {"--master", 0, CLI_CUSTOM, .fn = set_master, .what = "HOST:PORT (IPv6 as [ADDR]:PORT)"},
    {"--job|--run-id|--run_id", 0, CLI_CUSTOM, .fn = set_job,
     .what = "1 to 64 characters of [A-Za-z0-9._-]"},
    {"--ssh-opts", 0, CLI_STR, .at = AT(ssh_opts, const char *)},
    {"--connect-timeout", 0, CLI_SECONDS, .at = AT(connect_timeout_ms, int64_t), .min = 1000,
     .max = 600000},
    {"--fanout", 0, CLI_INT, .at = AT(fanout, int), .min = 1, .max = 64},
    {"--ssh-self", 0, CLI_FLAG, .at = AT(ssh_self, int)},
    {"--cohort", 0, CLI_STR, .at = AT(cohort, const char *), .what = "a path",
     .flags = CLI_NONEMPTY},
};

static const cli_cmd launch_cmd = {
    "cohort launch", launch_usage, launch_opts, BASE_ARRAY_LEN(launch_opts), CLI_AFTER_DASHDASH, 0};

/* 1 when word is one of launch's options (as NAME or NAME=VALUE); *takes: it
 * takes its value from the next word. */
static int launch_option(const char *word, int *takes) {
  for (size_t r = 0; r < BASE_ARRAY_LEN(launch_opts); r++) {
    const cli_opt *o = &launch_opts[r];
    for (const char *p = o->names; *p;) {
      size_t len = strcspn(p, "|");
      if (strncmp(word, p, len) == 0 && (word[len] == '\0' || word[len] == '=')) {
        *takes = o->kind != CLI_HELP_OPT && o->kind != CLI_FLAG && word[len] == '\0';
        return 1;
      }
      p += len + (p[len] == '|');
    }
    if (o->letter != 0 && word[0] == '-' && word[1] == o->letter && word[2] == '\0') {
      *takes = 0;
      return 1;
    }
  }
  return 0;
}

/*
 * Splits argv at launch's own options: *mine gets "launch", them, "--" and
 * the command; *run gets the other words before "--" (NULL-terminated).
 * Both are malloc'ed arrays of pointers into argv.
 */
static int split_args(int argc, char **argv, char ***mine, int *nmine, char ***run) {
  char **m = calloc((size_t)argc + 2, sizeof *m), **r = calloc((size_t)argc + 1, sizeof *r);
  if (m == NULL || r == NULL) {
    free(m);
    free(r);
    return -1;
  }
  int nm = 0, nr = 0, i = 1;
  m[nm++] = argv[0];
  for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
    int takes = 0;
    if (launch_option(argv[i], &takes)) {
      m[nm++] = argv[i];
      if (takes && i + 1 < argc) m[nm++] = argv[++i];
    } else {
      r[nr++] = argv[i];
    }
  }
  for (; i < argc; i++) m[nm++] = argv[i];
  *mine = m;
  *nmine = nm;
  *run = r;
  return 0;
}

/* Checks run's options with run's own parser; launch sets some itself. */
static int check_run_words(char **run, char **command, int *grace_ms) {
  const char *prog = launch_cmd.prog;
  size_t nr = 0, nc = 0;
  while (run[nr] != NULL) nr++;
  while (command[nc] != NULL) nc++;
  for (size_t k = 0; k < nr; k++)
    if (strncmp(run[k], "--token", 7) == 0)
      return cli_usage_error(prog, "launch makes the job's token itself and passes it over ssh's "
                                   "standard input; --token would show on remote command lines");
  char **v = calloc(nr + nc + 3, sizeof *v);
  if (v == NULL) return cli_error(prog, AGENT_EXIT_INTERNAL, "out of memory");
  v[0] = "run";
  memcpy(v + 1, run, nr * sizeof *v);
  v[nr + 1] = "--";
  memcpy(v + nr + 2, command, nc * sizeof *v);
  agent_config cfg;
  int rc = cmd_run_parse((int)(nr + nc + 2), v, &cfg);
  free(v);
  if (rc == CLI_HELP) return cli_usage_error(prog, "'cohort run --help' describes run's options");
  if (rc != CLI_OK) return rc;
  if (cfg.rdzv.nnodes_min != 0 || cfg.rdzv.node_rank >= 0)
    return cli_usage_error(prog, "launch sets --nnodes and --node-rank itself (one node per host)");
  if (cfg.rdzv.method != RDZV_AUTO || cfg.rdzv.mcast_group != NULL || cfg.rdzv.iface != NULL)
    return cli_usage_error(prog, "launch finds node 0's store itself (--master HOST:PORT "
                                 "chooses its address)");
  *grace_ms = (int)cfg.grace_ms;
  return CLI_OK;
}

/* The host list from --hosts or --hostfile, filtered. */
static int read_hosts(const launch_args *a, launch_hosts *h) {
  const char *prog = launch_cmd.prog;
  char err[LAUNCH_ERR_MAX];
  if ((a->hosts == NULL) == (a->hostfile == NULL))
    return cli_usage_error(prog,
                           "give the hosts with --hosts LIST or --hostfile FILE (one of them)");
  if (a->hosts != NULL) {
    if (launch_hosts_parse_list(a->hosts, h, err, sizeof err) != 0)
      return cli_usage_error(prog, "%s", err);
  } else {
    FILE *f = fopen(a->hostfile, "re");
    if (f == NULL) return cli_usage_error(prog, "cannot read --hostfile %s: %m", a->hostfile);
    char *text = malloc(1 << 20);
    size_t len = text != NULL ? fread(text, 1, 1 << 20, f) : 0;
    int big = text != NULL && len == 1 << 20 && fgetc(f) != EOF, bad = text == NULL || ferror(f);
    fclose(f);
    int rc = big || bad ? -1 : launch_hostfile_parse(text, len, h, err, sizeof err);
    free(text);
    if (big) return cli_usage_error(prog, "--hostfile %s is over 1 MiB", a->hostfile);
    if (bad) return cli_usage_error(prog, "cannot read --hostfile %s", a->hostfile);
    if (rc != 0) return cli_usage_error(prog, "--hostfile %s: %s", a->hostfile, err);
  }
  if (launch_hosts_filter(h, a->include, a->exclude, err, sizeof err) != 0) {
    launch_hosts_free(h);
    return cli_usage_error(prog, "%s", err);
  }
  return CLI_OK;
}

/*
 * Parses everything into *job (which points into argv, a and self).
 * Returns CLI_OK, CLI_HELP, or an exit status after printing the error.
 */
static int parse(int argc, char **argv, launch_args *a, launch_job *job, char ***mine, char ***run,
                 char *self, size_t selflen) {
  int nmine = 0, grace_ms = 0;
  cli_args command;
  if (split_args(argc, argv, mine, &nmine, run) != 0)
    return cli_error(launch_cmd.prog, AGENT_EXIT_INTERNAL, "out of memory");
  int rc = cli_parse(&launch_cmd, nmine, *mine, a, &command);
  if (rc == CLI_OK) rc = check_run_words(*run, command.argv, &grace_ms);
  if (rc == CLI_OK) rc = read_hosts(a, &job->hosts);
  if (rc != CLI_OK) return rc;
  if (a->cohort == NULL) {
    ssize_t n = readlink("/proc/self/exe", self, selflen - 1);
    if (n <= 0) return cli_error(launch_cmd.prog, AGENT_EXIT_INTERNAL, "cannot find this binary");
    self[n] = '\0';
  }
  if (launch_ssh_set_opts(&job->ssh, a->ssh_opts) != 0)
    return cli_error(launch_cmd.prog, AGENT_EXIT_INTERNAL, "out of memory");
  job->ssh.connect_timeout_s = (int)((a->connect_timeout_ms + 999) / 1000);
  job->cohort_path = a->cohort != NULL ? a->cohort : self;
  job->run_words = *run;
  job->command = command.argv;
  job->nproc = a->nproc;
  job->master = a->master;
  job->job_id = a->job;
  job->stop_grace_ms = grace_ms;
  job->expect = "cohort " COHORT_VERSION_STRING;
  job->fanout = a->fanout;
  job->answer_ms = a->connect_timeout_ms + 20000;
  job->local = a->ssh_self ? -1 : launch_local_host(&job->hosts);
  return CLI_OK;
}

/* Three descriptors per host: the soft limit up to the hard one (1024 would do for some 300). */
static void raise_fd_limit(void) {
  struct rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

int cmd_launch(int argc, char **argv) {
  launch_args a = {.fanout = 32, .connect_timeout_ms = 10000};
  launch_job job = {.out_fd = 1, .err_fd = 2};
  char **mine = NULL, **run = NULL, self[4096];
  int rc = parse(argc, argv, &a, &job, &mine, &run, self, sizeof self);
  if (rc == CLI_HELP) {
    rc = 0;
  } else if (rc == CLI_OK) {
    int status;
    raise_fd_limit();
    int err = launch_job_run(&job, &status);
    rc = err != 0 ? AGENT_EXIT_INTERNAL : status;
  }
  launch_ssh_free(&job.ssh);
  launch_hosts_free(&job.hosts);
  free(mine);
  free(run);
  return rc;
}

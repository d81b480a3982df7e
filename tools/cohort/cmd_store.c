/*
 * cmd_store.c - `cohort store serve|get|set|add|cas|wait|delete|ping`: host a
 * rendezvous store, or query one for debugging. Argument parsing only; the
 * store is src/store.
 *
 * Exit status: 0 success, 1 the operation failed (key absent, timeout,
 * unreachable, refused), 2 usage error.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "store/store.h"
#include "tools/cli.h"
#include "tools/cohort/cmd.h"

#define DEFAULT_PORT 29400
#define DEFAULT_TIMEOUT_MS 30000

static const char store_usage[] =
    "usage: cohort store serve [--host H] [--port P] [--token T] [options]\n"
    "       cohort store get    [--addr HOST:PORT] [--token T] [--raw] KEY\n"
    "       cohort store set    [--addr HOST:PORT] [--token T] KEY VALUE|-\n"
    "       cohort store add    [--addr HOST:PORT] [--token T] KEY [[--] DELTA]\n"
    "       cohort store cas    [--addr HOST:PORT] [--token T] KEY EXPECTED|--absent DESIRED\n"
    "       cohort store wait   [--addr HOST:PORT] [--token T] KEY...\n"
    "       cohort store delete [--addr HOST:PORT] [--token T] KEY\n"
    "       cohort store ping   [--addr HOST:PORT] [--token T]\n"
    "\n"
    "Hosts the rendezvous key-value store that `cohort run` uses, or talks to one.\n"
    "\n"
    "serve: runs a store until SIGINT or SIGTERM and prints its address.\n"
    "  --host H              address to listen on (default: all IPv4 addresses)\n"
    "  --port P              port (default 29400; 0 picks a free one)\n"
    "  --max-conns N         connection limit (default 1024)\n"
    "  --idle-timeout S      close connections silent this many seconds (default 600)\n"
    "  --io-timeout S        a request must arrive whole within S seconds (default 10)\n"
    "  --max-bytes SIZE      memory for keys and values, e.g. 256M (default 256M)\n"
    "\n"
    "get prints the value (with a newline unless --raw); set reads the value from\n"
    "stdin when it is '-'; add (DELTA defaults to 1) prints the new value; cas\n"
    "replaces the value only when it equals EXPECTED (or the key is absent, with\n"
    "--absent) and prints the value after the operation; wait returns when every\n"
    "KEY exists; ping prints the round trip time.\n"
    "\n"
    "common options:\n"
    "  --addr HOST:PORT      the store (default: $COHORT_STORE)\n"
    "  --token T             job token (default: $COHORT_TOKEN); prefer\n"
    "  --token-file F        reading it from F (default: $COHORT_TOKEN_FILE), readable\n"
    "                        by you alone, as command lines are visible to all\n"
    "  --timeout S           deadline of the connection and operation (default 30)\n"
    "  -h, --help            show this help\n"
    "\n"
    "exit status: 0 success, 1 the operation failed, 2 usage error\n";

static const char prog[] = "cohort store";

typedef struct opts {
  const char *host;
  int port;
  const char *addr;
  const char *token;
  const char *token_file;
  int64_t timeout_ms;
  int max_conns;
  int64_t idle_ms, io_ms;
  uint64_t max_bytes;
  int raw;
  int absent;
} opts;

#define AT(FIELD, CTYPE) CLI_AT(opts, FIELD, CTYPE)

/* The options of every subcommand; which apply is checked by the subcommand. */
static const cli_opt store_opts[] = {
    {"--help", 'h', .kind = CLI_HELP_OPT},
    {"--host", 0, CLI_STR, .at = AT(host, const char *)},
    {"--port", 0, CLI_INT, .at = AT(port, int), .min = 0, .max = 65535},
    {"--addr", 0, CLI_STR, .at = AT(addr, const char *)},
    {"--token", 0, CLI_STR, .at = AT(token, const char *)},
    {"--token-file", 0, CLI_STR, .at = AT(token_file, const char *), .env = "COHORT_TOKEN_FILE",
     .flags = CLI_NONEMPTY},
    {"--timeout", 0, CLI_SECONDS, .at = AT(timeout_ms, int64_t), .min = 0, .max = 86400000LL * 365},
    {"--max-conns", 0, CLI_INT, .at = AT(max_conns, int), .min = 1, .max = 1000000},
    {"--idle-timeout", 0, CLI_SECONDS, .at = AT(idle_ms, int64_t), .min = 1,
     .max = 86400000LL * 24},
    {"--io-timeout", 0, CLI_SECONDS, .at = AT(io_ms, int64_t), .min = 1, .max = 86400000},
    {"--max-bytes", 0, CLI_SIZE, .at = AT(max_bytes, uint64_t), .min = 4096, .max = INT64_MAX,
     .what = "a size of at least 4K (e.g. 256M)"},
    {"--raw", 0, CLI_FLAG, .at = AT(raw, int)},
    {"--absent", 0, CLI_FLAG, .at = AT(absent, int)},
};

static const cli_cmd store_cmd = {
    prog, store_usage, store_opts, BASE_ARRAY_LEN(store_opts), CLI_ANYWHERE, 1};

static int stop_pipe[2] = {-1, -1};

static void on_signal(int sig) {
  int saved = errno;
  char b = (char)sig;
  ssize_t w = write(stop_pipe[1], &b, 1);
  (void)w;
  errno = saved;
}

static int do_serve(const opts *o, const char *token, int nargs) {
  if (nargs != 0) return cli_usage_error(prog, "serve takes no arguments");
  if (o->addr != NULL) return cli_usage_error(prog, "serve takes --host and --port, not --addr");
  if (pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    return cli_error(prog, 1, "pipe: %s", strerror(errno));
  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  store_server_opts so = {
      .bind_host = o->host,
      .port = o->port,
      .token = token,
      .max_conns = o->max_conns,
      .idle_timeout_ms = (int)o->idle_ms,
      .io_timeout_ms = (int)o->io_ms,
      .max_bytes = (size_t)o->max_bytes,
  };
  store_server *srv = NULL;
  int rc = store_server_start(&so, &srv);
  const char *shown = (o->host == NULL || o->host[0] == '\0') ? "0.0.0.0" : o->host;
  if (rc != 0) {
    char a[BASE_HOST_MAX + 8];
    base_join_hostport(shown, o->port, a, sizeof a);
    return cli_error(prog, 1, "cannot serve on %s: %s", a, cohort_strerror(rc));
  }
  char a[BASE_HOST_MAX + 8];
  base_join_hostport(shown, store_server_port(srv), a, sizeof a);
  printf("cohort store: serving on %s%s\n", a, token ? " (token required)" : "");
  fflush(stdout);
  struct pollfd p = {.fd = stop_pipe[0], .events = POLLIN};
  while (poll(&p, 1, -1) < 0 && errno == EINTR) {
  }
  store_server_stop(srv);
  fprintf(stderr, "cohort store: stopped\n");
  return 0;
}

/* Reads all of stdin (at most STORE_VALUE_MAX bytes). */
static int read_stdin(char **out, size_t *len) {
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  if (buf == NULL) return cli_error(prog, 1, "out of memory");
  for (;;) {
    if (n == cap) {
      if (cap > STORE_VALUE_MAX) {
        free(buf);
        return cli_error(prog, 1, "value on stdin exceeds %u bytes", (unsigned)STORE_VALUE_MAX);
      }
      char *nb = realloc(buf, cap * 2);
      if (nb == NULL) {
        free(buf);
        return cli_error(prog, 1, "out of memory");
      }
      buf = nb;
      cap *= 2;
    }
    ssize_t r = read(STDIN_FILENO, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      free(buf);
      return cli_error(prog, 1, "reading stdin: %s", strerror(errno));
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  if (n > STORE_VALUE_MAX) {
    free(buf);
    return cli_error(prog, 1, "value on stdin exceeds %u bytes", (unsigned)STORE_VALUE_MAX);
  }
  *out = buf;
  *len = n;
  return 0;
}

static void print_value(const void *v, size_t n, int raw) {
  fwrite(v, 1, n, stdout);
  if (!raw) fputc('\n', stdout);
}

static int check_key_arg(const char *k) {
  if (k[0] == '\0') return cli_usage_error(prog, "a key must not be empty");
  if (strlen(k) > STORE_KEY_MAX)
    return cli_usage_error(prog, "key longer than %d bytes", STORE_KEY_MAX);
  return 0;
}

/* The operands a client subcommand takes: at least *min, at most *max. */
static void client_arity(const char *cmd, const opts *o, int *min, int *max) {
  *min = *max = 1;
  if (strcmp(cmd, "ping") == 0)
    *min = *max = 0;
  else if (strcmp(cmd, "set") == 0)
    *min = *max = 2;
  else if (strcmp(cmd, "add") == 0)
    *max = 2;
  else if (strcmp(cmd, "cas") == 0)
    *min = *max = o->absent ? 2 : 3;
  else if (strcmp(cmd, "wait") == 0)
    *max = 4096;
}

/* Checks a client's arguments before touching the network. */
static int check_client_args(const char *cmd, const opts *o, int nargs, char **args,
                             int64_t *delta) {
  int want_min, want_max;
  client_arity(cmd, o, &want_min, &want_max);
  if (nargs < want_min || nargs > want_max)
    return cli_usage_error(prog, "wrong number of arguments for '%s'", cmd);
  for (int i = 0; i < nargs && strcmp(cmd, "ping") != 0; i++) {
    if (i == 0 || strcmp(cmd, "wait") == 0) {
      int rc = check_key_arg(args[i]);
      if (rc != 0) return rc;
    }
  }
  if (o->raw && strcmp(cmd, "get") != 0) return cli_usage_error(prog, "--raw applies to get only");
  if (o->absent && strcmp(cmd, "cas") != 0)
    return cli_usage_error(prog, "--absent applies to cas only");
  if (o->host != NULL || o->port != 0 || o->max_conns != 0 || o->idle_ms != 0 || o->io_ms != 0 ||
      o->max_bytes != 0)
    return cli_usage_error(prog, "'%s' takes --addr; the server options belong to serve", cmd);
  *delta = 1;
  if (strcmp(cmd, "add") == 0 && nargs == 2 &&
      base_parse_i64(args[1], INT64_MIN, INT64_MAX, delta) != 0)
    return cli_usage_error(prog, "DELTA must be an integer, not '%s'", args[1]);
  return 0;
}

/* One client request; what it prints on success, it prints. *status: a cas that did not match. */
typedef struct request {
  const char *cmd, *addr;
  const opts *o;
  int nargs;
  char **args;
  const char *value; /* set's value */
  size_t vlen;
  int64_t delta, deadline;
} request;

static int cas(store_client *c, const request *q, int *status) {
  const char *exp = q->o->absent ? NULL : q->args[1];
  const char *des = q->args[q->o->absent ? 1 : 2];
  void *v = NULL;
  size_t n = 0;
  int rc =
      store_cas(c, q->args[0], exp, exp ? strlen(exp) : 0, des, strlen(des), &v, &n, q->deadline);
  if (rc == 0) {
    int swapped = v != NULL && n == strlen(des) && memcmp(v, des, n) == 0;
    if (v != NULL)
      print_value(v, n, 0);
    else
      printf("(absent)\n");
    if (!swapped) *status = cli_error(prog, 1, "compare-and-set of '%s' did not match", q->args[0]);
  }
  free(v);
  return rc;
}

static int perform(store_client *c, const request *q, int *status) {
  int rc = -EINVAL;
  const char *cmd = q->cmd;
  if (strcmp(cmd, "ping") == 0) {
    int64_t t0 = base_now_us();
    rc = store_ping(c, q->deadline);
    if (rc == 0)
      printf("pong from %s in %.3f ms\n", q->addr, (double)(base_now_us() - t0) / 1000.0);
  } else if (strcmp(cmd, "get") == 0) {
    void *v = NULL;
    size_t n = 0;
    rc = store_get(c, q->args[0], &v, &n, q->deadline);
    if (rc == 0) print_value(v, n, q->o->raw);
    free(v);
  } else if (strcmp(cmd, "set") == 0) {
    rc = store_set(c, q->args[0], q->value, q->vlen, q->deadline);
  } else if (strcmp(cmd, "add") == 0) {
    int64_t r = 0;
    rc = store_add(c, q->args[0], q->delta, &r, q->deadline);
    if (rc == 0) printf("%lld\n", (long long)r);
  } else if (strcmp(cmd, "cas") == 0) {
    rc = cas(c, q, status);
  } else if (strcmp(cmd, "wait") == 0) {
    rc = store_wait(c, (const char *const *)q->args, (size_t)q->nargs, q->deadline);
  } else if (strcmp(cmd, "delete") == 0) {
    rc = store_delete(c, q->args[0], q->deadline);
  }
  return rc;
}

/* Connects, performs the request and turns its outcome into the exit status. */
static int send_request(const request *q, const char *host, int port, const char *token) {
  store_client *c = NULL;
  char err[512];
  int rc = store_client_connect(host, port, token, q->deadline, &c, err, sizeof err);
  if (rc != 0) return cli_error(prog, 1, "%s", err);
  int status = 0;
  rc = perform(c, q, &status);
  if (rc == -ENOENT)
    status = cli_error(prog, 1, "key '%s' not found at %s", q->args[0], q->addr);
  else if (rc == -ETIMEDOUT && strcmp(q->cmd, "wait") == 0)
    status = cli_error(prog, 1, "timed out waiting for the keys at %s", q->addr);
  else if (rc != 0)
    status = cli_error(prog, 1, "%s at %s: %s", q->cmd, q->addr, cohort_strerror(rc));
  store_client_close(c);
  return status;
}

static int do_client(const char *cmd, const opts *o, const char *token, int nargs, char **args) {
  request q = {.cmd = cmd, .o = o, .nargs = nargs, .args = args};
  int rc = check_client_args(cmd, o, nargs, args, &q.delta);
  if (rc != 0) return rc;
  q.addr = o->addr != NULL ? o->addr : getenv("COHORT_STORE");
  if (q.addr == NULL || q.addr[0] == '\0')
    return cli_usage_error(prog, "no store address: give --addr HOST:PORT or set COHORT_STORE");
  char host[BASE_HOST_MAX];
  int port;
  if (base_split_hostport(q.addr, host, sizeof host, &port, 0) != 0 || host[0] == '\0')
    return cli_usage_error(prog, "--addr takes HOST:PORT, not '%s'", q.addr);
  char *stdin_value = NULL;
  if (strcmp(cmd, "set") == 0) {
    if (strcmp(args[1], "-") == 0) {
      if (read_stdin(&stdin_value, &q.vlen) != 0) return 1;
      q.value = stdin_value;
    } else {
      q.value = args[1];
      q.vlen = strlen(args[1]);
      if (q.vlen > STORE_VALUE_MAX)
        return cli_usage_error(prog, "value longer than %u bytes", (unsigned)STORE_VALUE_MAX);
    }
  }
  q.deadline = base_deadline_in(o->timeout_ms);
  rc = send_request(&q, host, port, token);
  free(stdin_value);
  return rc;
}

static int is_subcommand(const char *cmd) {
  static const char *const known[] = {"serve", "get",  "set",    "add",
                                      "cas",   "wait", "delete", "ping"};
  for (size_t i = 0; i < BASE_ARRAY_LEN(known); i++)
    if (strcmp(cmd, known[i]) == 0) return 1;
  return 0;
}

int cmd_store(int argc, char **argv) {
  if (argc < 2) {
    fputs(store_usage, stderr);
    return CLI_USAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    fputs(store_usage, stdout);
    return 0;
  }
  if (!is_subcommand(cmd)) return cli_usage_error(prog, "unknown subcommand '%s'", cmd);
  opts o = {.port = -1, .timeout_ms = DEFAULT_TIMEOUT_MS};
  cli_args operands;
  int rc = cli_parse(&store_cmd, argc - 1, argv + 1, &o, &operands);
  if (rc != CLI_OK) return rc == CLI_HELP ? 0 : rc;
  char tokbuf[STORE_TOKEN_MAX + 2];
  const char *token = NULL;
  rc = cmd_token_load(prog, o.token, o.token_file, tokbuf, sizeof tokbuf, &token);
  if (rc != 0) return rc;
  if (strcmp(cmd, "serve") == 0) {
    if (o.port < 0) o.port = DEFAULT_PORT;
    if (o.raw || o.absent) return cli_usage_error(prog, "--raw and --absent do not apply to serve");
    return do_serve(&o, token, operands.argc);
  }
  if (o.port < 0) o.port = 0;
  return do_client(cmd, &o, token, operands.argc, operands.argv);
}

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
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "store/store.h"
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
    "  --token-file F        reading it from a file, as command lines are visible\n"
    "  --timeout S           deadline of the connection and operation (default 30)\n"
    "  -h, --help            show this help\n"
    "\n"
    "exit status: 0 success, 1 the operation failed, 2 usage error\n";

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "cohort store: %s; see 'cohort store --help'\n", msg);
  return 2;
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int fail(const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "cohort store: %s\n", msg);
  return 1;
}

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

enum {
  OPT_HOST = 256,
  OPT_PORT,
  OPT_ADDR,
  OPT_TOKEN,
  OPT_TOKEN_FILE,
  OPT_TIMEOUT,
  OPT_MAX_CONNS,
  OPT_IDLE,
  OPT_IO,
  OPT_MAX_BYTES,
  OPT_RAW,
  OPT_ABSENT,
};

static const struct option long_opts[] = {
    {"host", required_argument, NULL, OPT_HOST},
    {"port", required_argument, NULL, OPT_PORT},
    {"addr", required_argument, NULL, OPT_ADDR},
    {"token", required_argument, NULL, OPT_TOKEN},
    {"token-file", required_argument, NULL, OPT_TOKEN_FILE},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"max-conns", required_argument, NULL, OPT_MAX_CONNS},
    {"idle-timeout", required_argument, NULL, OPT_IDLE},
    {"io-timeout", required_argument, NULL, OPT_IO},
    {"max-bytes", required_argument, NULL, OPT_MAX_BYTES},
    {"raw", no_argument, NULL, OPT_RAW},
    {"absent", no_argument, NULL, OPT_ABSENT},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Parses the options of every subcommand; which apply is checked by the caller. */
static int parse_opts(int argc, char **argv, opts *o, int *help) {
  *help = 0;
  opterr = 0;
  optind = 1;
  int ch;
  while ((ch = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
    switch (ch) {
    case 'h':
      *help = 1;
      return 0;
    case OPT_HOST:
      o->host = optarg;
      break;
    case OPT_PORT:
      if (base_parse_int(optarg, 0, 65535, &o->port) != 0)
        return usage_error("--port wants 0..65535, not '%s'", optarg);
      break;
    case OPT_ADDR:
      o->addr = optarg;
      break;
    case OPT_TOKEN:
      o->token = optarg;
      break;
    case OPT_TOKEN_FILE:
      o->token_file = optarg;
      break;
    case OPT_TIMEOUT:
      if (base_parse_seconds(optarg, 86400.0 * 365, &o->timeout_ms) != 0)
        return usage_error("--timeout wants seconds, not '%s'", optarg);
      break;
    case OPT_MAX_CONNS:
      if (base_parse_int(optarg, 1, 1000000, &o->max_conns) != 0)
        return usage_error("--max-conns wants 1..1000000, not '%s'", optarg);
      break;
    case OPT_IDLE:
      if (base_parse_seconds(optarg, 86400.0 * 24, &o->idle_ms) != 0 || o->idle_ms < 1)
        return usage_error("--idle-timeout wants positive seconds, not '%s'", optarg);
      break;
    case OPT_IO:
      if (base_parse_seconds(optarg, 86400.0, &o->io_ms) != 0 || o->io_ms < 1)
        return usage_error("--io-timeout wants positive seconds, not '%s'", optarg);
      break;
    case OPT_MAX_BYTES:
      if (base_parse_size(optarg, &o->max_bytes) != 0 || o->max_bytes < 4096)
        return usage_error("--max-bytes wants a size of at least 4K (e.g. 256M), not '%s'", optarg);
      break;
    case OPT_RAW:
      o->raw = 1;
      break;
    case OPT_ABSENT:
      o->absent = 1;
      break;
    case '?':
    default:
      if (optopt != 0) return usage_error("option -%c is unknown or lacks its value", optopt);
      return usage_error("option '%s' is unknown or lacks its value", argv[optind - 1]);
    }
  }
  return 0;
}

/* Loads the token from --token, --token-file or $COHORT_TOKEN into buf. */
static int load_token(const opts *o, char *buf, size_t buflen, const char **token) {
  *token = NULL;
  if (o->token != NULL && o->token_file != NULL)
    return usage_error("give --token or --token-file, not both");
  if (o->token_file != NULL) {
    int fd = open(o->token_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail("cannot read token file %s: %s", o->token_file, strerror(errno));
    ssize_t n = read(fd, buf, buflen - 1);
    int err = errno;
    close(fd);
    if (n < 0) return fail("cannot read token file %s: %s", o->token_file, strerror(err));
    if ((size_t)n == buflen - 1)
      return fail("token file %s: token longer than %d bytes", o->token_file, STORE_TOKEN_MAX);
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0'; /* one line; a trailing newline is not part of it */
    if (buf[0] == '\0') return fail("token file %s is empty", o->token_file);
    *token = buf;
    return 0;
  }
  const char *t = o->token != NULL ? o->token : getenv("COHORT_TOKEN");
  if (t != NULL && t[0] != '\0') {
    if (strlen(t) > STORE_TOKEN_MAX)
      return usage_error("the token is longer than %d bytes", STORE_TOKEN_MAX);
    *token = t;
  }
  return 0;
}

static int stop_pipe[2] = {-1, -1};

static void on_signal(int sig) {
  int saved = errno;
  char b = (char)sig;
  ssize_t w = write(stop_pipe[1], &b, 1);
  (void)w;
  errno = saved;
}

static int do_serve(const opts *o, const char *token, int nargs) {
  if (nargs != 0) return usage_error("serve takes no arguments");
  if (o->addr != NULL) return usage_error("serve takes --host and --port, not --addr");
  if (pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return fail("pipe: %s", strerror(errno));
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
    return fail("cannot serve on %s: %s", a, cohort_strerror(rc));
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
  if (buf == NULL) return fail("out of memory");
  for (;;) {
    if (n == cap) {
      if (cap > STORE_VALUE_MAX) {
        free(buf);
        return fail("value on stdin exceeds %u bytes", (unsigned)STORE_VALUE_MAX);
      }
      char *nb = realloc(buf, cap * 2);
      if (nb == NULL) {
        free(buf);
        return fail("out of memory");
      }
      buf = nb;
      cap *= 2;
    }
    ssize_t r = read(STDIN_FILENO, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      free(buf);
      return fail("reading stdin: %s", strerror(errno));
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  if (n > STORE_VALUE_MAX) {
    free(buf);
    return fail("value on stdin exceeds %u bytes", (unsigned)STORE_VALUE_MAX);
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
  if (k[0] == '\0') return usage_error("a key must not be empty");
  if (strlen(k) > STORE_KEY_MAX) return usage_error("key longer than %d bytes", STORE_KEY_MAX);
  return 0;
}

static int do_client(const char *cmd, const opts *o, const char *token, int nargs, char **args) {
  /* Check the arguments before touching the network. */
  int want_min = 1, want_max = 1;
  if (strcmp(cmd, "ping") == 0)
    want_min = want_max = 0;
  else if (strcmp(cmd, "set") == 0)
    want_min = want_max = 2;
  else if (strcmp(cmd, "add") == 0)
    want_max = 2;
  else if (strcmp(cmd, "cas") == 0)
    want_min = want_max = o->absent ? 2 : 3;
  else if (strcmp(cmd, "wait") == 0)
    want_max = 4096;
  if (nargs < want_min || nargs > want_max)
    return usage_error("wrong number of arguments for '%s'", cmd);
  for (int i = 0; i < nargs && strcmp(cmd, "ping") != 0; i++) {
    if (i == 0 || strcmp(cmd, "wait") == 0) {
      int rc = check_key_arg(args[i]);
      if (rc != 0) return rc;
    }
  }
  if (o->raw && strcmp(cmd, "get") != 0) return usage_error("--raw applies to get only");
  if (o->absent && strcmp(cmd, "cas") != 0) return usage_error("--absent applies to cas only");
  if (o->host != NULL || o->port != 0 || o->max_conns != 0 || o->idle_ms != 0 || o->io_ms != 0 ||
      o->max_bytes != 0)
    return usage_error("'%s' takes --addr; the server options belong to serve", cmd);
  int64_t delta = 1;
  if (strcmp(cmd, "add") == 0 && nargs == 2 &&
      base_parse_i64(args[1], INT64_MIN, INT64_MAX, &delta) != 0)
    return usage_error("DELTA must be an integer, not '%s'", args[1]);

  const char *addr = o->addr != NULL ? o->addr : getenv("COHORT_STORE");
  if (addr == NULL || addr[0] == '\0')
    return usage_error("no store address: give --addr HOST:PORT or set COHORT_STORE");
  char host[BASE_HOST_MAX];
  int port;
  if (base_split_hostport(addr, host, sizeof host, &port, 0) != 0 || host[0] == '\0')
    return usage_error("--addr wants HOST:PORT, not '%s'", addr);

  char *value = NULL;
  size_t vlen = 0;
  if (strcmp(cmd, "set") == 0) {
    if (strcmp(args[1], "-") == 0) {
      if (read_stdin(&value, &vlen) != 0) return 1;
    } else {
      vlen = strlen(args[1]);
      if (vlen > STORE_VALUE_MAX)
        return usage_error("value longer than %u bytes", (unsigned)STORE_VALUE_MAX);
    }
  }

  int64_t deadline = base_deadline_in(o->timeout_ms);
  store_client *c = NULL;
  char err[512];
  int64_t t0 = base_now_us();
  int rc = store_client_connect(host, port, token, deadline, &c, err, sizeof err);
  if (rc != 0) {
    free(value);
    return fail("%s", err);
  }
  int status = 0;
  void *v = NULL;
  size_t n = 0;
  if (strcmp(cmd, "ping") == 0) {
    t0 = base_now_us();
    rc = store_ping(c, deadline);
    if (rc == 0) printf("pong from %s in %.3f ms\n", addr, (double)(base_now_us() - t0) / 1000.0);
  } else if (strcmp(cmd, "get") == 0) {
    rc = store_get(c, args[0], &v, &n, deadline);
    if (rc == 0) print_value(v, n, o->raw);
  } else if (strcmp(cmd, "set") == 0) {
    rc = store_set(c, args[0], value ? value : args[1], vlen, deadline);
  } else if (strcmp(cmd, "add") == 0) {
    int64_t r = 0;
    rc = store_add(c, args[0], delta, &r, deadline);
    if (rc == 0) printf("%lld\n", (long long)r);
  } else if (strcmp(cmd, "cas") == 0) {
    const char *exp = o->absent ? NULL : args[1];
    const char *des = args[o->absent ? 1 : 2];
    rc = store_cas(c, args[0], exp, exp ? strlen(exp) : 0, des, strlen(des), &v, &n, deadline);
    if (rc == 0) {
      int swapped = v != NULL && n == strlen(des) && memcmp(v, des, n) == 0;
      if (v != NULL)
        print_value(v, n, 0);
      else
        printf("(absent)\n");
      if (!swapped) status = fail("compare-and-set of '%s' did not match", args[0]);
    }
  } else if (strcmp(cmd, "wait") == 0) {
    rc = store_wait(c, (const char *const *)args, (size_t)nargs, deadline);
  } else if (strcmp(cmd, "delete") == 0) {
    rc = store_delete(c, args[0], deadline);
  }
  if (rc == -ENOENT)
    status = fail("key '%s' not found at %s", args[0], addr);
  else if (rc == -ETIMEDOUT && strcmp(cmd, "wait") == 0)
    status = fail("timed out waiting for the keys at %s", addr);
  else if (rc != 0)
    status = fail("%s at %s: %s", cmd, addr, cohort_strerror(rc));
  free(v);
  free(value);
  store_client_close(c);
  return status;
}

int cmd_store(int argc, char **argv) {
  if (argc < 2) {
    fputs(store_usage, stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    fputs(store_usage, stdout);
    return 0;
  }
  static const char *const known[] = {"serve", "get",  "set",    "add",
                                      "cas",   "wait", "delete", "ping"};
  int found = 0;
  for (size_t i = 0; i < BASE_ARRAY_LEN(known); i++)
    if (strcmp(cmd, known[i]) == 0) found = 1;
  if (!found) return usage_error("unknown subcommand '%s'", cmd);

  opts o = {.port = -1, .timeout_ms = DEFAULT_TIMEOUT_MS};
  int help = 0;
  int rc = parse_opts(argc - 1, argv + 1, &o, &help);
  if (rc != 0) return rc;
  if (help) {
    fputs(store_usage, stdout);
    return 0;
  }
  char tokbuf[STORE_TOKEN_MAX + 2];
  const char *token = NULL;
  rc = load_token(&o, tokbuf, sizeof tokbuf, &token);
  if (rc != 0) return rc;
  int nargs = argc - 1 - optind;
  char **args = argv + 1 + optind;
  if (strcmp(cmd, "serve") == 0) {
    if (o.port < 0) o.port = DEFAULT_PORT;
    if (o.raw || o.absent) return usage_error("--raw and --absent do not apply to serve");
    return do_serve(&o, token, nargs);
  }
  if (o.port < 0) o.port = 0;
  return do_client(cmd, &o, token, nargs, args);
}

/* cli.c - the option-table parser and the one-line usage errors (see cli.h). */
#include "tools/cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* Enough for torchrun's options and cohort's own on one command. */
#define CLI_MAX_OPTS 256

typedef struct parser {
  const cli_cmd *cmd;
  void *settings;
  unsigned char seen[CLI_MAX_OPTS]; /* given on the command line: the environment yields */
} parser;

static void vreport(const char *prog, const char *see, const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (see != NULL)
    fprintf(stderr, "%s: %s; see '%s --help'\n", prog, msg, see);
  else
    fprintf(stderr, "%s: %s\n", prog, msg);
}

int cli_usage_error(const char *prog, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vreport(prog, prog, fmt, ap);
  va_end(ap);
  return CLI_USAGE;
}

int cli_error(const char *prog, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vreport(prog, NULL, fmt, ap);
  va_end(ap);
  return status;
}

/* Length of the first spelling in names: the one messages use. */
static int main_name_len(const cli_opt *o) {
  return (int)strcspn(o->names, "|");
}

/* 2: a spelling of o is arg[0..len); 1: arg[0..len) is a prefix of one; 0: neither. */
static int spelling_match(const cli_opt *o, const char *arg, size_t len) {
  int prefix = 0;
  for (const char *s = o->names; *s != '\0';) {
    size_t n = strcspn(s, "|");
    if (n == len && memcmp(s, arg, len) == 0) return 2;
    if (n > len && memcmp(s, arg, len) == 0) prefix = 1;
    s += n + (s[n] == '|');
  }
  return prefix;
}

/* The row of the long option arg[0..len): its index, -1 unknown, -2 an ambiguous prefix. */
static int find_long(const cli_cmd *cmd, const char *arg, size_t len) {
  int found = -1;
  for (size_t r = 0; r < cmd->nopts; r++) {
    int m = spelling_match(&cmd->opts[r], arg, len);
    if (m == 2) return (int)r;
    if (m == 1 && cmd->abbrev) found = found == -1 ? (int)r : -2;
  }
  return found;
}

static int find_letter(const cli_cmd *cmd, char letter) {
  for (size_t r = 0; r < cmd->nopts; r++)
    if (letter != '\0' && cmd->opts[r].letter == letter) return (int)r;
  return -1;
}

/* What a value of o must be, for the error message. */
static void describe(const cli_opt *o, char *buf, size_t len) {
  size_t n = 0;
  if (o->what != NULL) {
    snprintf(buf, len, "%s", o->what);
  } else if (o->kind == CLI_INT || o->kind == CLI_I64) {
    snprintf(buf, len, "a whole number from %lld to %lld", (long long)o->min, (long long)o->max);
  } else if (o->kind == CLI_SECONDS) {
    snprintf(buf, len, "seconds from %g to %g", (double)o->min / 1000, (double)o->max / 1000);
  } else if (o->kind == CLI_FLOAT) {
    snprintf(buf, len, "a number from %g to %g", o->fmin, o->fmax);
  } else if (o->kind == CLI_CHOICE) {
    buf[0] = '\0';
    for (const cli_choice *c = o->choices; c->name != NULL && n < len; c++) {
      const char *sep = c == o->choices ? "" : c[1].name == NULL ? " or " : ", ";
      n += (size_t)snprintf(buf + n, len - n, "%s%s", sep, c->name);
    }
  } else {
    snprintf(buf, len, "a value");
  }
}

static int bad_value(const parser *p, const cli_opt *o, const char *value, const char *env) {
  char what[256];
  describe(o, what, sizeof what);
  if (env != NULL)
    return cli_usage_error(p->cmd->prog, "%.*s (from %s) takes %s, not '%s'", main_name_len(o),
                           o->names, env, what, value);
  return cli_usage_error(p->cmd->prog, "%.*s takes %s, not '%s'", main_name_len(o), o->names, what,
                         value);
}

static int parse_float(const char *s, double min, double max, float *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (s[0] == '\0' || *end != '\0' || errno != 0 || !isfinite(v) || v < min || v > max) return -1;
  *out = (float)v;
  return 0;
}

static int parse_choice(const cli_choice *c, const char *s, int *out) {
  for (; c->name != NULL; c++)
    if (strcmp(c->name, s) == 0) {
      *out = c->value;
      return 0;
    }
  return -1;
}

/* Stores value into the settings as row o says; -1 when the value is bad. */
static int store(void *settings, const cli_opt *o, const char *v) {
  char *dst = (char *)settings + o->at;
  int64_t i64;
  uint64_t u64;
  switch (o->kind) {
  case CLI_FLAG: /* v is NULL on the command line, the variable's value from the environment */
    if (v == NULL) {
      *(int *)dst = 1;
      return 0;
    }
    return base_parse_int(v, 0, 1, (int *)dst) == 0 ? 0 : -1;
  case CLI_STR:
    if ((o->flags & CLI_NONEMPTY) && v[0] == '\0') return -1;
    *(const char **)dst = v;
    return 0;
  case CLI_INT:
    return base_parse_int(v, (int)o->min, (int)o->max, (int *)dst) == 0 ? 0 : -1;
  case CLI_I64:
    return base_parse_i64(v, o->min, o->max, (int64_t *)dst) == 0 ? 0 : -1;
  case CLI_SECONDS:
    if (base_parse_seconds(v, (double)o->max / 1000, &i64) != 0 || i64 < o->min) return -1;
    *(int64_t *)dst = i64;
    return 0;
  case CLI_SIZE:
    if (base_parse_size(v, &u64) != 0 || u64 < (uint64_t)o->min || u64 > (uint64_t)o->max)
      return -1;
    *(uint64_t *)dst = u64;
    return 0;
  case CLI_FLOAT:
    return parse_float(v, o->fmin, o->fmax, (float *)dst);
  case CLI_CHOICE:
    return parse_choice(o->choices, v, (int *)dst);
  case CLI_CUSTOM:
    return o->fn(settings, v) == 0 ? 0 : -1;
  case CLI_NOTE:
    return 0;
  default:
    return -1;
  }
}

/* The error for a prefix that several options share, naming them. */
static int ambiguous(const cli_cmd *cmd, const char *arg, size_t len) {
  char names[512] = "";
  size_t n = 0;
  for (size_t r = 0; r < cmd->nopts && n < sizeof names; r++) {
    const cli_opt *o = &cmd->opts[r];
    if (spelling_match(o, arg, len) == 0) continue;
    n += (size_t)snprintf(names + n, sizeof names - n, "%s%.*s", n ? ", " : "", main_name_len(o),
                          o->names);
  }
  return cli_usage_error(cmd->prog, "option '%.*s' is ambiguous (%s)", (int)len, arg, names);
}

/* The row that argument a names, and its value when written into it ("--x=v", "-xv"). */
static int lookup(const parser *p, const char *a, int *row, const char **inline_value) {
  const cli_cmd *cmd = p->cmd;
  *inline_value = NULL;
  if (a[1] == '-') {
    const char *eq = strchr(a, '=');
    size_t len = eq != NULL ? (size_t)(eq - a) : strlen(a);
    if (eq != NULL) *inline_value = eq + 1;
    *row = find_long(cmd, a, len);
    if (*row == -2) return ambiguous(cmd, a, len);
    if (*row < 0) return cli_usage_error(cmd->prog, "unknown option '%.*s'", (int)len, a);
    return CLI_OK;
  }
  *row = find_letter(cmd, a[1]);
  if (*row < 0) return cli_usage_error(cmd->prog, "unknown option '-%c'", a[1]);
  if (a[2] != '\0') *inline_value = a[2] == '=' ? a + 3 : a + 2;
  return CLI_OK;
}

/* The line a CLI_NOTE row prints when given. */
static void note(const parser *p, const cli_opt *o) {
  if (o->kind == CLI_NOTE)
    fprintf(stderr, "%s: note: %.*s has no effect (%s)\n", p->cmd->prog, main_name_len(o), o->names,
            o->what != NULL ? o->what : "accepted for compatibility");
}

/* Handles the option at argv[*i] (and its value at argv[*i + 1] when not written into it). */
static int option(parser *p, int argc, char **argv, int *i) {
  int row;
  const char *v;
  int rc = lookup(p, argv[*i], &row, &v);
  if (rc != CLI_OK) return rc;
  const cli_opt *o = &p->cmd->opts[row];
  int nl = main_name_len(o);
  if (o->kind == CLI_HELP_OPT) {
    fputs(p->cmd->usage, stdout);
    return CLI_HELP;
  }
  if (o->kind == CLI_FLAG && v != NULL)
    return cli_usage_error(p->cmd->prog, "%.*s takes no value", nl, o->names);
  if (o->kind != CLI_FLAG && v == NULL) {
    if (*i + 1 >= argc)
      return cli_usage_error(p->cmd->prog, "option %.*s needs a value", nl, o->names);
    v = argv[++*i];
  }
  p->seen[row] = 1;
  if (store(p->settings, o, v) != 0) return bad_value(p, o, v, NULL);
  note(p, o);
  return CLI_OK;
}

/* After the command line: values from the environment, then the required options. */
static int finish(parser *p) {
  const cli_cmd *cmd = p->cmd;
  for (size_t r = 0; r < cmd->nopts; r++) {
    const cli_opt *o = &cmd->opts[r];
    const char *v = o->env != NULL && !p->seen[r] ? getenv(o->env) : NULL;
    if (v == NULL) continue;
    if (store(p->settings, o, v) != 0) return bad_value(p, o, v, o->env);
    p->seen[r] = 1;
    note(p, o);
  }
  for (size_t r = 0; r < cmd->nopts; r++) {
    const cli_opt *o = &cmd->opts[r];
    if ((o->flags & CLI_REQUIRED) && !p->seen[r])
      return cli_usage_error(cmd->prog, "%.*s is required", main_name_len(o), o->names);
  }
  return CLI_OK;
}

/* An operand before any "--": kept (at argv[*w]) or refused, as the command says. */
static int operand(const parser *p, char **argv, int i, int *w) {
  switch (p->cmd->operands) {
  case CLI_ANYWHERE:
    argv[(*w)++] = argv[i];
    return CLI_OK;
  case CLI_AFTER_DASHDASH:
    return cli_usage_error(p->cmd->prog, "missing '--' before the command '%s'", argv[i]);
  case CLI_COMMAND: /* not reached: the command starts here (cli_parse) */
  default:
    return cli_usage_error(p->cmd->prog, "unexpected argument '%s'", argv[i]);
  }
}

/* The words after "--" (from argv[i]) and the operands gathered before, into *rest. */
static int operands_after(const parser *p, int argc, char **argv, int i, int dashdash, int w,
                          cli_args *rest) {
  const char *prog = p->cmd->prog;
  switch (p->cmd->operands) {
  case CLI_AFTER_DASHDASH:
    if (!dashdash) return cli_usage_error(prog, "missing '--' before the command");
    if (i >= argc) return cli_usage_error(prog, "no command after '--'");
    rest->argc = argc - i;
    rest->argv = argv + i;
    return CLI_OK;
  case CLI_COMMAND:
    if (i >= argc)
      return cli_usage_error(prog, dashdash ? "no command after '--'" : "no program to run");
    rest->argc = argc - i;
    rest->argv = argv + i;
    return CLI_OK;
  case CLI_ANYWHERE:
    while (i < argc) argv[w++] = argv[i++];
    if (w < argc) argv[w] = NULL;
    rest->argc = w - 1;
    rest->argv = argv + 1;
    return CLI_OK;
  default:
    if (i < argc) return cli_usage_error(prog, "unexpected argument '%s'", argv[i]);
    rest->argc = 0;
    rest->argv = argv + argc;
    return CLI_OK;
  }
}

int cli_parse(const cli_cmd *cmd, int argc, char **argv, void *settings, cli_args *rest) {
  parser p = {.cmd = cmd, .settings = settings};
  if (cmd->nopts > CLI_MAX_OPTS)
    return cli_usage_error(cmd->prog, "internal error: more than %d options", CLI_MAX_OPTS);
  int i = 1, w = 1, dashdash = 0, rc = CLI_OK;
  for (; i < argc && rc == CLI_OK; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      dashdash = 1;
      i++;
      break;
    }
    if (a[0] == '-' && a[1] != '\0')
      rc = option(&p, argc, argv, &i);
    else if (cmd->operands == CLI_COMMAND)
      break; /* the program and its arguments start here */
    else
      rc = operand(&p, argv, i, &w);
  }
  if (rc != CLI_OK) return rc;
  rest->dashdash = dashdash;
  rc = operands_after(&p, argc, argv, i, dashdash, w, rest);
  if (rc != CLI_OK) return rc;
  return finish(&p);
}

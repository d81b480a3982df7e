/*
 * cli.h - the command-line layer of the tools: one option table per command.
 *
 * A command describes each option as one row of a table (its spellings, an
 * optional letter, the kind of value, where the value goes in the command's
 * settings struct, an optional environment variable) and calls cli_parse().
 * Aliases such as torchrun's `--nproc_per_node`, the `--opt=value` form and
 * the environment form are rows or fields of rows, never code in a command.
 *
 * Every usage error is one line, "PROG: WHAT; see 'PROG --help'", and the
 * status CLI_USAGE (2). Nothing here exits; the functions print to stderr
 * only (and the help text to stdout). Not thread-safe (getenv).
 */
#ifndef COHORT_TOOLS_CLI_H
#define COHORT_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>

/* What cli_parse() returns: parse on, help printed (exit 0), usage error (exit 2). */
enum { CLI_OK = 0, CLI_HELP = 1, CLI_USAGE = 2 };

typedef enum cli_kind {
  CLI_HELP_OPT, /* prints the command's usage to stdout; cli_parse() returns CLI_HELP */
  CLI_FLAG,     /* no value; sets an int to 1 */
  CLI_STR,      /* const char *; with CLI_NONEMPTY "" is refused */
  CLI_INT,      /* int in [min, max] */
  CLI_I64,      /* int64_t in [min, max] */
  CLI_SECONDS,  /* seconds, fractions allowed, into int64_t milliseconds in [min, max] */
  CLI_SIZE,     /* bytes with an optional K/M/G suffix, into uint64_t in [min, max] */
  CLI_FLOAT,    /* float in [fmin, fmax], finite */
  CLI_CHOICE,   /* one of the names in choices, into an int */
  CLI_CUSTOM,   /* fn(settings, value) decides; returns 0 or -1 for a bad value */
  CLI_NOTE,     /* takes a value and stores nothing: accepted for compatibility, with one
                   line "PROG: note: OPT has no effect (WHAT)" on stderr */
} cli_kind;

/* Row flags. A CLI_FLAG row read from its environment variable takes 1 or 0 there. */
#define CLI_NONEMPTY 1u /* CLI_STR: the empty string is a bad value */
#define CLI_REQUIRED 2u /* the option must be given (on the command line or by env) */

typedef struct cli_choice {
  const char *name;
  int value;
} cli_choice;

typedef struct cli_opt {
  /* Spellings separated by '|', each with its dashes: "--nproc-per-node|--nproc_per_node".
   * The first is the one messages name. */
  const char *names;
  char letter; /* short form -x, or 0 */
  cli_kind kind;
  size_t at;                 /* offset of the destination in the settings: CLI_AT() */
  int64_t min, max;          /* CLI_INT, CLI_I64, CLI_SECONDS (in ms), CLI_SIZE */
  double fmin, fmax;         /* CLI_FLOAT */
  const cli_choice *choices; /* CLI_CHOICE, ended by {NULL, 0} */
  int (*fn)(void *settings, const char *value); /* CLI_CUSTOM */
  const char *what; /* what a value must be, for errors ("a directory"); derived when NULL */
  const char *env;  /* variable that gives the value when the option is not on the line */
  unsigned flags;   /* CLI_NONEMPTY, CLI_REQUIRED */
} cli_opt;

/*
 * Offset of FIELD in TYPE, checked at compile time to have type CTYPE (a
 * pointer comparison of distinct types is an error under -Werror).
 */
#define CLI_AT(TYPE, FIELD, CTYPE)                                                                 \
  (offsetof(TYPE, FIELD) + 0 * sizeof((CTYPE *)0 == &((TYPE *)0)->FIELD))

/* Where arguments that are not options (operands) may stand. */
typedef enum cli_operands {
  CLI_NO_OPERANDS,    /* none: the first is an error */
  CLI_ANYWHERE,       /* before, between and after the options, as GNU getopt permutes them;
                         everything after "--" is an operand too */
  CLI_AFTER_DASHDASH, /* options, then "--" and a command (at least one word) taken whole */
  CLI_COMMAND,        /* options, then a command taken whole: the words after "--", or the
                         first operand and everything after it (torchrun's script and its
                         arguments, which may look like options) */
} cli_operands;

typedef struct cli_cmd {
  const char *prog;  /* "cohort run": starts every message */
  const char *usage; /* printed by the help row */
  const cli_opt *opts;
  size_t nopts;
  cli_operands operands;
  int abbrev; /* 1: a unique prefix of a long option stands for it (as getopt_long) */
} cli_cmd;

/* The operands: argc words at argv, argv[argc] == NULL. */
typedef struct cli_args {
  int argc;
  char **argv;
  int dashdash; /* 1: the operands came after "--" */
} cli_args;

/*
 * Parses argv[1..argc) (argv[0] is the command's name) into settings, which
 * the caller has filled with the defaults. Options set from the command line
 * first; then each row with an environment variable that is set and whose
 * option was not given takes its value from there. Operands are moved to
 * the end of argv's pointer array (the strings are untouched) and returned
 * in *rest. Returns CLI_OK, CLI_HELP after printing the usage, or CLI_USAGE
 * after printing one line.
 */
int cli_parse(const cli_cmd *cmd, int argc, char **argv, void *settings, cli_args *rest);

/* Prints "PROG: MESSAGE; see 'PROG --help'" to stderr and returns CLI_USAGE. */
int cli_usage_error(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints "PROG: MESSAGE" to stderr and returns status (a failure that is not a usage error). */
int cli_error(const char *prog, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif

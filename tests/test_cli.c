/*
 * test_cli.c - the option-table parser of the tools (tools/cli.c): every
 * spelling of an option, the environment form, required options, prefixes,
 * the three placements of operands, and the one-line errors.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "check.h"
#include "tools/cli.h"

typedef struct settings {
  int num, flag, color;
  int64_t ms;
  const char *name;
} settings;

#define AT(FIELD, CTYPE) CLI_AT(settings, FIELD, CTYPE)

static const cli_choice colors[] = {{"red", 1}, {"green", 2}, {"blue", 3}, {NULL, 0}};

static const cli_opt opts[] = {
    {"--help", 'h', .kind = CLI_HELP_OPT},
    {"--num-x|--num_x", 'n', CLI_INT, .at = AT(num, int), .min = 1, .max = 9,
     .env = "TEST_CLI_NUM"},
    {"--flag", 0, CLI_FLAG, .at = AT(flag, int)},
    {"--color", 0, CLI_CHOICE, .at = AT(color, int), .choices = colors},
    {"--wait", 0, CLI_SECONDS, .at = AT(ms, int64_t), .min = 500, .max = 60000},
    {"--name", 0, CLI_STR, .at = AT(name, const char *), .flags = CLI_NONEMPTY | CLI_REQUIRED},
};

static cli_cmd cmd = {"prog", "usage: prog\n", opts, BASE_ARRAY_LEN(opts), CLI_NO_OPERANDS, 0};

static char err[1024];

/* Parses the words (argv[0] = "prog"); what it wrote to stderr lands in err. */
static int parse(settings *s, cli_args *rest, char **words) {
  char *argv[32] = {"prog"};
  int argc = 1;
  for (; words[argc - 1] != NULL; argc++) argv[argc] = words[argc - 1];
  argv[argc] = NULL;
  *s = (settings){0};
  cli_args ignored;
  FILE *tmp = tmpfile();
  int saved = dup(2);
  fflush(stderr);
  dup2(fileno(tmp), 2);
  int rc = cli_parse(&cmd, argc, argv, s, rest ? rest : &ignored);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  rewind(tmp);
  size_t n = fread(err, 1, sizeof err - 1, tmp);
  err[n] = '\0';
  fclose(tmp);
  return rc;
}

#define PARSE(S, REST, ...) parse(S, REST, (char *[]){__VA_ARGS__, NULL})

/* One line, starting with the program and ending with the pointer to --help, holding want. */
static int one_line(const char *want) {
  int ok = strncmp(err, "prog: ", 6) == 0 && strchr(err, '\n') == err + strlen(err) - 1 &&
           strstr(err, "; see 'prog --help'\n") != NULL && strstr(err, want) != NULL;
  if (!ok) fprintf(stderr, "expected one line with '%s', got: %s", want, err);
  return ok;
}

static void test_spellings(void) {
  settings s;
  const char *forms[][2] = {{"--num-x", "3"},    {"--num_x", "3"}, {"--num-x=3", NULL},
                            {"--num_x=3", NULL}, {"-n", "3"},      {"-n3", NULL},
                            {"-n=3", NULL}};
  for (size_t i = 0; i < BASE_ARRAY_LEN(forms); i++) {
    char *w[5] = {"--name", "x", (char *)forms[i][0], (char *)forms[i][1], NULL};
    CHECK_EQ_INT(parse(&s, NULL, w), CLI_OK);
    CHECK_EQ_INT(s.num, 3);
  }
  CHECK_EQ_INT(PARSE(&s, NULL, "--name", "x", "--flag", "--color", "blue", "--wait", "1.5"), 0);
  CHECK(s.flag == 1 && s.color == 3 && s.ms == 1500 && strcmp(s.name, "x") == 0);
  CHECK_EQ_INT(PARSE(&s, NULL, "--help"), CLI_HELP);
}

static void test_errors(void) {
  settings s;
  CHECK_EQ_INT(PARSE(&s, NULL, "--name", "x", "--flag=1"), CLI_USAGE);
  CHECK(one_line("--flag takes no value"));
  CHECK_EQ_INT(PARSE(&s, NULL, "--name", "x", "--num_x"), CLI_USAGE);
  CHECK(one_line("option --num-x needs a value"));
  CHECK_EQ_INT(PARSE(&s, NULL, "--name", "x", "--zzz=1"), CLI_USAGE);
  CHECK(one_line("unknown option '--zzz'"));
  CHECK_EQ_INT(PARSE(&s, NULL, "--name", "x", "-q"), CLI_USAGE);
  CHECK(one_line("unknown option '-q'"));
  CHECK_EQ_INT(PARSE(&s, NULL, "--name", "x", "-n", "10"), CLI_USAGE);
  CHECK(one_line("--num-x takes a whole number from 1 to 9, not '10'"));
  CHECK_EQ_INT(PARSE(&s, NULL, "--name", "x", "--color", "pink"), CLI_USAGE);
  CHECK(one_line("--color takes red, green or blue, not 'pink'"));
  CHECK_EQ_INT(PARSE(&s, NULL, "--name", "x", "--wait", "0.1"), CLI_USAGE);
  CHECK(one_line("--wait takes seconds from 0.5 to 60, not '0.1'"));
  CHECK_EQ_INT(PARSE(&s, NULL, "--name="), CLI_USAGE);
  CHECK(one_line("--name takes a value, not ''"));
  CHECK_EQ_INT(PARSE(&s, NULL, "--flag"), CLI_USAGE);
  CHECK(one_line("--name is required"));
  CHECK_EQ_INT(PARSE(&s, NULL, "--name", "x", "stray"), CLI_USAGE);
  CHECK(one_line("unexpected argument 'stray'"));
}

static void test_environment(void) {
  settings s;
  setenv("TEST_CLI_NUM", "7", 1);
  CHECK_EQ_INT(PARSE(&s, NULL, "--name", "x"), CLI_OK);
  CHECK_EQ_INT(s.num, 7);
  CHECK_EQ_INT(PARSE(&s, NULL, "--name", "x", "-n", "2"), CLI_OK);
  CHECK_EQ_INT(s.num, 2); /* the command line wins */
  setenv("TEST_CLI_NUM", "many", 1);
  CHECK_EQ_INT(PARSE(&s, NULL, "--name", "x", "-n", "2"), CLI_OK); /* not read when given */
  CHECK_EQ_INT(PARSE(&s, NULL, "--name", "x"), CLI_USAGE);
  CHECK(one_line("--num-x (from TEST_CLI_NUM) takes a whole number from 1 to 9, not 'many'"));
  unsetenv("TEST_CLI_NUM");
}

static void test_prefixes(void) {
  settings s;
  CHECK_EQ_INT(PARSE(&s, NULL, "--na", "x"), CLI_USAGE); /* off unless the command says */
  CHECK(one_line("unknown option '--na'"));
  cmd.abbrev = 1;
  CHECK_EQ_INT(PARSE(&s, NULL, "--na", "x", "--num=4", "--fl"), CLI_OK);
  CHECK(s.num == 4 && s.flag == 1 && strcmp(s.name, "x") == 0);
  CHECK_EQ_INT(PARSE(&s, NULL, "--name", "x", "--n", "1"), CLI_USAGE);
  CHECK(one_line("option '--n' is ambiguous (--num-x, --name)"));
  cmd.abbrev = 0;
}

static void test_operands(void) {
  settings s;
  cli_args rest;
  cmd.operands = CLI_ANYWHERE;
  CHECK_EQ_INT(PARSE(&s, &rest, "a", "--name", "x", "-", "b", "--", "--flag", "c"), CLI_OK);
  CHECK(s.flag == 0 && rest.argc == 5 && rest.argv[rest.argc] == NULL);
  if (rest.argc == 5)
    CHECK(strcmp(rest.argv[0], "a") == 0 && strcmp(rest.argv[1], "-") == 0 &&
          strcmp(rest.argv[2], "b") == 0 && strcmp(rest.argv[3], "--flag") == 0 &&
          strcmp(rest.argv[4], "c") == 0);
  cmd.operands = CLI_AFTER_DASHDASH;
  CHECK_EQ_INT(PARSE(&s, &rest, "--name", "x", "--", "cmd", "--flag"), CLI_OK);
  CHECK(s.flag == 0 && rest.argc == 2 && strcmp(rest.argv[0], "cmd") == 0 && rest.argv[2] == NULL);
  CHECK_EQ_INT(PARSE(&s, &rest, "--name", "x", "cmd"), CLI_USAGE);
  CHECK(one_line("missing '--' before the command 'cmd'"));
  CHECK_EQ_INT(PARSE(&s, &rest, "--name", "x"), CLI_USAGE);
  CHECK(one_line("missing '--' before the command"));
  CHECK_EQ_INT(PARSE(&s, &rest, "--name", "x", "--"), CLI_USAGE);
  CHECK(one_line("no command after '--'"));
  cmd.operands = CLI_NO_OPERANDS;
}

int main(void) {
  unsetenv("TEST_CLI_NUM");
  test_spellings();
  test_errors();
  test_environment();
  test_prefixes();
  test_operands();
  return check_report();
}

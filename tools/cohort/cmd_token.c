/*
 * cmd_token.c - `cohort token [--file PATH]`: a fresh random job token,
 * printed or written to a new file that only its owner can read.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "store/auth.h"
#include "tools/cli.h"
#include "tools/cohort/cmd.h"

static const char prog[] = "cohort token";

static const char token_usage[] =
    "usage: cohort token [--file PATH]\n"
    "\n"
    "Prints a fresh random job token (32 hex characters: 128 bits from the kernel's\n"
    "generator, getrandom(2)). Give every node of a job the same token (COHORT_TOKEN, --token or\n"
    "COHORT_TOKEN_FILE); without it nothing can read, write or join the job's store.\n"
    "\n"
    "options:\n"
    "  --file PATH           write the token to PATH, a new file readable only by\n"
    "                        you (for COHORT_TOKEN_FILE), instead of printing it\n"
    "  -h, --help            show this help\n";

typedef struct token_args {
  const char *file;
} token_args;

static const cli_opt token_opts[] = {
    {"--help", 'h', .kind = CLI_HELP_OPT},
    {"--file", 0, CLI_STR, .at = CLI_AT(token_args, file, const char *), .flags = CLI_NONEMPTY},
};

static const cli_cmd token_cmd = {
    prog, token_usage, token_opts, BASE_ARRAY_LEN(token_opts), CLI_NO_OPERANDS, 1};

int cmd_secret_file(const char *who, const char *what, const char *path, char *buf, size_t len) {
  int rc = store_token_read_file(path, buf, len);
  if (rc == -EPERM)
    return cli_usage_error(who,
                           "%s file %s may be read by others (or is not a regular file): "
                           "run chmod 600 %s",
                           what, path, path);
  if (rc == -E2BIG || rc == -ENODATA)
    return cli_usage_error(who,
                           rc == -E2BIG ? "%s file %s: the %s is longer than 256 bytes"
                                        : "%s file %s: no %s on its first line",
                           what, path, what);
  if (rc != 0) return cli_usage_error(who, "cannot read %s file %s: %s", what, path, strerror(-rc));
  return CLI_OK;
}

int cmd_token_file(const char *who, const char *path, char *buf, size_t len) {
  return cmd_secret_file(who, "token", path, buf, len);
}

int cmd_token_load(const char *who, const char *token, const char *token_file, char *buf,
                   size_t len, const char **out) {
  *out = NULL;
  if (token != NULL && token_file != NULL)
    return cli_usage_error(who, "give --token or --token-file, not both");
  if (token_file != NULL) {
    int rc = cmd_token_file(who, token_file, buf, len);
    if (rc == CLI_OK) *out = buf;
    return rc;
  }
  const char *t = token != NULL ? token : getenv("COHORT_TOKEN");
  if (t != NULL && t[0] != '\0') {
    if (strlen(t) > STORE_TOKEN_MAX)
      return cli_usage_error(who, "the token is longer than %d bytes", STORE_TOKEN_MAX);
    *out = t;
  }
  return CLI_OK;
}

/* Creates path (which must not exist) with mode 0600 and writes line into it. */
static int write_new_file(const char *path, const char *line) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return -errno;
  size_t len = strlen(line);
  ssize_t n = write(fd, line, len);
  int rc = n == (ssize_t)len ? 0 : (n < 0 ? -errno : -EIO);
  if (rc == 0 && fsync(fd) != 0) rc = -errno;
  if (close(fd) != 0 && rc == 0) rc = -errno;
  if (rc != 0) unlink(path);
  return rc;
}

int cmd_token(int argc, char **argv) {
  token_args a = {0};
  cli_args rest;
  int rc = cli_parse(&token_cmd, argc, argv, &a, &rest);
  if (rc != CLI_OK) return rc == CLI_HELP ? 0 : rc;
  char token[STORE_TOKEN_NEW_LEN + 1], line[STORE_TOKEN_NEW_LEN + 2];
  if (store_token_new(token) != 0) return cli_error(prog, 1, "no random bytes from the kernel");
  snprintf(line, sizeof line, "%s\n", token);
  if (a.file == NULL) {
    if (fputs(line, stdout) == EOF || fflush(stdout) != 0)
      return cli_error(prog, 1, "writing the token failed: %s", strerror(errno));
    return 0;
  }
  rc = write_new_file(a.file, line);
  if (rc != 0)
    return cli_error(prog, 1, "cannot write %s: %s%s", a.file, strerror(-rc),
                     rc == -EEXIST ? " (a new file is made; remove the old one first)" : "");
  return 0;
}

/*
 * cmd.h - entry points of the `cohort` subcommands, one file each
 * (tools/cohort/cmd_<name>.c). Each takes argv with argv[0] = "<name>" and
 * returns the process exit status: 0 success, 2 usage error, other codes as
 * the command documents. Declared weak so main.c lists only those built.
 */
#ifndef COHORT_TOOLS_CMD_H
#define COHORT_TOOLS_CMD_H

#define COHORT_WEAK __attribute__((weak))

COHORT_WEAK int cmd_run(int argc, char **argv);
/* `cohort run` with torchrun's name, help and defaults: main() when argv[0] is torchrun. */
COHORT_WEAK int cmd_torchrun(int argc, char **argv);
COHORT_WEAK int cmd_launch(int argc, char **argv);
COHORT_WEAK int cmd_doctor(int argc, char **argv);
COHORT_WEAK int cmd_bench(int argc, char **argv);
COHORT_WEAK int cmd_store(int argc, char **argv);
COHORT_WEAK int cmd_manifest(int argc, char **argv);
COHORT_WEAK int cmd_plot(int argc, char **argv);
COHORT_WEAK int cmd_token(int argc, char **argv);
COHORT_WEAK int cmd_status(int argc, char **argv);
COHORT_WEAK int cmd_stop(int argc, char **argv);
COHORT_WEAK int cmd_stacks(int argc, char **argv);

#include <stddef.h>

/*
 * Reads a job token file given as --token-file (or COHORT_TOKEN_FILE) into
 * buf (STORE_TOKEN_MAX + 2 bytes), refusing one that others may read.
 * Returns CLI_OK, or the usage error's exit status after printing it as who.
 */
int cmd_token_file(const char *who, const char *path, char *buf, size_t len);
/* The same for another secret: WHAT names it in the errors ("password"). */
int cmd_secret_file(const char *who, const char *what, const char *path, char *buf, size_t len);

/*
 * The job token of a command that talks to a job's store: --token, else
 * --token-file (buf as above), else $COHORT_TOKEN; *out NULL for none.
 * Returns CLI_OK or the usage error's exit status after printing it.
 */
int cmd_token_load(const char *who, const char *token, const char *token_file, char *buf,
                   size_t len, const char **out);

#endif

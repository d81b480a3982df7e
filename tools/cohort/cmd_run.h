/*
 * cmd_run.h - `cohort run`'s argument parser, apart from the command so that
 * fuzz/fuzz_cli.c can run it on random argument vectors.
 */
#ifndef COHORT_TOOLS_CMD_RUN_H
#define COHORT_TOOLS_CMD_RUN_H

#include "agent/agent.h"

/*
 * Parses `cohort run`'s arguments (argv[0] = "run") into *out. Returns
 * CLI_OK (0) when the job should start (out->argv is the command, pointing
 * into argv), CLI_HELP (1) when --help was printed, or CLI_USAGE (2) after
 * printing a one-line error. Starts nothing and reads only the environment
 * (COHORT_TOKEN).
 */
int cmd_run_parse(int argc, char **argv, agent_config *out);

#endif

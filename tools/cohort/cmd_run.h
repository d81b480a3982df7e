/*
 * cmd_run.h - `cohort run`'s argument parser, apart from the command so that
 * fuzz/fuzz_cli.c can run it on random argument vectors.
 */
#ifndef COHORT_TOOLS_CMD_RUN_H
#define COHORT_TOOLS_CMD_RUN_H

#include "agent/agent.h"

/*
 * Parses `cohort run`'s arguments (argv[0] = "run") into *out. Returns
 * CLI_OK (0) when the job should start (out->argv is the command: the
 * words after "--", or torchrun's program through Python; its array lives
 * until the next call), CLI_HELP (1) when --help was printed, or CLI_USAGE (2) after
 * printing a one-line error. Starts nothing; reads the environment
 * (COHORT_TOKEN, torchrun's PET_* forms of the options, PYTHON_EXEC).
 */
int cmd_run_parse(int argc, char **argv, agent_config *out);

/*
 * The same under the name torchrun (argv[0] = "torchrun"): messages and help
 * say torchrun, a program after "--" still runs through Python, and
 * --nnodes above 1 alone means torchrun's static master 127.0.0.1:29500.
 */
int cmd_torchrun_parse(int argc, char **argv, agent_config *out);

#endif

/* cmd_stacks.h - the printing of `cohort stacks`, which fuzz/fuzz_status.c feeds. */
#ifndef COHORT_TOOLS_CMD_STACKS_H
#define COHORT_TOOLS_CMD_STACKS_H

#include <jansson.h>

/* Prints `cohort stacks`' answers (answers[k]: node k's, or NULL) to stdout. */
void stacks_print_answers(json_t *const *answers, int nnodes);

#endif

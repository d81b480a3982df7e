/*
 * cmd_status.h - the pure parts of `cohort status`, which fuzz/fuzz_status.c
 * feeds with any bytes.
 */
#ifndef COHORT_TOOLS_CMD_STATUS_H
#define COHORT_TOOLS_CMD_STATUS_H

#include <jansson.h>
#include <stdint.h>

/*
 * The --json document (docs/status.schema.json) of a job from node 0's
 * snapshot and every node's (an array by node rank, null for a node
 * without one; taken over), at wall-clock time now (ms).
 */
json_t *status_document(const char *job, const char *addr, const json_t *n0, json_t *nodes,
                        int64_t now);
/* The document as the table, or as indented JSON; malloc'ed, NULL out of memory. */
char *status_render(const json_t *doc, int as_json);

#endif

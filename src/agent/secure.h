/*
 * secure.h - the job token policy of a multi-node agent: a job without a
 * token runs an open store, which the agent says once, or refuses to do
 * when told to (--require-token, COHORT_REQUIRE_TOKEN=1). docs/security.md
 * describes what the token protects.
 */
#ifndef COHORT_AGENT_SECURE_H
#define COHORT_AGENT_SECURE_H

#include <errno.h>

#include "agent/agent.h"

/* agent_token_policy() refused the job, an error as any other (the agent
 * maps it to AGENT_EXIT_USAGE). */
#define AGENT_TOKEN_REFUSED (-EKEYREJECTED)

/*
 * Called once a job is known to span several nodes, with its token (NULL
 * when none) and the store's address. Without a token: returns
 * AGENT_TOKEN_REFUSED after one line on stderr when cfg->require_token is
 * set; otherwise prints the warning block (what is exposed, to whom, the
 * one-line fix) to stderr and returns 0. With a token: returns 0 silently.
 */
int agent_token_policy(const agent_config *cfg, const char *token, const char *store_host,
                       int store_port);

#endif

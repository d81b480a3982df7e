/* secure.c - the warning or refusal of a multi-node job without a token. */
#include "agent/secure.h"

#include <stdio.h>

#include "base/base.h"
#include "base/net.h"

int agent_token_policy(const agent_config *cfg, const char *token, const char *store_host,
                       int store_port) {
  if (token != NULL) return 0;
  if (cfg->require_token) {
    fprintf(stderr, "cohort: refusing to run a multi-node job without a token (--require-token "
                    "or COHORT_REQUIRE_TOKEN=1): export COHORT_TOKEN=$(cohort token) on every "
                    "node, the same on all\n");
    return AGENT_TOKEN_REFUSED;
  }
  if (cfg->rdzv.method == RDZV_ETCD) {
    /* etcd guards the plan with its own users and TLS; node 0's workers' store is open. */
    fprintf(stderr,
            "cohort: warning: this job runs without a token: anyone who can reach node 0's\n"
            "cohort:   workers' store (libcohort's bootstrap) can read and change what the\n"
            "cohort:   workers exchange there. Fix: export COHORT_TOKEN=$(cohort token) on\n"
            "cohort:   every node, the same on all (docs/security.md).\n");
    return 0;
  }
  char addr[BASE_HOST_MAX + 16];
  base_join_hostport(store_host, store_port, addr, sizeof addr);
  /* One block, printed once per agent: what is open, to whom, and the fix. */
  fprintf(stderr,
          "cohort: warning: this multi-node job runs without a token. Anyone who can reach\n"
          "cohort:   its store at %s can read the rank plan (every node's address\n"
          "cohort:   and host), stop the job with a failure report of their own, and join it\n"
          "cohort:   as a node. Fix: give every node the same token, e.g.\n"
          "cohort:     export COHORT_TOKEN=$(cohort token)\n"
          "cohort:   (--require-token or COHORT_REQUIRE_TOKEN=1 makes this an error; see\n"
          "cohort:   docs/security.md.)\n",
          addr);
  return 0;
}

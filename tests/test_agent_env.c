/*
 * test_agent_env.c - the worker environment (src/agent/env.c) against
 * docs/torchrun-env.md: every variable of the table, the user's values that
 * win, and the inherited environment passed through. Also the other pure
 * function of a worker's set-up: where its output goes (agent_worker_output,
 * torchrun's -r/-t and --local-ranks-filter).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/env.h"
#include "agent/worker.h"
#include "tests/check.h"

/* Two workers per node, node 1 of 3: rank 3 is local rank 1. */
static agent_env_in two_per_node(char *const *parent) {
  agent_env_in in = {.parent = parent,
                     .rank = 3,
                     .local_rank = 1,
                     .world_size = 6,
                     .local_world_size = 2,
                     .group_rank = 1,
                     .group_world_size = 3,
                     .role = "trainer",
                     .master_addr = "10.0.0.1",
                     .master_port = 29512,
                     .restart = 2,
                     .round = 4,
                     .max_restarts = 5,
                     .run_id = "job7",
                     .error_file = "/tmp/e/attempt2-rank3.json",
                     .iface = "eth1",
                     .store = "10.0.0.1:29400",
                     .token = "s3cret"};
  return in;
}

/* How many entries of the list name the variable. */
static int count_of(char *const *env, const char *name) {
  size_t nl = strlen(name);
  int n = 0;
  for (char *const *p = env; *p != NULL; p++) n += strncmp(*p, name, nl) == 0 && (*p)[nl] == '=';
  return n;
}

static void check_var(char *const *env, const char *name, const char *want) {
  const char *got = agent_env_get(env, name);
  if (want == NULL) {
    if (got != NULL) fprintf(stderr, "%s should be unset, is '%s'\n", name, got);
    CHECK(got == NULL);
    return;
  }
  CHECK_STREQ(got, want);
  CHECK_EQ_INT(count_of(env, name), 1);
}

/* The torchrun table and cohort's own variables. */
static void test_table(void) {
  char *parent[] = {"PATH=/usr/bin", "HOME=/root", "RANK=99", NULL};
  agent_env_in in = two_per_node(parent);
  agent_env e = {0};
  CHECK_EQ_INT(agent_env_build(&in, &e), 0);
  if (e.v == NULL) return;
  const char *want[][2] = {
      {"RANK", "3"},
      {"LOCAL_RANK", "1"},
      {"WORLD_SIZE", "6"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"GROUP_RANK", "1"},
      {"GROUP_WORLD_SIZE", "3"},
      {"ROLE_RANK", "3"},
      {"ROLE_WORLD_SIZE", "6"},
      {"ROLE_NAME", "trainer"},
      {"MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "29512"},
      {"TORCHELASTIC_RESTART_COUNT", "2"},
      {"TORCHELASTIC_MAX_RESTARTS", "5"},
      {"TORCHELASTIC_RUN_ID", "job7"},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"TORCHELASTIC_ERROR_FILE", "/tmp/e/attempt2-rank3.json"},
      {"NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"OMP_NUM_THREADS", "1"},
      {"GLOO_SOCKET_IFNAME", "eth1"},
      {"NCCL_SOCKET_IFNAME", "eth1"},
      {"COHORT_STORE", "10.0.0.1:29400"},
      {"COHORT_JOB_ID", "job7"},
      {"COHORT_ROUND", "4"},
      {"COHORT_TOKEN", "s3cret"},
      {"COHORT_NODE_RANK", "1"},
      {"COHORT_NNODES", "3"},
      /* inherited */
      {"PATH", "/usr/bin"},
      {"HOME", "/root"},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) check_var(e.v, want[i][0], want[i][1]);
  /* torchrun's LC_CTYPE comes from its interpreter, not from torchrun. */
  check_var(e.v, "LC_CTYPE", NULL);
  CHECK_EQ_INT(e.n, sizeof want / sizeof want[0]);
  CHECK(e.v[e.n] == NULL);
  agent_env_free(&e);
  agent_env_free(&e); /* safe twice */
}

/* Values the user set stay; one worker gets no OMP_NUM_THREADS. */
static void test_user_wins(void) {
  char *parent[] = {
      "OMP_NUM_THREADS=7",      "NCCL_ASYNC_ERROR_HANDLING=0", "TORCH_NCCL_ASYNC_ERROR_HANDLING=3",
      "GLOO_SOCKET_IFNAME=ib0", "NCCL_SOCKET_IFNAME=mine0",    NULL};
  agent_env_in in = two_per_node(parent);
  agent_env e = {0};
  CHECK_EQ_INT(agent_env_build(&in, &e), 0);
  if (e.v == NULL) return;
  check_var(e.v, "OMP_NUM_THREADS", "7");
  check_var(e.v, "NCCL_ASYNC_ERROR_HANDLING", "0");
  check_var(e.v, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "3");
  check_var(e.v, "GLOO_SOCKET_IFNAME", "ib0");
  check_var(e.v, "NCCL_SOCKET_IFNAME", "mine0");
  agent_env_free(&e);

  char *none[] = {NULL};
  in = two_per_node(none);
  in.local_world_size = 1;
  in.error_file = NULL;
  in.token = NULL;
  in.iface = "";
  CHECK_EQ_INT(agent_env_build(&in, &e), 0);
  if (e.v == NULL) return;
  check_var(e.v, "OMP_NUM_THREADS", NULL);
  check_var(e.v, "TORCHELASTIC_ERROR_FILE", NULL);
  check_var(e.v, "COHORT_TOKEN", NULL);
  check_var(e.v, "GLOO_SOCKET_IFNAME", NULL);
  check_var(e.v, "NCCL_SOCKET_IFNAME", NULL);
  agent_env_free(&e);
}

/* Derived network settings are added, and the agent's interface beats theirs. */
static void test_network(void) {
  char *parent[] = {"HOME=/root", NULL};
  doctor_var net[] = {{.name = "NCCL_IB_DISABLE", .value = "1"},
                      {.name = "NCCL_SOCKET_IFNAME", .value = "derived0"}};
  agent_env_in in = two_per_node(parent);
  in.net = net;
  in.nnet = 2;
  agent_env e = {0};
  CHECK_EQ_INT(agent_env_build(&in, &e), 0);
  if (e.v == NULL) return;
  check_var(e.v, "NCCL_IB_DISABLE", "1");
  check_var(e.v, "NCCL_SOCKET_IFNAME", "eth1");
  agent_env_free(&e);
}

static void test_output(void) {
  agent_std s;
  CHECK_EQ_INT(agent_std_parse("3", &s), 0);
  CHECK_EQ_INT(agent_std_of(&s, 7), 3);
  CHECK_EQ_INT(agent_std_parse("0:3,2:1", &s), 0);
  CHECK_EQ_INT(agent_std_of(&s, 0), 3);
  CHECK_EQ_INT(agent_std_of(&s, 1), 0); /* not named: torchrun's NONE */
  CHECK_EQ_INT(agent_std_of(&s, 2), 1);
  const char *bad[] = {"", "4", "-1", "0:", ":1", "a:1", "0:4", "0:3;1:1", "1024:1", "0:3,x"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    CHECK_EQ_INT(agent_std_parse(bad[i], &s), -EINVAL);

  agent_config c = {.log_dir = "/logs"};
  int console, files;
  agent_worker_output(&c, 0, &console, &files); /* torchrun's defaults: the console only */
  CHECK_EQ_INT(console, 3);
  CHECK_EQ_INT(files, 0);
  agent_std_parse("2", &c.redirects); /* Debian's line: -r 2 -t 1 */
  agent_std_parse("1", &c.tee);
  agent_worker_output(&c, 1, &console, &files);
  CHECK_EQ_INT(console, 1);
  CHECK_EQ_INT(files, 3);
  c.nshown = 1; /* --local-ranks-filter 0 */
  c.shown[0] = 0;
  agent_worker_output(&c, 1, &console, &files);
  CHECK_EQ_INT(console, 0);
  CHECK_EQ_INT(files, 3);
  agent_worker_output(&c, 0, &console, &files);
  CHECK_EQ_INT(console, 1);
  c.log_dir = NULL; /* no directory: no files, whatever -r says */
  agent_worker_output(&c, 0, &console, &files);
  CHECK_EQ_INT(files, 0);
}

/* The progress file under its name and its earlier one; neither without it. */
static void test_progress(void) {
  char *parent[] = {"HOME=/root", NULL};
  agent_env_in in = two_per_node(parent);
  agent_env e = {0};
  CHECK_EQ_INT(agent_env_build(&in, &e), 0);
  if (e.v == NULL) return;
  check_var(e.v, "COHORT_PROGRESS", NULL);
  check_var(e.v, "COHORT_HEARTBEAT", NULL);
  agent_env_free(&e);
  in.progress = "/run/job/progress-1";
  CHECK_EQ_INT(agent_env_build(&in, &e), 0);
  if (e.v == NULL) return;
  check_var(e.v, "COHORT_PROGRESS", "/run/job/progress-1");
  check_var(e.v, "COHORT_HEARTBEAT", "/run/job/progress-1");
  agent_env_free(&e);
}

/* A worker started ahead of its membership (--on-failure reform): COHORT_AWAIT_FORM and no
 * membership variable, not even one the agent inherited; its local ones stay. */
static void test_await_form(void) {
  char *parent[] = {"PATH=/usr/bin", "RANK=99", "MASTER_PORT=1", "COHORT_ROUND=7", NULL};
  agent_env_in in = two_per_node(parent);
  in.await_form = 1;
  in.newcomer = 1;
  in.control_fd = 9;
  agent_env e = {0};
  CHECK_EQ_INT(agent_env_build(&in, &e), 0);
  if (e.v == NULL) return;
  const char *gone[] = {"RANK",         "WORLD_SIZE",      "GROUP_RANK",       "GROUP_WORLD_SIZE",
                        "ROLE_RANK",    "ROLE_WORLD_SIZE", "MASTER_ADDR",      "MASTER_PORT",
                        "COHORT_STORE", "COHORT_ROUND",    "COHORT_NODE_RANK", "COHORT_NNODES"};
  for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++) check_var(e.v, gone[i], NULL);
  check_var(e.v, "COHORT_AWAIT_FORM", "1");
  check_var(e.v, "COHORT_NEWCOMER", "1");
  check_var(e.v, "COHORT_CONTROL_FD", "9");
  check_var(e.v, "LOCAL_RANK", "1");
  check_var(e.v, "LOCAL_WORLD_SIZE", "2");
  check_var(e.v, "COHORT_JOB_ID", "job7");
  agent_env_free(&e);
}

int main(void) {
  test_output();
  test_progress();
  test_table();
  test_await_form();
  test_user_wins();
  test_network();
  return check_report();
}

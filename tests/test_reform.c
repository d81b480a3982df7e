/*
 * test_reform.c - the pure parts of --on-failure reform: the control
 * channel's messages (agent_control_parse), a socketpair that carries one
 * message per datagram, and a re-form round's planner with a replacement
 * counted pending (rdzv_mark_pending, a store on loopback).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/control.h"
#include "base/base.h"
#include "check.h"
#include "rdzv/join.h"
#include "store/store.h"

static int parse(const char *s, control_msg *m) {
  return agent_control_parse(s, strlen(s), m);
}

static void test_parse(void) {
  control_msg m;
  CHECK_EQ_INT(parse("hello pid=42", &m), 0);
  CHECK_EQ_INT(m.verb, CONTROL_HELLO);
  CHECK_EQ_INT(m.pid, 42);
  CHECK_EQ_INT(m.step, -1);
  CHECK_EQ_INT(m.await_form, -1);
  CHECK_EQ_INT(parse("hello pid=42 await_form=1", &m), 0);
  CHECK_EQ_INT(m.await_form, 1);
  CHECK_EQ_INT(parse("ready epoch=3 step=-1\n", &m), 0);
  CHECK_EQ_INT(m.verb, CONTROL_READY);
  CHECK_EQ_INT(m.epoch, 3);
  CHECK_EQ_INT(m.step, -1);
  CHECK_EQ_INT(parse("formed  epoch=4 step=17 colour=blue", &m), 0); /* unknown keys skipped */
  CHECK_EQ_INT(m.verb, CONTROL_FORMED);
  CHECK_EQ_INT(m.step, 17);
  CHECK_EQ_INT(parse("formed epoch=4 why=step=x = = pid=z", &m), 0); /* why: the rest */
  CHECK_EQ_INT(m.pid, -1);
  CHECK_EQ_INT(parse("wave hand=left", &m), 0);
  CHECK_EQ_INT(m.verb, CONTROL_OTHER);
  CHECK_STREQ(m.name, "wave");
  CHECK_EQ_INT(parse("", &m), -EPROTO);
  CHECK_EQ_INT(parse("\n", &m), -EPROTO);
  CHECK_EQ_INT(parse("Hello pid=1", &m), -EPROTO);
  CHECK_EQ_INT(parse("hello pid", &m), -EPROTO);
  CHECK_EQ_INT(parse("hello =1", &m), -EPROTO);
  CHECK_EQ_INT(parse("hello pid=12x", &m), -EPROTO);
  CHECK_EQ_INT(parse("hello pid=1234567890123456789", &m), -EPROTO);
  CHECK_EQ_INT(parse("hello\tpid=1", &m), -EPROTO);
  CHECK_EQ_INT(agent_control_parse("hello pid=1\0x", 13, &m), -EPROTO);
  CHECK_EQ_INT(parse("ready step=\xff", &m), -EPROTO);
  char big[CONTROL_MSG_MAX + 2];
  memset(big, 'a', sizeof big);
  CHECK_EQ_INT(agent_control_parse(big, CONTROL_MSG_MAX, &m), 0);
  CHECK_EQ_INT(agent_control_parse(big, CONTROL_MSG_MAX + 1, &m), -EPROTO);
}

static void test_channel(void) {
  int fds[2];
  CHECK_EQ_INT(agent_control_open(fds), 0);
  CHECK_EQ_INT(agent_control_send(fds[0], "form epoch=%d rank=%d", 2, 5), 0);
  CHECK_EQ_INT(agent_control_send(fds[0], "stop why=%s", "the job restarts"), 0);
  char buf[64];
  ssize_t n = recv(fds[1], buf, sizeof buf, 0);
  CHECK_EQ_INT(n, (ssize_t)strlen("form epoch=2 rank=5")); /* one message per datagram */
  n = recv(fds[1], buf, sizeof buf, 0);
  CHECK_EQ_INT(n, (ssize_t)strlen("stop why=the job restarts"));
  char huge[CONTROL_MSG_MAX + 8];
  memset(huge, 'x', sizeof huge - 1);
  huge[sizeof huge - 1] = '\0';
  CHECK_EQ_INT(agent_control_send(fds[0], "%s", huge), -EMSGSIZE);
  close(fds[1]);
  CHECK_EQ_INT(agent_control_send(fds[0], "reshape epoch=1"), -EPIPE);
  close(fds[0]);
}

/*
 * Re-form round `round` of job on the store: a survivor (record node/1, last node rank 1) has
 * joined; node 0 joins and plans with expect 3 (the lost node, or its replacement, is the
 * third), settle_ms and MIN as given. Returns rdzv_join's code, the plan in *plan.
 */
static int plan_round(store_client *c, const char *job, int round, int min, int64_t settle_ms,
                      int64_t wait_ms, rdzv_plan *plan) {
  rdzv_join_opts o = {.job_id = job,
                      .round = round,
                      .claimed_rank = -1,
                      .nproc = 1,
                      .nnodes_min = min,
                      .nnodes_max = 3,
                      .my_host = "127.0.0.2",
                      .master_host = "127.0.0.1",
                      .expect = 3,
                      .settle_ms = settle_ms,
                      .prev_rank = 1,
                      .deadline_ms = base_deadline_in(wait_ms)};
  char rec[1024], key[STORE_KEY_MAX], err[256];
  rdzv_record_format(rec, sizeof rec, 0x1111, &o, "survivor");
  rdzv_key(key, sizeof key, job, round, "node/1");
  CHECK_EQ_INT(store_set(c, key, rec, strlen(rec), base_deadline_in(2000)), 0);
  rdzv_key(key, sizeof key, job, round, "joined");
  CHECK_EQ_INT(store_add(c, key, 1, NULL, base_deadline_in(2000)), 0);
  o.is_host = 1;
  o.prev_rank = 0;
  o.my_host = "127.0.0.1";
  o.master_host = NULL;
  return rdzv_join(c, &o, plan, err, sizeof err);
}

/* A client of the store server srv (NULL when it cannot connect: the check says so). */
static store_client *client_of(store_server *srv) {
  store_client *c = NULL;
  char err[256];
  CHECK_EQ_INT(store_client_connect("127.0.0.1", store_server_port(srv), NULL,
                                    base_deadline_in(5000), &c, err, sizeof err),
               0);
  return c;
}

/* A store of the test's own on loopback and a client of it (NULL, checks failed, if either
 * could not be had). */
static store_client *served(store_server **srv) {
  store_server_opts so = {.bind_host = "127.0.0.1"};
  *srv = NULL;
  CHECK_EQ_INT(store_server_start(&so, srv), 0);
  return *srv != NULL ? client_of(*srv) : NULL;
}

/*
 * A replacement counted pending in the survivors' re-form round (its workers start ahead):
 * the round plans at once with the survivors instead of waiting out the settle time for the
 * node it replaces; never below MIN.
 */
static void test_pending(void) {
  store_server *srv;
  store_client *c = served(&srv);
  if (c == NULL) return;
  rdzv_plan plan = {0};
  /* Pending: planned at once with the two survivors (settle 30 s: ms expected, 15 s bound). */
  CHECK_EQ_INT(rdzv_mark_pending(c, "pj", 1, base_deadline_in(2000)), 0);
  int64_t t0 = base_now_ms();
  CHECK_EQ_INT(plan_round(c, "pj", 1, 1, 30000, 60000, &plan), 0);
  CHECK(base_now_ms() - t0 < 15000);
  CHECK_EQ_INT(plan.nnodes, 2);
  CHECK_EQ_INT(plan.my_index, 0);
  rdzv_plan_free(&plan);
  /* None pending: after the settle time, with the two that came. */
  t0 = base_now_ms();
  CHECK_EQ_INT(plan_round(c, "pj", 2, 1, 300, 90000, &plan), 0);
  CHECK(base_now_ms() - t0 >= 250);
  CHECK_EQ_INT(plan.nnodes, 2);
  rdzv_plan_free(&plan);
  /* MIN 3: a pending node does not make two joined enough. */
  CHECK_EQ_INT(rdzv_mark_pending(c, "pj", 3, base_deadline_in(2000)), 0);
  CHECK_EQ_INT(plan_round(c, "pj", 3, 3, 100, 600, &plan), -ETIMEDOUT);
  rdzv_plan_free(&plan);
  store_client_close(c);
  store_server_stop(srv);
}

/* A node joining round `round` of job as a re-form member (prev >= 0) or as a new node (prev -1:
 * a replacement, whose record has no prev), as rdzv_join writes them. */
static void joins(store_client *c, const char *job, int round, int prev, uint64_t uid) {
  rdzv_join_opts o = {.job_id = job,
                      .round = round,
                      .claimed_rank = -1,
                      .nproc = 1,
                      .nnodes_min = 2,
                      .nnodes_max = 3,
                      .my_host = "127.0.0.3",
                      .master_host = "127.0.0.1",
                      .expect = prev >= 0 ? 2 : 0,
                      .prev_rank = prev};
  char rec[1024], key[STORE_KEY_MAX];
  int64_t seq = 0;
  rdzv_key(key, sizeof key, job, round, "joined");
  CHECK_EQ_INT(store_add(c, key, 1, &seq, base_deadline_in(2000)), 0);
  rdzv_record_format(rec, sizeof rec, uid, &o, prev >= 0 ? "survivor" : "replacement");
  char suffix[32];
  snprintf(suffix, sizeof suffix, "node/%lld", (long long)seq);
  rdzv_key(key, sizeof key, job, round, suffix);
  CHECK_EQ_INT(store_set(c, key, rec, strlen(rec), base_deadline_in(2000)), 0);
  rdzv_key(key, sizeof key, job, round, "back");
  if (prev >= 0) CHECK_EQ_INT(store_add(c, key, 1, NULL, base_deadline_in(2000)), 0);
}

typedef struct {
  store_client *c;
  rdzv_plan plan;
  int rc;
} host_run;

/* Node 0 of a loss's re-form round: 2 nodes expected, both members (expect_back 2). */
static void *host_plans(void *arg) {
  host_run *h = arg;
  rdzv_join_opts o = {.job_id = "sf",
                      .round = 1,
                      .claimed_rank = -1,
                      .nproc = 1,
                      .nnodes_min = 2,
                      .nnodes_max = 3,
                      .my_host = "127.0.0.1",
                      .is_host = 1,
                      .expect = 2,
                      .expect_back = 2,
                      .settle_ms = 30000,
                      .prev_rank = 0,
                      .deadline_ms = base_deadline_in(60000)};
  char err[256];
  h->rc = rdzv_join(h->c, &o, &h->plan, err, sizeof err);
  return NULL;
}

/*
 * A replacement that joins the loss's re-form round before a slow survivor does: the round waits
 * for the survivor (it does not plan with node 0 and the replacement, leaving the survivor out,
 * whose agent then had no place in the plan), and takes all three.
 */
static void test_members_first(void) {
  store_server *srv;
  store_client *c = served(&srv), *hc = c != NULL ? client_of(srv) : NULL;
  if (c == NULL || hc == NULL) return;
  host_run h = {.c = hc};
  pthread_t t;
  CHECK_EQ_INT(pthread_create(&t, NULL, host_plans, &h), 0);
  char key[STORE_KEY_MAX];
  rdzv_key(key, sizeof key, "sf", 1, "back");
  const char *k = key;
  CHECK_EQ_INT(store_wait(c, &k, 1, base_deadline_in(10000)), 0); /* node 0 joined */
  joins(c, "sf", 1, -1, 0x2222);                                  /* the replacement */
  usleep(500000);
  rdzv_key(key, sizeof key, "sf", 1, "plan");
  void *val = NULL;
  size_t len = 0;
  CHECK_EQ_INT(store_get(c, key, &val, &len, base_deadline_in(2000)), -ENOENT);
  free(val);
  joins(c, "sf", 1, 1, 0x3333); /* the survivor, late */
  CHECK_EQ_INT(pthread_join(t, NULL), 0);
  CHECK_EQ_INT(h.rc, 0);
  CHECK_EQ_INT(h.plan.nnodes, 3);
  rdzv_plan_free(&h.plan);
  store_client_close(hc);
  store_client_close(c);
  store_server_stop(srv);
}

/* A node joining round `round` of job "lc" with etcd's rule (the first to join plans), MIN 1. */
static int first_joins(store_client *c, int round, rdzv_plan *plan) {
  rdzv_join_opts o = {.job_id = "lc",
                      .round = round,
                      .claimed_rank = -1,
                      .nproc = 1,
                      .nnodes_min = 1,
                      .nnodes_max = 1,
                      .first_plans = 1,
                      .my_host = "127.0.0.1",
                      .deadline_ms = base_deadline_in(10000)};
  char err[256];
  return rdzv_join(c, &o, plan, err, sizeof err);
}

/*
 * With etcd a round's keys die with the node that wrote them last, its join counter among them:
 * a late node must not count 1 in a round planned long ago and plan it again (it planned round
 * 0 alone, beside the survivors' round 1). It is told the round was planned without it.
 */
static void test_late_counts_first(void) {
  store_server *srv;
  store_client *c = served(&srv);
  if (c == NULL) return;
  rdzv_plan plan;
  CHECK_EQ_INT(first_joins(c, 0, &plan), 0); /* round 0 planned, node 0 the first to join */
  CHECK_EQ_INT(plan.nnodes, 1);
  rdzv_plan_free(&plan);
  char key[STORE_KEY_MAX];
  rdzv_key(key, sizeof key, "lc", 0, "joined");
  CHECK_EQ_INT(store_delete(c, key, base_deadline_in(2000)), 0); /* its counter's lease ended */
  CHECK_EQ_INT(first_joins(c, 0, &plan), -EAGAIN);
  CHECK_EQ_INT(plan.nnodes, 1); /* the plan it read, without it */
  rdzv_plan_free(&plan);
  /* A round whose keys are all gone, a later one the latest: told at once. */
  CHECK_EQ_INT(store_set(c, "lc/latest", "5", 1, base_deadline_in(2000)), 0);
  CHECK_EQ_INT(first_joins(c, 3, &plan), -EAGAIN);
  rdzv_plan_free(&plan);
  /* Counted second there, it waits for a plan that will not come: told within a second or so
   * (before, it waited out its deadline). */
  int64_t t0 = base_now_ms();
  CHECK_EQ_INT(first_joins(c, 3, &plan), -EAGAIN);
  CHECK(base_now_ms() - t0 < 9000);
  rdzv_plan_free(&plan);
  store_client_close(c);
  store_server_stop(srv);
}

int main(void) {
  test_parse();
  test_channel();
  test_pending();
  test_members_first();
  test_late_counts_first();
  return check_report();
}

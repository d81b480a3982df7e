/*
 * test_reform.c - the pure parts of --on-failure reform: the control
 * channel's messages (agent_control_parse), a socketpair that carries one
 * message per datagram, and a re-form round's planner with a replacement
 * counted pending (rdzv_mark_pending, a store on loopback).
 */
#include <errno.h>
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

/*
 * A replacement counted pending in the survivors' re-form round (its workers start ahead):
 * the round plans at once with the survivors instead of waiting out the settle time for the
 * node it replaces; never below MIN.
 */
static void test_pending(void) {
  store_server *srv = NULL;
  store_client *c = NULL;
  store_server_opts so = {.bind_host = "127.0.0.1"};
  CHECK_EQ_INT(store_server_start(&so, &srv), 0);
  if (srv == NULL) return;
  char err[256];
  CHECK_EQ_INT(store_client_connect("127.0.0.1", store_server_port(srv), NULL,
                                    base_deadline_in(5000), &c, err, sizeof err),
               0);
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

int main(void) {
  test_parse();
  test_channel();
  test_pending();
  return check_report();
}

/*
 * test_reform.c - the pure parts of --on-failure reform: the control
 * channel's messages (agent_control_parse) and a socketpair that carries
 * one message per datagram.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/control.h"
#include "check.h"

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

int main(void) {
  test_parse();
  test_channel();
  return check_report();
}

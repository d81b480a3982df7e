/* test_base.c - parsing, addresses, deadlines and sockets of src/base. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "tests/check.h"

static void test_parse(void) {
  int v = 0;
  CHECK_EQ_INT(base_parse_int("42", 0, 100, &v), 0);
  CHECK_EQ_INT(v, 42);
  CHECK_EQ_INT(base_parse_int("101", 0, 100, &v), -ERANGE);
  CHECK_EQ_INT(base_parse_int("", 0, 100, &v), -EINVAL);
  CHECK_EQ_INT(base_parse_int(" 4", 0, 100, &v), -EINVAL);
  CHECK_EQ_INT(base_parse_int("4x", 0, 100, &v), -EINVAL);
  CHECK_EQ_INT(base_parse_int("99999999999999999999", 0, 100, &v), -ERANGE);
  uint64_t sz = 0;
  CHECK_EQ_INT(base_parse_size("256M", &sz), 0);
  CHECK_EQ_INT(sz, 256ull << 20);
  CHECK_EQ_INT(base_parse_size("8", &sz), 0);
  CHECK_EQ_INT(sz, 8);
  CHECK_EQ_INT(base_parse_size("1G", &sz), 0);
  CHECK_EQ_INT(sz, 1ull << 30);
  CHECK_EQ_INT(base_parse_size("1T", &sz), -EINVAL);
  CHECK_EQ_INT(base_parse_size("-1", &sz), -EINVAL);
  CHECK_EQ_INT(base_parse_size("99999999999999999999G", &sz), -ERANGE);
  int64_t ms = 0;
  CHECK_EQ_INT(base_parse_seconds("2.5", 100, &ms), 0);
  CHECK_EQ_INT(ms, 2500);
  CHECK_EQ_INT(base_parse_seconds("nan", 100, &ms), -EINVAL);
  CHECK_EQ_INT(base_parse_seconds("-1", 100, &ms), -EINVAL);
  CHECK_EQ_INT(base_parse_seconds("1000", 100, &ms), -ERANGE);
}

static void test_hostport(void) {
  char host[BASE_HOST_MAX];
  int port = 0;
  CHECK_EQ_INT(base_split_hostport("node0:29500", host, sizeof host, &port, 0), 0);
  CHECK_STREQ(host, "node0");
  CHECK_EQ_INT(port, 29500);
  CHECK_EQ_INT(base_split_hostport("[fd00::1]:80", host, sizeof host, &port, 0), 0);
  CHECK_STREQ(host, "fd00::1");
  CHECK_EQ_INT(base_split_hostport(":0", host, sizeof host, &port, 1), 0);
  CHECK_STREQ(host, "");
  CHECK_EQ_INT(base_split_hostport(":0", host, sizeof host, &port, 0), -EINVAL);
  CHECK_EQ_INT(base_split_hostport("node0", host, sizeof host, &port, 0), -EINVAL);
  CHECK_EQ_INT(base_split_hostport("fd00::1:80", host, sizeof host, &port, 0), -EINVAL);
  CHECK_EQ_INT(base_split_hostport("h:70000", host, sizeof host, &port, 0), -EINVAL);
  CHECK_EQ_INT(base_split_hostport("[fd00::1]80", host, sizeof host, &port, 0), -EINVAL);
  char joined[300];
  base_join_hostport("fd00::1", 5, joined, sizeof joined);
  CHECK_STREQ(joined, "[fd00::1]:5");
  base_join_hostport("10.0.0.1", 5, joined, sizeof joined);
  CHECK_STREQ(joined, "10.0.0.1:5");
}

static void test_sockets(void) {
  int lfd = -1, port = 0;
  CHECK_EQ_INT(base_tcp_listen("127.0.0.1", 0, 4, &lfd, &port), 0);
  CHECK(port > 0);
  int cfd = -1;
  CHECK_EQ_INT(base_tcp_connect("127.0.0.1", port, base_deadline_in(2000), &cfd), 0);
  int sfd = accept(lfd, NULL, NULL);
  CHECK(sfd >= 0);
  char buf[4] = {0};
  CHECK_EQ_INT(base_write_full(cfd, "ping", 4, base_deadline_in(1000)), 0);
  CHECK_EQ_INT(base_read_full(sfd, buf, 4, base_deadline_in(1000)), 0);
  CHECK(memcmp(buf, "ping", 4) == 0);
  /* Nothing more arrives: the read must end at its deadline, not hang. */
  int64_t t0 = base_now_ms();
  CHECK_EQ_INT(base_read_full(sfd, buf, 1, base_deadline_in(100)), -ETIMEDOUT);
  CHECK(base_now_ms() - t0 >= 90);
  close(cfd);
  CHECK_EQ_INT(base_read_full(sfd, buf, 1, base_deadline_in(1000)), -ECONNRESET);
  close(sfd);
  close(lfd);
  /* A closed port refuses rather than hanging. */
  int fport = 0;
  CHECK_EQ_INT(base_free_port("127.0.0.1", &fport), 0);
  CHECK(base_tcp_connect("127.0.0.1", fport, base_deadline_in(1000), &cfd) == -ECONNREFUSED);
  /* A name that does not resolve is reported, not retried forever. */
  CHECK(base_tcp_connect("no-such-host.invalid", 1, base_deadline_in(1000), &cfd) < 0);
}

static void test_strerror(void) {
  CHECK_STREQ(cohort_strerror(-ETIMEDOUT), "Connection timed out");
  CHECK(strstr(cohort_strerror(COHORT_EMISMATCH), "different collectives") != NULL);
  CHECK_STREQ(cohort_strerror(-99999), "unknown error");
  CHECK_STREQ(cohort_strerror(12345), "unknown error");
}

int main(void) {
  test_parse();
  test_hostport();
  test_sockets();
  test_strerror();
  return check_report();
}

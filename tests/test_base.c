/*
 * test_base.c - parsing, addresses, deadlines, sockets, random bytes and the
 * Nettle calls of src/base (SHA-256, HMAC-SHA256, base64).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "base/buf.h"
#include "base/proc.h"
#include "base/crypto.h"
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

static void check_hex(const uint8_t d[BASE_SHA256_LEN], const char *want) {
  char hex[2 * BASE_SHA256_LEN + 1];
  base_hex(d, BASE_SHA256_LEN, hex);
  CHECK_STREQ(hex, want);
}

static void test_sha256(void) {
  uint8_t d[BASE_SHA256_LEN];
  /* FIPS 180-4 examples (NIST CSRC "SHA256.pdf"). */
  CHECK_EQ_INT(base_sha256("abc", 3, d), 0);
  check_hex(d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK_EQ_INT(base_sha256("", 0, d), 0);
  check_hex(d, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  CHECK_EQ_INT(base_sha256(two, strlen(two), d), 0);
  check_hex(d, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

/* One RFC 4231 case: the MAC, its check, and the check refusing a flipped bit. */
static void check_hmac(const void *key, size_t keylen, const void *data, size_t len,
                       const char *want) {
  uint8_t d[BASE_SHA256_LEN];
  CHECK_EQ_INT(base_hmac_sha256(key, keylen, data, len, d), 0);
  check_hex(d, want);
  CHECK(base_hmac_sha256_ok(key, keylen, data, len, d));
  d[BASE_SHA256_LEN - 1] ^= 0x80;
  CHECK(!base_hmac_sha256_ok(key, keylen, data, len, d));
}

static void test_hmac_sha256(void) {
  /* RFC 4231 test cases 1, 2, 3, 6 and 7 (6 and 7: a key longer than a block). */
  uint8_t key[131], data[50];
  memset(key, 0x0b, 20);
  check_hmac(key, 20, "Hi There", 8,
             "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  check_hmac("Jefe", 4, "what do ya want for nothing?", 28,
             "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  memset(key, 0xaa, 20);
  memset(data, 0xdd, 50);
  check_hmac(key, 20, data, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  memset(key, 0xaa, 131);
  const char *t6 = "Test Using Larger Than Block-Size Key - Hash Key First";
  check_hmac(key, 131, t6, strlen(t6),
             "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  const char *t7 = "This is a test using a larger than block-size key and a larger than "
                   "block-size data. The key needs to be hashed before being used by the HMAC "
                   "algorithm.";
  check_hmac(key, 131, t7, strlen(t7),
             "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

/* RFC 4648's test vectors, both ways; then what is not base64. */
static void test_b64(void) {
  static const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
  static const char *coded[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
  for (size_t i = 0; i < BASE_ARRAY_LEN(plain); i++) {
    char text[16], back[16];
    size_t n = strlen(plain[i]), got = 99;
    CHECK_EQ_INT((int)BASE_B64_LEN(n), (int)strlen(coded[i]));
    base_b64_encode(plain[i], n, text);
    CHECK_STREQ(text, coded[i]);
    CHECK_EQ_INT(base_b64_decode(coded[i], strlen(coded[i]), back, &got), 0);
    CHECK_EQ_INT((int)got, (int)n);
    CHECK(memcmp(back, plain[i], n) == 0);
  }
  uint8_t bytes[3] = {0xfb, 0xff, 0x00}; /* the characters past Z, z and 9 */
  char text[8];
  base_b64_encode(bytes, sizeof bytes, text);
  CHECK_STREQ(text, "+/8A");
  char back[8];
  size_t got;
  CHECK_EQ_INT(base_b64_decode("Zm9v!mFy", 8, back, &got), -EINVAL);
  CHECK_EQ_INT(base_b64_decode("Zm9vY===", 8, back, &got), -EINVAL);
  CHECK_EQ_INT(base_b64_decode("Zm9vYg", 6, back, &got), -EINVAL);
}

static void test_random_bytes(void) {
  uint8_t a[32], b[32], zero[32] = {0};
  CHECK_EQ_INT(base_random_bytes(a, sizeof a), 0);
  CHECK_EQ_INT(base_random_bytes(b, sizeof b), 0);
  /* 2^-256 odds of a false failure for each check. */
  CHECK(memcmp(a, b, sizeof a) != 0);
  CHECK(memcmp(a, zero, sizeof a) != 0);
}

/* The text buffer: appends past the first allocation, take, a sticky failure. */
static void test_buf(void) {
  base_buf b = {0};
  char *text = NULL;
  size_t len = 99;
  CHECK_EQ_INT(base_buf_take(&b, &text, &len), 0);
  CHECK(text != NULL && text[0] == '\0' && len == 0);
  free(text);
  for (int i = 0; i < 1000; i++) base_buf_printf(&b, "%d,", i % 10);
  base_buf_puts(&b, "end");
  base_buf_putn(&b, "xyz", 1);
  CHECK(b.data != NULL && b.len == 2004 && strlen(b.data) == 2004);
  CHECK(b.len < b.cap && strncmp(b.data, "0,1,2,", 6) == 0 && strcmp(b.data + 2000, "endx") == 0);
  CHECK_EQ_INT(base_buf_take(&b, &text, &len), 0);
  CHECK(len == 2004 && b.data == NULL && b.len == 0 && b.cap == 0);
  free(text);
  base_buf_puts(&b, "kept");
  b.oom = 1; /* as after a failed realloc: later appends do nothing */
  base_buf_puts(&b, " lost");
  CHECK(strcmp(b.data, "kept") == 0);
  text = NULL;
  CHECK_EQ_INT(base_buf_take(&b, &text, NULL), -ENOMEM);
  CHECK(text == NULL && b.data == NULL && b.oom == 0);
  base_buf_puts(&b, "again");
  CHECK(b.data != NULL && strcmp(b.data, "again") == 0);
  base_buf_free(&b);
  CHECK(b.data == NULL && b.len == 0);
}

/* /proc/PID/stat: a command name with ") (" in it, bad text, a fixture root, this process. */
static void test_proc_stat(void) {
  base_proc_stat s;
  const char *line = "4242 (a) b (c) T 17 4242 4242 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 1 0";
  CHECK_EQ_INT(base_proc_stat_parse(line, &s), 0);
  CHECK(s.pid == 4242 && s.ppid == 17 && s.state == 'T' && s.utime == 250 && s.stime == 31);
  CHECK_EQ_INT(base_proc_stat_parse("4242 (no close paren S 1", &s), -EPROTO);
  CHECK_EQ_INT(base_proc_stat_parse("4242 (x) S 1 2", &s), -EPROTO);
  CHECK_EQ_INT(base_proc_stat_parse("", &s), -EPROTO);
  char root[] = "/tmp/test_base_procXXXXXX", path[128];
  CHECK(mkdtemp(root) != NULL);
  snprintf(path, sizeof path, "%s/4242", root);
  CHECK_EQ_INT(mkdir(path, 0700), 0);
  snprintf(path, sizeof path, "%s/4242/stat", root);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (f != NULL) {
    fputs(line, f);
    fclose(f);
  }
  memset(&s, 0, sizeof s);
  CHECK_EQ_INT(base_proc_stat_read(root, 4242, &s), 0);
  CHECK(s.pid == 4242 && s.ppid == 17 && s.state == 'T');
  CHECK_EQ_INT(base_proc_stat_read(root, 4243, &s), -ESRCH);
  unlink(path);
  snprintf(path, sizeof path, "%s/4242", root);
  rmdir(path);
  rmdir(root);
  CHECK_EQ_INT(base_proc_stat_read("/proc", getpid(), &s), 0);
  CHECK(s.pid == getpid() && s.ppid == getppid() && s.state == 'R');
}

int main(void) {
  test_parse();
  test_proc_stat();
  test_buf();
  test_hostport();
  test_sockets();
  test_strerror();
  test_sha256();
  test_hmac_sha256();
  test_b64();
  test_random_bytes();
  return check_report();
}

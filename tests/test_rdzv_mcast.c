/*
 * test_rdzv_mcast.c - the node driver of tests/test_rdzv_mcast.sh, run inside a
 * network namespace: discovers the store of --job by multicast; a hosting
 * node listens on the chosen address, publishes it and greets --expect
 * joiners with its job id and address; a joining node connects to what it
 * found and checks the greeting. A --rogue node announces a store that does
 * not exist (with whatever --token it is given) to show joiners ignore it.
 *
 * Prints one line: "HOSTED job=J addr=H:P ms=T", "JOINED job=J addr=H:P ms=T"
 * (T: milliseconds rdzv_discover took) or "ERROR ..."; exits 0 only on success.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "rdzv/discover.h"

static int usage(void) {
  fprintf(stderr, "usage: test_rdzv_mcast --job J [--rank R] [--token T] [--iface I] [--group "
                  "ADDR:PORT] [--settle MS] [--timeout MS] [--expect N] [--rogue MS]\n");
  return 2;
}

static int host(const rdzv_opts *o, const rdzv_target *t, int expect, int64_t deadline,
                int64_t ms) {
  char err[256], addr[BASE_HOST_MAX + 16], greeting[512];
  int lfd, port;
  int rc = base_tcp_listen(t->host, t->port, 16, &lfd, &port);
  if (rc != 0) {
    printf("ERROR listen %s:%d: %s\n", t->host, t->port, cohort_strerror(rc));
    return 1;
  }
  rdzv_publisher *pub = NULL;
  rc = rdzv_publish_start(o, NULL, port, &pub, err, sizeof err);
  if (rc != 0) {
    printf("ERROR publish: %s\n", err);
    return 1;
  }
  base_join_hostport(t->host, port, addr, sizeof addr);
  printf("HOSTED job=%s addr=%s ms=%lld\n", o->job_id, addr, (long long)ms);
  fflush(stdout);
  snprintf(greeting, sizeof greeting, "cohort-rdzv-test job=%s addr=%s\n", o->job_id, addr);
  int served = 0;
  while (served < expect) {
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    int n = poll(&p, 1, base_deadline_left(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) continue;
    if (base_write_full(c, greeting, strlen(greeting), base_deadline_in(2000)) == 0) served++;
    close(c);
  }
  /* All joined: the agent would stop announcing now. */
  rdzv_publish_stop(pub);
  close(lfd);
  if (served < expect) {
    fprintf(stderr, "host %s: only %d of %d joiners arrived\n", addr, served, expect);
    return 1;
  }
  return 0;
}

static int join(const rdzv_opts *o, const rdzv_target *t, int64_t deadline, int64_t ms) {
  char addr[BASE_HOST_MAX + 16], want[512], got[512];
  base_join_hostport(t->host, t->port, addr, sizeof addr);
  snprintf(want, sizeof want, "cohort-rdzv-test job=%s addr=%s\n", o->job_id, addr);
  /* The store may still be starting: retry, bounded by the deadline. */
  for (;;) {
    int fd;
    int rc = base_tcp_connect(t->host, t->port, base_deadline_in(1000), &fd);
    if (rc == 0) {
      size_t len = strlen(want);
      memset(got, 0, sizeof got);
      rc = base_read_full(fd, got, len, base_deadline_in(3000));
      close(fd);
      if (rc == 0 && strcmp(got, want) == 0) {
        printf("JOINED job=%s addr=%s ms=%lld\n", o->job_id, addr, (long long)ms);
        return 0;
      }
      printf("ERROR wrong greeting from %s: '%.*s'\n", addr, (int)strcspn(got, "\n"), got);
      return 1;
    }
    if (base_deadline_left(deadline) == 0) {
      printf("ERROR cannot connect to %s: %s\n", addr, cohort_strerror(rc));
      return 1;
    }
    base_sleep_ms(100);
  }
}

int main(int argc, char **argv) {
  rdzv_opts o = {.method = RDZV_MCAST, .node_rank = -1};
  int timeout_ms = 8000, expect = 0, rogue_ms = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) return usage();
    i++;
    if (strcmp(a, "--job") == 0)
      o.job_id = v;
    else if (strcmp(a, "--rank") == 0 && base_parse_int(v, 0, 4095, &o.node_rank) == 0)
      continue;
    else if (strcmp(a, "--token") == 0)
      o.token = v;
    else if (strcmp(a, "--iface") == 0)
      o.iface = v;
    else if (strcmp(a, "--group") == 0)
      o.mcast_group = v;
    else if (strcmp(a, "--settle") == 0 && base_parse_int(v, 1, 60000, &o.settle_ms) == 0)
      continue;
    else if (strcmp(a, "--timeout") == 0 && base_parse_int(v, 1, 600000, &timeout_ms) == 0)
      continue;
    else if (strcmp(a, "--expect") == 0 && base_parse_int(v, 0, 64, &expect) == 0)
      continue;
    else if (strcmp(a, "--rogue") == 0 && base_parse_int(v, 1, 60000, &rogue_ms) == 0)
      continue;
    else
      return usage();
  }
  if (o.job_id == NULL) return usage();
  int64_t deadline = base_deadline_in(timeout_ms);
  o.deadline_ms = deadline;
  char err[256];
  if (rogue_ms > 0) {
    /* Announces a store at port 1 of this node, where nothing listens. */
    rdzv_publisher *pub = NULL;
    if (rdzv_publish_start(&o, NULL, 1, &pub, err, sizeof err) != 0) {
      printf("ERROR rogue publish: %s\n", err);
      return 1;
    }
    base_sleep_ms(rogue_ms);
    rdzv_publish_stop(pub);
    printf("ROGUE job=%s done\n", o.job_id);
    return 0;
  }
  rdzv_target t;
  int64_t t0 = base_now_ms();
  int rc = rdzv_discover(&o, NULL, &t, err, sizeof err);
  int64_t ms = base_now_ms() - t0; /* discovery time, printed for the script's summary */
  if (rc != 0) {
    printf("ERROR discover: %s\n", err);
    return 1;
  }
  fprintf(stderr, "%s\n", t.source);
  return t.host_store ? host(&o, &t, expect, deadline, ms) : join(&o, &t, deadline, ms);
}

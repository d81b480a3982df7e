/*
 * test_rdzv.c - discovery: Slurm hostlists, every scheduler environment and
 * its conflicts, the static method's hosting decision, the rank plan with
 * uneven slots, joining over a store (the plan in pages), the shared file
 * (format, stale and malformed files, atomic replace, processes racing to
 * host).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "rdzv/discover.h"
#include "rdzv/internal.h"
#include "rdzv/join.h"
#include "rdzv/where.h"
#include "store/store.h"
#include "tests/check.h"

static char tmpdir[256];

/* ---- hostlists ---- */

/* Expands expr and compares with the space-separated names in want. */
static int hostlist_is(const char *expr, const char *want) {
  char **hosts;
  size_t n;
  if (rdzv_hostlist_expand(expr, RDZV_HOSTLIST_MAX, &hosts, &n) != 0) return 0;
  char joined[4096] = "";
  for (size_t i = 0; i < n; i++) {
    if (i) strcat(joined, " ");
    strcat(joined, hosts[i]);
  }
  rdzv_hostlist_free(hosts, n);
  if (strcmp(joined, want) != 0) fprintf(stderr, "  %s -> '%s', want '%s'\n", expr, joined, want);
  return strcmp(joined, want) == 0;
}

static int hostlist_rc(const char *expr, size_t max) {
  char **hosts;
  size_t n;
  int rc = rdzv_hostlist_expand(expr, max, &hosts, &n);
  if (rc == 0)
    rdzv_hostlist_free(hosts, n);
  else
    CHECK(hosts == NULL && n == 0);
  return rc;
}

/* Random expressions over the hostlist alphabet: never a crash, a leak or a wrong count. */
static void test_hostlist_random(void) {
  static const char alphabet[] = "ab0129[]-,.";
  uint32_t x = 777;
  int ok = 0;
  for (int iter = 0; iter < 20000; iter++) {
    char expr[24];
    x = x * 1103515245u + 12345u;
    size_t len = 1 + (x >> 16) % (sizeof expr - 1);
    for (size_t k = 0; k < len; k++) {
      x = x * 1103515245u + 12345u;
      expr[k] = alphabet[(x >> 16) % (sizeof alphabet - 1)];
    }
    expr[len] = '\0';
    char **hosts;
    size_t n;
    int rc = rdzv_hostlist_expand(expr, 1000, &hosts, &n);
    CHECK(rc == 0 || rc == -EINVAL || rc == COHORT_ELIMIT);
    if (rc == 0) {
      ok++;
      CHECK(n >= 1 && n <= 1000);
      for (size_t k = 0; k < n; k++) CHECK(hosts[k][0] != '\0' && strchr(hosts[k], '[') == NULL);
      rdzv_hostlist_free(hosts, n);
    }
  }
  printf("random hostlists expanded: %d of 20000\n", ok);
}

static void test_hostlist(void) {
  CHECK(hostlist_is("node[01-04,07]", "node01 node02 node03 node04 node07"));
  CHECK(hostlist_is("a[1-2]b[3-4]", "a1b3 a1b4 a2b3 a2b4"));
  CHECK(hostlist_is("x1,y[2-3]", "x1 y2 y3"));
  CHECK(hostlist_is("n[8-10]", "n8 n9 n10"));
  CHECK(hostlist_is("n[008-010]", "n008 n009 n010"));
  CHECK(hostlist_is("gpu-[1-2]-ib", "gpu-1-ib gpu-2-ib"));
  CHECK(hostlist_is("single", "single"));
  CHECK(hostlist_is("r[1-2]n[1],c[5]", "r1n1 r2n1 c5"));
  CHECK(hostlist_is("a.b_c-d[0]", "a.b_c-d0"));
  const char *bad[] = {
      "",        "node[",  "node[1-",  "node[3-1]", "node[a-b]", "a,,b",  "a,",
      ",a",      "node]1", "node[1]]", "n[[1]]",    "has space", "n[1,]", "n[,1]",
      "n[1--2]", "n[]",    "n[-1]",    "n[1]x]",    "n[1-2",     "a;b",   "n[1234567890123456789]"};
  for (size_t i = 0; i < BASE_ARRAY_LEN(bad); i++) {
    int rc = hostlist_rc(bad[i], RDZV_HOSTLIST_MAX);
    if (rc != -EINVAL) fprintf(stderr, "  '%s' gave %d\n", bad[i], rc);
    CHECK_EQ_INT(rc, -EINVAL);
  }
  /* Counted before allocating: refused quickly, not expanded. */
  int64_t t0 = base_now_ms();
  CHECK_EQ_INT(hostlist_rc("node[0-99999999]", RDZV_HOSTLIST_MAX), COHORT_ELIMIT);
  CHECK_EQ_INT(hostlist_rc("a[0-999]b[0-999]", RDZV_HOSTLIST_MAX), COHORT_ELIMIT);
  CHECK_EQ_INT(hostlist_rc("n[0-999999999999999999]", RDZV_HOSTLIST_MAX), COHORT_ELIMIT);
  CHECK(base_now_ms() - t0 <
        10000); /* microseconds; expanding n[0-999999999999999999] never ends */
  CHECK_EQ_INT(hostlist_rc("n[1-4]", 4), 0);
  CHECK_EQ_INT(hostlist_rc("n[1-4],m", 4), COHORT_ELIMIT);
  CHECK_EQ_INT(hostlist_rc("n[1-5]", 4), COHORT_ELIMIT);
  /* A name longer than a host name may be is malformed, not truncated. */
  char longname[300];
  memset(longname, 'a', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  CHECK_EQ_INT(hostlist_rc(longname, RDZV_HOSTLIST_MAX), -EINVAL);
}

/* ---- scheduler environments ---- */

static rdzv_opts base_opts(void) {
  rdzv_opts o = {0};
  o.method = RDZV_AUTO;
  o.node_rank = -1;
  o.deadline_ms = base_deadline_in(5000);
  return o;
}

static int disc(const rdzv_opts *o, char **env, rdzv_target *t, char *err) {
  int rc = rdzv_discover(o, env, t, err, 256);
  if (rc != 0) {
    CHECK(strlen(err) > 0 && strchr(err, '\n') == NULL);
  }
  return rc;
}

static void test_slurm(void) {
  rdzv_opts o = base_opts();
  rdzv_target t;
  char err[256];
  char *env[] = {"SLURM_JOB_ID=1042",
                 "SLURM_NODEID=1",
                 "SLURM_NNODES=4",
                 "SLURM_JOB_NODELIST=node[01-04]",
                 "SLURM_PROCID=1",
                 "PATH=/bin",
                 NULL};
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_STREQ(t.host, "node01");
  CHECK_EQ_INT(t.port, RDZV_DEFAULT_PORT + 42);
  CHECK_EQ_INT(t.node_rank, 1);
  CHECK_EQ_INT(t.host_store, 0);
  CHECK_EQ_INT(t.nnodes_min, 4);
  CHECK_EQ_INT(t.nnodes_max, 4);
  CHECK(strstr(t.source, "slurm job 1042") != NULL);
  CHECK(strstr(t.source, "node01") != NULL);
  /* RDZV_ENV requires it and gives the same. */
  o.method = RDZV_ENV;
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_STREQ(t.host, "node01");
  /* Node 0 hosts. */
  env[1] = "SLURM_NODEID=0";
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 1);
  CHECK_EQ_INT(t.node_rank, 0);
  /* Explicit --master: its port (":PORT" keeps node 0 of the list), or host and port. */
  o.master = ":29999";
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_STREQ(t.host, "node01");
  CHECK_EQ_INT(t.port, 29999);
  o.master = "login1:2000";
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_STREQ(t.host, "login1");
  CHECK_EQ_INT(t.port, 2000);
  o.master = NULL;
  /* Agreeing flags are fine; conflicting ones name both values. */
  o.node_rank = 0;
  o.nnodes_min = o.nnodes_max = 4;
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  o.node_rank = 1;
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  CHECK(strstr(err, "--node-rank 1") != NULL && strstr(err, "SLURM_NODEID=0") != NULL);
  o.node_rank = -1;
  o.nnodes_min = o.nnodes_max = 2;
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  CHECK(strstr(err, "--nnodes 2") != NULL && strstr(err, "SLURM_NNODES=4") != NULL);
  o.nnodes_min = 2;
  o.nnodes_max = 8; /* an elastic range that contains the count is not a conflict */
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_EQ_INT(t.nnodes_min, 4);
  o.nnodes_min = o.nnodes_max = 0;
  /* A step's own list, count and relative node id take precedence over the job's. */
  char *step[] = {"SLURM_JOB_ID=7",         "SLURM_NODEID=1",
                  "SLURM_NNODES=8",         "SLURM_JOB_NODELIST=big[1-8]",
                  "SLURM_STEP_NUM_NODES=2", "SLURM_STEP_NODELIST=big[3-4]",
                  "SLURM_STEP_NUM_TASKS=2", NULL};
  CHECK_EQ_INT(disc(&o, step, &t, err), 0);
  CHECK_STREQ(t.host, "big3");
  CHECK_EQ_INT(t.nnodes_max, 2);
  CHECK_EQ_INT(t.port, RDZV_DEFAULT_PORT + 7);
  step[6] = "SLURM_STEP_NUM_TASKS=16";
  CHECK_EQ_INT(disc(&o, step, &t, err), -EINVAL);
  CHECK(strstr(err, "ntasks-per-node=1") != NULL);
  /* Malformed values: one line each. */
  struct {
    const char *var;
    const char *value;
    const char *expect;
  } bad[] = {
      {"SLURM_NODEID", "SLURM_NODEID=x", "SLURM_NODEID='x'"},
      {"SLURM_NODEID", "SLURM_NODEID=4", "SLURM_NODEID=4 is not below SLURM_NNODES=4"},
      {"SLURM_NODEID", "SLURM_NODEID=-1", "SLURM_NODEID"},
      {"SLURM_NNODES", "SLURM_NNODES=0", "SLURM_NNODES"},
      {"SLURM_NNODES", "SLURM_NNODES=3", "names 4 hosts but SLURM_NNODES=3"},
      {"SLURM_JOB_NODELIST", "SLURM_JOB_NODELIST=node[01-", "not a valid Slurm hostlist"},
      {"SLURM_JOB_NODELIST", "SLURM_JOB_NODELIST=node[0-99999999]", "more than"},
      {"SLURM_JOB_ID", "SLURM_JOB_ID=abc", "SLURM_JOB_ID"},
  };
  for (size_t i = 0; i < BASE_ARRAY_LEN(bad); i++) {
    char *e[] = {"SLURM_JOB_ID=1042", "SLURM_NODEID=1", "SLURM_NNODES=4",
                 "SLURM_JOB_NODELIST=node[01-04]", NULL};
    for (size_t k = 0; e[k]; k++)
      if (strncmp(e[k], bad[i].var, strlen(bad[i].var)) == 0 && e[k][strlen(bad[i].var)] == '=')
        e[k] = (char *)bad[i].value;
    int rc = disc(&o, e, &t, err);
    CHECK_EQ_INT(rc, -EINVAL);
    if (strstr(err, bad[i].expect) == NULL) fprintf(stderr, "  %s: '%s'\n", bad[i].value, err);
    CHECK(strstr(err, bad[i].expect) != NULL);
  }
  char *nolist[] = {"SLURM_JOB_ID=5", "SLURM_NODEID=0", "SLURM_NNODES=2", NULL};
  CHECK_EQ_INT(disc(&o, nolist, &t, err), -EINVAL);
  CHECK(strstr(err, "NODELIST") != NULL);
}

static void test_k8s(void) {
  rdzv_opts o = base_opts();
  rdzv_target t;
  char err[256];
  char *env[] = {"JOB_COMPLETION_INDEX=2", "HOSTNAME=train-2", NULL};
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  CHECK(strstr(err, "--master") != NULL);
  o.master = "train-0.train:29400";
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_STREQ(t.host, "train-0.train");
  CHECK_EQ_INT(t.port, 29400);
  CHECK_EQ_INT(t.node_rank, 2);
  CHECK_EQ_INT(t.host_store, 0);
  CHECK(strstr(t.source, "kubernetes") != NULL);
  env[0] = "JOB_COMPLETION_INDEX=0";
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 1);
  /* The manifest passes --node-rank $(JOB_COMPLETION_INDEX): equal, fine; different, refused. */
  o.node_rank = 0;
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  o.node_rank = 3;
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  CHECK(strstr(err, "--node-rank 3") && strstr(err, "JOB_COMPLETION_INDEX=0"));
  o.node_rank = -1;
  env[0] = "JOB_COMPLETION_INDEX=4";
  o.nnodes_min = o.nnodes_max = 4;
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  CHECK(strstr(err, "JOB_COMPLETION_INDEX=4 is not below --nnodes 4") != NULL);
  o.nnodes_min = o.nnodes_max = 0;
  env[0] = "JOB_COMPLETION_INDEX=two";
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  o.master = "train-0.train"; /* no port */
  env[0] = "JOB_COMPLETION_INDEX=1";
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  CHECK(strstr(err, "--master") != NULL);
}

static void test_replica(void) {
  rdzv_opts o = base_opts();
  rdzv_target t;
  char err[256];
  char *env[] = {"MASTER_ADDR=job-master-0", "MASTER_PORT=23456", "RANK=2", "WORLD_SIZE=3", NULL};
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_STREQ(t.host, "job-master-0");
  CHECK_EQ_INT(t.port, 23456);
  CHECK_EQ_INT(t.node_rank, 2);
  CHECK_EQ_INT(t.nnodes_min, 3);
  CHECK_EQ_INT(t.nnodes_max, 3);
  CHECK_EQ_INT(t.host_store, 0);
  env[2] = "RANK=0";
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 1);
  /* --master overrides the environment's address (the port torch's own store would use). */
  o.master = "job-master-0:29400";
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_EQ_INT(t.port, 29400);
  o.master = NULL;
  env[2] = "RANK=3";
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  CHECK(strstr(err, "RANK=3 is not below WORLD_SIZE=3") != NULL);
  env[2] = "RANK=1";
  env[1] = "MASTER_PORT=http";
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  CHECK(strstr(err, "MASTER_PORT") != NULL);
  env[1] = "MASTER_PORT=23456";
  o.nnodes_min = o.nnodes_max = 2;
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  CHECK(strstr(err, "--nnodes 2") && strstr(err, "WORLD_SIZE=3"));
  o.nnodes_min = o.nnodes_max = 0;
  /* Only some of the four set: not a replica environment, so static (which needs --master). */
  char *partial[] = {"MASTER_ADDR=x", "RANK=1", NULL};
  CHECK_EQ_INT(disc(&o, partial, &t, err), -ENOENT);
  CHECK(strstr(err, "--master") != NULL);
}

static void test_ompi(void) {
  rdzv_opts o = base_opts();
  rdzv_target t;
  char err[256];
  char *env[] = {"OMPI_COMM_WORLD_RANK=1",
                 "OMPI_COMM_WORLD_SIZE=4",
                 "OMPI_COMM_WORLD_LOCAL_SIZE=1",
                 "SLURM_JOB_ID=9",
                 "SLURM_NODEID=0",
                 "SLURM_NNODES=4",
                 "SLURM_JOB_NODELIST=n[1-4]",
                 NULL};
  /* mpirun's variables win over inherited Slurm ones, and the store must be given. */
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  CHECK(strstr(err, "--master") != NULL);
  o.master = "[fd00::1]:29400";
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_STREQ(t.host, "fd00::1");
  CHECK_EQ_INT(t.node_rank, 1);
  CHECK_EQ_INT(t.nnodes_max, 4);
  CHECK(strstr(t.source, "open mpi") != NULL);
  env[2] = "OMPI_COMM_WORLD_LOCAL_SIZE=8";
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  CHECK(strstr(err, "ppr:1:node") != NULL);
  env[2] = "OMPI_COMM_WORLD_LOCAL_SIZE=1";
  env[1] = "OMPI_COMM_WORLD_SIZE=1";
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  char *nosize[] = {"OMPI_COMM_WORLD_RANK=0", NULL};
  CHECK_EQ_INT(disc(&o, nosize, &t, err), -EINVAL);
}

static void test_no_env(void) {
  rdzv_opts o = base_opts();
  rdzv_target t;
  char err[256];
  char *env[] = {"HOME=/root", NULL};
  o.method = RDZV_ENV;
  CHECK_EQ_INT(disc(&o, env, &t, err), -ENOENT);
  CHECK(strstr(err, "no scheduler environment") != NULL);
  CHECK_EQ_INT(disc(&o, NULL, &t, err), -ENOENT);
  o.method = RDZV_AUTO;
  CHECK_EQ_INT(disc(&o, env, &t, err), -ENOENT);
  CHECK(strstr(err, "--master") != NULL);
  /* Options checked before anything else. */
  o.master = "127.0.0.1:1";
  o.node_rank = 4;
  o.nnodes_min = o.nnodes_max = 4;
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  o.node_rank = -1;
  o.job_id = "has space";
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
  o.job_id = NULL;
  o.method = (rdzv_method)42;
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
}

/* ---- static ---- */

static int has_ipv6_loopback(void) {
  FILE *f = fopen("/proc/net/if_inet6", "r");
  if (f == NULL) return 0;
  char line[256];
  int found = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "00000000000000000000000000000001", 32) == 0) found = 1;
  fclose(f);
  return found;
}

/* etcd: the endpoints in any order name the same target (the job id derives from it). */
static void test_etcd_target(void) {
  rdzv_opts o = base_opts();
  rdzv_target t;
  char err[256];
  char *env[] = {NULL};
  o.method = RDZV_ETCD;
  const char *lists[] = {"10.0.0.2:2379,10.0.0.1:2379,10.0.0.10:2379",
                         "10.0.0.1:2379,10.0.0.10:2379,10.0.0.2:2379",
                         "10.0.0.10:2379,10.0.0.1:2379"};
  char first[sizeof t.host] = "";
  for (int i = 0; i < 3; i++) {
    o.master = lists[i];
    CHECK_EQ_INT(disc(&o, env, &t, err), 0);
    if (i == 0) snprintf(first, sizeof first, "%s", t.host);
    CHECK_STREQ(t.host, first); /* the least as text: 10.0.0.10 sorts before 10.0.0.1: */
    CHECK_EQ_INT(t.port, 2379);
    CHECK_EQ_INT(t.host_store, 0);
  }
  CHECK_STREQ(first, "10.0.0.10");
  o.master = "10.0.0.1:2379,,10.0.0.2:2379";
  CHECK(disc(&o, env, &t, err) != 0);
  o.master = NULL;
  CHECK(disc(&o, env, &t, err) != 0);
}

static void test_static(void) {
  rdzv_opts o = base_opts();
  rdzv_target t;
  char err[256];
  char *env[] = {NULL};
  o.method = RDZV_STATIC;
  o.master = "127.0.0.1:29400";
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 1);
  CHECK_EQ_INT(t.node_rank, -1);
  CHECK_STREQ(t.host, "127.0.0.1");
  CHECK_EQ_INT(t.port, 29400);
  o.master = "localhost:29400";
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 1);
  o.master = "192.0.2.1:29400"; /* TEST-NET-1: never a local address */
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 0);
  if (has_ipv6_loopback()) {
    o.master = "[::1]:29400";
    CHECK_EQ_INT(disc(&o, env, &t, err), 0);
    CHECK_EQ_INT(t.host_store, 1);
    CHECK_STREQ(t.host, "::1");
  } else {
    printf("note: no ::1 on this machine, IPv6 loopback hosting not checked\n");
  }
  o.master = "[2001:db8::1]:29400";
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 0);
  /* This machine's own name, also with a domain after it (pod name vs. service name). */
  char self[256] = "", withdomain[300];
  gethostname(self, sizeof self - 1);
  snprintf(withdomain, sizeof withdomain, "%s.svc-x:5", self);
  o.master = withdomain;
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 1);
  /* A name that does not resolve (yet) is a joiner, not an error, and is decided within the
   * deadline (300 ms here), not after the resolver's own timeouts (5 s and more). */
  o.master = "cohort-test-nonexistent.invalid:29400";
  int64_t t0 = base_now_ms();
  o.deadline_ms = base_deadline_in(300);
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 0);
  CHECK(base_now_ms() - t0 < 3000);
  o.deadline_ms = base_opts().deadline_ms;
  CHECK_STREQ(t.host, "cohort-test-nonexistent.invalid");
  /* With a node rank the rank decides, resolution or not. */
  o.node_rank = 0;
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 1);
  CHECK_EQ_INT(t.node_rank, 0);
  o.node_rank = 2;
  o.master = "127.0.0.1:29400";
  CHECK_EQ_INT(disc(&o, env, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 0);
  CHECK_EQ_INT(t.node_rank, 2);
  o.node_rank = -1;
  const char *bad[] = {"nohost", "h:0", "h:70000", ":5", "fd00::1:5", "[fd00::1]5", "h:-1", ""};
  for (size_t i = 0; i < BASE_ARRAY_LEN(bad); i++) {
    o.master = bad[i];
    CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
    CHECK(strstr(err, "--master") != NULL);
  }
  o.master = NULL;
  CHECK_EQ_INT(disc(&o, env, &t, err), -EINVAL);
}

/* ---- the rank plan ---- */

/* A plan of three nodes with uneven slots (2, 1, 3), as node 0 publishes it: each node's first
 * global rank is the sum of the slots before it, not node rank x slots; the world is the sum.
 * Node 0 finds itself in the head; the others in their page, knowing node 0 and themselves. */
static void test_plan_ranks(void) {
  const char *head = "ok nnodes=3 master=10.0.0.1 port=29500 world=6 store=29401\n"
                     "0 00000000000000a0 2 10.0.0.1 n0\n";
  const char *page = "1 0 0 00000000000000a0 2 10.0.0.1 n0\n"
                     "2 2 3 00000000000000c2 3 10.0.0.3 n2\n"
                     "3 1 2 00000000000000b1 1 10.0.0.2 n1\n";
  static const uint64_t uid[3] = {0xa0, 0xb1, 0xc2};
  static const int nproc[3] = {2, 1, 3}, first[3] = {0, 2, 3};
  for (int me = 0; me < 3; me++) {
    rdzv_plan p = {0};
    char err[128] = "";
    CHECK_EQ_INT(rdzv_plan_parse(head, me == 0 ? NULL : page, uid[me], &p, err, sizeof err), 0);
    CHECK_EQ_INT(p.nnodes, 3);
    CHECK_EQ_INT(p.world_size, 6);
    CHECK_EQ_INT(p.my_index, me);
    CHECK_EQ_INT(p.master_port, 29500);
    CHECK_EQ_INT(p.store_port, 29401);
    for (int n = 0; n < 3 && p.nodes != NULL; n++) {
      if (n != 0 && n != me) {
        CHECK_EQ_INT(p.nodes[n].node_rank, -1);
        continue;
      }
      CHECK_EQ_INT(p.nodes[n].node_rank, n);
      CHECK_EQ_INT(p.nodes[n].nproc, nproc[n]);
      CHECK_EQ_INT(p.nodes[n].rank_offset, first[n]);
      CHECK_EQ_INT(p.nodes[n].uid, uid[n]);
    }
    rdzv_plan_free(&p);
  }
  /* Left out: the plan's node count, -ESRCH. A place outside the world: malformed. */
  rdzv_plan p = {0};
  char err[128] = "";
  CHECK_EQ_INT(rdzv_plan_parse(head, page, 0xdd, &p, err, sizeof err), -ESRCH);
  CHECK_EQ_INT(p.nnodes, 3);
  CHECK(p.nodes == NULL);
  CHECK_EQ_INT(rdzv_plan_parse(head, "1 2 5 00000000000000c2 3 h n\n", 0xc2, &p, err, sizeof err),
               -EPROTO);
  CHECK_EQ_INT(rdzv_plan_parse("ok nnodes=3 master=h port=1 world=2\n0 a0 1 h n\n", NULL, 0xa0, &p,
                               err, sizeof err),
               -EPROTO);
}

/* ---- joining over the store: a plan in pages ---- */

#define JOIN_NODES (2 * RDZV_PLAN_PAGE + 3) /* three pages, the last one part full */

typedef struct joiner {
  int port, index, rc;
  rdzv_plan plan;
  char err[256];
} joiner;

static void *join_main(void *arg) {
  joiner *j = arg;
  store_client *c = NULL;
  j->rc = store_client_connect("127.0.0.1", j->port, NULL, base_deadline_in(20000), &c, j->err,
                               sizeof j->err);
  if (j->rc != 0) return NULL;
  rdzv_join_opts o = {.job_id = "pages",
                      .is_host = j->index == 0,
                      .claimed_rank = -1,
                      .nproc = 1 + j->index % 3,
                      .nnodes_min = JOIN_NODES,
                      .nnodes_max = JOIN_NODES,
                      .my_host = "127.0.0.1",
                      .master_host = j->index == 0 ? NULL : "127.0.0.1",
                      .deadline_ms = base_deadline_in(30000)};
  j->rc = rdzv_join(c, &o, &j->plan, j->err, sizeof j->err);
  store_client_close(c);
  return NULL;
}

/* What a node other than node 0 knows: node 0, and itself as node 0 placed it. */
static void check_joiner(const joiner *j, const rdzv_plan *full, int *seen) {
  const rdzv_plan *p = &j->plan;
  CHECK_EQ_INT(p->nnodes, JOIN_NODES);
  CHECK_EQ_INT(p->world_size, full->world_size);
  CHECK_EQ_INT(p->master_port, full->master_port);
  int me = p->my_index;
  CHECK(me >= 1 && me < JOIN_NODES);
  if (me < 1 || me >= JOIN_NODES || p->nodes == NULL) return;
  CHECK(!seen[me]);
  seen[me] = 1;
  CHECK_EQ_INT(p->nodes[me].nproc, 1 + j->index % 3);
  CHECK_EQ_INT(p->nodes[me].rank_offset, full->nodes[me].rank_offset);
  CHECK_EQ_INT(p->nodes[me].uid, full->nodes[me].uid);
  CHECK_EQ_INT(p->nodes[0].nproc, 1);
  CHECK_EQ_INT(p->nodes[0].uid, full->nodes[0].uid);
  int known = 0;
  for (int r = 0; r < p->nnodes; r++) known += p->nodes[r].node_rank == r;
  CHECK_EQ_INT(known, 2);
}

/*
 * JOIN_NODES agents join over a real store: node 0 has the whole plan; every
 * other node reads the head, which stays small whatever the node count, and
 * its page of at most RDZV_PLAN_PAGE lines, never the whole plan (N nodes
 * reading it all cost N² bytes: the swarm at 16,384 nodes never finished).
 */
static void test_join_pages(void) {
  store_server_opts so = {.bind_host = "127.0.0.1"};
  store_server *srv = NULL;
  CHECK_EQ_INT(store_server_start(&so, &srv), 0);
  if (srv == NULL) return;
  static joiner js[JOIN_NODES];
  pthread_t th[JOIN_NODES];
  for (int i = 0; i < JOIN_NODES; i++) {
    js[i] = (joiner){.port = store_server_port(srv), .index = i};
    CHECK_EQ_INT(pthread_create(&th[i], NULL, join_main, &js[i]), 0);
  }
  for (int i = 0; i < JOIN_NODES; i++) pthread_join(th[i], NULL);
  int ok = 1;
  for (int i = 0; i < JOIN_NODES; i++) {
    if (js[i].rc != 0) fprintf(stderr, "  joiner %d: %d %s\n", i, js[i].rc, js[i].err);
    ok &= js[i].rc == 0;
  }
  CHECK(ok);
  const rdzv_plan *full = &js[0].plan;
  if (ok) {
    CHECK_EQ_INT(full->my_index, 0);
    int world = 0;
    for (int r = 0; r < JOIN_NODES; r++) {
      CHECK_EQ_INT(full->nodes[r].node_rank, r);
      CHECK_EQ_INT(full->nodes[r].rank_offset, world);
      world += full->nodes[r].nproc;
    }
    CHECK_EQ_INT(full->world_size, world);
    int seen[JOIN_NODES] = {0};
    for (int i = 1; i < JOIN_NODES; i++) check_joiner(&js[i], full, seen);
  }
  store_client *c = NULL;
  CHECK_EQ_INT(store_client_connect("127.0.0.1", store_server_port(srv), NULL,
                                    base_deadline_in(5000), &c, NULL, 0),
               0);
  const char *keys[4] = {"pages/0/plan", "pages/0/plan/0", "pages/0/plan/2", "pages/0/plan/3"};
  void *vals[4] = {NULL};
  size_t lens[4] = {0};
  CHECK_EQ_INT(store_get_many(c, keys, 4, vals, lens, base_deadline_in(5000)), 0);
  CHECK(vals[0] != NULL && lens[0] < 512);
  int lines[3] = {0};
  for (int k = 1; k < 3; k++)
    for (size_t i = 0; vals[k] != NULL && i < lens[k]; i++)
      lines[k] += ((char *)vals[k])[i] == '\n';
  CHECK_EQ_INT(lines[1], RDZV_PLAN_PAGE);
  CHECK_EQ_INT(lines[2], 3);
  CHECK(vals[3] == NULL);
  for (int k = 0; k < 4; k++) free(vals[k]);
  store_client_close(c);
  for (int i = 0; i < JOIN_NODES; i++) rdzv_plan_free(&js[i].plan);
  store_server_stop(srv);
}

/* ---- shared file ---- */

static void write_raw(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
}

static int count_dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  closedir(d);
  return n;
}

static void test_file_format(void) {
  rdzv_file_info in = {0}, out;
  strcpy(in.job_id, "job-7");
  in.node_id = 0xfedcba9876543210ull;
  in.ready = 1;
  strcpy(in.host, "fd00::2");
  in.port = 1234;
  char buf[1024];
  int n = rdzv_file_format(&in, buf, sizeof buf);
  CHECK(n > 0);
  CHECK_EQ_INT(rdzv_file_parse(buf, (size_t)n, &out), 0);
  CHECK_STREQ(out.job_id, "job-7");
  CHECK_STREQ(out.host, "fd00::2");
  CHECK_EQ_INT(out.port, 1234);
  CHECK_EQ_INT(out.ready, 1);
  CHECK(out.node_id == 0xfedcba9876543210ull);
  in.ready = 0;
  n = rdzv_file_format(&in, buf, sizeof buf);
  CHECK_EQ_INT(rdzv_file_parse(buf, (size_t)n, &out), 0);
  CHECK_EQ_INT(out.ready, 0);
#define NODE "node=00000000000000ab\n"
  const char *good = "cohort-rdzv 1\njob=a\n" NODE "state=ready\nhost=h\nport=5\n";
  CHECK_EQ_INT(rdzv_file_parse(good, strlen(good), &out), 0);
  CHECK(out.node_id == 0xab);
  const char *bad[] = {
      "",
      "cohort-rdzv 1\n",
      "cohort-rdzv 2\njob=a\n" NODE "state=claimed\n",
      "cohort-rdzv 1\njob=a\n" NODE "state=claimed",
      "cohort-rdzv 1\njob=a\nstate=claimed\n",
      "cohort-rdzv 1\njob=a\nnode=ab\nstate=claimed\n",
      "cohort-rdzv 1\njob=a\nnode=00000000000000AB\nstate=claimed\n",
      "cohort-rdzv 1\njob=a\nnode=00000000000000xy\nstate=claimed\n",
      "cohort-rdzv 1\njob=a\n" NODE NODE "state=claimed\n",
      "cohort-rdzv 1\njob=a\n" NODE "state=ready\nhost=h\n",
      "cohort-rdzv 1\njob=a\n" NODE "state=ready\nhost=h\nport=0\n",
      "cohort-rdzv 1\njob=a\n" NODE "state=ready\nhost=h\nport=x\n",
      "cohort-rdzv 1\njob=a\n" NODE "state=claimed\nhost=h\nport=5\n",
      "cohort-rdzv 1\njob=a\njob=b\n" NODE "state=claimed\n",
      "cohort-rdzv 1\njob=a\n" NODE "state=claimed\nextra=1\n",
      "cohort-rdzv 1\njob=a b\n" NODE "state=claimed\n",
      "cohort-rdzv 1\njob=\n" NODE "state=claimed\n",
      "cohort-rdzv 1\njob=a\n" NODE "state=maybe\n",
      "cohort-rdzv 1\njob=a\n" NODE "state=ready\nhost=h\nport=5\n\n",
      "garbage\x01\x02",
  };
  for (size_t i = 0; i < BASE_ARRAY_LEN(bad); i++)
    CHECK_EQ_INT(rdzv_file_parse(bad[i], strlen(bad[i]), &out), -EINVAL);
  /* NUL bytes inside are malformed, not a shorter string. */
  char nul[] = "cohort-rdzv 1\njob=a\0b\n" NODE "state=claimed\n";
  CHECK_EQ_INT(rdzv_file_parse(nul, sizeof nul - 1, &out), -EINVAL);
}

/* With a token, a record carries a MAC: only a writer holding the token makes one a reader takes.
 */
static void test_file_sealed(void) {
  rdzv_file_info in = {0}, out;
  strcpy(in.job_id, "job-7");
  in.node_id = 0xab;
  in.ready = 1;
  strcpy(in.host, "10.0.0.1");
  in.port = 4000;
  char buf[1024];
  int n = rdzv_file_format(&in, buf, sizeof buf);
  CHECK(n > 0);
  CHECK_EQ_INT(rdzv_file_seal(NULL, buf, (size_t)n, sizeof buf), n); /* no token: unchanged */
  int sealed = rdzv_file_seal("s3cret", buf, (size_t)n, sizeof buf);
  CHECK_EQ_INT(sealed, n + 69);
  CHECK(strncmp(buf + n, "mac=", 4) == 0 && buf[sealed - 1] == '\n');
  CHECK_EQ_INT(rdzv_file_open("s3cret", buf, (size_t)sealed, &out), 0);
  CHECK_STREQ(out.host, "10.0.0.1");
  CHECK_EQ_INT(out.port, 4000);
  /* Another token, no token, a changed byte, an unsigned record, a cut MAC: refused. */
  CHECK_EQ_INT(rdzv_file_open("other", buf, (size_t)sealed, &out), COHORT_EAUTH);
  CHECK_EQ_INT(rdzv_file_open(NULL, buf, (size_t)sealed, &out), COHORT_EAUTH);
  CHECK_EQ_INT(rdzv_file_open("s3cret", buf, (size_t)n, &out), COHORT_EAUTH);
  CHECK_EQ_INT(rdzv_file_open("s3cret", buf, (size_t)sealed - 1, &out), COHORT_EAUTH);
  char forged[1024];
  memcpy(forged, buf, (size_t)sealed);
  forged[strstr(forged, "10.0.0.1") - forged + 7] = '9'; /* host 10.0.0.9 */
  CHECK_EQ_INT(rdzv_file_open("s3cret", forged, (size_t)sealed, &out), COHORT_EAUTH);
  /* Too small a buffer for the MAC line. */
  CHECK_EQ_INT(rdzv_file_seal("s3cret", buf, (size_t)n, (size_t)n + 10), COHORT_ELIMIT);
}

/* Random bytes and random corruption of valid files: parsed or refused, never a crash. */
static void test_file_random(void) {
  rdzv_file_info in = {0}, out;
  strcpy(in.job_id, "job");
  in.node_id = 42;
  in.ready = 1;
  strcpy(in.host, "h");
  in.port = 7;
  char good[256];
  int n = rdzv_file_format(&in, good, sizeof good);
  uint32_t x = 99;
  for (int iter = 0; iter < 20000; iter++) {
    char buf[300];
    size_t len = (size_t)n;
    memcpy(buf, good, len);
    x = x * 1103515245u + 12345u;
    if (iter % 3 == 0) {
      len = (x >> 16) % sizeof buf;
      for (size_t k = 0; k < len; k++) {
        x = x * 1103515245u + 12345u;
        buf[k] = (char)(x >> 16);
      }
    } else {
      buf[(x >> 8) % len] = (char)(x >> 20);
      if (iter % 3 == 2) len = (x >> 4) % (len + 1);
    }
    int rc = rdzv_file_parse(buf, len, &out);
    CHECK(rc == 0 || rc == -EINVAL);
    if (rc == 0) CHECK(rdzv_job_id_valid(out.job_id) && (!out.ready || out.port > 0));
  }
}

static rdzv_opts file_opts(const char *path, const char *job, int rank, int64_t ms) {
  rdzv_opts o = base_opts();
  o.method = RDZV_FILE;
  o.rdzv_file = path;
  o.job_id = job;
  o.node_rank = rank;
  o.deadline_ms = base_deadline_in(ms);
  o.settle_ms = 150;
  return o;
}

static void test_file_method(void) {
  char dir[300], path[400];
  snprintf(dir, sizeof dir, "%s/f1", tmpdir);
  mkdir(dir, 0700);
  snprintf(path, sizeof path, "%s/rdzv", dir);
  rdzv_target t;
  char err[256];
  rdzv_file_info info;

  /* Needs a path and a job id. */
  rdzv_opts o = file_opts(NULL, "j1", -1, 1000);
  CHECK_EQ_INT(disc(&o, NULL, &t, err), -EINVAL);
  o = file_opts(path, NULL, -1, 1000);
  CHECK_EQ_INT(disc(&o, NULL, &t, err), -EINVAL);

  /* Rank 1 before anything exists: waits, then times out naming what it saw. */
  o = file_opts(path, "j1", 1, 300);
  int64_t t0 = base_now_ms();
  CHECK_EQ_INT(disc(&o, NULL, &t, err), -ETIMEDOUT);
  CHECK(base_now_ms() - t0 >= 250);
  CHECK(strstr(err, "no file") != NULL);

  /* A stale file of another job and a malformed one are ignored by joiners. */
  write_raw(path, "cohort-rdzv 1\njob=old\nnode=0000000000000001\nstate=ready\nhost=10.0.0.9\n"
                  "port=4000\n");
  CHECK_EQ_INT(disc(&o, NULL, &t, err), -ETIMEDOUT);
  CHECK(strstr(err, "stale file of job old") != NULL);
  write_raw(path, "cohort-rdzv 1\njob=j1\nnode=0000000000000001\nstate=ready\nhost=10.0.0.9\n");
  CHECK_EQ_INT(disc(&o, NULL, &t, err), -ETIMEDOUT);
  CHECK(strstr(err, "malformed") != NULL);
  /* With a token, a well-formed record of this job without its MAC (an intruder's) is not taken. */
  write_raw(path, "cohort-rdzv 1\njob=j1\nnode=0000000000000001\nstate=ready\nhost=10.0.0.9\n"
                  "port=4000\n");
  o.token = "s3cret";
  CHECK_EQ_INT(disc(&o, NULL, &t, err), -ETIMEDOUT);
  CHECK(strstr(err, "not signed with this job") != NULL);
  o.token = NULL;

  /* Rank 0 hosts at once and replaces whatever was there with its claim. */
  o = file_opts(path, "j1", 0, 1000);
  CHECK_EQ_INT(disc(&o, NULL, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 1);
  CHECK(t.port > 0);
  FILE *f = fopen(path, "r");
  char buf[512];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  CHECK_EQ_INT(rdzv_file_parse(buf, n, &info), 0);
  CHECK_STREQ(info.job_id, "j1");
  CHECK_EQ_INT(info.ready, 0);
  /* Claimed but not ready: a joiner keeps waiting. */
  o = file_opts(path, "j1", 1, 250);
  CHECK_EQ_INT(disc(&o, NULL, &t, err), -ETIMEDOUT);
  CHECK(strstr(err, "claimed") != NULL);

  /* Publishing writes the address; a joiner then finds it. */
  rdzv_opts po = file_opts(path, "j1", 0, 1000);
  rdzv_publisher *pub = NULL;
  CHECK_EQ_INT(rdzv_publish_start(&po, "10.1.2.3", 4567, &pub, err, sizeof err), 0);
  CHECK(pub != NULL);
  o = file_opts(path, "j1", 1, 1000);
  CHECK_EQ_INT(disc(&o, NULL, &t, err), 0);
  CHECK_STREQ(t.host, "10.1.2.3");
  CHECK_EQ_INT(t.port, 4567);
  CHECK_EQ_INT(t.host_store, 0);
  CHECK_EQ_INT(t.node_rank, 1);
  rdzv_publish_stop(pub);
  /* Stopping leaves the file for late joiners; republishing replaces it atomically, and no
   * temporary or lock file is left behind. */
  CHECK_EQ_INT(rdzv_publish_start(&po, "bad host", 4568, &pub, err, sizeof err), -EINVAL);
  CHECK(pub == NULL);
  CHECK_EQ_INT(disc(&o, NULL, &t, err), 0);
  CHECK_EQ_INT(t.port, 4567);
  CHECK_EQ_INT(rdzv_publish_start(&po, "10.1.2.4", 4569, &pub, err, sizeof err), 0);
  rdzv_publish_stop(pub);
  CHECK_EQ_INT(disc(&o, NULL, &t, err), 0);
  CHECK_STREQ(t.host, "10.1.2.4");
  CHECK_EQ_INT(t.port, 4569);
  CHECK_EQ_INT(count_dir_entries(dir), 1);
  CHECK_EQ_INT(rdzv_publish_start(&po, "h", 0, &pub, err, sizeof err), -EINVAL);
  CHECK(pub == NULL);

  /* Without a rank: a file of this job means join (here: at once, it is ready). */
  o = file_opts(path, "j1", -1, 1000);
  CHECK_EQ_INT(disc(&o, NULL, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 0);
  CHECK_STREQ(t.host, "10.1.2.4");
  /* ...a stale file of another job is replaced and this node hosts... */
  o = file_opts(path, "j2", -1, 1000);
  CHECK_EQ_INT(disc(&o, NULL, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 1);
  f = fopen(path, "r");
  n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  CHECK_EQ_INT(rdzv_file_parse(buf, n, &info), 0);
  CHECK_STREQ(info.job_id, "j2");
  CHECK_EQ_INT(count_dir_entries(dir), 1);
  /* ...as is a malformed one... */
  write_raw(path, "not a rendezvous file\n");
  o = file_opts(path, "j3", -1, 1000);
  CHECK_EQ_INT(disc(&o, NULL, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 1);
  /* ...and with no file at all the first node hosts. */
  unlink(path);
  o = file_opts(path, "j4", -1, 1000);
  CHECK_EQ_INT(disc(&o, NULL, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 1);
  CHECK_EQ_INT(count_dir_entries(dir), 1);
  /* A node without a rank that claimed the file defers to a --node-rank 0 node starting within
   * its settle window (here: the parent, 300 ms later), and joins its store. */
  unlink(path);
  int fds[2];
  CHECK_EQ_INT(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    rdzv_opts co = file_opts(path, "mix", -1, 5000);
    co.settle_ms = 1500;
    rdzv_target ct;
    char cerr[256];
    int crc = rdzv_discover(&co, NULL, &ct, cerr, sizeof cerr);
    char line[64];
    snprintf(line, sizeof line, "%d %d %d", crc, ct.host_store, ct.port);
    _exit(write(fds[1], line, strlen(line)) > 0 ? 0 : 1);
  }
  close(fds[1]);
  base_sleep_ms(300);
  o = file_opts(path, "mix", 0, 2000);
  CHECK_EQ_INT(disc(&o, NULL, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 1);
  CHECK_EQ_INT(rdzv_publish_start(&o, "127.0.0.1", 5555, &pub, err, sizeof err), 0);
  rdzv_publish_stop(pub);
  char line[64] = "";
  CHECK(read(fds[0], line, sizeof line - 1) > 0);
  close(fds[0]);
  waitpid(pid, NULL, 0);
  CHECK_STREQ(line, "0 0 5555");
  /* Publishing over another node's claim of the same job is refused, naming the conflict. */
  write_raw(path, "cohort-rdzv 1\njob=mix\nnode=0000000000000001\nstate=claimed\n");
  CHECK_EQ_INT(rdzv_publish_start(&o, "127.0.0.1", 5556, &pub, err, sizeof err), -EEXIST);
  CHECK(pub == NULL);
  CHECK(strstr(err, "another node") != NULL && strstr(err, "--node-rank") != NULL);
  /* A directory where the file should be is an error, not a hang. */
  unlink(path);
  mkdir(path, 0700);
  o = file_opts(path, "j5", -1, 1000);
  CHECK(disc(&o, NULL, &t, err) < 0);
  rmdir(path);
}

/*
 * nproc processes race to host job "race" on path (optionally over a stale
 * file): exactly one must host, and every other must find its address.
 */
static void file_race(const char *path, int nproc, int stale) {
  unlink(path);
  if (stale)
    write_raw(path,
              "cohort-rdzv 1\njob=older\nnode=0000000000000001\nstate=ready\nhost=h\nport=9\n");
  int go[2], res[2];
  CHECK_EQ_INT(pipe(go), 0);
  CHECK_EQ_INT(pipe(res), 0);
  pid_t pids[16];
  for (int i = 0; i < nproc; i++) {
    pids[i] = fork();
    if (pids[i] == 0) {
      close(go[1]);
      char c;
      if (read(go[0], &c, 1) < 0) _exit(3); /* returns 0 at EOF: the start signal */
      rdzv_opts o = file_opts(path, "race", -1, 5000);
      rdzv_target t;
      char err[256];
      int rc = rdzv_discover(&o, NULL, &t, err, sizeof err);
      char line[64];
      if (rc != 0) {
        snprintf(line, sizeof line, "E %d\n", rc);
      } else if (t.host_store) {
        rdzv_publisher *pub;
        char host[32];
        snprintf(host, sizeof host, "127.0.0.%d", 10 + i);
        rc = rdzv_publish_start(&o, host, 30000 + i, &pub, err, sizeof err);
        rdzv_publish_stop(pub);
        snprintf(line, sizeof line, "H %d %d\n", 30000 + i, rc);
      } else {
        snprintf(line, sizeof line, "J %d\n", t.port);
      }
      if (write(res[1], line, strlen(line)) < 0) _exit(3);
      _exit(0);
    }
  }
  close(go[0]);
  close(res[1]);
  close(go[1]); /* all start together */
  char all[1024] = "";
  size_t len = 0;
  ssize_t r;
  while ((r = read(res[0], all + len, sizeof all - 1 - len)) > 0) len += (size_t)r;
  all[len] = '\0';
  close(res[0]);
  for (int i = 0; i < nproc; i++) {
    int st;
    waitpid(pids[i], &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  int hosts = 0, joins = 0, host_port = -1, ok = 1;
  int join_ports[16];
  for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n")) {
    int a, b;
    if (sscanf(line, "H %d %d", &a, &b) == 2) {
      hosts++;
      host_port = a;
      if (b != 0) ok = 0;
    } else if (sscanf(line, "J %d", &a) == 1) {
      join_ports[joins++] = a;
    } else {
      fprintf(stderr, "  racer: %s\n", line);
      ok = 0;
    }
  }
  CHECK_EQ_INT(hosts, 1);
  CHECK_EQ_INT(joins, nproc - 1);
  CHECK(ok);
  for (int i = 0; i < joins; i++) CHECK_EQ_INT(join_ports[i], host_port);
}

static void test_file_race(void) {
  char dir[300], path[400];
  snprintf(dir, sizeof dir, "%s/race", tmpdir);
  mkdir(dir, 0700);
  snprintf(path, sizeof path, "%s/rdzv", dir);
  for (int round = 0; round < 4; round++) {
    file_race(path, 5, round % 2);
    CHECK_EQ_INT(count_dir_entries(dir), 1);
  }
}

/* ---- multicast: codec, group, routes (no traffic: multicast runs only in test namespaces) ---- */

static rdzv_dgram sample_announce(void) {
  rdzv_dgram d = {0};
  d.kind = RDZV_ANNOUNCE;
  d.node_id = 0x0123456789abcdefull;
  d.claimed_rank = 0;
  strcpy(d.job_id, "job-42");
  strcpy(d.host, "10.77.0.1");
  d.port = 40123;
  return d;
}

static void test_dgram(void) {
  uint8_t buf[RDZV_DGRAM_MAX];
  rdzv_dgram in = sample_announce(), out;
  /* Round trip without and with a token. */
  int n = rdzv_dgram_encode(&in, NULL, buf, sizeof buf);
  CHECK_EQ_INT(n, RDZV_DGRAM_HEADER + 6 + 9);
  CHECK_EQ_INT(rdzv_dgram_parse(buf, (size_t)n, NULL, &out), 0);
  CHECK_EQ_INT(out.kind, RDZV_ANNOUNCE);
  CHECK(out.node_id == in.node_id);
  CHECK_EQ_INT(out.claimed_rank, 0);
  CHECK_STREQ(out.job_id, "job-42");
  CHECK_STREQ(out.host, "10.77.0.1");
  CHECK_EQ_INT(out.port, 40123);
  CHECK_EQ_INT(out.authenticated, 0);
  CHECK(memcmp(buf, "CHRV", 4) == 0);
  int m = rdzv_dgram_encode(&in, "s3cret", buf, sizeof buf);
  CHECK_EQ_INT(m, n + RDZV_MAC_LEN);
  CHECK_EQ_INT(rdzv_dgram_parse(buf, (size_t)m, "s3cret", &out), 0);
  CHECK_EQ_INT(out.authenticated, 1);
  CHECK_STREQ(out.host, "10.77.0.1");
  /* Wrong token, missing token on either side. */
  CHECK_EQ_INT(rdzv_dgram_parse(buf, (size_t)m, "s3creT", &out), COHORT_EAUTH);
  CHECK_EQ_INT(rdzv_dgram_parse(buf, (size_t)m, NULL, &out), COHORT_EAUTH);
  CHECK_EQ_INT(rdzv_dgram_parse(buf, (size_t)m, "", &out), COHORT_EAUTH);
  n = rdzv_dgram_encode(&in, NULL, buf, sizeof buf);
  CHECK_EQ_INT(rdzv_dgram_parse(buf, (size_t)n, "s3cret", &out), COHORT_EAUTH);
  /* Any changed byte under a MAC fails: the port, the host, the job. */
  m = rdzv_dgram_encode(&in, "s3cret", buf, sizeof buf);
  for (int i = 8; i < m; i++) {
    if (i == 7 || i == 22) continue; /* lengths: changing them is malformed instead */
    uint8_t copy[RDZV_DGRAM_MAX];
    memcpy(copy, buf, (size_t)m);
    copy[i] ^= 0x01;
    int rc = rdzv_dgram_parse(copy, (size_t)m, "s3cret", &out);
    if (rc != COHORT_EAUTH && rc != COHORT_EPROTO) fprintf(stderr, "  byte %d: %d\n", i, rc);
    CHECK(rc == COHORT_EAUTH || rc == COHORT_EPROTO);
  }
  /* Candidates carry no address. */
  rdzv_dgram c = {0};
  c.kind = RDZV_CANDIDATE;
  c.node_id = 7;
  c.claimed_rank = -1;
  strcpy(c.job_id, "j");
  n = rdzv_dgram_encode(&c, NULL, buf, sizeof buf);
  CHECK_EQ_INT(n, RDZV_DGRAM_HEADER + 1);
  CHECK_EQ_INT(rdzv_dgram_parse(buf, (size_t)n, NULL, &out), 0);
  CHECK_EQ_INT(out.kind, RDZV_CANDIDATE);
  CHECK_EQ_INT(out.claimed_rank, -1);
  CHECK(out.node_id == 7);
  CHECK_EQ_INT(out.port, 0);
  CHECK_STREQ(out.host, "");
  /* An announcement may leave the host empty (the sender's address is used). */
  rdzv_dgram e = sample_announce();
  e.host[0] = '\0';
  n = rdzv_dgram_encode(&e, NULL, buf, sizeof buf);
  CHECK_EQ_INT(rdzv_dgram_parse(buf, (size_t)n, NULL, &out), 0);
  CHECK_STREQ(out.host, "");
  /* Encoding refuses fields out of range. */
  rdzv_dgram bad = sample_announce();
  bad.port = 0;
  CHECK_EQ_INT(rdzv_dgram_encode(&bad, NULL, buf, sizeof buf), -EINVAL);
  bad = sample_announce();
  strcpy(bad.job_id, "a b");
  CHECK_EQ_INT(rdzv_dgram_encode(&bad, NULL, buf, sizeof buf), -EINVAL);
  bad = sample_announce();
  bad.kind = 9;
  CHECK_EQ_INT(rdzv_dgram_encode(&bad, NULL, buf, sizeof buf), -EINVAL);
  bad = c;
  bad.port = 5;
  CHECK_EQ_INT(rdzv_dgram_encode(&bad, NULL, buf, sizeof buf), -EINVAL);
  bad = sample_announce();
  CHECK_EQ_INT(rdzv_dgram_encode(&bad, NULL, buf, 20), -EINVAL);
  /* Every truncation and every extension is malformed, with and without a MAC. */
  for (int tok = 0; tok < 2; tok++) {
    const char *token = tok ? "k" : NULL;
    n = rdzv_dgram_encode(&in, token, buf, sizeof buf);
    for (int len = 0; len < n; len++)
      CHECK_EQ_INT(rdzv_dgram_parse(buf, (size_t)len, token, &out), COHORT_EPROTO);
    buf[n] = 0;
    CHECK_EQ_INT(rdzv_dgram_parse(buf, (size_t)n + 1, token, &out), COHORT_EPROTO);
  }
  /* Field by field: magic, version, kind, flags, reserved, lengths, characters, rank. */
  struct {
    int off;
    uint8_t val;
  } mut[] = {{0, 'X'},  {4, 2},  {5, 0},    {5, 3},         {6, 0x02},  {7, 0}, {7, 200},
             {22, 200}, {23, 1}, {24, ' '}, {24 + 6, 0x7f}, {16, 0x80}, {20, 0}};
  for (size_t i = 0; i < BASE_ARRAY_LEN(mut); i++) {
    n = rdzv_dgram_encode(&in, NULL, buf, sizeof buf);
    if (mut[i].off == 20) buf[21] = 0; /* port 0 in an announcement */
    buf[mut[i].off] = mut[i].val;
    int rc = rdzv_dgram_parse(buf, (size_t)n, NULL, &out);
    if (rc != COHORT_EPROTO) fprintf(stderr, "  mutation %zu: %d\n", i, rc);
    CHECK_EQ_INT(rc, COHORT_EPROTO);
  }
  /* A candidate with an address is malformed. */
  n = rdzv_dgram_encode(&c, NULL, buf, sizeof buf);
  buf[21] = 1;
  CHECK_EQ_INT(rdzv_dgram_parse(buf, (size_t)n, NULL, &out), COHORT_EPROTO);
  /* Garbage: random bytes, and random corruption of valid datagrams, never crash. */
  uint32_t x = 12345;
  int accepted = 0;
  for (int iter = 0; iter < 20000; iter++) {
    uint8_t g[RDZV_DGRAM_MAX];
    size_t len;
    if (iter % 2) {
      len = (size_t)(x % sizeof g);
      for (size_t k = 0; k < len; k++) {
        x = x * 1103515245u + 12345u;
        g[k] = (uint8_t)(x >> 16);
      }
      if (len >= 4) memcpy(g, "CHRV", 4);
      if (len >= 5) g[4] = 1;
    } else {
      len = (size_t)rdzv_dgram_encode(&in, iter % 4 ? "k" : NULL, g, sizeof g);
      x = x * 1103515245u + 12345u;
      g[(x >> 8) % len] ^= (uint8_t)(1u << ((x >> 4) % 8));
    }
    int rc = rdzv_dgram_parse(g, len, iter % 4 ? "k" : NULL, &out);
    CHECK(rc == 0 || rc == COHORT_EPROTO || rc == COHORT_EAUTH);
    if (rc == 0) {
      accepted++;
      CHECK(iter % 4 == 0); /* with a token, no corrupted or random datagram passes */
      CHECK(strlen(out.job_id) > 0 && strlen(out.job_id) <= RDZV_JOB_ID_MAX);
    }
  }
  printf("garbage datagrams parsed: %d of 20000 (all without a token)\n", accepted);
}

static void test_group(void) {
  char a[64], b[64];
  int pa, pb;
  CHECK_EQ_INT(rdzv_mcast_group_for_job("job-1", a, sizeof a, &pa), 0);
  CHECK_EQ_INT(rdzv_mcast_group_for_job("job-1", b, sizeof b, &pb), 0);
  CHECK_STREQ(a, b);
  CHECK_EQ_INT(pa, pb);
  CHECK(strncmp(a, "239.255.", 8) == 0);
  CHECK(pa >= 29500 && pa < 30500);
  /* Different jobs spread over groups and ports (the hash of 50 ids hits many). */
  int distinct = 0;
  char seen[50][64];
  for (int i = 0; i < 50; i++) {
    char job[32];
    snprintf(job, sizeof job, "job-%d", i);
    CHECK_EQ_INT(rdzv_mcast_group_for_job(job, seen[i], sizeof seen[i], &pb), 0);
    CHECK(pb >= 29500 && pb < 30500);
    int dup = 0;
    for (int k = 0; k < i; k++) dup |= strcmp(seen[k], seen[i]) == 0;
    distinct += !dup;
  }
  CHECK(distinct >= 45);
}

static void write_route(const char *root, const char *text) {
  char path[400];
  snprintf(path, sizeof path, "%s/net", root);
  mkdir(path, 0700);
  snprintf(path, sizeof path, "%s/net/route", root);
  write_raw(path, text);
}

static void test_route(void) {
  char root[300];
  snprintf(root, sizeof root, "%s/proc", tmpdir);
  mkdir(root, 0700);
  char ifn[32];
  const char *hdr =
      "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n";
  char text[1024];
  /* Default route via eth0, a /24 on eth1: the group follows the default route. */
  snprintf(text, sizeof text,
           "%seth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
           "eth1\t00004D0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n",
           hdr);
  write_route(root, text);
  CHECK_EQ_INT(rdzv_route_iface(root, "239.255.1.2", ifn, sizeof ifn), 0);
  CHECK_STREQ(ifn, "eth0");
  /* A 224.0.0.0/4 route is more specific than the default one. */
  snprintf(text, sizeof text,
           "%seth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
           "ib0\t000000E0\t00000000\t0001\t0\t0\t0\t000000F0\t0\t0\t0\n",
           hdr);
  write_route(root, text);
  CHECK_EQ_INT(rdzv_route_iface(root, "239.255.1.2", ifn, sizeof ifn), 0);
  CHECK_STREQ(ifn, "ib0");
  /* Two default routes: the lower metric wins; a route that is down is ignored. */
  snprintf(text, sizeof text,
           "%seth0\t00000000\t0100000A\t0003\t0\t0\t600\t00000000\t0\t0\t0\n"
           "eth2\t00000000\t0100000B\t0003\t0\t0\t50\t00000000\t0\t0\t0\n"
           "eth3\t00000000\t0100000C\t0002\t0\t0\t1\t00000000\t0\t0\t0\n",
           hdr);
  write_route(root, text);
  CHECK_EQ_INT(rdzv_route_iface(root, "239.255.1.2", ifn, sizeof ifn), 0);
  CHECK_STREQ(ifn, "eth2");
  /* No route that covers the group; garbage lines are skipped. */
  snprintf(text, sizeof text,
           "%seth1\t00004D0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\ngarbage line\n", hdr);
  write_route(root, text);
  CHECK_EQ_INT(rdzv_route_iface(root, "239.255.1.2", ifn, sizeof ifn), -ENOENT);
  CHECK_EQ_INT(rdzv_route_iface(root, "not-an-address", ifn, sizeof ifn), -EINVAL);
  char missing[320];
  snprintf(missing, sizeof missing, "%s/nonexistent", tmpdir);
  CHECK_EQ_INT(rdzv_route_iface(missing, "239.255.1.2", ifn, sizeof ifn), -ENOENT);

  /* Discovery's own checks, before any socket: job id, group, interface. */
  rdzv_opts o = base_opts();
  o.method = RDZV_MCAST;
  rdzv_target t;
  char err[256];
  CHECK_EQ_INT(disc(&o, NULL, &t, err), -EINVAL);
  CHECK(strstr(err, "job id") != NULL);
  o.job_id = "jm";
  o.mcast_group = "10.0.0.1:5000";
  CHECK_EQ_INT(disc(&o, NULL, &t, err), -EINVAL);
  CHECK(strstr(err, "multicast address") != NULL);
  o.mcast_group = "239.1.2.3";
  CHECK_EQ_INT(disc(&o, NULL, &t, err), -EINVAL);
  o.mcast_group = NULL;
  o.iface = "cohort-noif0";
  CHECK_EQ_INT(disc(&o, NULL, &t, err), -ENODEV);
  CHECK(strstr(err, "cohort-noif0") != NULL);
  o.iface = NULL;
  CHECK_EQ_INT(rdzv_mcast_discover_root(&o, root, &t, err, sizeof err), -ENETUNREACH);
  CHECK(strstr(err, "--iface") != NULL);
  /* Node rank 0 hosts at once, on the interface's address (no datagram is sent). */
  o.iface = "lo";
  o.node_rank = 0;
  CHECK_EQ_INT(disc(&o, NULL, &t, err), 0);
  CHECK_EQ_INT(t.host_store, 1);
  CHECK_STREQ(t.host, "127.0.0.1");
  CHECK(t.port > 0);
  CHECK(strstr(t.source, "multicast") != NULL);
  /* The node id is stable within a process and differs in a child. */
  uint64_t id = rdzv_node_id();
  CHECK(id != 0 && rdzv_node_id() == id);
  int fds[2];
  CHECK_EQ_INT(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    uint64_t cid = rdzv_node_id();
    _exit(write(fds[1], &cid, sizeof cid) == sizeof cid ? 0 : 1);
  }
  uint64_t cid = 0;
  CHECK_EQ_INT(read(fds[0], &cid, sizeof cid), (long long)sizeof cid);
  waitpid(pid, NULL, 0);
  close(fds[0]);
  close(fds[1]);
  CHECK(cid != 0 && cid != id);
}

static void cleanup_dir(const char *dir) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* --rdzv-conf, decided once for cohort run and the commands that find a job. */
static void test_where_conf(void) {
  rdzv_conf c;
  char err[256] = "";
  CHECK_EQ_INT(rdzv_conf_parse("join_timeout=5,last_call_timeout=1,is_host=true,protocol=https,"
                               "cacert=/c,user=u,password_file=/p,read_timeout=3,x=y",
                               &c, err, sizeof err),
               0);
  CHECK(c.join_timeout_ms == 5000 && c.last_call_ms == 1000 && c.is_host == 1 && c.https == 1);
  CHECK_STREQ(c.cacert, "/c");
  CHECK_STREQ(c.user, "u");
  CHECK_STREQ(c.password_file, "/p");
  CHECK(c.cert == NULL && c.key == NULL);
  CHECK_STREQ(c.unused, "read_timeout,x");
  CHECK_EQ_INT(rdzv_conf_parse("", &c, err, sizeof err), 0);
  CHECK(c.join_timeout_ms == -1 && c.last_call_ms == -1 && c.is_host == -1 && c.unused[0] == 0);
  CHECK_EQ_INT(rdzv_conf_parse("join_timeout", &c, err, sizeof err), -EINVAL);
  CHECK(strstr(err, "KEY=VALUE") != NULL);
  CHECK_EQ_INT(rdzv_conf_parse("protocol=ftp", &c, err, sizeof err), -EINVAL);
  CHECK(strstr(err, "protocol") != NULL && strchr(err, '\n') == NULL);
  CHECK_EQ_INT(rdzv_conf_parse("join_timeout=0", &c, err, sizeof err), -EINVAL);
  CHECK_EQ_INT(rdzv_conf_parse("is_host=maybe", &c, err, sizeof err), -EINVAL);
  CHECK_EQ_INT(rdzv_conf_parse("cert=", &c, err, sizeof err), -EINVAL);
}

/* Where the store is: etcd's list, the built-in store's HOST[:PORT], or left to the command. */
static void test_where_resolve(void) {
  rdzv_where w;
  rdzv_conf c;
  char err[256] = "";
  rdzv_where_in in = {.backend = RDZV_BACKEND_ETCD, .endpoint = "e1,e2:2380,[::1]"};
  CHECK_EQ_INT(rdzv_where_resolve(&in, &w, err, sizeof err), 0);
  CHECK(w.method == RDZV_ETCD && w.etcd.endpoints == w.master);
  CHECK_STREQ(w.master, "e1:2379,e2:2380,[::1]:2379");
  in = (rdzv_where_in){.discover = RDZV_ETCD, .master = "e1"}; /* --discover etcd --master */
  CHECK_EQ_INT(rdzv_where_resolve(&in, &w, err, sizeof err), 0);
  CHECK(w.method == RDZV_ETCD && strcmp(w.master, "e1:2379") == 0 && w.etcd.cacert == NULL);
  in = (rdzv_where_in){.backend = RDZV_BACKEND_ETCD};
  CHECK_EQ_INT(rdzv_where_resolve(&in, &w, err, sizeof err), -EINVAL);
  CHECK(strstr(err, "--rdzv-endpoint") != NULL);
  in.endpoint = ",,";
  CHECK_EQ_INT(rdzv_where_resolve(&in, &w, err, sizeof err), -EINVAL);
  CHECK_EQ_INT(rdzv_conf_parse("protocol=https,cert=/x", &c, err, sizeof err), 0);
  in = (rdzv_where_in){.backend = RDZV_BACKEND_ETCD, .endpoint = "e1", .conf = &c};
  CHECK_EQ_INT(rdzv_where_resolve(&in, &w, err, sizeof err), -EINVAL);
  CHECK(strstr(err, "cert and key") != NULL);
  CHECK_EQ_INT(rdzv_conf_parse("protocol=https,cert=/x,key=/k", &c, err, sizeof err), 0);
  CHECK_EQ_INT(rdzv_where_resolve(&in, &w, err, sizeof err), 0);
  CHECK(w.etcd.cacert != NULL && w.etcd.cacert[0] == '\0'); /* https: the system's CAs */
  CHECK_STREQ(w.etcd.key, "/k");

  in = (rdzv_where_in){.backend = RDZV_BACKEND_C10D, .endpoint = "node0"};
  CHECK_EQ_INT(rdzv_where_resolve(&in, &w, err, sizeof err), 0);
  CHECK(w.method == RDZV_STATIC && strcmp(w.master, "node0:29400") == 0 && !w.port0);
  in.endpoint = "node0:0";
  CHECK_EQ_INT(rdzv_where_resolve(&in, &w, err, sizeof err), -EINVAL); /* not for status */
  in.port0_ok = 1;
  CHECK_EQ_INT(rdzv_where_resolve(&in, &w, err, sizeof err), 0);
  CHECK(w.port0 && w.method == RDZV_AUTO && w.master[0] == '\0');
  in = (rdzv_where_in){.backend = RDZV_BACKEND_C10D};
  CHECK_EQ_INT(rdzv_where_resolve(&in, &w, err, sizeof err), -EINVAL);
  in.endpoint_dflt = "localhost"; /* cohort run's default */
  CHECK_EQ_INT(rdzv_where_resolve(&in, &w, err, sizeof err), 0);
  CHECK_STREQ(w.master, "localhost:29400");
  in = (rdzv_where_in){.endpoint = "a:1,b:2"};
  CHECK_EQ_INT(rdzv_where_resolve(&in, &w, err, sizeof err), -EINVAL);
  CHECK(strstr(err, "list of endpoints") != NULL);
  in = (rdzv_where_in){.master = "node0:29500"}; /* cohort's own: left to the command */
  CHECK_EQ_INT(rdzv_where_resolve(&in, &w, err, sizeof err), 0);
  CHECK(w.method == RDZV_AUTO && w.master[0] == '\0');
}

int main(void) {
  test_where_conf();
  test_where_resolve();
  snprintf(tmpdir, sizeof tmpdir, "/tmp/cohort_test_rdzv_XXXXXX");
  if (mkdtemp(tmpdir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  test_hostlist();
  test_hostlist_random();
  test_slurm();
  test_k8s();
  test_replica();
  test_ompi();
  test_no_env();
  test_static();
  test_plan_ranks();
  test_join_pages();
  test_etcd_target();
  test_file_format();
  test_file_sealed();
  test_file_random();
  test_file_method();
  test_file_race();
  test_dgram();
  test_group();
  test_route();
  cleanup_dir(tmpdir);
  return check_report();
}

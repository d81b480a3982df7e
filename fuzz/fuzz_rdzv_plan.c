/*
 * fuzz_rdzv_plan.c - libFuzzer target for the rendezvous round's text
 * formats (src/rdzv/join.c): node records, rank assignment and the plan.
 *
 * parse_record() and parse_plan() are static and reached only through
 * rdzv_join(), which talks to a store; so this target hosts one store_server
 * on 127.0.0.1 for the whole run and plays a round per input, with a fresh
 * job id each time and every key deleted afterwards:
 *
 *   byte 0 % 4 == 0, joiner: the rest is the plan's head node 0 published,
 *     a NUL byte and its first page (none without the NUL); rdzv_join() as
 *     a non-host node (the first to join: page 0) registers, reads and
 *     parses them.
 *   byte 0 % 4 == 1, host: the rest is up to 16 node records (separated by
 *     NUL bytes) that other nodes registered; rdzv_join() as node 0 parses
 *     them, assigns ranks, publishes the plan and parses its own plan.
 *   byte 0 % 4 == 2: rdzv_assign_ranks() directly over claims from the input.
 *   byte 0 % 4 == 3, re-form host: byte 1 gives node 0's own last rank and
 *     whether it can take part; the rest is up to 16 records of a re-form
 *     round (with their prev= and part= fields): rdzv_join() as node 0 of
 *     a re-form round (expect) parses them, orders the ranks by their last
 *     ones and publishes the plan, restart=1 when one cannot take part.
 *
 * Checks: errors are the documented ones with a one-line reason; a plan
 * that was accepted places node 0 and this node within the world (at least
 * one process each), and node 0's whole plan has node ranks 0..n-1 in
 * order with rank offsets that add up to the world size; assigned ranks are
 * a permutation that keeps every valid claim; a re-form plan has the host
 * first, the others by their last rank (new nodes last, in join order), and
 * says restart exactly when a record said part=0.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cohort/cohort.h"
#include "rdzv/join.h"
#include "store/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define MAX_RECORDS 16

static store_server *srv;
static store_client *cli;
static unsigned long round_no;

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_rdzv_plan: check failed: %s\n", what);
    abort();
  }
}

static void stop_store(void) {
  store_client_close(cli);
  store_server_stop(srv);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  base_log_set_level(BASE_LOG_ERROR);
  store_server_opts o = {.bind_host = "127.0.0.1"};
  check(store_server_start(&o, &srv) == 0, "cannot start the store");
  char err[256];
  check(store_client_connect("127.0.0.1", store_server_port(srv), NULL, base_deadline_in(5000),
                             &cli, err, sizeof err) == 0,
        "cannot connect to the store");
  atexit(stop_store);
  return 0;
}

static void key_of(char *out, size_t len, const char *job, const char *suffix) {
  rdzv_key(out, len, job, 0, suffix);
}

static void set_text(const char *job, const char *suffix, const void *p, size_t n) {
  char key[STORE_KEY_MAX];
  key_of(key, sizeof key, job, suffix);
  check(store_set(cli, key, p, n, base_deadline_in(5000)) == 0, "store_set");
}

static void delete_round(const char *job, int nrecords) {
  char key[STORE_KEY_MAX];
  key_of(key, sizeof key, job, "joined");
  store_delete(cli, key, base_deadline_in(5000));
  key_of(key, sizeof key, job, "plan");
  store_delete(cli, key, base_deadline_in(5000));
  key_of(key, sizeof key, job, "plan/0");
  store_delete(cli, key, base_deadline_in(5000));
  for (int i = 1; i <= nrecords; i++) {
    char suffix[32];
    snprintf(suffix, sizeof suffix, "node/%d", i);
    key_of(key, sizeof key, job, suffix);
    store_delete(cli, key, base_deadline_in(5000));
  }
}

/* A plan as a node has it: node 0 and itself known and within the world; the whole plan
 * (node 0's, full) every node in rank order with offsets that add up to the world. */
static void check_plan(const rdzv_plan *p, int full) {
  check(p->nnodes >= 1 && p->nnodes <= RDZV_MAX_NODES && p->nodes != NULL, "plan: nnodes");
  check(p->my_index >= 0 && p->my_index < p->nnodes, "plan: my index");
  check(p->master_port >= 1 && p->master_port <= 65535, "plan: port");
  int offset = 0;
  for (int r = 0; r < p->nnodes; r++) {
    const rdzv_node *nd = &p->nodes[r];
    if (!full && nd->node_rank == -1 && r != 0 && r != p->my_index) continue;
    check(nd->node_rank == r, "plan: ranks out of order");
    check(nd->nproc >= 1, "plan: nproc");
    check(nd->rank_offset >= 0 && nd->rank_offset <= p->world_size - nd->nproc,
          "plan: a node outside the world");
    check(!full || nd->rank_offset == offset, "plan: rank offsets");
    check(memchr(nd->host, '\0', sizeof nd->host) != NULL, "plan: host");
    offset += nd->nproc;
  }
  check(!full || p->world_size == offset, "plan: world size");
}

/*
 * Reasons are one line. Not checked for a plan node 0 published as
 * "error REASON": parse_plan() passes REASON on verbatim, newlines included
 * (reported to the rdzv owner; node 0 itself only writes one-line reasons).
 */
static void check_reason(int rc, const char *err, const uint8_t *plan, size_t n) {
  if (rc == 0) return;
  if (plan != NULL && n >= 6 && memcmp(plan, "error ", 6) == 0) return;
  check(strchr(err, '\n') == NULL, "a reason of more than one line");
}

static void joiner(const char *job, const uint8_t *p, size_t n) {
  const uint8_t *nul = memchr(p, '\0', n);
  size_t head = nul != NULL ? (size_t)(nul - p) : n;
  if (nul != NULL) set_text(job, "plan/0", nul + 1, n - head - 1);
  set_text(job, "plan", p, head);
  rdzv_join_opts o = {.job_id = job,
                      .claimed_rank = -1,
                      .nproc = 1,
                      .nnodes_min = 1,
                      .nnodes_max = 1,
                      .my_host = "127.0.0.1",
                      .master_host = "127.0.0.1",
                      .deadline_ms = base_deadline_in(5000)};
  rdzv_plan plan;
  char err[512];
  int rc = rdzv_join(cli, &o, &plan, err, sizeof err);
  /* The plan cannot name this node (its uid is random), unless the fuzzer guessed 64 bits: a
   * valid plan leaves it out (-EAGAIN, with the plan's node count, for an elastic job to grow). */
  check(rc == -EINVAL || rc == -EPROTO || rc == -ENOMEM || rc == -EAGAIN || rc == 0,
        "joiner: unexpected error");
  if (rc == -EAGAIN)
    check(plan.nodes == NULL && plan.nnodes >= 1 && plan.nnodes <= RDZV_MAX_NODES,
          "joiner: a plan left out of keeps its node count");
  check_reason(rc, err, p, head);
  if (rc == 0) check_plan(&plan, 0);
  rdzv_plan_free(&plan);
  delete_round(job, 1);
}

/* What a test of the plan needs of one record (as join.c reads it, a spec written again). */
typedef struct record {
  int ok;         /* it parses */
  uint64_t uid;   /* its uid */
  int prev, part; /* the re-form fields: -1 / 1 when absent or bad */
  int store_host; /* it says it hosts the store (sees=-) */
} record;

static void read_record(const uint8_t *p, size_t n, record *r) {
  char text[1024], host[256], name[256], sees[256];
  size_t k = n < sizeof text - 1 ? n : sizeof text - 1;
  memcpy(text, p, k);
  text[k] = '\0';
  unsigned long long uid;
  int claim, nproc;
  *r = (record){0};
  r->ok = sscanf(text, "uid=%llx claim=%d nproc=%d host=%255s hostname=%255s sees=%255s", &uid,
                 &claim, &nproc, host, name, sees) == 6 &&
          nproc >= 1 && nproc <= 1024 && claim >= -1 && claim < RDZV_MAX_NODES;
  r->uid = uid;
  r->store_host = r->ok && strcmp(sees, "-") == 0;
  const char *f = strstr(text, " prev=");
  r->prev = -1;
  r->part = 1;
  if (f == NULL || sscanf(f, " prev=%d part=%d", &r->prev, &r->part) != 2 || r->prev < -1 ||
      r->prev >= RDZV_MAX_NODES)
    r->prev = -1;
  r->part = r->part != 0;
}

/* The records of the nodes that joined before node 0 (NUL-separated in p): how many. */
static int put_records(const char *job, const uint8_t *p, size_t n, record *recs) {
  int k = 0;
  size_t start = 0;
  for (size_t i = 0; i <= n && k < MAX_RECORDS; i++) {
    if (i == n || p[i] == '\0') {
      char suffix[32];
      snprintf(suffix, sizeof suffix, "node/%d", k + 1);
      set_text(job, suffix, p + start, i - start);
      if (recs != NULL) read_record(p + start, i - start, &recs[k]);
      k++;
      start = i + 1;
    }
  }
  char key[STORE_KEY_MAX];
  key_of(key, sizeof key, job, "joined");
  check(store_add(cli, key, k, NULL, base_deadline_in(5000)) == 0, "store_add");
  return k;
}

static void host(const char *job, const uint8_t *p, size_t n) {
  int k = put_records(job, p, n, NULL);
  rdzv_join_opts o = {.job_id = job,
                      .is_host = 1,
                      .claimed_rank = 0,
                      .nproc = 2,
                      .nnodes_min = k + 1,
                      .nnodes_max = k + 1,
                      .my_host = "127.0.0.1",
                      .deadline_ms = base_deadline_in(5000)};
  rdzv_plan plan;
  char err[512];
  int rc = rdzv_join(cli, &o, &plan, err, sizeof err);
  check(rc == 0 || rc == -EINVAL || rc == -EPROTO || rc == -ENOMEM, "host: unexpected error");
  check_reason(rc, err, NULL, 0);
  if (rc == 0) {
    check_plan(&plan, 1);
    check(plan.nnodes == k + 1, "host: not every node is in the plan");
  }
  rdzv_plan_free(&plan);
  delete_round(job, k + 1);
}

/* The order a re-form plan gives: the store's host first, then by last rank, new nodes last. */
static int reform_key(const record *r, int is_host) {
  return is_host ? -1 : r->prev < 0 ? RDZV_MAX_NODES : r->prev;
}

/* A re-form plan against the records (recs[k] is node 0's own, whose uid is not known). */
static void check_reform_plan(const rdzv_plan *plan, const record *recs, int k) {
  int host = k; /* the first record that hosts the store (node 0's own, last, does) */
  for (int i = k - 1; i >= 0; i--)
    if (recs[i].store_host) host = i;
  int restart = 0, at[MAX_RECORDS + 1];
  for (int i = 0; i <= k; i++) {
    restart |= !recs[i].part;
    at[i] = -1;
  }
  check(plan->restart == restart, "reform: restart is not whether a node cannot take part");
  /* Each record's node rank, through its uid (not checked when uids repeat). */
  for (int r = 0; r < plan->nnodes; r++) {
    int found = -1, count = 0;
    for (int i = 0; i < k; i++)
      if (recs[i].uid == plan->nodes[r].uid) found = i, count++;
    if (count > 1) return;
    at[found >= 0 ? found : k] = r;
  }
  for (int i = 0; i <= k; i++) check(at[i] >= 0, "reform: a record has no node in the plan");
  check(at[host] == 0, "reform: the store's host is not node 0");
  for (int i = 0; i <= k; i++)
    for (int j = i + 1; j <= k; j++) {
      int ki = reform_key(&recs[i], i == host), kj = reform_key(&recs[j], j == host);
      if (ki != kj)
        check((ki < kj) == (at[i] < at[j]), "reform: not ordered by last rank");
      else
        check(at[i] < at[j], "reform: equal last ranks not in join order");
    }
}

static void reform_host(const char *job, const uint8_t *p, size_t n) {
  if (n < 1) return;
  record recs[MAX_RECORDS + 1];
  int k = put_records(job, p + 1, n - 1, recs);
  rdzv_join_opts o = {.job_id = job,
                      .is_host = 1,
                      .claimed_rank = 0,
                      .nproc = 2,
                      .nnodes_min = 1,
                      .nnodes_max = k + 1,
                      .my_host = "127.0.0.1",
                      .expect = k + 1,
                      .prev_rank = (p[0] & 0x7f) % 20 - 1,
                      .cannot_reform = p[0] >> 7,
                      .deadline_ms = base_deadline_in(5000)};
  recs[k] = (record){.ok = 1, .prev = o.prev_rank, .part = !o.cannot_reform, .store_host = 1};
  int all_ok = 1;
  for (int i = 0; i < k; i++) all_ok &= recs[i].ok;
  rdzv_plan plan;
  char err[512];
  int rc = rdzv_join(cli, &o, &plan, err, sizeof err);
  check(rc == 0 || rc == -EINVAL || rc == -EPROTO || rc == -ENOMEM, "reform: unexpected error");
  check(rc != 0 || all_ok, "reform: a malformed record was accepted");
  check_reason(rc, err, NULL, 0);
  if (rc == 0) {
    check_plan(&plan, 1);
    check(plan.nnodes == k + 1, "reform: not every node is in the plan");
    check_reform_plan(&plan, recs, k);
  }
  rdzv_plan_free(&plan);
  delete_round(job, k + 1);
}

static void assign(const uint8_t *p, size_t n) {
  if (n < 1) return;
  int cnt = (int)(n - 1 < 64 ? n - 1 : 64);
  if (cnt < 1) return;
  int host_index = p[0] % cnt;
  rdzv_node nodes[64];
  int claims[64];
  memset(nodes, 0, sizeof nodes);
  for (int i = 0; i < cnt; i++) {
    /* 0xff: no claim; else a rank that may be out of range. */
    claims[i] = p[1 + i] == 0xff ? -1 : p[1 + i] % 80;
    snprintf(nodes[i].hostname, sizeof nodes[i].hostname, "n%d", i);
    nodes[i].node_rank = -1;
  }
  char err[256] = "";
  int rc = rdzv_assign_ranks(nodes, claims, cnt, host_index, err, sizeof err);
  check(rc == 0 || rc == -EINVAL, "assign: unexpected error");
  if (rc != 0) {
    check(err[0] != '\0', "assign: no reason");
    return;
  }
  int seen[64] = {0};
  for (int i = 0; i < cnt; i++) {
    int r = nodes[i].node_rank;
    check(r >= 0 && r < cnt && !seen[r], "assign: ranks are not a permutation");
    seen[r] = 1;
    if (i == host_index)
      check(r == 0, "assign: the host is not rank 0");
    else if (claims[i] >= 0)
      check(r == claims[i], "assign: a claim was not kept");
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 16384) return 0;
  char job[64];
  snprintf(job, sizeof job, "fz%lu", round_no++);
  switch (data[0] % 4) {
  case 0:
    joiner(job, data + 1, size - 1);
    break;
  case 1:
    host(job, data + 1, size - 1);
    break;
  case 2:
    assign(data + 1, size - 1);
    break;
  default:
    reform_host(job, data + 1, size - 1);
    break;
  }
  return 0;
}

/* join.c - joining a rendezvous round and planning node ranks. */
#include "rdzv/join.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "store/proto.h"

#define POLL_MS 50

/* Why a store call failed: a backend's own words (etcd's message) where it has them. */
static const char *why(store_client *c, int rc) {
  const char *e = store_client_error(c);
  return e[0] != '\0' ? e : cohort_strerror(rc);
}

void rdzv_key(char *out, size_t outlen, const char *job_id, int round, const char *suffix) {
  snprintf(out, outlen, "%s/%d/%s", job_id, round, suffix);
}

void rdzv_plan_free(rdzv_plan *plan) {
  if (plan == NULL) return;
  free(plan->nodes);
  plan->nodes = NULL;
  plan->nnodes = 0;
}

int rdzv_assign_ranks(rdzv_node *nodes, const int *claimed, int n, int host_index, char *errbuf,
                      size_t errlen) {
  int *owner = malloc((size_t)n * sizeof *owner);
  if (owner == NULL) return -ENOMEM;
  for (int r = 0; r < n; r++) owner[r] = -1;
  int rc = 0;
  /* The host is node 0 by definition: the store lives with node 0's agent. */
  if (claimed[host_index] > 0) {
    snprintf(errbuf, errlen, "node %s hosts the store but claims node rank %d (the host is node 0)",
             nodes[host_index].hostname, claimed[host_index]);
    rc = -EINVAL;
    goto out;
  }
  owner[0] = host_index;
  nodes[host_index].node_rank = 0;
  for (int i = 0; i < n; i++) {
    if (i == host_index || claimed[i] < 0) continue;
    int r = claimed[i];
    if (r >= n) {
      snprintf(errbuf, errlen, "node %s claims node rank %d but the job has %d nodes",
               nodes[i].hostname, r, n);
      rc = -EINVAL;
      goto out;
    }
    if (owner[r] >= 0) {
      snprintf(errbuf, errlen, "nodes %s and %s both claim node rank %d", nodes[owner[r]].hostname,
               nodes[i].hostname, r);
      rc = -EINVAL;
      goto out;
    }
    owner[r] = i;
    nodes[i].node_rank = r;
  }
  /* The others take the free ranks in the order they joined. */
  int next = 0;
  for (int i = 0; i < n; i++) {
    if (i == host_index || claimed[i] >= 0) continue;
    while (owner[next] >= 0) next++;
    owner[next] = i;
    nodes[i].node_rank = next;
  }
out:
  free(owner);
  return rc;
}

void rdzv_record_format(char *out, size_t outlen, uint64_t uid, const rdzv_join_opts *o,
                        const char *hostname) {
  char name[BASE_HOST_MAX];
  base_strlcpy(name, hostname, sizeof name);
  for (char *h = name; *h; h++)
    if (*h == ' ') *h = '_';
  snprintf(out, outlen, "uid=%016llx claim=%d nproc=%d host=%s hostname=%s sees=%s",
           (unsigned long long)uid, o->is_host ? 0 : o->claimed_rank, o->nproc,
           o->my_host && o->my_host[0] ? o->my_host : "-", name[0] ? name : "unknown",
           o->is_host ? "-" : (o->master_host && o->master_host[0] ? o->master_host : "?"));
  size_t len = strlen(out);
  if (o->expect > 0 && len < outlen)
    snprintf(out + len, outlen - len, " prev=%d part=%d", o->prev_rank, !o->cannot_reform);
}

/* A re-form round's fields of a record: the node's last rank and whether it takes part. */
static void parse_reform_fields(const char *text, int *prev, int *part) {
  const char *p = strstr(text, " prev=");
  *prev = -1;
  *part = 1;
  if (p == NULL || sscanf(p, " prev=%d part=%d", prev, part) != 2 || *prev < -1 ||
      *prev >= RDZV_MAX_NODES)
    *prev = -1;
  *part = *part != 0;
}

/* Re-form ranks: the host first, then the others by their last rank, new nodes last in join
 * order (rank order kept across a re-form, docs/reform.md). */
typedef struct by_prev {
  int prev, seq;
} by_prev;

/* The host (-2) first, new nodes (-1) last. */
static int prev_key(int prev) {
  return prev == -2 ? -1 : prev < 0 ? RDZV_MAX_NODES : prev;
}

static int by_prev_cmp(const void *a, const void *b) {
  const by_prev *x = a, *y = b;
  int xp = prev_key(x->prev), yp = prev_key(y->prev);
  return xp != yp ? (xp < yp ? -1 : 1) : (x->seq > y->seq) - (x->seq < y->seq);
}

static int assign_by_prev(rdzv_node *nodes, const int *prevs, int n, int host_index) {
  by_prev *order = malloc((size_t)n * sizeof *order);
  if (order == NULL) return -ENOMEM;
  for (int i = 0; i < n; i++) order[i] = (by_prev){i == host_index ? -2 : prevs[i], i};
  qsort(order, (size_t)n, sizeof *order, by_prev_cmp);
  for (int r = 0; r < n; r++) nodes[order[r].seq].node_rank = r;
  free(order);
  return 0;
}

static int parse_record(const char *text, rdzv_node *node, int *claim, char *sees, size_t seeslen) {
  char host[BASE_HOST_MAX], hostname[BASE_HOST_MAX], seen[BASE_HOST_MAX];
  unsigned long long uid;
  int nproc, cl;
  if (sscanf(text, "uid=%llx claim=%d nproc=%d host=%255s hostname=%255s sees=%255s", &uid, &cl,
             &nproc, host, hostname, seen) != 6)
    return -EPROTO;
  if (nproc < 1 || nproc > RDZV_MAX_NPROC || cl < -1 || cl >= RDZV_MAX_NODES) return -EPROTO;
  node->uid = uid;
  node->nproc = nproc;
  node->node_rank = -1;
  base_strlcpy(node->host, host, sizeof node->host);
  base_strlcpy(node->hostname, hostname, sizeof node->hostname);
  *claim = cl;
  base_strlcpy(sees, seen, seeslen);
  return 0;
}

static int get_text(store_client *c, const char *key, char **out, int64_t deadline) {
  void *val = NULL;
  size_t len = 0;
  int rc = store_get(c, key, &val, &len, deadline);
  if (rc != 0) return rc;
  char *s = malloc(len + 1);
  if (s == NULL) {
    free(val);
    return -ENOMEM;
  }
  memcpy(s, val, len);
  s[len] = '\0';
  free(val);
  *out = s;
  return 0;
}

/*
 * The plan of a round whose ranks are assigned, as node 0 keeps it: every
 * node by node rank with its first global rank, the master (the address the
 * other nodes saw the host at, "" if none did) and a free port for the
 * workers. nodes[] is in join order; the host's address becomes the master.
 */
static int full_plan(const rdzv_join_opts *o, rdzv_node *nodes, int n, int host_index, char *master,
                     int restart, rdzv_plan *plan) {
  /* No host (etcd): node 0 is the planner, at the address it reaches etcd from. A host
   * given its own address (--local-addr) is there rather than where the others saw it. */
  if (o->first_plans || (o->is_host && o->my_host && o->my_host[0]))
    base_strlcpy(master, nodes[host_index].host, BASE_HOST_MAX);
  if (master[0] == '\0') base_strlcpy(master, "127.0.0.1", BASE_HOST_MAX);
  /* The host's own address is the one the others reached it at. */
  base_strlcpy(nodes[host_index].host, master, sizeof nodes[host_index].host);
  memset(plan, 0, sizeof *plan);
  plan->nodes = calloc((size_t)n, sizeof *plan->nodes);
  if (plan->nodes == NULL) return -ENOMEM;
  plan->nnodes = n;
  plan->my_index = nodes[host_index].node_rank; /* 0: the planner is node 0 */
  base_strlcpy(plan->master_addr, master, sizeof plan->master_addr);
  if (base_free_port(NULL, &plan->master_port) != 0) plan->master_port = 29500;
  plan->store_port = o->store_port > 0 ? o->store_port : 0;
  plan->restart = restart;
  /* The ranks are a permutation of 0..n-1 (rdzv_assign_ranks), so one pass places them. */
  for (int i = 0; i < n; i++) plan->nodes[nodes[i].node_rank] = nodes[i];
  for (int r = 0; r < n; r++) {
    plan->nodes[r].rank_offset = plan->world_size;
    plan->world_size += plan->nodes[r].nproc;
  }
  return 0;
}

/* The plan's head: its header line and node 0's line. */
static void format_head(const rdzv_plan *p, char *out, size_t cap) {
  size_t off = (size_t)snprintf(out, cap, "ok nnodes=%d master=%s port=%d world=%d", p->nnodes,
                                p->master_addr, p->master_port, p->world_size);
  if (p->store_port > 0) off += (size_t)snprintf(out + off, cap - off, " store=%d", p->store_port);
  if (p->restart) off += (size_t)snprintf(out + off, cap - off, " restart=1");
  const rdzv_node *n0 = &p->nodes[0];
  snprintf(out + off, cap - off, "\n0 %016llx %d %s %s\n", (unsigned long long)n0->uid, n0->nproc,
           n0->host, n0->hostname);
}

/* Page pg: the lines of the nodes that joined RDZV_PLAN_PAGE * pg + 1 .. + RDZV_PLAN_PAGE. */
static void format_page(const rdzv_plan *p, const rdzv_node *nodes, int n, int pg, char *out,
                        size_t cap) {
  size_t off = 0;
  out[0] = '\0';
  for (int i = pg * RDZV_PLAN_PAGE; i < n && i < (pg + 1) * RDZV_PLAN_PAGE; i++) {
    const rdzv_node *nd = &p->nodes[nodes[i].node_rank];
    off += (size_t)snprintf(out + off, cap - off, "%d %d %d %016llx %d %s %s\n", i + 1,
                            nd->node_rank, nd->rank_offset, (unsigned long long)nd->uid, nd->nproc,
                            nd->host, nd->hostname);
  }
}

/*
 * Publishes the plan: its pages, then its head, which the other nodes wait
 * for. A node reads the head and the one page its join order names, so
 * that no node reads the whole plan (N nodes reading it would cross N²
 * bytes; 12 GB at 16,384 nodes).
 */
static int publish_plan(store_client *c, const rdzv_join_opts *o, const rdzv_plan *plan,
                        const rdzv_node *nodes, int n) {
  size_t cap = (size_t)RDZV_PLAN_PAGE * (2 * BASE_HOST_MAX + 96) + 64;
  char *text = malloc(cap);
  if (text == NULL) return -ENOMEM;
  int rc = 0;
  char key[STORE_KEY_MAX], suffix[32];
  for (int pg = 0; rc == 0 && pg * RDZV_PLAN_PAGE < n; pg++) {
    format_page(plan, nodes, n, pg, text, cap);
    snprintf(suffix, sizeof suffix, "plan/%d", pg);
    rdzv_key(key, sizeof key, o->job_id, o->round, suffix);
    rc = store_set(c, key, text, strlen(text), o->deadline_ms);
  }
  if (rc == 0) {
    format_head(plan, text, cap);
    rdzv_key(key, sizeof key, o->job_id, o->round, "plan");
    rc = store_set(c, key, text, strlen(text), o->deadline_ms);
  }
  free(text);
  return rc;
}

/* The records to plan with: MIN of them, then a last call for more up to MAX; *n how many. */
static int await_nodes(store_client *c, const rdzv_join_opts *o, char (*keybuf)[STORE_KEY_MAX],
                       int64_t *n, char *errbuf, size_t errlen) {
  char key[STORE_KEY_MAX];
  int rc = 0;
  *n = o->nnodes_min;
  /* Wait for MIN records (keys node/1..node/MIN). */
  const char **keys = calloc((size_t)o->nnodes_min, sizeof *keys);
  if (keys == NULL) return -ENOMEM;
  for (int i = 0; i < o->nnodes_min; i++) keys[i] = keybuf[i];
  /* A WAIT names at most STORE_WAIT_KEYS_MAX keys: the records in slices of that many. */
  for (int at = 0; rc == 0 && at < o->nnodes_min; at += STORE_WAIT_KEYS_MAX) {
    int k = o->nnodes_min - at < STORE_WAIT_KEYS_MAX ? o->nnodes_min - at : STORE_WAIT_KEYS_MAX;
    rc = store_wait(c, keys + at, (size_t)k, o->deadline_ms);
  }
  if (rc != 0) {
    int64_t joined = 0;
    rdzv_key(key, sizeof key, o->job_id, o->round, "joined");
    store_add(c, key, 0, &joined, base_deadline_in(1000));
    snprintf(errbuf, errlen, "only %lld of %d nodes joined before the deadline", (long long)joined,
             o->nnodes_min);
    goto done;
  }
  /* Elastic: give late nodes a last call, up to MAX. */
  rdzv_key(key, sizeof key, o->job_id, o->round, "joined");
  if (o->nnodes_max > o->nnodes_min) {
    int64_t until = base_now_ms() + o->last_call_ms;
    if (until > o->deadline_ms) until = o->deadline_ms;
    while (base_now_ms() < until) {
      int64_t joined = 0;
      if (store_add(c, key, 0, &joined, base_deadline_in(1000)) == 0 && joined >= o->nnodes_max)
        break;
      base_sleep_ms(POLL_MS);
    }
    int64_t joined = 0;
    rc = store_add(c, key, 0, &joined, base_deadline_in(1000));
    if (rc != 0) goto done;
    *n = joined < o->nnodes_max ? joined : o->nnodes_max;
    if (*n < o->nnodes_min) *n = o->nnodes_min; /* the count lost (etcd), the MIN records there */
    for (int64_t i = o->nnodes_min; i < *n; i++) {
      const char *k = keybuf[i];
      rc = store_wait(c, &k, 1, o->deadline_ms);
      if (rc != 0) goto done;
    }
  }
done:
  free(keys);
  return rc;
}

/*
 * A re-form round's records: as soon as expect nodes joined, or once
 * settle_ms passed with at least MIN there (a survivor learns of the loss
 * from the fail key at once; one that has not come by then is lost too, and
 * one that comes later is taken in by the next re-form), or at once with
 * those there (at least MIN) when the nodes joined and the nodes pending
 * (rdzv_mark_pending: a replacement whose workers are still starting) make
 * expect. *n how many.
 */
static int await_reform(store_client *c, const rdzv_join_opts *o, char (*keybuf)[STORE_KEY_MAX],
                        int64_t *n, char *errbuf, size_t errlen) {
  char key[STORE_KEY_MAX], pkey[STORE_KEY_MAX], bkey[STORE_KEY_MAX];
  rdzv_key(key, sizeof key, o->job_id, o->round, "joined");
  rdzv_key(pkey, sizeof pkey, o->job_id, o->round, "pending");
  rdzv_key(bkey, sizeof bkey, o->job_id, o->round, "back");
  int64_t settle = base_now_ms() + o->settle_ms, joined = 0, pending = 0, back = 0;
  for (;;) {
    int rc = store_add(c, key, 0, &joined, base_deadline_in(1000));
    if (rc == 0 && o->expect_back > 0) rc = store_add(c, bkey, 0, &back, base_deadline_in(1000));
    if (rc == 0 && joined < o->expect) rc = store_add(c, pkey, 0, &pending, base_deadline_in(1000));
    if (rc != 0) return rc;
    int64_t now = base_now_ms();
    /* A replacement joining first must not take a member's place in the round. */
    int members = back >= o->expect_back;
    int enough = now >= settle || (members && joined + pending >= o->expect);
    if ((members && joined >= o->expect) || (enough && joined >= o->nnodes_min)) break;
    if (now >= o->deadline_ms) {
      snprintf(errbuf, errlen, "only %lld of the %d nodes expected came back (at least %d needed)",
               (long long)joined, o->expect, o->nnodes_min);
      return -ETIMEDOUT;
    }
    base_sleep_ms(POLL_MS);
  }
  *n = joined < o->nnodes_max ? joined : o->nnodes_max;
  for (int64_t i = 0; i < *n; i++) {
    const char *k = keybuf[i];
    int rc = store_wait(c, &k, 1, o->deadline_ms);
    if (rc != 0) return rc;
  }
  return 0;
}

/* The host's part: wait for the nodes, plan, publish; *plan is the whole plan (node 0's). */
static int host_plan(store_client *c, const rdzv_join_opts *o, rdzv_plan *plan, char *errbuf,
                     size_t errlen) {
  int rc = 0;
  rdzv_node *nodes = NULL;
  int *claims = NULL, *prevs = NULL, restart = 0;
  void **vals = NULL;
  size_t *lens = NULL;
  int64_t n = o->nnodes_min;
  char(*keybuf)[STORE_KEY_MAX] = calloc((size_t)o->nnodes_max, sizeof *keybuf);
  if (keybuf == NULL) {
    rc = -ENOMEM;
    goto out;
  }
  for (int i = 0; i < o->nnodes_max; i++) {
    char suffix[32];
    snprintf(suffix, sizeof suffix, "node/%d", i + 1);
    rdzv_key(keybuf[i], sizeof keybuf[i], o->job_id, o->round, suffix);
  }
  rc = o->expect > 0 ? await_reform(c, o, keybuf, &n, errbuf, errlen)
                     : await_nodes(c, o, keybuf, &n, errbuf, errlen);
  if (rc != 0) goto out;
  nodes = calloc((size_t)n, sizeof *nodes);
  claims = calloc((size_t)n, sizeof *claims);
  prevs = calloc((size_t)n, sizeof *prevs);
  if (nodes == NULL || claims == NULL || prevs == NULL) {
    rc = -ENOMEM;
    goto out;
  }
  int host_index = -1;
  char master[BASE_HOST_MAX] = "";
  /* One pipelined read of all records: one round trip, not one per node. */
  vals = calloc((size_t)n, sizeof *vals);
  lens = calloc((size_t)n, sizeof *lens);
  const char **rkeys = (const char **)calloc((size_t)n, sizeof *rkeys);
  if (vals == NULL || lens == NULL || rkeys == NULL) {
    free(rkeys);
    rc = -ENOMEM;
    goto out;
  }
  for (int64_t i = 0; i < n; i++) rkeys[i] = keybuf[i];
  rc = store_get_many(c, rkeys, (size_t)n, vals, lens, o->deadline_ms);
  free(rkeys);
  if (rc != 0) goto out;
  for (int64_t i = 0; i < n; i++) {
    char text[1024], sees[BASE_HOST_MAX];
    size_t k = lens[i] < sizeof text - 1 ? lens[i] : sizeof text - 1;
    if (vals[i] != NULL) memcpy(text, vals[i], k);
    text[vals[i] != NULL ? k : 0] = '\0';
    int part = 1;
    rc = parse_record(text, &nodes[i], &claims[i], sees, sizeof sees);
    if (rc != 0) {
      snprintf(errbuf, errlen, "malformed node record %s", keybuf[i]);
      goto out;
    }
    parse_reform_fields(text, &prevs[i], &part);
    restart |= !part;
    if (strcmp(sees, "-") == 0) {
      if (host_index < 0) host_index = (int)i;
    } else if (master[0] == '\0') {
      base_strlcpy(master, sees, sizeof master);
    }
  }
  if (host_index < 0) {
    snprintf(errbuf, errlen, "no joined node hosts the store");
    rc = -EINVAL;
    goto out;
  }
  char reason[512] = "";
  if (o->expect > 0)
    rc = assign_by_prev(nodes, prevs, (int)n, host_index);
  else
    rc = rdzv_assign_ranks(nodes, claims, (int)n, host_index, reason, sizeof reason);
  char pkey[STORE_KEY_MAX];
  rdzv_key(pkey, sizeof pkey, o->job_id, o->round, "plan");
  if (rc != 0) {
    /* Every node reads the reason where it waits for the plan. */
    char text[sizeof reason + 8];
    snprintf(text, sizeof text, "error %s", reason);
    snprintf(errbuf, errlen, "%s", reason);
    store_set(c, pkey, text, strlen(text), o->deadline_ms);
    goto out;
  }
  rc = full_plan(o, nodes, (int)n, host_index, master, restart, plan);
  if (rc == 0) rc = publish_plan(c, o, plan, nodes, (int)n);
  if (rc == 0) {
    /* Where a node that comes late finds the running round. */
    char latest[16], lkey[STORE_KEY_MAX];
    snprintf(latest, sizeof latest, "%d", o->round);
    snprintf(lkey, sizeof lkey, "%s/latest", o->job_id);
    rc = store_set(c, lkey, latest, strlen(latest), o->deadline_ms);
  }
  if (rc != 0) rdzv_plan_free(plan);
out:
  for (int64_t i = 0; vals != NULL && i < n; i++) free(vals[i]);
  free(vals);
  free(lens);
  free(keybuf);
  free(nodes);
  free(claims);
  free(prevs);
  return rc;
}

/* The head's first line; 0, or -EPROTO with a reason. */
static int parse_header(const char *head, rdzv_plan *plan, char *errbuf, size_t errlen) {
  int n = 0, port = 0, world = 0;
  char master[BASE_HOST_MAX];
  if (sscanf(head, "ok nnodes=%d master=%255s port=%d world=%d", &n, master, &port, &world) != 4 ||
      n < 1 || n > RDZV_MAX_NODES || port < 1 || port > 65535 || world < n ||
      world > n * RDZV_MAX_NPROC) {
    snprintf(errbuf, errlen, "malformed rendezvous plan");
    return -EPROTO;
  }
  plan->nnodes = n;
  plan->world_size = world;
  plan->master_port = port;
  base_strlcpy(plan->master_addr, master, sizeof plan->master_addr);
  const char *eol = strchr(head, '\n');
  const char *store = strstr(head, " store=");
  if (store != NULL && (eol == NULL || store < eol)) plan->store_port = atoi(store + 7);
  const char *restart = strstr(head, " restart=1");
  plan->restart = restart != NULL && (eol == NULL || restart < eol);
  return 0;
}

/* A node's place within the world: at least one process, all of them in it. */
static int place_ok(const rdzv_plan *plan, int rank, int offset, int nproc) {
  return rank >= 0 && rank < plan->nnodes && offset >= 0 && nproc >= 1 &&
         nproc <= plan->world_size - offset;
}

/* Node 0's line (the head's second) into nodes[0]; 0 or -EPROTO. */
static int parse_node0(const char *head, rdzv_plan *plan) {
  const char *p = strchr(head, '\n');
  rdzv_node *nd = &plan->nodes[0];
  unsigned long long uid;
  if (p == NULL || sscanf(p + 1, "%d %llx %d %255s %255s", &nd->node_rank, &uid, &nd->nproc,
                          nd->host, nd->hostname) != 5)
    return -EPROTO;
  nd->uid = uid;
  nd->rank_offset = 0;
  return nd->node_rank == 0 && place_ok(plan, 0, 0, nd->nproc) ? 0 : -EPROTO;
}

/* Finds my_uid's line in a page of the plan and places it in nodes[]; 1 found, 0 not, -EPROTO. */
static int parse_page(const char *page, uint64_t my_uid, rdzv_plan *plan) {
  for (const char *p = page; *p != '\0'; p++) {
    rdzv_node nd = {0};
    unsigned long long uid;
    int seq;
    if (sscanf(p, "%d %d %d %llx %d %255s %255s", &seq, &nd.node_rank, &nd.rank_offset, &uid,
               &nd.nproc, nd.host, nd.hostname) != 7 ||
        seq < 1 || !place_ok(plan, nd.node_rank, nd.rank_offset, nd.nproc))
      return -EPROTO;
    nd.uid = uid;
    if (uid == my_uid && nd.node_rank > 0) {
      plan->nodes[nd.node_rank] = nd;
      plan->my_index = nd.node_rank;
      return 1;
    }
    p = strchr(p, '\n');
    if (p == NULL) break;
  }
  return 0;
}

int rdzv_plan_parse(const char *head, const char *page, uint64_t my_uid, rdzv_plan *plan,
                    char *errbuf, size_t errlen) {
  memset(plan, 0, sizeof *plan);
  if (strncmp(head, "error ", 6) == 0) {
    snprintf(errbuf, errlen, "%s", head + 6);
    /* One line, whatever wrote the plan. */
    for (char *c = errbuf; *c; c++)
      if (*c == '\n' || *c == '\r') *c = ' ';
    return -EINVAL;
  }
  int rc = parse_header(head, plan, errbuf, errlen);
  if (rc != 0) return rc;
  int n = plan->nnodes;
  plan->nodes = calloc((size_t)n, sizeof *plan->nodes);
  if (plan->nodes == NULL) return -ENOMEM;
  for (int r = 1; r < n; r++) plan->nodes[r].node_rank = -1;
  plan->my_index = -1;
  int found = 0;
  rc = parse_node0(head, plan);
  if (rc == 0 && plan->nodes[0].uid == my_uid) {
    plan->my_index = 0;
    found = 1;
  } else if (rc == 0 && page != NULL) {
    found = parse_page(page, my_uid, plan);
    rc = found < 0 ? found : 0;
  }
  if (rc != 0) {
    snprintf(errbuf, errlen, "malformed rendezvous plan");
    rdzv_plan_free(plan);
    return rc;
  }
  if (!found) {
    snprintf(errbuf, errlen, "the job already has its %d nodes; this node came too late", n);
    rdzv_plan_free(plan);
    plan->nnodes = n;
    return -ESRCH;
  }
  return 0;
}

int rdzv_mark_pending(store_client *c, const char *job_id, int round, int64_t deadline_ms) {
  char key[STORE_KEY_MAX];
  rdzv_key(key, sizeof key, job_id, round, "pending");
  return store_add(c, key, 1, NULL, deadline_ms);
}

int rdzv_wait_first_joined(store_client *c, const char *job_id, int round, int64_t deadline_ms) {
  char key[STORE_KEY_MAX];
  rdzv_key(key, sizeof key, job_id, round, "joined");
  const char *keys[] = {key};
  return store_wait(c, keys, 1, deadline_ms);
}

int rdzv_latest_round(store_client *c, const char *job_id, int64_t deadline_ms) {
  char key[STORE_KEY_MAX];
  snprintf(key, sizeof key, "%s/latest", job_id);
  char *text = NULL;
  int rc = get_text(c, key, &text, deadline_ms);
  if (rc != 0) return rc;
  int round = -1;
  rc = base_parse_int(text, 0, INT32_MAX, &round);
  free(text);
  return rc == 0 ? round : -EPROTO;
}

/*
 * Waits for the plan's head. With etcd (first_plans) the planner's keys die with it, so the wait
 * looks each second whether a later round is the latest: then the head will not come, -ESRCH.
 */
static int await_head(store_client *c, const rdzv_join_opts *o, const char *head) {
  const char *keys[1] = {head};
  if (!o->first_plans) return store_wait(c, keys, 1, o->deadline_ms);
  for (;;) {
    int64_t slice = base_deadline_in(1000);
    int rc = store_wait(c, keys, 1, slice < o->deadline_ms ? slice : o->deadline_ms);
    if (rc != -ETIMEDOUT || base_now_ms() >= o->deadline_ms) return rc;
    if (rdzv_latest_round(c, o->job_id, base_deadline_in(2000)) > o->round) return -ESRCH;
  }
}

/*
 * A node other than node 0 waits for the plan's head, then reads it and the
 * page of its join order seq in one round trip.
 */
static int read_plan(store_client *c, const rdzv_join_opts *o, int64_t seq, uint64_t uid,
                     rdzv_plan *plan, char *errbuf, size_t errlen) {
  char head[STORE_KEY_MAX], page[STORE_KEY_MAX], suffix[32];
  rdzv_key(head, sizeof head, o->job_id, o->round, "plan");
  snprintf(suffix, sizeof suffix, "plan/%lld", (long long)((seq - 1) / RDZV_PLAN_PAGE));
  rdzv_key(page, sizeof page, o->job_id, o->round, suffix);
  const char *keys[2] = {head, page};
  int rc = await_head(c, o, head);
  if (rc == -ESRCH) return rc; /* planned without this node: a later round runs */
  if (rc != 0) {
    snprintf(errbuf, errlen, "no rendezvous plan from node 0 before the deadline (%s)", why(c, rc));
    return rc;
  }
  void *vals[2] = {NULL, NULL};
  size_t lens[2] = {0, 0};
  char *text[2] = {NULL, NULL};
  rc = store_get_many(c, keys, 2, vals, lens, o->deadline_ms);
  for (int i = 0; rc == 0 && i < 2; i++) {
    if (vals[i] == NULL) continue; /* no page: a node beyond the plan */
    text[i] = malloc(lens[i] + 1);
    if (text[i] == NULL) rc = -ENOMEM;
    if (text[i] != NULL) memcpy(text[i], vals[i], lens[i]);
    if (text[i] != NULL) text[i][lens[i]] = '\0';
  }
  if (rc == 0 && text[0] == NULL) rc = -ENOENT;
  if (rc == 0) rc = rdzv_plan_parse(text[0], text[1], uid, plan, errbuf, errlen);
  for (int i = 0; i < 2; i++) {
    free(vals[i]);
    free(text[i]);
  }
  return rc;
}

/*
 * Whether round o->round has been planned already: 1 its plan's head is there, 2 only a later
 * round is the latest, else 0. With etcd a round's keys die with the lease of the node that wrote
 * them last, its join counter among them: a node that comes late may count 1 in a round planned
 * long ago (first_plans would make it the planner of that round again).
 */
static int round_planned(store_client *c, const rdzv_join_opts *o) {
  char head[STORE_KEY_MAX];
  rdzv_key(head, sizeof head, o->job_id, o->round, "plan");
  void *val = NULL;
  size_t len = 0;
  int rc = store_get(c, head, &val, &len, base_deadline_in(2000));
  free(val);
  if (rc == 0) return 1;
  return rdzv_latest_round(c, o->job_id, base_deadline_in(2000)) > o->round ? 2 : 0;
}

int rdzv_join(store_client *c, const rdzv_join_opts *o, rdzv_plan *plan, char *errbuf,
              size_t errlen) {
  memset(plan, 0, sizeof *plan);
  errbuf[0] = '\0';
  if (o->nnodes_min < 1 || o->nnodes_max < o->nnodes_min || o->nnodes_max > RDZV_MAX_NODES) {
    snprintf(errbuf, errlen, "invalid node count %d:%d", o->nnodes_min, o->nnodes_max);
    return -EINVAL;
  }
  uint64_t uid;
  int rc = base_random_bytes(&uid, sizeof uid);
  if (rc != 0) return rc;
  char key[STORE_KEY_MAX];
  rdzv_key(key, sizeof key, o->job_id, o->round, "joined");
  int64_t seq = 0;
  rc = store_add(c, key, 1, &seq, o->deadline_ms);
  if (rc != 0) {
    snprintf(errbuf, errlen, "cannot register with the store: %s", why(c, rc));
    return rc;
  }
  char hostname[BASE_HOST_MAX] = "unknown";
  gethostname(hostname, sizeof hostname - 1);
  /* No host (etcd): the first node to join plans the round and is node 0. */
  rdzv_join_opts me = *o;
  int planned = o->first_plans && seq == 1 ? round_planned(c, o) : 0;
  if (planned == 2) {
    snprintf(errbuf, errlen, "round %d was planned before this node came", o->round);
    return -EAGAIN; /* its plan is gone with its planner: the latest round is the one to join */
  }
  if (o->first_plans) me.is_host = seq == 1 && !planned;
  o = &me;
  char record[1024];
  rdzv_record_format(record, sizeof record, uid, o, hostname);
  char suffix[32];
  snprintf(suffix, sizeof suffix, "node/%lld", (long long)seq);
  rdzv_key(key, sizeof key, o->job_id, o->round, suffix);
  rc = store_set(c, key, record, strlen(record), o->deadline_ms);
  if (rc == 0 && o->expect > 0 && o->prev_rank >= 0) { /* a member back, its record there */
    rdzv_key(key, sizeof key, o->job_id, o->round, "back");
    rc = store_add(c, key, 1, NULL, o->deadline_ms);
  }
  if (rc != 0) {
    snprintf(errbuf, errlen, "cannot register with the store: %s", why(c, rc));
    return rc;
  }
  /* Node 0 planned: it has the whole plan; the others read their part of it. */
  if (o->is_host) return host_plan(c, o, plan, errbuf, errlen);
  rc = read_plan(c, o, seq, uid, plan, errbuf, errlen);
  return rc == -ESRCH ? -EAGAIN : rc;
}

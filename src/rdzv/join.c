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
  if (nproc < 1 || nproc > 1024 || cl < -1 || cl >= RDZV_MAX_NODES) return -EPROTO;
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
 * Appends the plan's node lines from off on, in node-rank order; the ranks
 * are a permutation of 0..n-1 (rdzv_assign_ranks), so one pass places them.
 */
static int format_nodes(const rdzv_node *nodes, int n, char *plan, size_t off, size_t cap) {
  int *at = malloc((size_t)n * sizeof *at);
  if (at == NULL) return -ENOMEM;
  for (int i = 0; i < n; i++) at[nodes[i].node_rank] = i;
  for (int r = 0; r < n; r++) {
    const rdzv_node *nd = &nodes[at[r]];
    off += (size_t)snprintf(plan + off, cap - off, "%d %016llx %d %s %s\n", r,
                            (unsigned long long)nd->uid, nd->nproc, nd->host, nd->hostname);
  }
  free(at);
  return 0;
}

/*
 * The plan of a round whose ranks are assigned: its header line (master, a
 * free port for the workers, the store's port, restart=1 when a node of a
 * re-form round cannot take part) and the node lines. master
 * holds the address the other nodes saw the host at ("" if none did).
 */
static int format_plan(const rdzv_join_opts *o, rdzv_node *nodes, int n, int host_index,
                       char *master, int restart, char *plan, size_t cap) {
  /* No host (etcd): node 0 is the planner, at the address it reaches etcd from. A host
   * given its own address (--local-addr) is there rather than where the others saw it. */
  if (o->first_plans || (o->is_host && o->my_host && o->my_host[0]))
    base_strlcpy(master, nodes[host_index].host, BASE_HOST_MAX);
  if (master[0] == '\0') base_strlcpy(master, "127.0.0.1", BASE_HOST_MAX);
  /* The host's own address is the one the others reached it at. */
  base_strlcpy(nodes[host_index].host, master, sizeof nodes[host_index].host);
  int port = 0;
  if (base_free_port(NULL, &port) != 0) port = 29500;
  size_t off = (size_t)snprintf(plan, cap, "ok nnodes=%d master=%s port=%d", n, master, port);
  if (o->store_port > 0) off += (size_t)snprintf(plan + off, cap - off, " store=%d", o->store_port);
  if (restart) off += (size_t)snprintf(plan + off, cap - off, " restart=1");
  off += (size_t)snprintf(plan + off, cap - off, "\n");
  return format_nodes(nodes, n, plan, off, cap);
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
  char key[STORE_KEY_MAX], pkey[STORE_KEY_MAX];
  rdzv_key(key, sizeof key, o->job_id, o->round, "joined");
  rdzv_key(pkey, sizeof pkey, o->job_id, o->round, "pending");
  int64_t settle = base_now_ms() + o->settle_ms, joined = 0, pending = 0;
  for (;;) {
    int rc = store_add(c, key, 0, &joined, base_deadline_in(1000));
    if (rc == 0 && joined < o->expect) rc = store_add(c, pkey, 0, &pending, base_deadline_in(1000));
    if (rc != 0) return rc;
    int64_t now = base_now_ms();
    int enough = now >= settle || joined + pending >= o->expect;
    if (joined >= o->expect || (enough && joined >= o->nnodes_min)) break;
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

/* The host's part: wait for the nodes, plan, publish. */
static int host_plan(store_client *c, const rdzv_join_opts *o, char *errbuf, size_t errlen) {
  int rc = 0;
  rdzv_node *nodes = NULL;
  int *claims = NULL, *prevs = NULL, restart = 0;
  char *plan = NULL;
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
  size_t cap = 256 + (size_t)n * (2 * BASE_HOST_MAX + 64);
  plan = malloc(cap);
  if (plan == NULL) {
    rc = -ENOMEM;
    goto out;
  }
  if (rc != 0) {
    snprintf(plan, cap, "error %s", reason);
    snprintf(errbuf, errlen, "%s", reason);
  } else if (format_plan(o, nodes, (int)n, host_index, master, restart, plan, cap) != 0) {
    rc = -ENOMEM;
    goto out;
  }
  char pkey[STORE_KEY_MAX];
  rdzv_key(pkey, sizeof pkey, o->job_id, o->round, "plan");
  int src = store_set(c, pkey, plan, strlen(plan), o->deadline_ms);
  if (rc == 0) rc = src;
  if (rc == 0) {
    /* Where a node that comes late finds the running round. */
    char latest[16], lkey[STORE_KEY_MAX];
    snprintf(latest, sizeof latest, "%d", o->round);
    snprintf(lkey, sizeof lkey, "%s/latest", o->job_id);
    rc = store_set(c, lkey, latest, strlen(latest), o->deadline_ms);
  }
out:
  for (int64_t i = 0; vals != NULL && i < n; i++) free(vals[i]);
  free(vals);
  free(lens);
  free(keybuf);
  free(nodes);
  free(claims);
  free(prevs);
  free(plan);
  return rc;
}

int rdzv_plan_parse(const char *text, uint64_t my_uid, rdzv_plan *plan, char *errbuf,
                    size_t errlen) {
  if (strncmp(text, "error ", 6) == 0) {
    snprintf(errbuf, errlen, "%s", text + 6);
    /* One line, whatever wrote the plan. */
    for (char *c = errbuf; *c; c++)
      if (*c == '\n' || *c == '\r') *c = ' ';
    return -EINVAL;
  }
  int n = 0, port = 0;
  char master[BASE_HOST_MAX];
  if (sscanf(text, "ok nnodes=%d master=%255s port=%d", &n, master, &port) != 3 || n < 1 ||
      n > RDZV_MAX_NODES || port < 1 || port > 65535) {
    snprintf(errbuf, errlen, "malformed rendezvous plan");
    return -EPROTO;
  }
  plan->nodes = calloc((size_t)n, sizeof *plan->nodes);
  if (plan->nodes == NULL) return -ENOMEM;
  plan->nnodes = n;
  plan->master_port = port;
  plan->my_index = -1;
  base_strlcpy(plan->master_addr, master, sizeof plan->master_addr);
  const char *p = strchr(text, '\n');
  int offset = 0;
  for (int r = 0; r < n; r++) {
    if (p == NULL) break;
    p++;
    rdzv_node *nd = &plan->nodes[r];
    unsigned long long uid;
    if (sscanf(p, "%d %llx %d %255s %255s", &nd->node_rank, &uid, &nd->nproc, nd->host,
               nd->hostname) != 5 ||
        nd->node_rank != r || nd->nproc < 1) {
      snprintf(errbuf, errlen, "malformed rendezvous plan line %d", r + 1);
      rdzv_plan_free(plan);
      return -EPROTO;
    }
    nd->uid = uid;
    nd->rank_offset = offset;
    offset += nd->nproc;
    if (uid == my_uid) plan->my_index = r;
    p = strchr(p, '\n');
  }
  plan->world_size = offset;
  const char *store = strstr(text, " store=");
  const char *eol = strchr(text, '\n');
  if (store != NULL && (eol == NULL || store < eol)) plan->store_port = atoi(store + 7);
  const char *restart = strstr(text, " restart=1");
  plan->restart = restart != NULL && (eol == NULL || restart < eol);
  if (plan->my_index < 0) {
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
    snprintf(errbuf, errlen, "cannot register with the store: %s", cohort_strerror(rc));
    return rc;
  }
  char hostname[BASE_HOST_MAX] = "unknown";
  gethostname(hostname, sizeof hostname - 1);
  /* No host (etcd): the first node to join plans the round and is node 0. */
  rdzv_join_opts me = *o;
  if (o->first_plans) me.is_host = seq == 1;
  o = &me;
  char record[1024];
  rdzv_record_format(record, sizeof record, uid, o, hostname);
  char suffix[32];
  snprintf(suffix, sizeof suffix, "node/%lld", (long long)seq);
  rdzv_key(key, sizeof key, o->job_id, o->round, suffix);
  rc = store_set(c, key, record, strlen(record), o->deadline_ms);
  if (rc != 0) {
    snprintf(errbuf, errlen, "cannot register with the store: %s", cohort_strerror(rc));
    return rc;
  }
  if (o->is_host) {
    rc = host_plan(c, o, errbuf, errlen);
    if (rc != 0 && rc != -EINVAL) return rc;
  }
  rdzv_key(key, sizeof key, o->job_id, o->round, "plan");
  const char *keys[1] = {key};
  rc = store_wait(c, keys, 1, o->deadline_ms);
  if (rc != 0) {
    if (errbuf[0] == '\0')
      snprintf(errbuf, errlen, "no rendezvous plan from node 0 before the deadline (%s)",
               cohort_strerror(rc));
    return rc;
  }
  char *text = NULL;
  rc = get_text(c, key, &text, o->deadline_ms);
  if (rc != 0) return rc;
  rc = rdzv_plan_parse(text, uid, plan, errbuf, errlen);
  free(text);
  return rc == -ESRCH ? -EAGAIN : rc;
}

/* cluster.c - store, run id, join, watch and the done/exit keys between agents. */
#include "agent/cluster.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/jobctl.h"
#include "agent/secure.h"
#include "agent/signals.h"
#include "store/auth.h"

extern char **environ;

const char *agent_cluster_token(const cluster *c) {
  return c->token[0] != '\0' ? c->token : NULL;
}

/* Starts the store this agent hosts on bind_host:port. */
static int host_store(cluster *c, const char *bind_host, int port) {
  store_server_opts so = {.bind_host = bind_host, .port = port, .token = agent_cluster_token(c)};
  int rc = store_server_start(&so, &c->store);
  if (rc != 0) {
    if (port != 0)
      fprintf(stderr, "cohort: cannot host the rendezvous store on port %d: %s\n", port,
              cohort_strerror(rc));
    else
      fprintf(stderr, "cohort: cannot start the rendezvous store: %s\n", cohort_strerror(rc));
    return rc;
  }
  c->store_port = store_server_port(c->store);
  base_strlcpy(c->store_host, "127.0.0.1", sizeof c->store_host);
  return 0;
}

/* This node alone: the store on loopback, no rendezvous, and a random token
 * unless one was given, so other local users cannot join. */
static int open_alone(cluster *c) {
  if (c->run_id[0] == '\0') {
    unsigned char raw[6];
    if (base_random_bytes(raw, sizeof raw) != 0) return -EIO;
    base_hex(raw, sizeof raw, c->run_id);
  }
  if (c->token[0] == '\0' && store_token_new(c->token) != 0) {
    fprintf(stderr, "cohort: cannot read random bytes for the job token\n");
    return -EIO;
  }
  c->multinode = 0;
  int rc = host_store(c, "127.0.0.1", 0);
  if (rc != 0) return rc;
  /* Its own connection, for the status snapshots; and where its user finds it. */
  if (store_client_connect("127.0.0.1", c->store_port, c->token, base_deadline_in(2000), &c->client,
                           NULL, 0) != 0 ||
      agent_jobctl_local_publish(c->run_id, c->store_port, c->token, c->local_file,
                                 sizeof c->local_file) != 0)
    base_log(BASE_LOG_INFO, "cohort status will not find this job");
  /* Its round's failure key watched as a job of several nodes: `cohort stop`. */
  return rdzv_backend_store("127.0.0.1", c->store_port, c->token, &c->backend);
}

/* A status snapshot or stacks request check waits no longer than this: the
 * agent's loop must not stall on a slow store. */
#define STATUS_WRITE_MS 250

/* Every node must use the same id: derived from what they share (jobctl.h). */
static int derive_run_id(cluster *c, const rdzv_target *t) {
  int rc = agent_jobctl_job_id(t, agent_cluster_token(c), c->run_id);
  if (rc != 0) fprintf(stderr, "cohort: cannot derive the job id: %s\n", cohort_strerror(rc));
  return rc;
}

/*
 * etcd holds the rendezvous; this node's own store waits for its workers
 * (libcohort's COHORT_STORE), used when the round makes it node 0.
 */
static int open_etcd(cluster *c, const agent_config *cfg) {
  etcd_opts o = cfg->etcd;
  o.endpoints = cfg->rdzv.master;
  int rc = rdzv_backend_etcd(&o, c->run_id, cfg->lost_after_ms, &c->backend);
  if (rc != 0) return rc;
  store_server_opts so = {.bind_host = "0.0.0.0", .port = 0, .token = agent_cluster_token(c)};
  rc = store_server_start(&so, &c->store);
  if (rc != 0) {
    fprintf(stderr, "cohort: cannot start the workers' store: %s\n", cohort_strerror(rc));
    return rc;
  }
  c->workers_port = store_server_port(c->store);
  return 0;
}

/* Several nodes: the counts and this node's rank, then host or find the store. */
static int open_multi(cluster *c, const agent_config *cfg, const rdzv_target *t) {
  c->multinode = 1;
  if (t->source[0]) fprintf(stderr, "cohort: rendezvous via %s\n", t->source);
  int rc = agent_token_policy(cfg, agent_cluster_token(c), t->host, t->port);
  if (rc == 0 && c->run_id[0] == '\0') rc = derive_run_id(c, t);
  if (rc != 0) return rc;
  c->ropts.job_id = c->run_id;
  /* The job's node counts come from discovery when the flags did not say. */
  c->nnodes_min = cfg->rdzv.nnodes_min;
  c->nnodes_max = cfg->rdzv.nnodes_max;
  if (c->nnodes_max <= 0) {
    c->nnodes_min = t->nnodes_min > 0 ? t->nnodes_min : 1;
    c->nnodes_max = t->nnodes_max > 0 ? t->nnodes_max : c->nnodes_min;
  }
  c->node_rank = cfg->rdzv.node_rank;
  if (c->node_rank < 0 && t->node_rank >= 0) c->node_rank = t->node_rank;
  if (t->host_store) rc = host_store(c, strchr(t->host, ':') ? "::" : "0.0.0.0", t->port);
  if (rc == -EADDRINUSE && c->node_rank < 0)
    fprintf(stderr, "cohort:   --master names this machine, so this agent took itself for node "
                    "0: if node 0's agent\n"
                    "cohort:   runs here already, give the other agents --node-rank 1, 2, ... and "
                    "they join it\n");
  if (rc != 0) return rc;
  if (!t->host_store) {
    base_strlcpy(c->store_host, t->host, sizeof c->store_host);
    c->store_port = t->port;
  }
  if (c->etcd) return open_etcd(c, cfg);
  return rdzv_backend_store(c->store_host, c->store_port, agent_cluster_token(c), &c->backend);
}

/* Decides one node or several and starts (or finds) the store. */
static int setup_store(cluster *c, const agent_config *cfg) {
  const rdzv_opts *ro = &cfg->rdzv;
  int explicit_multi = ro->method != RDZV_AUTO || ro->master != NULL || ro->nnodes_max > 0 ||
                       ro->node_rank >= 0 || ro->rdzv_file != NULL;
  rdzv_target t;
  memset(&t, 0, sizeof t);
  char err[512] = "";
  c->ropts = *ro;
  c->ropts.job_id = c->run_id[0] ? c->run_id : NULL;
  c->ropts.token = agent_cluster_token(c);
  c->ropts.deadline_ms = base_deadline_in(cfg->join_timeout_ms);
  int rc = rdzv_discover(&c->ropts, environ, &t, err, sizeof err);
  if (rc != 0 && (explicit_multi || rc != -ENOENT)) {
    /* A scheduler environment that is there but malformed is an error, not
     * a reason to run alone. */
    fprintf(stderr, "cohort: rendezvous: %s\n", err[0] ? err : cohort_strerror(rc));
    return rc;
  }
  if (rc != 0 || (!explicit_multi && t.nnodes_max <= 1)) return open_alone(c);
  return open_multi(c, cfg, &t);
}

int agent_cluster_open(cluster *c, const agent_config *cfg) {
  gethostname(c->hostname, sizeof c->hostname - 1);
  c->etcd = cfg->rdzv.method == RDZV_ETCD;
  if (cfg->run_id != NULL) base_strlcpy(c->run_id, cfg->run_id, sizeof c->run_id);
  if (cfg->token != NULL) base_strlcpy(c->token, cfg->token, sizeof c->token);
  int rc = setup_store(c, cfg);
  if (rc != 0 || !c->multinode) return rc;
  char err[512] = "";
  if (c->store != NULL && !c->etcd) {
    rc = rdzv_publish_start(&c->ropts, NULL, c->store_port, &c->pub, err, sizeof err);
    if (rc != 0) {
      fprintf(stderr, "cohort: cannot announce the store: %s\n",
              err[0] ? err : cohort_strerror(rc));
      return rc;
    }
  }
  rc = rdzv_backend_connect(c->backend, base_deadline_in(cfg->join_timeout_ms), &c->client, err,
                            sizeof err);
  if (rc != 0) {
    fprintf(stderr, "cohort: cannot reach %s: %s\n", c->etcd ? "etcd" : "the rendezvous store",
            err[0] ? err : cohort_strerror(rc));
    return rc;
  }
  return 0;
}

/* One node: a plan of its own, with a fresh master port. */
static int join_alone(cluster *c, const agent_config *cfg) {
  rdzv_plan_free(&c->plan);
  c->plan.nodes = calloc(1, sizeof *c->plan.nodes);
  if (c->plan.nodes == NULL) return -ENOMEM;
  c->plan.nnodes = 1;
  c->plan.world_size = cfg->nproc;
  c->plan.my_index = 0;
  c->plan.nodes[0].nproc = cfg->nproc;
  base_strlcpy(c->plan.nodes[0].hostname, c->hostname, sizeof c->plan.nodes[0].hostname);
  base_strlcpy(c->plan.master_addr, "127.0.0.1", sizeof c->plan.master_addr);
  if (base_free_port("127.0.0.1", &c->plan.master_port) != 0) c->plan.master_port = 29500;
  base_strlcpy(c->iface, "lo", sizeof c->iface);
  base_join_hostport("127.0.0.1", c->store_port, c->store_env, sizeof c->store_env);
  return 0;
}

/* The interface holding a local address, for GLOO/NCCL_SOCKET_IFNAME. */
static void find_iface(const char *addr, char *out, size_t outlen) {
  out[0] = '\0';
  if (addr == NULL || addr[0] == '\0') return;
  base_iface_of_addr(addr, out, outlen);
}

/* Where the workers find node 0: its interface and COHORT_STORE. */
static void locate_master(cluster *c, const char *local, const char *remote) {
  const rdzv_plan *p = &c->plan;
  if (c->etcd) {
    /* Node 0 is another member of the job: the way there, and its store for the workers. */
    char mine[BASE_HOST_MAX] = "", theirs[BASE_HOST_MAX] = "";
    base_route_addrs(p->master_addr, p->master_port, mine, sizeof mine, theirs, sizeof theirs);
    find_iface(mine[0] ? mine : local, c->iface, sizeof c->iface);
    base_join_hostport(p->master_addr, p->store_port, c->store_env, sizeof c->store_env);
  } else if (c->store == NULL) {
    find_iface(local, c->iface, sizeof c->iface);
    base_join_hostport(remote[0] ? remote : c->store_host, c->store_port, c->store_env,
                       sizeof c->store_env);
  } else if (p->nnodes == 1) {
    base_strlcpy(c->iface, "lo", sizeof c->iface);
    base_join_hostport("127.0.0.1", c->store_port, c->store_env, sizeof c->store_env);
  } else {
    find_iface(p->master_addr, c->iface, sizeof c->iface);
    base_join_hostport(p->master_addr, c->store_port, c->store_env, sizeof c->store_env);
  }
}

/*
 * The job is full without this node: it may be the replacement of a node
 * the job lost a moment ago, started before the survivors began their next
 * round. Waits (bounded by the rendezvous deadline) for the first node to
 * join round + 1 and returns that round, or -1 when none began.
 */
static int wait_next_round(cluster *c, int round, int64_t timeout_ms, const char *why) {
  fprintf(stderr,
          "cohort: the job has all its nodes (round %d); waiting up to %lld s for a round "
          "that takes this node in (a replacement after a loss)\n",
          round, (long long)(timeout_ms / 1000));
  char key[STORE_KEY_MAX];
  rdzv_key(key, sizeof key, c->run_id, round + 1, "joined");
  const char *keys[1] = {key};
  if (store_wait(c->client, keys, 1, base_deadline_in(timeout_ms)) == 0) return round + 1;
  fprintf(stderr, "cohort: rendezvous failed (round %d): %s\n", round, why);
  return -1;
}

/* The job-wide keys that say whether workers can be started ahead ("yes", "no"). */
static void ahead_key(const cluster *c, const char *what, char *key, size_t len) {
  snprintf(key, len, "%s/ahead/%s", c->run_id, what);
}

void agent_cluster_note_ahead(cluster *c, int yes) {
  if (c->ahead_noted || c->client == NULL || !c->multinode) return;
  char key[STORE_KEY_MAX];
  ahead_key(c, yes ? "yes" : "no", key, sizeof key);
  c->ahead_noted = store_set(c->client, key, "1", 1, base_deadline_in(STATUS_WRITE_MS)) == 0;
}

/* Reads the job's ahead keys: 1 when some node said yes (*no: some said no), 0 when none
 * answered, negative when the store did not. */
static int read_ahead(cluster *c, int *yes_out, int *no_out) {
  char yes[STORE_KEY_MAX], no[STORE_KEY_MAX];
  ahead_key(c, "yes", yes, sizeof yes);
  ahead_key(c, "no", no, sizeof no);
  const char *keys[2] = {yes, no};
  void *vals[2] = {NULL, NULL};
  size_t lens[2];
  int rc = store_get_many(c->client, keys, 2, vals, lens, base_deadline_in(2000));
  *yes_out = rc == 0 && vals[0] != NULL;
  *no_out = rc == 0 && vals[1] != NULL;
  free(vals[0]);
  free(vals[1]);
  return rc;
}

/* The round's key that says a worker of it finished (exited 0). */
static void finished_key(const cluster *c, int round, char *key, size_t len) {
  rdzv_key(key, len, c->run_id, round, "finished");
}

/* The round's key that says a node of it finished or went: set after "finished" by a finishing
 * node's agent, and by the store for an agent whose connection closed (its will, left in
 * join_round; not with etcd, whose lease keeps a dead agent's keys until its TTL). */
static void left_key(const cluster *c, int round, char *key, size_t len) {
  rdzv_key(key, len, c->run_id, round, "left");
}

/* The built-in store sets the round's "left" key when this agent's connection ends unasked. */
static void leave_will(cluster *c, int round) {
  if (c->etcd) return;
  char key[STORE_KEY_MAX];
  left_key(c, round, key, sizeof key);
  int rc = store_will(c->client, key, "1", 1, base_deadline_in(2000));
  if (rc != 0)
    base_log(BASE_LOG_INFO,
             "no will with the store (%s): a lost peer is waited for as long as a finisher's word",
             cohort_strerror(rc));
}

void agent_cluster_note_finished(cluster *c, int round) {
  if (c->client == NULL || !c->multinode || c->store_lost) return;
  char key[STORE_KEY_MAX];
  finished_key(c, round, key, sizeof key);
  store_set(c->client, key, "1", 1, base_deadline_in(STATUS_WRITE_MS));
  left_key(c, round, key, sizeof key);
  store_set(c->client, key, "1", 1, base_deadline_in(STATUS_WRITE_MS));
}

/* Waits for a node of the round to finish or go ("left"), then tells which: a node killed whole
 * is known at once by its will, a finisher by its word (same connection, in order: its "finished"
 * is in before its "left"). */
int agent_cluster_left(cluster *c, int round, int64_t wait_ms) {
  if (c->client == NULL || !c->multinode || c->store_lost) return 0;
  char left[STORE_KEY_MAX], fin[STORE_KEY_MAX];
  left_key(c, round, left, sizeof left);
  finished_key(c, round, fin, sizeof fin);
  const char *keys[1] = {left};
  if (store_wait(c->client, keys, 1, base_deadline_in(wait_ms)) != 0) return 0;
  void *v = NULL;
  size_t n = 0;
  int rc = store_get(c->client, fin, &v, &n, base_deadline_in(STATUS_WRITE_MS));
  free(v);
  return rc == 0 ? AGENT_LEFT_FINISHED : AGENT_LEFT_GONE;
}

int agent_cluster_job_spoke(cluster *c) {
  if (c->ahead_noted) return 1;
  if (c->client == NULL || !c->multinode) return 0;
  int yes = 0, no = 0;
  return read_ahead(c, &yes, &no) == 0 && (yes || no);
}

/* Whether this late node starts its workers ahead: allowed, not yet, and the job's say so. */
static int start_ahead(cluster *c) {
  if (!c->ahead_ok || c->ahead != 0) return 0;
  int yes = 0, no = 0;
  int ahead = read_ahead(c, &yes, &no) == 0 && yes && !no;
  if (!ahead) return 0;
  /* The interface toward the store: the workers' GLOO/NCCL_SOCKET_IFNAME before any plan. */
  char local[BASE_HOST_MAX] = "", remote[BASE_HOST_MAX] = "";
  base_route_addrs(c->store_host, c->store_port, local, sizeof local, remote, sizeof remote);
  find_iface(local, c->iface, sizeof c->iface);
  c->ahead = 1;
  fprintf(stderr, "cohort: starting the workers ahead; this node joins once they said hello\n");
  return 1;
}

/*
 * Round `round` was planned without this node. A later one may be running:
 * returns it to join. Else, an elastic job with room is asked to re-form
 * (its failure key, RDZV_GROW_PREFIX) and the next round is returned; a
 * full job is waited on for its next round (wait_next_round). When this
 * node starts its workers ahead (start_ahead) it asks only once they are
 * ready: the round it returns then is the one to join after (a full job's
 * next, where it counts as pending). Under --on-failure reform (reform) the
 * round it asks for is a re-form round: should this node plan it (etcd: the
 * first node to join plans), it waits for the members first, as a survivor
 * planning it would.
 */
static int late_round(cluster *c, int round, int reform, int64_t timeout_ms, const char *why) {
  int nnodes_max = c->nnodes_max;
  int latest = rdzv_latest_round(c->client, c->run_id, base_deadline_in(5000));
  c->newcomer = 1; /* the job went on without this node: it joins a running round */
  if (latest > round) return latest;
  if (c->plan.nnodes >= nnodes_max) {
    int next = wait_next_round(c, round, timeout_ms, why);
    if (next >= 0 && start_ahead(c))
      rdzv_mark_pending(c->client, c->run_id, next, base_deadline_in(2000));
    return next;
  }
  if (start_ahead(c)) return round;
  if (reform) { /* the round it asks for re-forms the members and this node (expect_back) */
    c->reform_expect = c->plan.nnodes + 1;
    c->reform_back = c->plan.nnodes;
    c->reform_prev = -1;
    c->reform_cannot = 0;
  }
  char report[BASE_HOST_MAX + 64], winner[WATCH_REPORT_MAX];
  snprintf(report, sizeof report, "%snode %s joins the job", RDZV_GROW_PREFIX, c->hostname);
  fprintf(stderr, "cohort: the job runs with fewer nodes than it may have: asking it to re-form\n");
  agent_cluster_publish_failure(c, round, report, winner, sizeof winner);
  return round + 1;
}

static int join_round(cluster *c, const agent_config *cfg, int round, char *err, size_t errlen) {
  rdzv_join_opts jo = {
      .job_id = c->run_id,
      .round = round,
      .is_host = c->store != NULL && !c->etcd,
      .first_plans = c->etcd,
      .store_port = c->workers_port,
      .claimed_rank = c->node_rank,
      .nproc = cfg->nproc,
      .nnodes_min = c->nnodes_min,
      .nnodes_max = c->nnodes_max,
      .last_call_ms = cfg->last_call_ms,
      .deadline_ms =
          base_deadline_in(c->reform_expect > 0 && c->reform_prev >= 0 ? cfg->reform_timeout_ms
                                                                       : cfg->join_timeout_ms),
      .expect = c->reform_expect,
      .expect_back = c->reform_back,
      .settle_ms = cfg->lost_after_ms,
      .prev_rank = c->reform_prev,
      .cannot_reform = c->reform_cannot,
  };
  char local[BASE_HOST_MAX] = "", remote[BASE_HOST_MAX] = "";
  if (c->store == NULL || c->etcd) {
    /* Which of our addresses reaches node 0 (etcd), and its address as we see it. */
    base_route_addrs(c->store_host, c->store_port, local, sizeof local, remote, sizeof remote);
    jo.my_host = local;
    jo.master_host = c->etcd ? NULL : remote;
  }
  /* --local-addr: this node's address for the others (MASTER_ADDR when it is node 0). */
  if (cfg->rdzv.local_addr != NULL) jo.my_host = cfg->rdzv.local_addr;
  /* A newcomer to a re-form round with etcd lets a member join first and plan it, so that
   * the members keep the low ranks and the newcomer catches up (docs/reform.md); after a
   * heartbeat timeout with no member it joins (and plans) anyway. */
  if (c->etcd && c->reform_expect > 0 && c->reform_prev < 0)
    (void)rdzv_wait_first_joined(c->client, c->run_id, round, base_deadline_in(cfg->lost_after_ms));
  rdzv_plan_free(&c->plan);
  free(c->lost); /* the last plan's */
  c->lost = NULL;
  int rc = rdzv_join(c->client, &jo, &c->plan, err, errlen);
  if (rc == -EAGAIN) return rc;
  if (rc != 0) {
    const char *etcd_said = store_client_error(c->client); /* etcd's own words, if any */
    fprintf(stderr, "cohort: rendezvous failed (round %d): %s\n", round,
            err[0]         ? err
            : etcd_said[0] ? etcd_said
                           : cohort_strerror(rc));
    return rc;
  }
  locate_master(c, local, remote);
  leave_will(c, round);
  const rdzv_plan *p = &c->plan;
  const rdzv_node *me = &p->nodes[p->my_index];
  fprintf(stderr,
          "cohort: node %d of %d (%s), ranks %d-%d of %d, master %s:%d, interface %s, round %d\n",
          p->my_index, p->nnodes, c->hostname, me->rank_offset, me->rank_offset + me->nproc - 1,
          p->world_size, p->master_addr, p->master_port, c->iface[0] ? c->iface : "?", round);
  /* Everyone has joined: announcements only to those who ask (cohort status, late nodes). */
  rdzv_publish_quiet(c->pub);
  return 0;
}

/* Bounds the rounds a late node chases (each ends in a join with its own deadline). */
#define GROW_TRIES 8

static int join_multi(cluster *c, const agent_config *cfg, int *round) {
  for (int tries = 0; tries < GROW_TRIES; tries++) {
    char err[512] = "";
    int rc = join_round(c, cfg, *round, err, sizeof err);
    if (c->reform_prev < 0) c->reform_expect = c->reform_back = 0; /* a late node's, used */
    if (rc != -EAGAIN) return rc;
    int next = late_round(c, *round, cfg->reform, cfg->join_timeout_ms, err);
    if (next < 0) return -EINVAL;
    *round = next;
    if (c->ahead == 1) return -EINPROGRESS; /* its workers first */
  }
  fprintf(stderr, "cohort: rendezvous failed: the job did not take this node in after %d rounds\n",
          GROW_TRIES);
  return -EAGAIN;
}

int agent_cluster_join(cluster *c, const agent_config *cfg, int *round) {
  return c->multinode ? join_multi(c, cfg, round) : join_alone(c, cfg);
}

/* The round's key for `what` followed by node k ("done/3"). */
static void node_key(const cluster *c, int round, const char *what, int k, char *key, size_t len) {
  char suffix[32];
  snprintf(suffix, sizeof suffix, "%s/%d", what, k);
  rdzv_key(key, len, c->run_id, round, suffix);
}

void agent_cluster_compare_network(cluster *c, int round, const doctor_result *net) {
  char mine[DOCTOR_SUMMARY_MAX], key[STORE_KEY_MAX];
  if (!c->multinode || net == NULL) return;
  if (doctor_summary_format(&net->summary, mine, sizeof mine) != 0) return;
  node_key(c, round, "net", c->plan.my_index, key, sizeof key);
  store_set(c->client, key, mine, strlen(mine), base_deadline_in(2000));
  if (c->plan.my_index == 0) return;
  node_key(c, round, "net", 0, key, sizeof key);
  const char *keys[1] = {key};
  void *val = NULL;
  size_t len = 0;
  if (store_wait(c->client, keys, 1, base_deadline_in(5000)) != 0 ||
      store_get(c->client, key, &val, &len, base_deadline_in(2000)) != 0)
    return;
  char theirs[DOCTOR_SUMMARY_MAX];
  size_t n = len < sizeof theirs - 1 ? len : sizeof theirs - 1;
  memcpy(theirs, val, n);
  theirs[n] = '\0';
  free(val);
  doctor_summary other;
  char msg[1024], me_name[BASE_HOST_MAX + 16], n0_name[BASE_HOST_MAX + 16];
  snprintf(me_name, sizeof me_name, "node %d (%s)", c->plan.my_index, c->hostname);
  snprintf(n0_name, sizeof n0_name, "node 0 (%s)", c->plan.nodes[0].hostname);
  if (doctor_summary_parse(theirs, &other) == 0 &&
      doctor_summary_compare(n0_name, &other, me_name, &net->summary, msg, sizeof msg) == 1)
    fprintf(stderr, "cohort: warning: %s\n", msg);
}

int agent_cluster_watch(cluster *c, const agent_config *cfg, int round, int notify_fd) {
  if (c->backend == NULL) return 0;
  c->store_lost = 0; /* it has just answered the join */
  c->all_done = 0;
  c->watch_names = calloc((size_t)c->plan.nnodes, sizeof *c->watch_names);
  int rc = -ENOMEM;
  if (c->watch_names != NULL) {
    for (int k = 0; k < c->plan.nnodes; k++) c->watch_names[k] = c->plan.nodes[k].hostname;
    watch_opts wo = {.backend = c->backend,
                     .job_id = c->run_id,
                     .round = round,
                     .my_node = c->plan.my_index,
                     .nnodes = c->plan.nnodes,
                     .hostnames = c->watch_names,
                     .heartbeat_ms = cfg->heartbeat_ms,
                     .lost_after_ms = cfg->lost_after_ms,
                     .notify_fd = notify_fd};
    rc = agent_watch_start(&wo, &c->watch);
  }
  if (rc != 0) {
    agent_cluster_unwatch(c);
    c->store_lost = rc == -ECONNREFUSED || rc == -ETIMEDOUT;
    fprintf(stderr, "cohort: cannot watch the other nodes: %s\n", cohort_strerror(rc));
  }
  return rc;
}

int agent_cluster_failure(cluster *c, char *report, size_t len) {
  return agent_watch_failure(c->watch, report, len);
}

void agent_cluster_unwatch(cluster *c) {
  if (agent_watch_store_lost(c->watch)) c->store_lost = 1;
  agent_watch_stop(c->watch);
  c->watch = NULL;
  free(c->watch_names);
  c->watch_names = NULL;
}

void agent_cluster_publish_failure(cluster *c, int round, const char *report, char *winner,
                                   size_t winner_len) {
  if (!c->multinode || c->store_lost) {
    base_strlcpy(winner, report, winner_len);
    return;
  }
  agent_watch_publish_failure(c->backend, c->run_id, round, report, winner, winner_len);
}

/* Waits for node k's done key; -1 on a failure or a stop signal. */
/* Keys "J/R/<what>/<k>" for every node k of the plan (malloc'ed; NULL on no memory). */
static const char **node_keys(cluster *c, int round, const char *what) {
  int n = c->plan.nnodes;
  const char **kp = calloc((size_t)n, sizeof *kp + STORE_KEY_MAX);
  if (kp == NULL) return NULL;
  char *text = (char *)(kp + n);
  for (int k = 0; k < n; k++) {
    node_key(c, round, what, k, text + (size_t)k * STORE_KEY_MAX, STORE_KEY_MAX);
    kp[k] = text + (size_t)k * STORE_KEY_MAX;
  }
  return kp;
}

/*
 * From keys[from] on, the first that is absent (n when none), in one read;
 * a negative error when the store does not answer.
 */
static int first_absent(cluster *c, const char **keys, int from, int n, int64_t deadline) {
  int m = n - from;
  void **vals = calloc((size_t)m, sizeof *vals);
  size_t *lens = calloc((size_t)m, sizeof *lens);
  int rc = vals && lens ? store_get_many(c->client, keys + from, (size_t)m, vals, lens, deadline)
                        : -ENOMEM;
  int there = 0;
  while (rc == 0 && there < m && vals[there] != NULL) there++;
  for (int i = 0; rc == 0 && i < m; i++) free(vals[i]);
  free(vals);
  free(lens);
  return rc != 0 ? rc : from + there;
}

/* A store that stopped answering while we wait for the done keys: the report. */
static void report_store_lost(cluster *c, int rc, char *report, size_t len) {
  c->store_lost = 1;
  if (c->etcd)
    snprintf(report, len, "lost %s: %s", rdzv_backend_name(c->backend), cohort_strerror(rc));
  else
    snprintf(report, len, "node 0 (%s) lost: the rendezvous store stopped answering (%s)",
             c->plan.nodes[0].hostname, cohort_strerror(rc));
}

/* A stop signal that came while we wait: 1 with it in *stop_signal. */
static int stop_came(int *stop_signal) {
  unsigned char sigs[64];
  ssize_t got = agent_signals_read(sigs, sizeof sigs);
  for (ssize_t i = 0; i < got; i++) {
    if (agent_signals_is_stop(sigs[i])) {
      *stop_signal = sigs[i];
      return 1;
    }
  }
  return 0;
}

/* Where the nodes count themselves done, and where the last of them says so. */
typedef struct done_keys {
  const char **each; /* "done/<k>" for every node k */
  char count[STORE_KEY_MAX], all[STORE_KEY_MAX];
  int64_t mine; /* the count this node's addition made, 0 before it was made */
  int announced;
} done_keys;

/*
 * How long, with etcd, a round's "alldone" and the leaving records under
 * its lease outlive the node that wrote it, unless the last node to leave
 * revokes that lease first (agent_cluster_leave): a node slower than this
 * to read "alldone" (stopped, cut off from etcd) is the one that fails.
 */
#define END_LINGER_MS 60000

/*
 * This node's part, again each turn until it is made: its done key, then
 * its addition to the count. A node whose addition made the count reach the
 * node count checks every done key once (an addition whose answer was lost
 * may have counted twice) and writes "alldone": with etcd on a lease of its
 * own (rdzv_backend_linger), not this node's, which goes with this node's
 * exit when a slower node may not have read it yet (that node then found
 * neither "alldone" nor this node's heartbeat and done keys: "node 0 lost"
 * at the end of a job that succeeded).
 */
static void count_me_done(cluster *c, done_keys *d) {
  int n = c->plan.nnodes;
  int64_t dl = base_deadline_in(5000);
  if (d->mine == 0 && store_set(c->client, d->each[c->plan.my_index], "1", 1, dl) == 0 &&
      store_add(c->client, d->count, 1, &d->mine, dl) != 0)
    d->mine = 0;
  if (d->mine >= n && !d->announced && first_absent(c, d->each, 0, n, dl) == n)
    d->announced = rdzv_backend_linger(c->backend, c->client, NULL, END_LINGER_MS) == 0 &&
                   store_set(c->client, d->all, "1", 1, dl) == 0;
}

/*
 * Every node done: a wait on "alldone" in 200 ms turns. A node used to read
 * every done key still awaited each turn (N² reads a turn across the job:
 * each agent read every other's); now one wait a turn, which etcd's held
 * watch serves without a request. -1 with the report on a failure, a lost
 * store (etcd: as the watcher judges it, an election ridden out) or a stop
 * signal.
 */
static int wait_all_done(cluster *c, done_keys *d, char *report, size_t len, int *stop_signal) {
  const char *all = d->all;
  for (;;) {
    if (agent_cluster_failure(c, report, len)) return -1;
    count_me_done(c, d);
    int rc = store_wait(c->client, &all, 1, base_deadline_in(200));
    if (rc == 0) return 0;
    /* etcd failing a wait (an election) is lost only when the watcher says so */
    if (rc != -ETIMEDOUT && !c->etcd) {
      report_store_lost(c, rc, report, len);
      return -1;
    }
    if (stop_came(stop_signal)) return -1;
  }
}

int agent_cluster_wait_done(cluster *c, int round, char *report, size_t len, int *stop_signal) {
  if (!c->multinode) return 0;
  done_keys d = {.each = node_keys(c, round, "done")};
  if (d.each == NULL) {
    base_strlcpy(report, "out of memory waiting for the other nodes", len);
    return -1;
  }
  rdzv_key(d.count, sizeof d.count, c->run_id, round, "ndone");
  rdzv_key(d.all, sizeof d.all, c->run_id, round, "alldone");
  int rc = wait_all_done(c, &d, report, len, stop_signal);
  c->all_done = rc == 0;
  free(d.each);
  if (rc != 0 && agent_cluster_stopped(report)) agent_cluster_ack_stop(c, round);
  return rc;
}

void agent_cluster_publish_status(cluster *c, const char *json) {
  if (c->client == NULL) return;
  char key[STORE_KEY_MAX];
  agent_jobctl_key(key, sizeof key, c->run_id, "status", c->plan.my_index);
  store_set(c->client, key, json, strlen(json), base_deadline_in(STATUS_WRITE_MS));
}

int agent_cluster_read_status(cluster *c, char **texts) {
  int n = c->plan.nnodes;
  char(*keys)[STORE_KEY_MAX] = calloc((size_t)n, sizeof *keys);
  const char **kp = calloc((size_t)n, sizeof *kp);
  size_t *lens = calloc((size_t)n, sizeof *lens);
  int rc = keys && kp && lens && c->client ? 0 : -ENOMEM;
  for (int k = 0; rc == 0 && k < n; k++) {
    agent_jobctl_key(keys[k], sizeof keys[k], c->run_id, "status", k);
    kp[k] = keys[k];
  }
  if (rc == 0)
    rc = store_get_many(c->client, kp, (size_t)n, (void **)texts, lens,
                        base_deadline_in(STATUS_WRITE_MS));
  for (int k = 0; rc == 0 && k < n; k++) { /* as text */
    char *t = texts[k] != NULL ? realloc(texts[k], lens[k] + 1) : NULL;
    if (t != NULL)
      t[lens[k]] = '\0';
    else
      free(texts[k]);
    texts[k] = t;
  }
  free(lens);
  free(kp);
  free(keys);
  return rc;
}

int agent_cluster_stacks_requested(cluster *c, int64_t *req) {
  if (c->client == NULL) return -ENOTCONN;
  char key[STORE_KEY_MAX];
  agent_jobctl_key(key, sizeof key, c->run_id, "stacks", -1);
  return store_add(c->client, key, 0, req, base_deadline_in(STATUS_WRITE_MS));
}

void agent_cluster_publish_stacks(cluster *c, const char *json) {
  if (c->client == NULL) return;
  char key[STORE_KEY_MAX];
  agent_jobctl_key(key, sizeof key, c->run_id, "stacks", c->plan.my_index);
  store_set(c->client, key, json, strlen(json), base_deadline_in(2000));
}

int agent_cluster_stopped(const char *report) {
  return strncmp(report, JOBCTL_STOPPED_BY, strlen(JOBCTL_STOPPED_BY)) == 0;
}

void agent_cluster_ack_stop(cluster *c, int round) {
  if (c->client == NULL) return;
  char key[STORE_KEY_MAX];
  agent_jobctl_stop_ack_key(key, sizeof key, c->run_id, round, c->plan.my_index);
  if (store_set(c->client, key, "1", 1, base_deadline_in(2000)) == 0) c->stop_acked = 1;
}

/* With etcd: node k's heartbeat key is gone (its agent ended and its lease took its keys). */
static int node_gone(cluster *c, int round, int k, int64_t deadline) {
  char key[STORE_KEY_MAX];
  node_key(c, round, "hb", k, key, sizeof key);
  void *val = NULL;
  size_t len = 0;
  int rc = store_get(c->client, key, &val, &len, deadline);
  free(val);
  return rc == -ENOENT;
}

/*
 * Waits until every node has left round: its exit key is there or, with
 * etcd, its heartbeat key is gone (a node that saw every exit key ends, and
 * its lease takes its keys, maybe before a slower node read its exit key);
 * a node known lost (agent_cluster_note_lost) writes none and is not waited for.
 * One read of the exit keys still awaited per turn, then a wait on the
 * first of them.
 */
static void wait_nodes_left(cluster *c, int round, int64_t deadline) {
  int n = c->plan.nnodes;
  const char **keys = node_keys(c, round, "exit");
  for (int from = 0; keys != NULL && base_deadline_left(deadline) > 0;) {
    if ((from = first_absent(c, keys, from, n, deadline)) < 0 || from == n) break;
    if ((c->lost != NULL && c->lost[from]) || (c->etcd && node_gone(c, round, from, deadline)))
      from++;
    else
      store_wait(c->client, keys + from, 1, c->etcd ? base_deadline_in(100) : deadline);
  }
  free(keys);
}

/*
 * With etcd, after a round every node finished: this node records its
 * leaving under "alldone"'s lease ("left/<k>", then an addition to
 * "nleft"), and goes. The node whose addition completes the count checks
 * every left key once (an addition whose answer was lost may have counted
 * twice) and revokes that lease, which takes "alldone" and the leaving
 * records with it; else the lease's TTL does. Three requests a node and no
 * wait (before: every node waited until every node's exit key was there or
 * its heartbeat key gone, reading the keys still awaited every 100 ms).
 */
static void leave_etcd(cluster *c, int round) {
  char all[STORE_KEY_MAX], count[STORE_KEY_MAX], mine[STORE_KEY_MAX];
  rdzv_key(all, sizeof all, c->run_id, round, "alldone");
  rdzv_key(count, sizeof count, c->run_id, round, "nleft");
  node_key(c, round, "left", c->plan.my_index, mine, sizeof mine);
  int n = c->plan.nnodes;
  int64_t dl = base_deadline_in(2000), left = 0;
  if (rdzv_backend_linger(c->backend, c->client, all, 0) != 0 ||
      store_set(c->client, mine, "1", 1, dl) != 0 ||
      store_add(c->client, count, 1, &left, dl) != 0 || left < n)
    return;
  const char **keys = node_keys(c, round, "left");
  if (keys != NULL && first_absent(c, keys, 0, n, dl) == n)
    rdzv_backend_linger_end(c->backend, c->client, dl);
  free(keys);
}

/* How long the store's host waits for `cohort stop` to have read every node's acknowledgement. */
#define STOP_LINGER_MS 5000

void agent_cluster_leave(cluster *c, int round) {
  if (c->client == NULL || c->store_lost) return;
  char key[STORE_KEY_MAX];
  if (c->stop_acked && c->store != NULL) {
    const char *all = key;
    agent_jobctl_stop_ack_key(key, sizeof key, c->run_id, round, -1);
    store_wait(c->client, &all, 1, base_deadline_in(STOP_LINGER_MS));
  }
  if (!c->multinode) return;
  if (c->etcd && c->all_done) {
    leave_etcd(c, round);
    return;
  }
  node_key(c, round, "exit", c->plan.my_index, key, sizeof key);
  store_set(c->client, key, "1", 1, base_deadline_in(2000));
  /* Node 0 keeps its store up until everyone has read the end; with etcd, after a failure,
   * every node stays until all are past it, since its lease takes its keys (the failure's). */
  if (c->store == NULL && !c->etcd) return;
  wait_nodes_left(c, round, base_deadline_in(3000));
}

int agent_cluster_lost_node(const char *report, char *host, size_t hostlen) {
  int k = -1, at = 0;
  if (sscanf(report, "node %d (%n", &k, &at) != 1 || at == 0) return -1;
  const char *eol = report + strcspn(report, "\n"), *close = NULL;
  for (const char *p = report + at; p < eol && close == NULL; p++)
    if (strncmp(p, ") lost: ", 8) == 0 || strncmp(p, "): its agent died", 17) == 0) close = p;
  if (close == NULL) return -1;
  if (host != NULL)
    snprintf(host, hostlen, "%.*s", (int)(close - report - at + 2), report + at - 1);
  return k;
}

void agent_cluster_note_lost(cluster *c, const char *report) {
  int k = agent_cluster_lost_node(report, NULL, 0);
  if (!c->multinode || k < 0 || k >= c->plan.nnodes) return;
  if (c->lost == NULL) c->lost = calloc((size_t)c->plan.nnodes, 1);
  if (c->lost != NULL) c->lost[k] = 1;
}

void agent_cluster_close(cluster *c) {
  free(c->lost);
  c->lost = NULL;
  agent_cluster_unwatch(c);
  rdzv_publish_stop(c->pub);
  c->pub = NULL;
  store_client_close(c->client);
  c->client = NULL;
  if (c->store_lost) rdzv_backend_lost(c->backend);
  rdzv_backend_close(c->backend);
  c->backend = NULL;
  if (c->local_file[0] != '\0') unlink(c->local_file);
  c->local_file[0] = '\0';
  rdzv_plan_free(&c->plan);
  store_server_stop(c->store);
  c->store = NULL;
}

int agent_cluster_gather(cluster *c, int round, const char *what, const char *mine,
                         int64_t timeout_ms, char **texts) {
  int n = c->plan.nnodes;
  for (int k = 0; k < n; k++) texts[k] = NULL;
  if (!c->multinode) {
    texts[0] = strdup(mine);
    return texts[0] != NULL;
  }
  char(*keys)[STORE_KEY_MAX] = calloc((size_t)n, sizeof *keys);
  const char **kp = calloc((size_t)n, sizeof *kp);
  void **vals = calloc((size_t)n, sizeof *vals);
  size_t *lens = calloc((size_t)n, sizeof *lens);
  int found = 0;
  if (keys == NULL || kp == NULL || vals == NULL || lens == NULL) goto out;
  for (int k = 0; k < n; k++) {
    node_key(c, round, what, k, keys[k], sizeof keys[k]);
    kp[k] = keys[k];
  }
  int64_t deadline = base_deadline_in(timeout_ms);
  store_set(c->client, keys[c->plan.my_index], mine, strlen(mine), deadline);
  /* All of them, or what there is at the deadline. */
  store_wait(c->client, kp, (size_t)n, deadline);
  if (store_get_many(c->client, kp, (size_t)n, vals, lens, base_deadline_in(5000)) != 0) goto out;
  for (int k = 0; k < n; k++) {
    if (vals[k] == NULL) continue;
    texts[k] = malloc(lens[k] + 1);
    if (texts[k] == NULL) continue;
    memcpy(texts[k], vals[k], lens[k]);
    texts[k][lens[k]] = '\0';
    found++;
  }
out:
  for (int k = 0; vals != NULL && k < n; k++) free(vals[k]);
  free(vals);
  free(lens);
  free(kp);
  free(keys);
  return found;
}

/*
 * swarm.c - many simulated nodes against one built-in store.
 *
 * Every simulated node speaks the bytes a `cohort run` agent sends, from its
 * own loopback address (127.1.x.y): the join of rdzv_join() (ADD joined,
 * SET its record, WAIT for the plan's head, GET it and the page of the plan
 * that holds the node, pipelined), then on a second connection
 * the watch of src/agent/watch.c (WAIT on "fail" in 200 ms slices, ADD its
 * heartbeat counter every heartbeat, and the liveness sweep: ADD 0 on the
 * other nodes' counters). Node 0 is a real rdzv_join() on its own thread, so
 * the plan is made by the agents' code. The store runs in a child process so
 * that its CPU time and memory can be read from /proc.
 *
 * Phases and figures (one line of key=value pairs on stdout):
 *   rendezvous_ms  from the release of all nodes until the last has its plan
 *                  (registered_ms: until the last record was stored;
 *                  planned_ms: until node 0 had published the plan)
 *   join_cpu_us    the store's CPU time per node for the rendezvous (from its
 *                  start to the end of the join: the figure that load on the
 *                  machine does not inflate as it does the times)
 *   hb_cpu_pct     store CPU during `--hold` seconds of heartbeats and watches
 *   hb_req_per_s   requests the nodes sent per second in that window
 *   fail_max_ms    from the CAS that publishes a failure until the last node
 *                  has read it (fail_med_ms: the median node)
 *   rss_kib        store RSS growth from its start to the end of the hold;
 *                  rss_b_per_conn that growth per connection (keys included),
 *                  rss_b_per_node per node (its connections and keys)
 * A run that does not complete within --timeout prints "incomplete" and
 * exits 1: no figures for it.
 *
 * usage: swarm [--nodes N] [--sweep all|host|none] [--hold S] [--timeout S]
 *              [--heartbeat MS] [--token T] [--join-conn keep|close] [--slice MS]
 *
 * --slice MS: the watch's WAIT slices last MS (200: the agents before they
 * waited until their next heartbeat); by default until the next heartbeat,
 * as src/agent/watch.c does.
 *
 * --join-conn close: a node closes its join connection once it has its plan,
 * before it opens its watch (agents keep both). For sizes whose two
 * connections a node would pass the store's file limit where it cannot be
 * raised (a container without CAP_SYS_RESOURCE: 16,384 nodes need 32,768);
 * rss_b_per_conn then counts one connection a node.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "base/base.h"
#include "base/net.h"
#include "rdzv/join.h"
#include "store/auth.h"
#include "store/proto.h"
#include "store/store.h"

#define JOB "swarm"
#define WAIT_SLICE_MIN_MS 20 /* src/agent/watch.c's */

enum sweep_mode { SWEEP_ALL, SWEEP_HOST, SWEEP_NONE };

typedef struct swarm_opts {
  int nodes;
  int sweep;
  double hold_s;
  double timeout_s;
  int heartbeat_ms;
  const char *token;
  int close_join; /* --join-conn close */
  int slice_ms;   /* --slice; 0: until the next heartbeat */
} swarm_opts;

/* The join connection's steps, then the watch connection's. */
enum {
  ST_CONNECTING,
  ST_HELLO,
  ST_AUTH,
  J_ADD,
  J_SET,
  J_WAIT_PLAN,
  J_GET_PLAN,
  J_DONE,
  W_WAIT_FAIL,
  W_BEAT,
  W_SWEEP,
  W_GET_FAIL,
  W_DONE,
};

/* The steps' names, for a failure's message. */
static const char *const step_names[] = {
    "connecting", "hello",     "auth",          "ADD joined", "SET record", "WAIT plan", "GET plan",
    "joined",     "WAIT fail", "ADD heartbeat", "sweep",      "GET fail",   "done",
};
_Static_assert(sizeof step_names / sizeof *step_names == W_DONE + 1, "a name for every step");

typedef struct node node;

typedef struct sconn {
  int fd;
  node *nd;
  int watch; /* 0: the join connection, 1: the watch connection */
  int state;
  store_buf out;
  size_t out_off;
  uint8_t *in;
  size_t in_len, in_cap;
  uint8_t op;   /* the request in flight */
  size_t frame; /* where its frame starts in out */
  uint8_t cnonce[STORE_NONCE_LEN];
  int64_t opened_us; /* when connect() was called */
} sconn;

struct node {
  int idx;
  uint64_t uid;
  char host[32];
  sconn join, watch;
  int64_t joined_us, failed_us;
  int64_t next_hb_us, next_sweep_us;
  int sweep_k;
  int node_rank;
  int64_t seq;   /* join order, from the ADD */
  int plan_part; /* the plan's answers read: the head, then the page */
};

typedef struct swarm {
  swarm_opts o;
  int epfd;
  node *nodes;
  int store_port;
  int joined, watching, failed;
  int64_t release_us;
  int64_t registered_us; /* the last node's record was stored */
  uint64_t requests;
  int errors;
  char first_error[256];
  char *plan; /* the plan's head every node read */
  size_t plan_len;
  char *page1; /* node 1's page, for the check of the whole format */
} swarm;

static void fail_node(swarm *w, node *nd, const char *what) {
  if (w->errors++ == 0)
    snprintf(w->first_error, sizeof w->first_error, "node %d: %s", nd->idx, what);
}

/* ---- connections ---- */

static int open_conn(swarm *w, node *nd, sconn *c, int watch) {
  c->nd = nd;
  c->watch = watch;
  c->state = ST_CONNECTING;
  c->opened_us = base_now_us();
  c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c->fd < 0) return -errno;
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  /* Many source addresses: the port is chosen at connect(), per address. */
  setsockopt(c->fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  struct sockaddr_in src = {.sin_family = AF_INET};
  inet_pton(AF_INET, nd->host, &src.sin_addr);
  if (bind(c->fd, (struct sockaddr *)&src, sizeof src) != 0) return -errno;
  struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)w->store_port)};
  inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
  if (connect(c->fd, (struct sockaddr *)&dst, sizeof dst) != 0 && errno != EINPROGRESS)
    return -errno;
  struct epoll_event e = {.events = EPOLLOUT | EPOLLIN, .data.ptr = c};
  return epoll_ctl(w->epfd, EPOLL_CTL_ADD, c->fd, &e) == 0 ? 0 : -errno;
}

static void begin(sconn *c, uint8_t op) {
  c->op = op;
  c->frame = store_buf_begin_frame(&c->out);
  store_buf_u8(&c->out, op);
}

static void end(swarm *w, sconn *c) {
  store_buf_end_frame(&c->out, c->frame);
  w->requests++;
}

static void flush(swarm *w, sconn *c) {
  while (c->out_off < c->out.len) {
    ssize_t n = send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      fail_node(w, c->nd, "send failed");
      return;
    }
    c->out_off += (size_t)n;
  }
  c->out.len = c->out_off = 0;
}

static void send_key(sconn *c, uint8_t op, const char *suffix) {
  char key[STORE_KEY_MAX];
  rdzv_key(key, sizeof key, JOB, 0, suffix);
  begin(c, op);
  store_buf_key(&c->out, key, strlen(key));
}

static void req_add(swarm *w, sconn *c, const char *suffix, int64_t delta) {
  send_key(c, STORE_OP_ADD, suffix);
  store_buf_u64(&c->out, (uint64_t)delta);
  end(w, c);
  flush(w, c);
}

static void req_wait(swarm *w, sconn *c, const char *suffix, uint32_t timeout_ms) {
  char key[STORE_KEY_MAX];
  rdzv_key(key, sizeof key, JOB, 0, suffix);
  begin(c, STORE_OP_WAIT);
  store_buf_u32(&c->out, timeout_ms);
  store_buf_u32(&c->out, 1);
  store_buf_key(&c->out, key, strlen(key));
  end(w, c);
  flush(w, c);
}

static void req_get(swarm *w, sconn *c, const char *suffix) {
  send_key(c, STORE_OP_GET, suffix);
  end(w, c);
  flush(w, c);
}

static void req_hello(swarm *w, sconn *c) {
  base_random_bytes(c->cnonce, sizeof c->cnonce);
  begin(c, STORE_OP_HELLO);
  store_buf_u8(&c->out, STORE_PROTO_VERSION);
  store_buf_put(&c->out, c->cnonce, sizeof c->cnonce);
  end(w, c);
  c->state = ST_HELLO;
  flush(w, c);
}

/* ---- the join (rdzv_join's requests) ---- */

static void join_step(swarm *w, node *nd, const store_response *r) {
  sconn *c = &nd->join;
  char suffix[48];
  switch (c->state) {
  case J_ADD: {
    nd->seq = r->number;
    snprintf(suffix, sizeof suffix, "node/%lld", (long long)r->number);
    char record[1024];
    rdzv_join_opts jo = {
        .claimed_rank = -1, .nproc = 1, .my_host = nd->host, .master_host = "127.0.0.1"};
    char name[32];
    snprintf(name, sizeof name, "sim%d", nd->idx);
    rdzv_record_format(record, sizeof record, nd->uid, &jo, name);
    send_key(c, STORE_OP_SET, suffix);
    store_buf_value(&c->out, record, strlen(record));
    end(w, c);
    c->state = J_SET;
    flush(w, c);
    return;
  }
  case J_SET:
    if (base_now_us() > w->registered_us) w->registered_us = base_now_us();
    c->state = J_WAIT_PLAN;
    req_wait(w, c, "plan", (uint32_t)(w->o.timeout_s * 1000));
    return;
  case J_WAIT_PLAN:
    if (r->status != STORE_ST_OK) {
      fail_node(w, nd, "no plan");
      return;
    }
    c->state = J_GET_PLAN;
    send_key(c, STORE_OP_GET, "plan");
    end(w, c);
    snprintf(suffix, sizeof suffix, "plan/%lld", (long long)((nd->seq - 1) / RDZV_PLAN_PAGE));
    req_get(w, c, suffix);
    return;
  default:
    break;
  }
}

static void plan_read(swarm *w, node *nd, const store_response *r);

/* ---- the watch (watch.c's loop) ---- */

static void watch_next(swarm *w, node *nd, int64_t now);

static void watch_sweep(swarm *w, node *nd, int64_t now) {
  sconn *c = &nd->watch;
  while (nd->sweep_k < w->o.nodes && nd->sweep_k == nd->node_rank) nd->sweep_k++;
  if (nd->sweep_k >= w->o.nodes) {
    watch_next(w, nd, now);
    return;
  }
  char suffix[32];
  snprintf(suffix, sizeof suffix, "hb/%d", nd->sweep_k++);
  c->state = W_SWEEP;
  req_add(w, c, suffix, 0);
}

static int sweeps(const swarm *w, const node *nd) {
  return w->o.sweep == SWEEP_ALL || (w->o.sweep == SWEEP_HOST && nd->node_rank == 0);
}

/* How long the next WAIT on "fail" lasts. */
static uint32_t slice_ms(const swarm *w, const node *nd, int64_t now) {
  if (w->o.slice_ms > 0) return (uint32_t)w->o.slice_ms;
  int64_t left = (nd->next_hb_us - now) / 1000;
  return left > WAIT_SLICE_MIN_MS ? (uint32_t)left : WAIT_SLICE_MIN_MS;
}

/* After a WAIT slice timed out: heartbeat when due, sweep when due, then wait again. */
static void watch_next(swarm *w, node *nd, int64_t now) {
  sconn *c = &nd->watch;
  if (c->state == W_WAIT_FAIL && now >= nd->next_hb_us) {
    nd->next_hb_us = now + w->o.heartbeat_ms * 1000;
    char suffix[32];
    snprintf(suffix, sizeof suffix, "hb/%d", nd->node_rank);
    c->state = W_BEAT;
    req_add(w, c, suffix, 1);
    return;
  }
  if (c->state == W_BEAT && sweeps(w, nd) && now >= nd->next_sweep_us) {
    nd->next_sweep_us = now + w->o.heartbeat_ms * 1000;
    nd->sweep_k = 0;
    watch_sweep(w, nd, now);
    return;
  }
  c->state = W_WAIT_FAIL;
  req_wait(w, c, "fail", slice_ms(w, nd, now));
}

static void watch_step(swarm *w, node *nd, const store_response *r, int64_t now) {
  sconn *c = &nd->watch;
  switch (c->state) {
  case W_WAIT_FAIL:
    if (r->status == STORE_ST_OK) {
      c->state = W_GET_FAIL;
      req_get(w, c, "fail");
      return;
    }
    watch_next(w, nd, now);
    return;
  case W_BEAT:
    watch_next(w, nd, now);
    return;
  case W_SWEEP:
    watch_sweep(w, nd, now);
    return;
  case W_GET_FAIL:
    if (r->status != STORE_ST_OK) fail_node(w, nd, "failure report unreadable");
    nd->failed_us = now;
    w->failed++;
    c->state = W_DONE;
    return;
  default:
    break;
  }
}

/* ---- responses ---- */

static void handshake_step(swarm *w, sconn *c, const store_response *r) {
  if (r->status != STORE_ST_OK) {
    fail_node(w, c->nd, "handshake refused");
    return;
  }
  if (c->state == ST_HELLO && r->auth_required) {
    uint8_t mac[STORE_MAC_LEN];
    const char *t = w->o.token ? w->o.token : "";
    store_auth_mac(t, strlen(t), STORE_AUTH_CLIENT_LABEL, c->cnonce, r->nonce.p, mac);
    begin(c, STORE_OP_AUTH);
    store_buf_u8(&c->out, STORE_MAC_LEN);
    store_buf_put(&c->out, mac, sizeof mac);
    end(w, c);
    c->state = ST_AUTH;
    flush(w, c);
    return;
  }
  if (c->watch) {
    c->state = W_WAIT_FAIL;
    w->watching++;
    req_wait(w, c, "fail", slice_ms(w, c->nd, base_now_us()));
  } else {
    c->state = J_ADD;
    req_add(w, c, "joined", 1);
  }
}

static void on_response(swarm *w, sconn *c, const store_response *r, int64_t now) {
  if (c->state == ST_HELLO || c->state == ST_AUTH)
    handshake_step(w, c, r);
  else if (c->watch)
    watch_step(w, c->nd, r, now);
  else if (c->state == J_GET_PLAN)
    plan_read(w, c->nd, r);
  else
    join_step(w, c->nd, r);
}

/* The node rank of the line of uid in a page of the plan, -1 if none. */
static int page_rank(const char *page, uint64_t uid) {
  for (const char *p = page; *p != '\0'; p++) {
    unsigned long long u;
    int seq, rank;
    if (sscanf(p, "%d %d %*d %llx", &seq, &rank, &u) != 3) return -1;
    if (u == uid) return rank;
    p = strchr(p, '\n');
    if (p == NULL) break;
  }
  return -1;
}

/*
 * Every node must read the same head: the first copy is kept and the others
 * compared with it; each finds its rank in its page, and check_ranks()
 * parses node 1's head and page with the agents' parser at the end.
 */
static void plan_read(swarm *w, node *nd, const store_response *r) {
  if (r->status != STORE_ST_OK) {
    fail_node(w, nd, nd->plan_part == 0 ? "plan unreadable" : "page of the plan unreadable");
    return;
  }
  if (nd->plan_part++ == 0) {
    if (w->plan == NULL) {
      w->plan = malloc(r->value.len + 1);
      if (w->plan == NULL) return;
      memcpy(w->plan, r->value.p, r->value.len);
      w->plan[r->value.len] = '\0';
      w->plan_len = r->value.len;
    } else if (r->value.len != w->plan_len || memcmp(r->value.p, w->plan, w->plan_len) != 0) {
      fail_node(w, nd, "a plan different from the other nodes'");
    }
    return;
  }
  nd->joined_us = base_now_us();
  nd->join.state = J_DONE;
  w->joined++;
  char *page = malloc(r->value.len + 1);
  if (page == NULL) return;
  memcpy(page, r->value.p, r->value.len);
  page[r->value.len] = '\0';
  nd->node_rank = page_rank(page, nd->uid);
  if (nd->idx == 1)
    w->page1 = page;
  else
    free(page);
}

/* Names a connection the store ended: which one, in which step, how and when. */
static void conn_lost(swarm *w, sconn *c, int err, int64_t now) {
  char what[160];
  snprintf(what, sizeof what, "%s connection lost at %s, %.1f ms after connect(): %s",
           c->watch ? "watch" : "join", step_names[c->state], (double)(now - c->opened_us) / 1000,
           err == 0 ? "end of stream" : strerror(err));
  fail_node(w, c->nd, what);
}

/* Reads what arrived and hands complete frames to on_response. */
static void conn_input(swarm *w, sconn *c, int64_t now) {
  for (;;) {
    if (c->in_len == c->in_cap) {
      size_t cap = c->in_cap ? c->in_cap * 2 : 4096;
      uint8_t *p = realloc(c->in, cap);
      if (p == NULL) return;
      c->in = p;
      c->in_cap = cap;
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (n <= 0) {
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        if (c->state != W_DONE && c->state != J_DONE) conn_lost(w, c, n == 0 ? 0 : errno, now);
        epoll_ctl(w->epfd, EPOLL_CTL_DEL, c->fd, NULL);
      }
      return;
    }
    c->in_len += (size_t)n;
    uint32_t blen;
    while (store_proto_frame(c->in, c->in_len, STORE_FRAME_MAX, &blen, NULL, 0) == 1) {
      store_response r;
      size_t total = STORE_HEADER_LEN + blen;
      if (store_proto_parse_response(c->op, c->in + STORE_HEADER_LEN, blen, &r, NULL, 0) != 0)
        fail_node(w, c->nd, "malformed response");
      else
        on_response(w, c, &r, now);
      memmove(c->in, c->in + total, c->in_len - total);
      c->in_len -= total;
    }
    if (c->in_len == 0 && c->in_cap > 4096) {
      free(c->in);
      c->in = NULL;
      c->in_cap = 0;
    }
  }
}

static void conn_ready(swarm *w, sconn *c, uint32_t ev, int64_t now) {
  if (c->state == ST_CONNECTING) {
    int err = 0;
    socklen_t el = sizeof err;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err != 0) {
      fail_node(w, c->nd, strerror(err));
      epoll_ctl(w->epfd, EPOLL_CTL_DEL, c->fd, NULL);
      return;
    }
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(w->epfd, EPOLL_CTL_MOD, c->fd, &e);
    req_hello(w, c);
    return;
  }
  if (ev & EPOLLOUT) flush(w, c);
  if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) conn_input(w, c, now);
}

/* Runs the loop until done() or the deadline. Returns 0 or -ETIMEDOUT. */
static int run_until(swarm *w, int (*done)(const swarm *), int64_t deadline_us) {
  struct epoll_event evs[512];
  while (!done(w)) {
    int64_t left = (deadline_us - base_now_us()) / 1000;
    if (left <= 0 || w->errors > 0) return w->errors > 0 ? -EPROTO : -ETIMEDOUT;
    int n = epoll_wait(w->epfd, evs, 512, left > 50 ? 50 : (int)left);
    int64_t now = base_now_us();
    for (int i = 0; i < n; i++) conn_ready(w, evs[i].data.ptr, evs[i].events, now);
  }
  return 0;
}

/* ---- the store child ---- */

/* Starts the store in a child process; returns its pid and port. The child lives until ctl closes.
 */
static pid_t spawn_store(const char *token, int *port, int *ctl) {
  int up[2], down[2];
  if (pipe2(up, O_CLOEXEC) != 0 || pipe2(down, O_CLOEXEC) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(up[0]);
    close(down[1]); /* so that the parent's close is seen as the end of the pipe */
    store_server_opts so = {.bind_host = "127.0.0.1", .token = token, .max_conns = 65536};
    store_server *srv = NULL;
    int p = store_server_start(&so, &srv) == 0 ? store_server_port(srv) : -1;
    ssize_t k = write(up[1], &p, sizeof p);
    char b;
    while ((k = read(down[0], &b, 1)) > 0 || (k < 0 && errno == EINTR)) {
    }
    store_server_stop(srv);
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  *port = -1;
  if (read(up[0], port, sizeof *port) != (ssize_t)sizeof *port) *port = -1;
  close(up[0]);
  *ctl = down[1];
  return pid;
}

/* CPU seconds (user + system) and RSS (KiB) of a process, from /proc. */
static int proc_usage(pid_t pid, double *cpu_s, long *rss_kib) {
  char path[64], buf[2048];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "re");
  if (f == NULL) return -errno;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  unsigned long ut = 0, st = 0;
  long rss = 0;
  if (p == NULL || sscanf(p + 2,
                          "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d "
                          "%*d %*d %*u %*u %ld",
                          &ut, &st, &rss) != 3)
    return -EPROTO;
  *cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
  *rss_kib = rss * (sysconf(_SC_PAGESIZE) / 1024);
  return 0;
}

/* CPU seconds a process's threads have run, to the nanosecond (schedstat; /proc's stat counts
 * ticks of 10 ms, too coarse for a rendezvous of a few hundred nodes). -1 when unreadable. */
static double proc_cpu_s(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (d == NULL) return -1;
  double total = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char p[320];
    snprintf(p, sizeof p, "/proc/%d/task/%s/schedstat", (int)pid, e->d_name);
    FILE *f = fopen(p, "re");
    unsigned long long ns = 0;
    if (f != NULL && fscanf(f, "%llu", &ns) == 1) total += (double)ns;
    if (f != NULL) fclose(f);
  }
  closedir(d);
  return total / 1e9;
}

/* ---- phases ---- */

typedef struct host_join {
  int port;
  int nodes;
  const char *token;
  int rc;
  char err[256];
  int64_t done_us;
} host_join;

/* Node 0: the agents' own rdzv_join() as the store's host. */
static void *host_main(void *arg) {
  host_join *h = arg;
  store_client *c = NULL;
  h->rc = store_client_connect("127.0.0.1", h->port, h->token, base_deadline_in(30000), &c, h->err,
                               sizeof h->err);
  if (h->rc != 0) return NULL;
  rdzv_join_opts o = {.job_id = JOB,
                      .is_host = 1,
                      .claimed_rank = -1,
                      .nproc = 1,
                      .nnodes_min = h->nodes,
                      .nnodes_max = h->nodes,
                      .my_host = "127.0.0.1",
                      .deadline_ms = base_deadline_in(60000)};
  rdzv_plan plan;
  h->rc = rdzv_join(c, &o, &plan, h->err, sizeof h->err);
  h->done_us = base_now_us();
  if (h->rc == 0) rdzv_plan_free(&plan);
  store_client_close(c);
  return NULL;
}

/* Node 0 joins on its own thread; all nodes watch, node 0 included. */
static int all_joined(const swarm *w) {
  return w->joined == w->o.nodes - 1;
}
static int all_watching(const swarm *w) {
  return w->watching == w->o.nodes;
}
static int all_failed(const swarm *w) {
  return w->failed == w->o.nodes;
}
static int never(const swarm *w) {
  (void)w;
  return 0;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* Publishes a failure as a node's agent does (CAS of "fail"), timed from the send. */
static int publish_failure(swarm *w, int64_t *sent_us) {
  store_client *c = NULL;
  int rc = store_client_connect("127.0.0.1", w->store_port, w->o.token, base_deadline_in(10000), &c,
                                NULL, 0);
  if (rc != 0) return rc;
  char key[STORE_KEY_MAX];
  rdzv_key(key, sizeof key, JOB, 0, "fail");
  const char *report = "node 7 (sim7): rank 7 exited with code 1";
  *sent_us = base_now_us();
  rc = store_cas(c, key, NULL, 0, report, strlen(report), NULL, NULL, base_deadline_in(10000));
  store_client_close(c);
  return rc;
}

static void usage_exit(void) {
  fprintf(stderr, "usage: swarm [--nodes N] [--sweep all|host|none] [--hold S] [--timeout S] "
                  "[--heartbeat MS] [--token T] [--join-conn keep|close] [--slice MS]\n");
  exit(2);
}

static void parse_args(int argc, char **argv, swarm_opts *o) {
  *o = (swarm_opts){.nodes = 256,
                    .sweep = SWEEP_ALL,
                    .hold_s = 3,
                    .timeout_s = 60,
                    .heartbeat_ms = 500,
                    .token = "swarm-token"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int64_t ms;
    if (v == NULL) usage_exit();
    if (strcmp(a, "--nodes") == 0 && base_parse_int(v, 2, RDZV_MAX_NODES, &o->nodes) == 0) {
    } else if (strcmp(a, "--sweep") == 0 && strcmp(v, "all") == 0) {
      o->sweep = SWEEP_ALL;
    } else if (strcmp(a, "--sweep") == 0 && strcmp(v, "host") == 0) {
      o->sweep = SWEEP_HOST;
    } else if (strcmp(a, "--sweep") == 0 && strcmp(v, "none") == 0) {
      o->sweep = SWEEP_NONE;
    } else if (strcmp(a, "--hold") == 0 && base_parse_seconds(v, 3600, &ms) == 0) {
      o->hold_s = (double)ms / 1000;
    } else if (strcmp(a, "--timeout") == 0 && base_parse_seconds(v, 3600, &ms) == 0 && ms > 0) {
      o->timeout_s = (double)ms / 1000;
    } else if (strcmp(a, "--heartbeat") == 0 &&
               base_parse_int(v, 10, 60000, &o->heartbeat_ms) == 0) {
    } else if (strcmp(a, "--token") == 0) {
      o->token = v;
    } else if (strcmp(a, "--slice") == 0 && base_parse_int(v, 1, 60000, &o->slice_ms) == 0) {
    } else if (strcmp(a, "--join-conn") == 0 && strcmp(v, "keep") == 0) {
      o->close_join = 0;
    } else if (strcmp(a, "--join-conn") == 0 && strcmp(v, "close") == 0) {
      o->close_join = 1;
    } else {
      usage_exit();
    }
    i++;
  }
}

static int setup_nodes(swarm *w) {
  w->nodes = calloc((size_t)w->o.nodes, sizeof *w->nodes);
  if (w->nodes == NULL) return -ENOMEM;
  for (int i = 0; i < w->o.nodes; i++) {
    node *nd = &w->nodes[i];
    nd->idx = i;
    nd->node_rank = i == 0 ? 0 : -1; /* node 0 is the host (host_main) */
    base_random_bytes(&nd->uid, sizeof nd->uid);
    snprintf(nd->host, sizeof nd->host, "127.1.%d.%d", i >> 8, i & 255);
    nd->join.fd = nd->watch.fd = -1;
  }
  base_strlcpy(w->nodes[0].host, "127.0.0.1", sizeof w->nodes[0].host);
  return 0;
}

static double median_ms(int64_t *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_i64);
  return n % 2 ? (double)v[n / 2] / 1000 : (double)(v[n / 2 - 1] + v[n / 2]) / 2000;
}

static int phase_join(swarm *w, host_join *h, pthread_t *th) {
  w->release_us = base_now_us();
  if (pthread_create(th, NULL, host_main, h) != 0) return -EAGAIN;
  for (int i = 1; i < w->o.nodes; i++) {
    if (open_conn(w, &w->nodes[i], &w->nodes[i].join, 0) != 0) {
      fail_node(w, &w->nodes[i], "cannot connect");
      return -EIO;
    }
  }
  return run_until(w, all_joined, w->release_us + (int64_t)(w->o.timeout_s * 1e6));
}

static void conn_free(sconn *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  store_buf_free(&c->out);
  free(c->in);
  c->in = NULL;
  c->in_len = c->in_cap = 0;
}

/* Opens the watch connections, as agents do once they have their plan. */
static int open_watches(swarm *w) {
  for (int i = 0; i < w->o.nodes; i++) {
    if (w->o.close_join) conn_free(&w->nodes[i].join);
    if (open_conn(w, &w->nodes[i], &w->nodes[i].watch, 1) != 0) return -EIO;
  }
  return 0;
}

/* Heartbeats for hold seconds; fills the store's CPU share and the request rate. */
static int phase_hold(swarm *w, pid_t store, double *cpu_pct, double *req_s) {
  int rc = open_watches(w);
  if (rc == 0) rc = run_until(w, all_watching, base_now_us() + (int64_t)(w->o.timeout_s * 1e6));
  if (rc != 0) return rc;
  double c0, c1;
  long rss;
  uint64_t r0 = w->requests;
  int64_t t0 = base_now_us();
  if (proc_usage(store, &c0, &rss) != 0) return -EIO;
  run_until(w, never, t0 + (int64_t)(w->o.hold_s * 1e6));
  if (w->errors > 0) return -EPROTO;
  int64_t t1 = base_now_us();
  if (proc_usage(store, &c1, &rss) != 0) return -EIO;
  *cpu_pct = 100.0 * (c1 - c0) / ((double)(t1 - t0) / 1e6);
  *req_s = (double)(w->requests - r0) / ((double)(t1 - t0) / 1e6);
  return 0;
}

typedef struct publisher {
  swarm *w;
  int rc;
  int64_t sent_us;
} publisher;

static void *publisher_main(void *arg) {
  publisher *p = arg;
  p->rc = publish_failure(p->w, &p->sent_us);
  return NULL;
}

static int phase_fail(swarm *w, double *max_ms, double *med_ms) {
  publisher p = {.w = w};
  pthread_t th;
  if (pthread_create(&th, NULL, publisher_main, &p) != 0) return -EAGAIN;
  int rc = run_until(w, all_failed, base_now_us() + (int64_t)(w->o.timeout_s * 1e6));
  pthread_join(th, NULL);
  if (rc != 0 || p.rc != 0) return rc != 0 ? rc : p.rc;
  int n = w->o.nodes;
  int64_t *d = malloc((size_t)n * sizeof *d);
  if (d == NULL) return -ENOMEM;
  for (int i = 0; i < n; i++) d[i] = w->nodes[i].failed_us - p.sent_us;
  *med_ms = median_ms(d, n);
  *max_ms = (double)d[n - 1] / 1000;
  free(d);
  return 0;
}

/* The plan places every node exactly once, node 0 (the host) first, in ranks 0..N-1. */
static int check_ranks(swarm *w) {
  rdzv_plan plan;
  char err[256];
  if (w->plan == NULL || w->page1 == NULL ||
      rdzv_plan_parse(w->plan, w->page1, w->nodes[1].uid, &plan, err, sizeof err) != 0)
    return 0;
  int ok = plan.nnodes == w->o.nodes && plan.world_size == w->o.nodes &&
           plan.my_index == w->nodes[1].node_rank;
  rdzv_plan_free(&plan);
  char *seen = calloc((size_t)w->o.nodes, 1);
  if (seen == NULL) return 0;
  for (int i = 1; ok && i < w->o.nodes; i++) {
    int r = w->nodes[i].node_rank;
    ok = r >= 1 && r < w->o.nodes && !seen[r];
    if (ok) seen[r] = 1;
  }
  free(seen);
  return ok;
}

static void swarm_free(swarm *w) {
  for (int i = 0; w->nodes != NULL && i < w->o.nodes; i++) {
    conn_free(&w->nodes[i].join);
    conn_free(&w->nodes[i].watch);
  }
  free(w->nodes);
  free(w->plan);
  free(w->page1);
  if (w->epfd >= 0) close(w->epfd);
}

/* Two connections a node on each side (this process and the store, its child, which inherits
 * the limit): the hard limit is raised too where allowed (root), as far as the nodes need. */
static void raise_nofile(int nodes) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  rlim_t want = 2 * (rlim_t)nodes + 1024;
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) {
    struct rlimit more = {want, want};
    if (setrlimit(RLIMIT_NOFILE, &more) == 0) return;
  }
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
}

int main(int argc, char **argv) {
  swarm w;
  memset(&w, 0, sizeof w);
  parse_args(argc, argv, &w.o);
  raise_nofile(w.o.nodes);
  signal(SIGPIPE, SIG_IGN);
  int ctl = -1;
  pid_t store = spawn_store(w.o.token, &w.store_port, &ctl);
  if (store < 0 || w.store_port <= 0) {
    fprintf(stderr, "swarm: cannot start the store\n");
    return 1;
  }
  double cpu0;
  long rss0 = 0, rss1 = 0;
  proc_usage(store, &cpu0, &rss0);
  double cpu_start = proc_cpu_s(store);
  w.epfd = epoll_create1(EPOLL_CLOEXEC);
  host_join h = {.port = w.store_port, .nodes = w.o.nodes, .token = w.o.token};
  pthread_t hth;
  double cpu_pct = 0, req_s = 0, fmax = 0, fmed = 0;
  int rc = setup_nodes(&w);
  if (rc == 0) rc = phase_join(&w, &h, &hth);
  if (rc != -EAGAIN && h.port > 0) pthread_join(hth, NULL);
  double join_cpu = proc_cpu_s(store) - cpu_start;
  int64_t join_end = 0;
  for (int i = 1; i < w.o.nodes; i++)
    if (w.nodes[i].joined_us > join_end) join_end = w.nodes[i].joined_us;
  if (h.done_us > join_end) join_end = h.done_us;
  if (rc == 0 && h.rc != 0) rc = h.rc;
  if (rc == 0 && !check_ranks(&w)) rc = -EPROTO;
  if (rc == 0) rc = phase_hold(&w, store, &cpu_pct, &req_s);
  if (rc == 0) proc_usage(store, &cpu0, &rss1);
  if (rc == 0) rc = phase_fail(&w, &fmax, &fmed);
  close(ctl);
  waitpid(store, NULL, 0);
  swarm_free(&w);
  if (rc != 0) {
    printf("incomplete nodes=%d joined=%d watching=%d failed=%d: %s\n", w.o.nodes, w.joined + 1,
           w.watching, w.failed,
           w.first_error[0] ? w.first_error
           : h.err[0]       ? h.err
                            : cohort_strerror(rc));
    return 1;
  }
  int conns = w.o.close_join ? w.o.nodes : 2 * (w.o.nodes - 1) + 1;
  printf("nodes=%d sweep=%s rendezvous_ms=%.1f registered_ms=%.1f planned_ms=%.1f "
         "join_cpu_us=%.0f hb_cpu_pct=%.1f hb_req_per_s=%.0f fail_max_ms=%.1f "
         "fail_med_ms=%.1f rss_kib=%ld rss_b_per_conn=%.0f rss_b_per_node=%.0f\n",
         w.o.nodes,
         w.o.sweep == SWEEP_ALL    ? "all"
         : w.o.sweep == SWEEP_HOST ? "host"
                                   : "none",
         (double)(join_end - w.release_us) / 1000, (double)(w.registered_us - w.release_us) / 1000,
         (double)(h.done_us - w.release_us) / 1000, join_cpu * 1e6 / w.o.nodes, cpu_pct, req_s,
         fmax, fmed, rss1 - rss0, (double)(rss1 - rss0) * 1024 / conns,
         (double)(rss1 - rss0) * 1024 / w.o.nodes);
  return 0;
}

/*
 * comm.c - the public communicator API: configuration, create and destroy
 * (the bootstrap is in bootstrap.c), the ordered operation queue and its
 * progress thread.
 *
 * Operations execute one at a time in submission order: on the caller's
 * thread when nothing is queued (lowest latency for blocking calls), else on
 * the communicator's progress thread, which is what lets an asynchronous
 * allreduce proceed while the caller computes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "coll/coll.h"

#define DEFAULT_TIMEOUT_MS 60000
#define DEFAULT_THRESHOLD (128u * 1024u)
#define DEFAULT_SLICE (512u * 1024u)
#define DEFAULT_STAGING (512u * 1024u)

/* ---- configuration ---- */

/* The membership's variables: RANK, WORLD_SIZE, COHORT_STORE, COHORT_JOB_ID and the round. */
static int membership_from_env(cohort_comm_config *cfg) {
  const char *rank = getenv("RANK"), *size = getenv("WORLD_SIZE");
  const char *store = getenv("COHORT_STORE"), *job = getenv("COHORT_JOB_ID");
  if (rank == NULL || size == NULL || store == NULL || job == NULL || job[0] == '\0')
    return COHORT_ENOENV;
  if (base_parse_int(size, 1, 1 << 20, &cfg->size) != 0 ||
      base_parse_int(rank, 0, cfg->size - 1, &cfg->rank) != 0)
    return COHORT_ENOENV;
  cfg->store_addr = store;
  cfg->job_id = job;
  /* The round keeps rounds apart on the store; an agent's own restart count
   * differs on a replacement node, so it is only the fallback. */
  const char *restart = getenv("COHORT_ROUND");
  if (restart == NULL) restart = getenv("TORCHELASTIC_RESTART_COUNT");
  if (restart != NULL && base_parse_int(restart, 0, 1 << 30, &cfg->restart) != 0)
    return COHORT_ENOENV;
  return 0;
}

COHORT_API int cohort_comm_config_from_env(cohort_comm_config *cfg) {
  if (cfg == NULL) return -EINVAL;
  memset(cfg, 0, sizeof *cfg);
  /* Started ahead of its membership: the agent's first form gives it (no control channel: no
   * form will come). */
  const char *ahead = getenv("COHORT_AWAIT_FORM"), *fd = getenv("COHORT_CONTROL_FD");
  if (ahead != NULL && strcmp(ahead, "1") == 0) {
    if (fd == NULL || fd[0] == '\0') return COHORT_ENOENV;
    cfg->await_form = COHORT_AWAIT_FORM_NOW;
    cfg->size = 1;
  } else {
    cfg->await_form = COHORT_AWAIT_FORM_ABLE;
    int rc = membership_from_env(cfg);
    if (rc != 0) return rc;
  }
  cfg->token = getenv("COHORT_TOKEN");
  const char *to = getenv("COHORT_TIMEOUT_MS");
  if (to != NULL && base_parse_int(to, 1, 1 << 30, &cfg->timeout_ms) != 0) return COHORT_ENOENV;
  const char *tr = getenv("COHORT_TRANSPORT");
  if (tr == NULL || strcmp(tr, "auto") == 0)
    cfg->transport = COHORT_TRANSPORT_AUTO;
  else if (strcmp(tr, "tcp") == 0)
    cfg->transport = COHORT_TRANSPORT_TCP;
  else if (strcmp(tr, "shm") == 0)
    cfg->transport = COHORT_TRANSPORT_SHM;
  else
    return COHORT_ENOENV;
  return 0;
}

static void *progress_main(void *arg);
static int prepare_next(void *arg);

COHORT_API int cohort_comm_create(const cohort_comm_config *cfg, cohort_comm **out) {
  if (out == NULL) return -EINVAL;
  *out = NULL;
  if (cfg == NULL || cfg->timeout_ms < 0 || (unsigned)cfg->transport > COHORT_TRANSPORT_SHM ||
      (unsigned)cfg->await_form > COHORT_AWAIT_FORM_NOW)
    return -EINVAL;
  int ahead = cfg->await_form == COHORT_AWAIT_FORM_NOW; /* rank, size, store and job: the form's */
  if (!ahead && (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size || cfg->job_id == NULL ||
                 cfg->job_id[0] == '\0' || strlen(cfg->job_id) > 200))
    return -EINVAL;
  cohort_comm *c = calloc(1, sizeof *c);
  if (c == NULL) return -ENOMEM;
  c->rank = ahead ? 0 : cfg->rank;
  c->size = ahead ? 1 : cfg->size;
  c->world = (coll_group){.n = c->size, .me = c->rank, .ranks = NULL};
  c->eng.rank = c->rank;
  c->eng.idle = prepare_next;
  c->eng.idle_arg = c;
  c->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : DEFAULT_TIMEOUT_MS;
  c->algo_threshold = DEFAULT_THRESHOLD;
  c->slice_bytes = DEFAULT_SLICE;
  c->staging_bytes = DEFAULT_STAGING;
  pthread_mutex_init(&c->eng.err_mu, NULL);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  int rc = coll_reform_init(c, cfg);
  if (rc == 0 && ahead && c->ctl.fd < 0) rc = COHORT_ENOENV; /* no channel: no form will come */
  if (rc != 0) goto fail;
  rc = coll_env_size("COHORT_ALGO_THRESHOLD", 0, (uint64_t)1 << 40, &c->algo_threshold);
  if (rc == 0) rc = coll_env_size("COHORT_SLICE", 4096, 1u << 30, &c->slice_bytes);
  size_t single = 1, collapse = 1;
  if (rc == 0) rc = coll_env_size("COHORT_SINGLE_COPY", 0, 1, &single);
  if (rc == 0) rc = coll_env_size("COHORT_SHM_COLLAPSE", 0, 1, &collapse);
  if (rc != 0) goto fail;
  c->single_copy = (int)single;
  c->collapse = (int)collapse;
  c->slice_bytes = (c->slice_bytes + 7u) & ~(size_t)7u;
  /* Scratch: two slices; latency algorithms reuse it when the message fits. */
  c->scratch_bytes = 2 * c->slice_bytes;
  c->scratch = malloc(c->scratch_bytes);
  c->eng.peer_ops = calloc((size_t)c->size, sizeof *c->eng.peer_ops);
  c->eng.peer_t = calloc((size_t)c->size, sizeof *c->eng.peer_t);
  c->newbits = calloc((size_t)c->size, 1);
  if (c->scratch == NULL || c->eng.peer_ops == NULL || c->eng.peer_t == NULL ||
      c->newbits == NULL) {
    rc = -ENOMEM;
    goto fail;
  }
  c->newbits[0] = (unsigned char)c->self_new;
  rc = ahead ? coll_first_form(c) : coll_first_connect(c, cfg);
  if (rc != 0) goto fail;
  if (pthread_create(&c->thread, NULL, progress_main, c) != 0) {
    rc = -EAGAIN;
    goto fail;
  }
  c->thread_started = 1;
  *out = c;
  return 0;
fail:
  cohort_comm_destroy(c);
  return rc;
}

COHORT_API int cohort_comm_create_from_env(cohort_comm **out) {
  if (out == NULL) return -EINVAL;
  *out = NULL;
  cohort_comm_config cfg;
  int rc = cohort_comm_config_from_env(&cfg);
  if (rc != 0) return rc;
  return cohort_comm_create(&cfg, out);
}

COHORT_API void cohort_comm_destroy(cohort_comm *c) {
  if (c == NULL) return;
  coll_ctl_close(&c->ctl); /* first: its thread may fail the transports */
  if (c->thread_started) {
    pthread_mutex_lock(&c->mu);
    int pending = c->head != NULL || c->busy;
    pthread_mutex_unlock(&c->mu);
    /* Queued work cannot finish usefully once the owner is leaving: fail it fast. */
    if (pending) cohort_comm_abort(c);
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
  }
  coll_watch_stop(&c->eng); /* nothing in flight now; before its fds close */
  coll_buf_release_all(c);
  coll_tcp_destroy(c->tcp);
  coll_shm_destroy(c->shm);
  free(c->scratch);
  free(c->collapsed);
  free(c->wire_buf);
  free(c->prep_buf);
  free(c->eng.peer_ops);
  free(c->eng.peer_t);
  free(c->local.ranks);
  free(c->leaders.ranks);
  free(c->cross.ranks);
  free(c->newbits);
  free(c->xfer.ranks);
  free(c->job_id);
  free(c->token);
  pthread_mutex_destroy(&c->ctl.mu);
  pthread_cond_destroy(&c->ctl.cv);
  pthread_mutex_destroy(&c->eng.err_mu);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

COHORT_API void cohort_comm_abort(cohort_comm *c) {
  if (c == NULL) return;
  coll_fail(&c->eng, COHORT_EABORTED, "rank %d: aborted by the application (cohort_comm_abort)",
            c->rank);
  /* Again when it had already failed: wakes this rank's waits too (idempotent). */
  coll_abort_transports(&c->eng, c->eng.errmsg);
}

COHORT_API int cohort_comm_rank(const cohort_comm *c) {
  return c == NULL ? -EINVAL : c->rank;
}

COHORT_API int cohort_comm_size(const cohort_comm *c) {
  return c == NULL ? -EINVAL : c->size;
}

COHORT_API int cohort_comm_set_timeout(cohort_comm *c, int timeout_ms) {
  if (c == NULL || timeout_ms <= 0) return -EINVAL;
  pthread_mutex_lock(&c->mu);
  c->timeout_ms = timeout_ms;
  pthread_mutex_unlock(&c->mu);
  return 0;
}

COHORT_API const char *cohort_comm_error_message(const cohort_comm *c) {
  if (c == NULL) return "";
  return atomic_load(&((cohort_comm *)c)->eng.failed) ? c->eng.errmsg : "";
}

COHORT_API int cohort_comm_failed(const cohort_comm *c) {
  if (c == NULL) return -EINVAL;
  coll_engine *e = &((cohort_comm *)c)->eng;
  if (!atomic_load(&e->failed)) return 0;
  pthread_mutex_lock(&e->err_mu);
  int err = e->err;
  pthread_mutex_unlock(&e->err_mu);
  return err != 0 ? err : COHORT_EABORTED;
}

/* ---- execution ---- */

static int execute_plain(cohort_comm *c, const coll_op *op) {
  coll_ctx x = {.eng = &c->eng,
                .comm = c,
                .op = op,
                .seq = c->seq++,
                .deadline_ms = 0, /* set when it first waits: no clock read when it never does */
                .es = cohort_dtype_size(op->dtype)};
  int rc = coll_run_op(&x);
  if (rc != 0 && !atomic_load(&c->eng.failed))
    coll_fail(&c->eng, rc, "rank %d: %s #%u failed: %s", c->rank, coll_kind_name(op->kind), x.seq,
              cohort_strerror(rc));
  return rc;
}

/* A wire buffer (*buf, *cap) with room for n elements (grown, never shrunk); NULL when out of
 * memory. */
static uint16_t *wire_room(uint16_t **buf, size_t *cap, size_t n) {
  if (n <= *cap && *buf != NULL) return *buf;
  uint16_t *w = malloc(n ? n * sizeof *w : 1);
  if (w == NULL) return NULL;
  free(*buf);
  *buf = w;
  *cap = n;
  return w;
}

/* The shape of a compressed operation in its wire buffer: `total` elements, of which the input
 * (`in` of them) starts at `at` (an allgather's own block sits in place in the gathered buffer). */
static void wire_shape(const cohort_comm *c, const coll_op *op, size_t *total, size_t *at,
                       size_t *in) {
  int rs = op->kind == COLL_REDUCE_SCATTER, ag = op->kind == COLL_ALLGATHER;
  *total = rs || ag ? op->count * (size_t)c->size : op->count;
  *at = ag ? (size_t)c->rank * op->count : 0;
  *in = ag ? op->count : *total;
}

/* Whether operation op (NULL: none) writes into [p, p + len). */
static int writes_into(const cohort_comm *c, const coll_op *op, const void *p, size_t len) {
  if (op == NULL || op->recv == NULL) return 0;
  int many = op->kind == COLL_REDUCE_SCATTER || op->kind == COLL_ALLGATHER;
  size_t out = op->count * (many ? (size_t)c->size : 1) * cohort_dtype_size(op->dtype);
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)op->recv;
  return a < b + out && b < a + len;
}

/* Elements rounded per call of prepare_next: about 0.1 ms, so the transfers it interleaves with
 * are looked at again soon. */
#define PREP_SLICE (256u << 10)

/* The engine's idle work while a collective waits on its transfers: rounds a slice of the next
 * queued compressed operation's input to its wire type. 1 if it did some, 0 if there is none. */
static int prepare_next(void *arg) {
  cohort_comm *c = arg;
  pthread_mutex_lock(&c->mu);
  const cohort_request *r = c->head; /* stays queued: only the executing side dequeues */
  pthread_mutex_unlock(&c->mu);
  if (r == NULL || r->op.wire == r->op.dtype || coll_wire_at_edges(c, &r->op)) return 0;
  const coll_op *op = &r->op;
  size_t total, at, in;
  wire_shape(c, op, &total, &at, &in);
  if (writes_into(c, c->cur_op, op->send, in * sizeof(float))) return 0; /* it reads our result */
  if (c->prep_op != op) {
    if (wire_room(&c->prep_buf, &c->prep_cap, total) == NULL) return 0;
    c->prep_op = op;
    c->prep_done = 0;
  }
  if (c->prep_done >= in) return 0;
  size_t n = in - c->prep_done < PREP_SLICE ? in - c->prep_done : PREP_SLICE;
  coll_to_wire(op->wire, c->prep_buf + at + c->prep_done, (const float *)op->send + c->prep_done,
               n);
  c->prep_done += n;
  return 1;
}

/*
 * An f32 allreduce, reduce-scatter or allgather whose bytes travel in 16 bits: the
 * input is rounded into a buffer of the wire type (half the input's size;
 * the communicator keeps it for the next one), reduced there in place (the
 * kernels accumulate in f32 and round every partial result to the wire
 * type), and the result widened into recv. The peers see an ordinary
 * collective of the wire type. One operation executes at a time (`busy`),
 * so one buffer serves them all, and a second holds the input of the next
 * one, rounded while this one waits on the link: `ready` elements of it.
 */
static int execute_wire(cohort_comm *c, const coll_op *op, size_t ready) {
  if (coll_wire_at_edges(c, op)) return execute_plain(c, op); /* converted as it travels */
  size_t total, at, in;
  wire_shape(c, op, &total, &at, &in);
  if (ready > 0) {
    c->prepared_ops++;
    uint16_t *b = c->wire_buf;
    size_t cap = c->wire_cap;
    c->wire_buf = c->prep_buf;
    c->wire_cap = c->prep_cap;
    c->prep_buf = b;
    c->prep_cap = cap;
  }
  uint16_t *w = wire_room(&c->wire_buf, &c->wire_cap, total);
  if (w == NULL) return coll_fail(&c->eng, -ENOMEM, "rank %d: out of memory", c->rank);
  coll_to_wire(op->wire, w + at + ready, (const float *)op->send + ready, in - ready);
  coll_op inner = *op;
  inner.dtype = op->wire;
  inner.send = w + at;
  inner.recv = w;
  int rc = execute_plain(c, &inner);
  if (rc == 0 && op->kind == COLL_REDUCE_SCATTER) {
    /* In place, a reduce-scatter's result lands in block `rank` of the buffer. */
    size_t block = (size_t)c->rank * op->count;
    float *dst = op->recv == op->send ? (float *)op->recv + block : (float *)op->recv;
    coll_from_wire(op->wire, dst, w + block, op->count);
  } else if (rc == 0) {
    coll_from_wire(op->wire, op->recv, w, total);
  }
  return rc;
}

static int execute(cohort_comm *c, const coll_op *op) {
  /* What prepare_next did is this operation's only if it was prepared for it. */
  size_t ready = c->prep_op == op ? c->prep_done : 0;
  c->prep_op = NULL;
  if (atomic_load(&c->eng.failed)) return coll_later_err(&c->eng);
  coll_op_begin(&c->eng); /* the peer watch leaves the streams to it */
  c->cur_op = op;
  int rc = op->wire != op->dtype ? execute_wire(c, op, ready) : execute_plain(c, op);
  c->cur_op = NULL;
  coll_op_end(&c->eng);
  if (rc == 0) coll_progress_auto(); /* progress, for the agent's --hang-timeout */
  return rc;
}

static void *progress_main(void *arg) {
  cohort_comm *c = arg;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (!c->stop && (c->head == NULL || c->busy)) pthread_cond_wait(&c->cv, &c->mu);
    if (c->head == NULL || c->busy) break; /* stopping with nothing left */
    cohort_request *r = c->head;
    c->head = r->next;
    if (c->head == NULL) c->tail = NULL;
    c->busy = 1;
    pthread_mutex_unlock(&c->mu);
    int rc = execute(c, &r->op);
    pthread_mutex_lock(&c->mu);
    c->busy = 0;
    atomic_fetch_sub(&c->inflight, 1);
    r->result = rc;
    r->done = 1;
    pthread_cond_broadcast(&c->cv);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

static int check_op(cohort_comm *c, coll_op *op) {
  if ((unsigned)op->dtype >= COHORT_DTYPE_COUNT || (unsigned)op->op >= COHORT_REDOP_COUNT)
    return -EINVAL;
  if (op->wire != op->dtype &&
      (op->dtype != COHORT_F32 || (op->wire != COHORT_BF16 && op->wire != COHORT_F16) ||
       (op->kind != COLL_ALLREDUCE && op->kind != COLL_REDUCE_SCATTER &&
        op->kind != COLL_ALLGATHER)))
    return -EINVAL;
  size_t es = cohort_dtype_size(op->dtype);
  size_t total = op->count;
  if (op->kind == COLL_REDUCE_SCATTER || op->kind == COLL_ALLGATHER) {
    if (total > SIZE_MAX / (size_t)c->size) return COHORT_ELIMIT;
    total *= (size_t)c->size;
  }
  if (total > (SIZE_MAX / 2) / es) return COHORT_ELIMIT;
  int rooted = op->kind == COLL_BROADCAST || op->kind == COLL_REDUCE;
  if (rooted && (op->root < 0 || op->root >= c->size)) return -EINVAL;
  if (op->count > 0) {
    int need_recv = op->kind != COLL_REDUCE || op->root == c->rank;
    if ((op->send == NULL && op->kind != COLL_BROADCAST) || (need_recv && op->recv == NULL))
      return -EINVAL;
  }
  return 0;
}

/* Validates, then runs now (idle communicator) or queues and waits. */
int coll_start(cohort_comm *c, coll_op *op, cohort_request **req) {
  if (req != NULL) *req = NULL;
  if (c == NULL) return -EINVAL;
  int rc = check_op(c, op);
  if (rc != 0) {
    /* Peers would wait for this rank until their deadline: tell them now. */
    char msg[64];
    snprintf(msg, sizeof msg, "%s", cohort_strerror(rc));
    return coll_fail(&c->eng, rc, "rank %d called %s with invalid arguments (%s)", c->rank,
                     coll_kind_name(op->kind), msg);
  }
  if (atomic_load(&c->eng.failed)) return coll_later_err(&c->eng);
  pthread_mutex_lock(&c->mu);
  op->timeout_ms = c->timeout_ms;
  atomic_fetch_add(&c->inflight, 1);
  if (req == NULL && c->head == NULL && !c->busy) {
    c->busy = 1;
    pthread_mutex_unlock(&c->mu);
    rc = execute(c, op);
    pthread_mutex_lock(&c->mu);
    c->busy = 0;
    atomic_fetch_sub(&c->inflight, 1);
    /* Only the progress thread waits for `busy` to clear, and only with work queued: waking it
     * for nothing would cost a context switch per blocking call. */
    if (c->head != NULL) pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return rc;
  }
  cohort_request local = {0}, *r = &local;
  if (req != NULL) {
    r = calloc(1, sizeof *r);
    if (r == NULL) {
      atomic_fetch_sub(&c->inflight, 1);
      pthread_mutex_unlock(&c->mu);
      return -ENOMEM;
    }
  }
  r->comm = c;
  r->op = *op;
  if (c->tail != NULL)
    c->tail->next = r;
  else
    c->head = r;
  c->tail = r;
  pthread_cond_broadcast(&c->cv);
  if (req != NULL) {
    pthread_mutex_unlock(&c->mu);
    *req = r;
    return 0;
  }
  while (!r->done) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  return r->result;
}

COHORT_API int cohort_request_test(cohort_request *req, int *done) {
  if (req == NULL || done == NULL) return -EINVAL;
  pthread_mutex_lock(&req->comm->mu);
  *done = req->done;
  pthread_mutex_unlock(&req->comm->mu);
  return 0;
}

COHORT_API int cohort_request_wait(cohort_request *req) {
  if (req == NULL) return 0;
  cohort_comm *c = req->comm;
  pthread_mutex_lock(&c->mu);
  while (!req->done) pthread_cond_wait(&c->cv, &c->mu);
  int rc = req->result;
  pthread_mutex_unlock(&c->mu);
  free(req);
  return rc;
}

/* ---- the collectives ---- */

#define OPW(k, s, r, n, dt, w, o, rt)                                                              \
  (coll_op) {                                                                                      \
    .kind = (k), .send = (s), .recv = (r), .count = (n), .dtype = (dt), .wire = (w), .op = (o),    \
    .root = (rt)                                                                                   \
  }
#define OP(k, s, r, n, dt, o, rt) OPW(k, s, r, n, dt, dt, o, rt)

COHORT_API int cohort_allreduce(cohort_comm *c, const void *send, void *recv, size_t count,
                                cohort_dtype dtype, cohort_redop op) {
  coll_op o = OP(COLL_ALLREDUCE, send, recv, count, dtype, op, -1);
  return coll_start(c, &o, NULL);
}

COHORT_API int cohort_reduce_scatter(cohort_comm *c, const void *send, void *recv, size_t recvcount,
                                     cohort_dtype dtype, cohort_redop op) {
  coll_op o = OP(COLL_REDUCE_SCATTER, send, recv, recvcount, dtype, op, -1);
  return coll_start(c, &o, NULL);
}

COHORT_API int cohort_allgather(cohort_comm *c, const void *send, void *recv, size_t sendcount,
                                cohort_dtype dtype) {
  coll_op o = OP(COLL_ALLGATHER, send, recv, sendcount, dtype, COHORT_SUM, -1);
  return coll_start(c, &o, NULL);
}

COHORT_API int cohort_broadcast(cohort_comm *c, void *buf, size_t count, cohort_dtype dtype,
                                int root) {
  coll_op o = OP(COLL_BROADCAST, buf, buf, count, dtype, COHORT_SUM, root);
  return coll_start(c, &o, NULL);
}

COHORT_API int cohort_reduce(cohort_comm *c, const void *send, void *recv, size_t count,
                             cohort_dtype dtype, cohort_redop op, int root) {
  coll_op o = OP(COLL_REDUCE, send, recv, count, dtype, op, root);
  return coll_start(c, &o, NULL);
}

COHORT_API int cohort_barrier(cohort_comm *c) {
  coll_op o = OP(COLL_BARRIER, NULL, NULL, 0, COHORT_U8, COHORT_SUM, -1);
  return coll_start(c, &o, NULL);
}

COHORT_API int cohort_iallreduce(cohort_comm *c, const void *send, void *recv, size_t count,
                                 cohort_dtype dtype, cohort_redop op, cohort_request **req) {
  if (req == NULL) return -EINVAL;
  coll_op o = OP(COLL_ALLREDUCE, send, recv, count, dtype, op, -1);
  return coll_start(c, &o, req);
}

COHORT_API int cohort_ireduce_scatter(cohort_comm *c, const void *send, void *recv,
                                      size_t recvcount, cohort_dtype dtype, cohort_redop op,
                                      cohort_request **req) {
  if (req == NULL) return -EINVAL;
  coll_op o = OP(COLL_REDUCE_SCATTER, send, recv, recvcount, dtype, op, -1);
  return coll_start(c, &o, req);
}

COHORT_API int cohort_iallgather(cohort_comm *c, const void *send, void *recv, size_t sendcount,
                                 cohort_dtype dtype, cohort_request **req) {
  if (req == NULL) return -EINVAL;
  coll_op o = OP(COLL_ALLGATHER, send, recv, sendcount, dtype, COHORT_SUM, -1);
  return coll_start(c, &o, req);
}

COHORT_API int cohort_ibroadcast(cohort_comm *c, void *buf, size_t count, cohort_dtype dtype,
                                 int root, cohort_request **req) {
  if (req == NULL) return -EINVAL;
  coll_op o = OP(COLL_BROADCAST, buf, buf, count, dtype, COHORT_SUM, root);
  return coll_start(c, &o, req);
}

COHORT_API int cohort_allreduce_wire(cohort_comm *c, const void *send, void *recv, size_t count,
                                     cohort_dtype dtype, cohort_dtype wire, cohort_redop op) {
  coll_op o = OPW(COLL_ALLREDUCE, send, recv, count, dtype, wire, op, -1);
  return coll_start(c, &o, NULL);
}

COHORT_API int cohort_iallreduce_wire(cohort_comm *c, const void *send, void *recv, size_t count,
                                      cohort_dtype dtype, cohort_dtype wire, cohort_redop op,
                                      cohort_request **req) {
  if (req == NULL) return -EINVAL;
  coll_op o = OPW(COLL_ALLREDUCE, send, recv, count, dtype, wire, op, -1);
  return coll_start(c, &o, req);
}

COHORT_API int cohort_reduce_scatter_wire(cohort_comm *c, const void *send, void *recv,
                                          size_t recvcount, cohort_dtype dtype, cohort_dtype wire,
                                          cohort_redop op) {
  coll_op o = OPW(COLL_REDUCE_SCATTER, send, recv, recvcount, dtype, wire, op, -1);
  return coll_start(c, &o, NULL);
}

COHORT_API int cohort_ireduce_scatter_wire(cohort_comm *c, const void *send, void *recv,
                                           size_t recvcount, cohort_dtype dtype, cohort_dtype wire,
                                           cohort_redop op, cohort_request **req) {
  if (req == NULL) return -EINVAL;
  coll_op o = OPW(COLL_REDUCE_SCATTER, send, recv, recvcount, dtype, wire, op, -1);
  return coll_start(c, &o, req);
}

COHORT_API int cohort_allgather_wire(cohort_comm *c, const void *send, void *recv, size_t sendcount,
                                     cohort_dtype dtype, cohort_dtype wire) {
  coll_op o = OPW(COLL_ALLGATHER, send, recv, sendcount, dtype, wire, COHORT_SUM, -1);
  return coll_start(c, &o, NULL);
}

COHORT_API int cohort_iallgather_wire(cohort_comm *c, const void *send, void *recv,
                                      size_t sendcount, cohort_dtype dtype, cohort_dtype wire,
                                      cohort_request **req) {
  if (req == NULL) return -EINVAL;
  coll_op o = OPW(COLL_ALLGATHER, send, recv, sendcount, dtype, wire, COHORT_SUM, -1);
  return coll_start(c, &o, req);
}

/*
 * client.c - the store client: blocking calls with deadlines.
 *
 * One request is in flight at a time. Any transport failure or timeout in
 * the middle of a call drops the connection (the byte stream can no longer
 * be trusted); the next call connects again. Before sending, a connection
 * the server closed meanwhile (for example for being idle) is noticed and
 * replaced, so no request is ever sent twice.
 */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "store/store.h"
#include "store/auth.h"
#include "store/proto.h"

/* Connection attempts back off from 10 ms, doubling up to 500 ms. */
#define BACKOFF_MIN_MS 10
#define BACKOFF_MAX_MS 500
/* How long past a WAIT's deadline the client waits for the server's answer. */
#define WAIT_GRACE_MS 2000

struct store_client {
  int fd;
  char host[BASE_HOST_MAX];
  int port;
  char addr[BASE_HOST_MAX + 8];
  char *token;
  store_buf req;
  uint8_t *resp;
  size_t resp_cap;
  const store_ops *ops; /* another backend (store_client_wrap), NULL: the store */
  void *impl;
  int wake_fd;            /* store_client_interruptible's eventfd, -1 */
  atomic_int interrupted; /* store_client_interrupt was called */
};

static void drop(store_client *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
}

/* Waits until fd is ready for events, or the deadline. */
static int wait_ready(int fd, short events, int64_t deadline_ms) {
  struct pollfd p = {.fd = fd, .events = events};
  for (;;) {
    int n = poll(&p, 1, base_deadline_left(deadline_ms));
    if (n > 0) return 0;
    if (n == 0) return -ETIMEDOUT;
    if (errno != EINTR) return -errno;
  }
}

/*
 * Sends all of len bytes. The socket is tried first and polled only when it
 * is full: a request is one send() in the common case.
 */
static int send_all(int fd, const uint8_t *p, size_t len, int64_t deadline_ms) {
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -errno;
    int rc = wait_ready(fd, POLLOUT, deadline_ms);
    if (rc != 0) return rc;
  }
  return 0;
}

/* wait_ready for an answer: also cut short by store_client_interrupt. */
static int wait_answer(store_client *c, int64_t deadline_ms) {
  if (c->wake_fd < 0) return wait_ready(c->fd, POLLIN, deadline_ms);
  struct pollfd p[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = c->wake_fd, .events = POLLIN}};
  for (;;) {
    if (atomic_load(&c->interrupted)) return -ECANCELED;
    int n = poll(p, 2, base_deadline_left(deadline_ms));
    if (n > 0 && p[0].revents != 0) return 0;
    if (n > 0) return -ECANCELED;
    if (n == 0) return -ETIMEDOUT;
    if (errno != EINTR) return -errno;
  }
}

/*
 * Receives into c->resp until it holds at least need bytes. The first wait
 * comes before the first recv(): right after a request the answer is not
 * there yet, and a recv() would only say EAGAIN.
 */
static int recv_until(store_client *c, size_t *have, size_t need, int64_t deadline_ms) {
  if (*have == 0) {
    int rc = wait_answer(c, deadline_ms);
    if (rc != 0) return rc;
  }
  while (*have < need) {
    ssize_t n = recv(c->fd, c->resp + *have, c->resp_cap - *have, MSG_DONTWAIT);
    if (n > 0) {
      *have += (size_t)n;
      continue;
    }
    if (n == 0) return -ECONNRESET;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -errno;
    int rc = wait_answer(c, deadline_ms);
    if (rc != 0) return rc;
  }
  return 0;
}

static int grow_resp(store_client *c, size_t cap) {
  if (cap <= c->resp_cap) return 0;
  uint8_t *p = realloc(c->resp, cap);
  if (p == NULL) return -ENOMEM;
  c->resp = p;
  c->resp_cap = cap;
  return 0;
}

/*
 * Reads one response frame into c->resp and parses it as the answer to op.
 * Header and body usually arrive in one recv(). The parsed fields point into
 * c->resp until the next call.
 */
static int read_response(store_client *c, uint8_t op, int64_t deadline_ms, store_response *resp) {
  size_t have = 0;
  int rc = grow_resp(c, 4096);
  if (rc == 0) rc = recv_until(c, &have, STORE_HEADER_LEN, deadline_ms);
  if (rc != 0) return rc;
  uint32_t n = store_load_u32(c->resp);
  if (n == 0 || n > STORE_FRAME_MAX) return COHORT_EPROTO;
  size_t total = STORE_HEADER_LEN + (size_t)n;
  if ((rc = grow_resp(c, total)) != 0) return rc;
  if ((rc = recv_until(c, &have, total, deadline_ms)) != 0) return rc;
  /* One request, one answer: anything more is not this protocol. */
  if (have != total) return COHORT_EPROTO;
  return store_proto_parse_response(op, c->resp + STORE_HEADER_LEN, n, resp, NULL, 0);
}

static int send_buf(int fd, const store_buf *b, int64_t deadline_ms) {
  if (b->oom) return -ENOMEM;
  return send_all(fd, b->p, b->len, deadline_ms);
}

/*
 * One connection attempt with the handshake. Returns 0, a transport error
 * (worth retrying), COHORT_ELIMIT (server full, worth retrying) or
 * COHORT_EAUTH / COHORT_EPROTO (final); why describes the failure.
 */
static int connect_once(store_client *c, int64_t deadline_ms, char *why, size_t whylen) {
  why[0] = '\0';
  int rc = base_tcp_connect(c->host, c->port, deadline_ms, &c->fd);
  if (rc != 0) {
    c->fd = -1;
    return rc;
  }
  uint8_t cnonce[STORE_NONCE_LEN], snonce[STORE_NONCE_LEN];
  /* Its own buffer: c->req may hold the request this connection is made for. */
  store_buf hs = {0};
  if ((rc = base_random_bytes(cnonce, sizeof cnonce)) != 0) goto out;
  size_t f = store_buf_begin_frame(&hs);
  store_buf_u8(&hs, STORE_OP_HELLO);
  store_buf_u8(&hs, STORE_PROTO_VERSION);
  store_buf_put(&hs, cnonce, sizeof cnonce);
  store_buf_end_frame(&hs, f);
  /* A full server answers before reading: look for its answer even if the send fails. */
  int wrc = send_buf(c->fd, &hs, deadline_ms);
  store_response r;
  rc = read_response(c, STORE_OP_HELLO, deadline_ms, &r);
  if (rc == 0 && r.status == STORE_ST_LIMIT) {
    snprintf(why, whylen, "the server's connection limit is reached");
    rc = COHORT_ELIMIT;
    goto out;
  }
  if (wrc != 0 && rc != 0) rc = wrc;
  if (rc != 0) goto out;
  if (r.status != STORE_ST_OK) {
    rc = store_proto_status_err(r.status);
    snprintf(why, whylen, "the server refused the handshake (%s)", cohort_strerror(rc));
    goto out;
  }
  if (!r.auth_required) {
    if (c->token != NULL) {
      /* Mutual authentication: a server without the token cannot be trusted. */
      snprintf(why, whylen, "the server does not use a token, so it cannot prove it is ours");
      rc = COHORT_EAUTH;
    }
    goto out;
  }
  memcpy(snonce, r.nonce.p, sizeof snonce);
  uint8_t mac[STORE_MAC_LEN];
  hs.len = 0;
  f = store_buf_begin_frame(&hs);
  store_buf_u8(&hs, STORE_OP_AUTH);
  if (c->token != NULL) {
    rc = store_auth_mac(c->token, strlen(c->token), STORE_AUTH_CLIENT_LABEL, cnonce, snonce, mac);
    if (rc != 0) goto out;
    store_buf_u8(&hs, STORE_MAC_LEN);
    store_buf_put(&hs, mac, sizeof mac);
  } else {
    /* Tell the server, so that its log says why this client was refused. */
    store_buf_u8(&hs, 0);
  }
  store_buf_end_frame(&hs, f);
  if ((rc = send_buf(c->fd, &hs, deadline_ms)) != 0) goto out;
  if (c->token == NULL) {
    snprintf(why, whylen, "the server requires a token and none was given");
    rc = COHORT_EAUTH;
    goto out;
  }
  rc = read_response(c, STORE_OP_AUTH, deadline_ms, &r);
  if (rc != 0) goto out;
  if (r.status != STORE_ST_OK) {
    rc = store_proto_status_err(r.status);
    if (rc == COHORT_EAUTH) snprintf(why, whylen, "the server refused our token");
    goto out;
  }
  if (!store_auth_ok(c->token, strlen(c->token), STORE_AUTH_SERVER_LABEL, cnonce, snonce,
                     r.mac.p)) {
    snprintf(why, whylen, "the server failed to prove it knows the token");
    rc = COHORT_EAUTH;
  }
out:
  store_buf_free(&hs);
  if (rc != 0) drop(c);
  return rc;
}

/* Connects with retries and backoff until the deadline. */
static int connect_retry(store_client *c, int64_t deadline_ms, char *errbuf, size_t errlen) {
  int64_t start = base_now_ms();
  int64_t backoff = BACKOFF_MIN_MS;
  int attempts = 0;
  int rc;
  char why[160];
  for (;;) {
    attempts++;
    rc = connect_once(c, deadline_ms, why, sizeof why);
    if (rc == 0) return 0;
    if (rc == COHORT_EAUTH || rc == COHORT_EPROTO || rc == -ENOMEM || rc == -EINVAL ||
        rc == -EAFNOSUPPORT) {
      if (errbuf != NULL)
        snprintf(errbuf, errlen, "store at %s: %s", c->addr, why[0] ? why : cohort_strerror(rc));
      return rc;
    }
    int left = base_deadline_left(deadline_ms);
    if (left <= 0) break;
    base_sleep_ms(backoff < left ? backoff : left);
    backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
    if (base_deadline_left(deadline_ms) <= 0) break;
  }
  if (errbuf != NULL)
    snprintf(errbuf, errlen, "cannot reach the store at %s within %.1f s (%d attempt%s): %s",
             c->addr, (double)(base_now_ms() - start) / 1000.0, attempts, attempts == 1 ? "" : "s",
             why[0] ? why : cohort_strerror(rc));
  return rc;
}

int store_client_connect(const char *host, int port, const char *token, int64_t deadline_ms,
                         store_client **out, char *errbuf, size_t errlen) {
  *out = NULL;
  if (errbuf != NULL && errlen > 0) errbuf[0] = '\0';
  if (host == NULL || host[0] == '\0' || strlen(host) >= BASE_HOST_MAX || port <= 0 ||
      port > 65535) {
    if (errbuf != NULL) snprintf(errbuf, errlen, "store: invalid address");
    return -EINVAL;
  }
  if (token != NULL && token[0] == '\0') token = NULL;
  if (token != NULL && strlen(token) > STORE_TOKEN_MAX) {
    if (errbuf != NULL)
      snprintf(errbuf, errlen, "store: token longer than %d bytes", STORE_TOKEN_MAX);
    return -EINVAL;
  }
  store_client *c = calloc(1, sizeof *c);
  if (c == NULL) return -ENOMEM;
  c->fd = -1;
  c->wake_fd = -1;
  base_strlcpy(c->host, host, sizeof c->host);
  c->port = port;
  base_join_hostport(host, port, c->addr, sizeof c->addr);
  if (token != NULL && (c->token = strdup(token)) == NULL) {
    store_client_close(c);
    return -ENOMEM;
  }
  int rc = connect_retry(c, deadline_ms, errbuf, errlen);
  if (rc != 0) {
    store_client_close(c);
    return rc;
  }
  *out = c;
  return 0;
}

int store_client_wrap(const store_ops *ops, void *impl, store_client **out) {
  store_client *c = calloc(1, sizeof *c);
  if (c == NULL) return -ENOMEM;
  c->fd = -1;
  c->wake_fd = -1;
  c->ops = ops;
  c->impl = impl;
  *out = c;
  return 0;
}

void store_client_close(store_client *c) {
  if (c == NULL) return;
  if (c->ops != NULL) c->ops->close(c->impl);
  drop(c);
  if (c->wake_fd >= 0) close(c->wake_fd);
  if (c->token != NULL) memset(c->token, 0, strlen(c->token));
  free(c->token);
  store_buf_free(&c->req);
  free(c->resp);
  free(c);
}

int store_client_interruptible(store_client *c) {
  if (c->ops != NULL) return c->ops->interrupt != NULL ? 0 : -ENOTSUP;
  if (c->wake_fd >= 0) return 0;
  c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return c->wake_fd >= 0 ? 0 : -errno;
}

void store_client_interrupt(store_client *c) {
  if (c->ops != NULL) {
    if (c->ops->interrupt != NULL) c->ops->interrupt(c->impl);
    return;
  }
  atomic_store(&c->interrupted, 1);
  uint64_t one = 1;
  if (c->wake_fd >= 0 && write(c->wake_fd, &one, sizeof one) < 0) {
    /* the counter is full, which wakes the poll as well */
  }
}

const char *store_client_error(store_client *c) {
  const char *e =
      c != NULL && c->ops != NULL && c->ops->error != NULL ? c->ops->error(c->impl) : "";
  return e != NULL ? e : "";
}

/* Has the server closed this connection while we were not looking? */
static int peer_closed(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  if (poll(&p, 1, 0) <= 0) return 0;
  /* Nothing is due between calls, so readable means EOF, an error or junk. */
  return 1;
}

/*
 * Sends c->req (one frame whose first body byte is op) and reads the answer
 * until read_deadline_ms. Returns 0 or the error; resp->status may still be
 * an error status, which the caller maps.
 */
static int call(store_client *c, uint8_t op, int64_t deadline_ms, int64_t read_deadline_ms,
                store_response *resp) {
  if (c->req.oom) return -ENOMEM;
  /* E.g. a WAIT for thousands of long keys: the server would refuse the frame. */
  if (c->req.len - STORE_HEADER_LEN > STORE_FRAME_MAX) return COHORT_ELIMIT;
  if (atomic_load(&c->interrupted)) return -ECANCELED;
  if (c->fd >= 0 && peer_closed(c->fd)) drop(c);
  if (c->fd < 0) {
    int rc = connect_retry(c, deadline_ms, NULL, 0);
    if (rc != 0) return rc;
  }
  int rc = send_buf(c->fd, &c->req, deadline_ms);
  if (rc == 0) rc = read_response(c, op, read_deadline_ms, resp);
  if (rc == 0 && (resp->status == STORE_ST_AUTH || resp->status == STORE_ST_PROTO)) {
    rc = store_proto_status_err(resp->status); /* the server closes after these */
  }
  if (rc != 0) drop(c);
  return rc;
}

/* Starts a request frame in c->req; finish with store_buf_end_frame(&c->req, 0). */
static void begin(store_client *c, uint8_t op) {
  c->req.len = 0;
  c->req.oom = 0;
  store_buf_begin_frame(&c->req);
  store_buf_u8(&c->req, op);
}

static int check_key(const char *key) {
  if (key == NULL || key[0] == '\0') return -EINVAL;
  if (strlen(key) > STORE_KEY_MAX) return COHORT_ELIMIT;
  return 0;
}

static int check_value(const void *val, size_t len) {
  if (val == NULL && len > 0) return -EINVAL;
  if (len > STORE_VALUE_MAX) return COHORT_ELIMIT;
  return 0;
}

static int copy_out(const store_bytes *b, void **val, size_t *len) {
  void *p = malloc(b->len ? b->len : 1);
  if (p == NULL) return -ENOMEM;
  if (b->len) memcpy(p, b->p, b->len);
  *val = p;
  if (len != NULL) *len = b->len;
  return 0;
}

/* A request of a key and a value answered by a status alone (SET, WILL). */
static int key_value_call(store_client *c, uint8_t op, const char *key, const void *val, size_t len,
                          int64_t deadline_ms) {
  begin(c, op);
  store_buf_key(&c->req, key, strlen(key));
  store_buf_value(&c->req, val, len);
  store_buf_end_frame(&c->req, 0);
  store_response r;
  int rc = call(c, op, deadline_ms, deadline_ms, &r);
  return rc != 0 ? rc : store_proto_status_err(r.status);
}

int store_set(store_client *c, const char *key, const void *val, size_t len, int64_t deadline_ms) {
  int rc = check_key(key);
  if (rc == 0) rc = check_value(val, len);
  if (rc != 0) return rc;
  if (c->ops != NULL) return c->ops->set(c->impl, key, val, len, deadline_ms);
  return key_value_call(c, STORE_OP_SET, key, val, len, deadline_ms);
}

int store_will(store_client *c, const char *key, const void *val, size_t len, int64_t deadline_ms) {
  int rc = check_key(key);
  if (rc == 0) rc = check_value(val, len);
  if (rc != 0) return rc;
  if (c->ops != NULL) return -ENOTSUP; /* etcd: a lease's keys go with it, at its TTL */
  return key_value_call(c, STORE_OP_WILL, key, val, len, deadline_ms);
}

int store_get(store_client *c, const char *key, void **val, size_t *len, int64_t deadline_ms) {
  *val = NULL;
  if (len != NULL) *len = 0;
  int rc = check_key(key);
  if (rc != 0) return rc;
  if (c->ops != NULL)
    return c->ops->get(c->impl, key, val, len != NULL ? len : &(size_t){0}, deadline_ms);
  begin(c, STORE_OP_GET);
  store_buf_key(&c->req, key, strlen(key));
  store_buf_end_frame(&c->req, 0);
  store_response r;
  rc = call(c, STORE_OP_GET, deadline_ms, deadline_ms, &r);
  if (rc != 0) return rc;
  if (r.status != STORE_ST_OK) return store_proto_status_err(r.status);
  return copy_out(&r.value, val, len);
}

int store_wait(store_client *c, const char *const *keys, size_t nkeys, int64_t deadline_ms) {
  if (nkeys == 0) return 0;
  if (nkeys > STORE_WAIT_KEYS_MAX) return COHORT_ELIMIT;
  for (size_t i = 0; i < nkeys; i++) {
    int rc = check_key(keys[i]);
    if (rc != 0) return rc;
  }
  if (c->ops != NULL) return c->ops->wait(c->impl, keys, nkeys, deadline_ms);
  /* The server gets a relative timeout, so the two clocks need not agree. */
  int64_t left = deadline_ms == INT64_MAX ? UINT32_MAX : deadline_ms - base_now_ms();
  if (left < 0) left = 0;
  if (left > UINT32_MAX) left = UINT32_MAX;
  begin(c, STORE_OP_WAIT);
  store_buf_u32(&c->req, (uint32_t)left);
  store_buf_u32(&c->req, (uint32_t)nkeys);
  for (size_t i = 0; i < nkeys; i++) store_buf_key(&c->req, keys[i], strlen(keys[i]));
  store_buf_end_frame(&c->req, 0);
  int64_t read_deadline =
      deadline_ms > INT64_MAX - WAIT_GRACE_MS ? INT64_MAX : deadline_ms + WAIT_GRACE_MS;
  store_response r;
  int rc = call(c, STORE_OP_WAIT, deadline_ms, read_deadline, &r);
  return rc != 0 ? rc : store_proto_status_err(r.status);
}

int store_add(store_client *c, const char *key, int64_t delta, int64_t *result,
              int64_t deadline_ms) {
  int rc = check_key(key);
  if (rc != 0) return rc;
  if (c->ops != NULL) return c->ops->add(c->impl, key, delta, result, deadline_ms);
  begin(c, STORE_OP_ADD);
  store_buf_key(&c->req, key, strlen(key));
  store_buf_u64(&c->req, (uint64_t)delta);
  store_buf_end_frame(&c->req, 0);
  store_response r;
  rc = call(c, STORE_OP_ADD, deadline_ms, deadline_ms, &r);
  if (rc != 0) return rc;
  if (r.status != STORE_ST_OK) return store_proto_status_err(r.status);
  if (result != NULL) *result = r.number;
  return 0;
}

int store_cas(store_client *c, const char *key, const void *expected, size_t elen,
              const void *desired, size_t dlen, void **current, size_t *curlen,
              int64_t deadline_ms) {
  if (current != NULL) *current = NULL;
  if (curlen != NULL) *curlen = 0;
  int rc = check_key(key);
  if (rc == 0 && expected != NULL) rc = check_value(expected, elen);
  if (rc == 0) rc = check_value(desired, dlen);
  if (rc != 0) return rc;
  if (c->ops != NULL)
    return c->ops->cas(c->impl, key, expected, elen, desired, dlen, current, curlen, deadline_ms);
  begin(c, STORE_OP_CAS);
  store_buf_key(&c->req, key, strlen(key));
  store_buf_u8(&c->req, expected != NULL);
  if (expected != NULL) store_buf_value(&c->req, expected, elen);
  store_buf_value(&c->req, desired, dlen);
  store_buf_end_frame(&c->req, 0);
  store_response r;
  rc = call(c, STORE_OP_CAS, deadline_ms, deadline_ms, &r);
  if (rc != 0) return rc;
  if (r.status != STORE_ST_OK) return store_proto_status_err(r.status);
  if (current != NULL && r.has_value) return copy_out(&r.value, current, curlen);
  return 0;
}

int store_delete(store_client *c, const char *key, int64_t deadline_ms) {
  int rc = check_key(key);
  if (rc != 0) return rc;
  if (c->ops != NULL) return c->ops->del(c->impl, key, deadline_ms);
  begin(c, STORE_OP_DELETE);
  store_buf_key(&c->req, key, strlen(key));
  store_buf_end_frame(&c->req, 0);
  store_response r;
  rc = call(c, STORE_OP_DELETE, deadline_ms, deadline_ms, &r);
  return rc != 0 ? rc : store_proto_status_err(r.status);
}

int store_ping(store_client *c, int64_t deadline_ms) {
  if (c->ops != NULL) {
    void *v = NULL;
    size_t n = 0;
    int rc = c->ops->get(c->impl, "ping", &v, &n, deadline_ms);
    free(v);
    return rc == -ENOENT ? 0 : rc;
  }
  begin(c, STORE_OP_PING);
  store_buf_end_frame(&c->req, 0);
  store_response r;
  int rc = call(c, STORE_OP_PING, deadline_ms, deadline_ms, &r);
  return rc != 0 ? rc : store_proto_status_err(r.status);
}

/* Sends what the socket takes of c->req from *off on, without waiting. */
static int send_some(store_client *c, size_t *off) {
  while (*off < c->req.len) {
    ssize_t n = send(c->fd, c->req.p + *off, c->req.len - *off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      *off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return -errno;
  }
  return 0;
}

/* Takes the complete GET answers at the start of c->resp; returns the bytes used or an error. */
static long take_answers(store_client *c, size_t have, void **vals, size_t *lens, size_t n,
                         size_t *done) {
  size_t off = 0;
  uint32_t blen;
  while (*done < n) {
    int rc = store_proto_frame(c->resp + off, have - off, STORE_FRAME_MAX, &blen, NULL, 0);
    if (rc < 0) return rc;
    if (rc == 0) break;
    store_response r;
    rc = store_proto_parse_response(STORE_OP_GET, c->resp + off + STORE_HEADER_LEN, blen, &r, NULL,
                                    0);
    if (rc == 0 && r.status == STORE_ST_OK)
      rc = copy_out(&r.value, &vals[*done], &lens[*done]);
    else if (rc == 0 && r.status != STORE_ST_NOTFOUND)
      rc = store_proto_status_err(r.status);
    if (rc != 0) return rc;
    (*done)++;
    off += STORE_HEADER_LEN + blen;
  }
  return (long)off;
}

/* Sends c->req (n GET frames) while reading the n answers, until the deadline. */
static int pipeline_gets(store_client *c, void **vals, size_t *lens, size_t n,
                         int64_t deadline_ms) {
  size_t sent = 0, have = 0, done = 0;
  int rc = grow_resp(c, 65536);
  while (rc == 0 && done < n) {
    struct pollfd p = {.fd = c->fd, .events = POLLIN | (sent < c->req.len ? POLLOUT : 0)};
    int k = poll(&p, 1, base_deadline_left(deadline_ms));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return k == 0 ? -ETIMEDOUT : -errno;
    if ((p.revents & POLLOUT) && (rc = send_some(c, &sent)) != 0) break;
    if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
    if (have == c->resp_cap && (rc = grow_resp(c, 2 * c->resp_cap)) != 0) break;
    ssize_t got = recv(c->fd, c->resp + have, c->resp_cap - have, MSG_DONTWAIT);
    if (got == 0) return -ECONNRESET;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return -errno;
    }
    have += (size_t)got;
    long used = take_answers(c, have, vals, lens, n, &done);
    if (used < 0) return (int)used;
    memmove(c->resp, c->resp + used, have - (size_t)used);
    have -= (size_t)used;
  }
  /* One request, one answer: anything more is not this protocol. */
  return rc != 0 ? rc : have != 0 ? COHORT_EPROTO : 0;
}

int store_get_many(store_client *c, const char *const *keys, size_t n, void **vals, size_t *lens,
                   int64_t deadline_ms) {
  for (size_t i = 0; i < n; i++) {
    vals[i] = NULL;
    lens[i] = 0;
  }
  for (size_t i = 0; i < n; i++) {
    int rc = check_key(keys[i]);
    if (rc != 0) return rc;
  }
  if (n == 0) return 0;
  if (c->ops != NULL) return c->ops->get_many(c->impl, keys, n, vals, lens, deadline_ms);
  c->req.len = 0;
  c->req.oom = 0;
  for (size_t i = 0; i < n; i++) {
    size_t f = store_buf_begin_frame(&c->req);
    store_buf_u8(&c->req, STORE_OP_GET);
    store_buf_key(&c->req, keys[i], strlen(keys[i]));
    store_buf_end_frame(&c->req, f);
  }
  if (c->req.oom) return -ENOMEM;
  if (atomic_load(&c->interrupted)) return -ECANCELED;
  if (c->fd >= 0 && peer_closed(c->fd)) drop(c);
  int rc = c->fd < 0 ? connect_retry(c, deadline_ms, NULL, 0) : 0;
  if (rc == 0) rc = pipeline_gets(c, vals, lens, n, deadline_ms);
  if (rc != 0) {
    drop(c);
    for (size_t i = 0; i < n; i++) {
      free(vals[i]);
      vals[i] = NULL;
      lens[i] = 0;
    }
  }
  return rc;
}

/*
 * fuzz_store_session.c - libFuzzer target for the store server's connection
 * handling: whole sessions of frames, not single messages.
 *
 * Each input starts a fresh store_server on 127.0.0.1 (so no state leaks
 * from one input to the next and LeakSanitizer sees everything freed by
 * store_server_stop()), then plays the input as the byte streams of one or
 * two client connections, written at once and half-closed, and reads every
 * response until the server closes.
 *
 *   byte 0, bit 0: the server requires a token (an unauthenticated client);
 *   byte 0, bit 1: two connections; byte 1 says where the input is split,
 *                  so one connection's SET can wake the other's WAIT.
 *   the rest:      the client byte streams (frames as docs/store-protocol.md).
 *
 * Checks, besides the sanitizers: every response is a well-formed frame that
 * parses as the answer to the request in the same position (requests are
 * answered in order, error statuses carry nothing); there are never more
 * responses than requests; with a token, no request other than HELLO is ever
 * answered OK (the fuzzer cannot know the token), a key set beforehand by an
 * authenticated client is unchanged afterwards, and its value never appears
 * in what the unauthenticated client received.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"
#include "base/net.h"
#include "store/store.h"
#include "store/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define TOKEN "fuzz-token-0123456789"
#define SECRET_KEY "secret"
#define SECRET_VAL "s3cr3t-value-only-for-authenticated-clients"
/* The whole exchange of one input must end within this; the server's own
 * io timeout is shorter, so a stalled session is the server's fault. */
#define SESSION_MS 3000

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_store_session: check failed: %s\n", what);
    abort();
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  /* The server logs one line per connection it closes: keep the fuzzer's output readable. */
  base_log_set_level(BASE_LOG_ERROR);
  return 0;
}

typedef struct session {
  const uint8_t *out; /* what the client sends */
  size_t out_len, out_off;
  uint8_t *in; /* what it received */
  size_t in_len, in_cap;
  int fd;
  int eof;
} session;

static int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Drives the sessions until both saw EOF or the time is up. */
static void run_sessions(session *s, int n) {
  int64_t deadline = base_now_ms() + SESSION_MS;
  for (;;) {
    struct pollfd p[2];
    int live = 0;
    for (int i = 0; i < n; i++) {
      p[i].fd = s[i].eof ? -1 : s[i].fd;
      p[i].events = POLLIN | (s[i].out_off < s[i].out_len ? POLLOUT : 0);
      p[i].revents = 0;
      if (!s[i].eof) live++;
    }
    if (live == 0) return;
    int left = base_deadline_left(deadline);
    if (left <= 0) return;
    if (poll(p, (nfds_t)n, left) < 0 && errno != EINTR) return;
    for (int i = 0; i < n; i++) {
      session *c = &s[i];
      if (c->eof) continue;
      if ((p[i].revents & POLLOUT) && c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w > 0) c->out_off += (size_t)w;
        if (w < 0 && errno != EAGAIN && errno != EINTR) c->out_off = c->out_len;
        if (c->out_off == c->out_len) shutdown(c->fd, SHUT_WR);
      }
      if (p[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        if (c->in_len == c->in_cap) {
          size_t cap = c->in_cap ? 2 * c->in_cap : 4096;
          uint8_t *np = realloc(c->in, cap);
          check(np != NULL, "out of memory");
          c->in = np;
          c->in_cap = cap;
        }
        ssize_t r = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
        if (r > 0) c->in_len += (size_t)r;
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) c->eof = 1;
      }
    }
  }
}

/*
 * Checks the responses of one session against its requests, replaying the
 * server's framing and parsing of the client's bytes.
 */
static void check_responses(const session *c, int auth_required) {
  const uint8_t *req = c->out;
  size_t req_left = c->out_len;
  const uint8_t *resp = c->in;
  size_t resp_left = c->in_len;
  int fatal_seen = 0;
  while (resp_left > 0) {
    check(!fatal_seen, "a response after an error that closes the connection");
    uint32_t blen = 0;
    int rc = store_proto_frame(resp, resp_left, STORE_FRAME_MAX, &blen, NULL, 0);
    /* The server closes only after a whole frame: a partial one is a bug. */
    check(rc == 1, "the server sent a truncated or invalid frame");
    /* The request this answers: the next frame of the client's stream. */
    uint8_t op = STORE_OP_PING;
    uint32_t qlen = 0;
    int qrc = store_proto_frame(req, req_left, STORE_FRAME_MAX, &qlen, NULL, 0);
    store_request r;
    int parsed = 0;
    if (qrc == 1) {
      if (store_proto_parse_request(req + STORE_HEADER_LEN, qlen, &r, NULL, 0) == 0) {
        op = r.op;
        parsed = 1;
      }
      req += STORE_HEADER_LEN + qlen;
      req_left -= STORE_HEADER_LEN + qlen;
    } else {
      /* A bad or incomplete header is answered with PROTO (or nothing). */
      req_left = 0;
    }
    store_response a;
    char why[128];
    const uint8_t *body = resp + STORE_HEADER_LEN;
    check(store_proto_parse_response(op, body, blen, &a, why, sizeof why) == 0,
          "a response that does not parse as the answer to its request");
    if (!parsed) check(a.status == STORE_ST_PROTO, "a malformed request not answered PROTO");
    if (a.status == STORE_ST_PROTO || a.status == STORE_ST_AUTH) fatal_seen = 1;
    if (auth_required && a.status == STORE_ST_OK)
      check(op == STORE_OP_HELLO, "an unauthenticated request was answered OK");
    resp += STORE_HEADER_LEN + blen;
    resp_left -= STORE_HEADER_LEN + blen;
  }
  if (auth_required) {
    const char *v = SECRET_VAL;
    check(c->in_len < strlen(v) || memmem(c->in, c->in_len, v, strlen(v)) == NULL,
          "an unauthenticated client received a stored value");
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int with_token = data[0] & 1;
  int two = (data[0] & 2) && size >= 2;
  const uint8_t *stream = data + (two ? 2 : 1);
  size_t stream_len = size - (two ? 2 : 1);
  size_t split = two ? stream_len * data[1] / 256 : stream_len;

  store_server_opts o = {.bind_host = "127.0.0.1",
                         .token = with_token ? TOKEN : NULL,
                         .io_timeout_ms = 1000,
                         .max_bytes = 256 * 1024,
                         .max_conns = 8};
  store_server *srv = NULL;
  check(store_server_start(&o, &srv) == 0, "cannot start a store server");
  int port = store_server_port(srv);

  store_client *admin = NULL;
  if (with_token) {
    char err[256];
    check(store_client_connect("127.0.0.1", port, TOKEN, base_deadline_in(2000), &admin, err,
                               sizeof err) == 0,
          "the authenticated client cannot connect");
    check(store_set(admin, SECRET_KEY, SECRET_VAL, strlen(SECRET_VAL), base_deadline_in(2000)) == 0,
          "the authenticated client cannot set");
  }

  session s[2];
  memset(s, 0, sizeof s);
  s[0].out = stream;
  s[0].out_len = split;
  s[1].out = stream + split;
  s[1].out_len = stream_len - split;
  int n = two ? 2 : 1;
  for (int i = 0; i < n; i++) {
    s[i].fd = connect_to(port);
    check(s[i].fd >= 0, "cannot connect");
    if (s[i].out_len == 0) shutdown(s[i].fd, SHUT_WR);
  }
  run_sessions(s, n);
  for (int i = 0; i < n; i++) {
    check_responses(&s[i], with_token);
    close(s[i].fd);
    free(s[i].in);
  }

  if (with_token) {
    /* The unauthenticated clients changed nothing. */
    void *v = NULL;
    size_t vlen = 0;
    check(store_get(admin, SECRET_KEY, &v, &vlen, base_deadline_in(2000)) == 0 &&
              vlen == strlen(SECRET_VAL) && memcmp(v, SECRET_VAL, vlen) == 0,
          "a key changed under unauthenticated clients");
    free(v);
    static const char *const probe[] = {"k", "key", "x", "a", "fuzz"};
    for (size_t i = 0; i < sizeof probe / sizeof probe[0]; i++) {
      v = NULL;
      check(store_get(admin, probe[i], &v, &vlen, base_deadline_in(2000)) == -ENOENT,
            "an unauthenticated client created a key");
      free(v);
    }
    store_client_close(admin);
  }
  store_server_stop(srv);
  return 0;
}

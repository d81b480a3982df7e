/* etcd.c - etcd v3 through its JSON gateway with libcurl; see etcd.h. */
#include "rdzv/etcd.h"

#include <curl/curl.h>
#include <dlfcn.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "base/crypto.h"
#include "base/net.h"

#define ETCD_MAX_ENDPOINTS 16
#define ETCD_TXN_OPS 128 /* etcd's default --max-txn-ops */
#define ETCD_BODY_MAX (64u << 20)
/* With several members, one attempt of a request that may be replayed lasts at most its share
 * of the time left, and at least this: a member that cannot serve it (a follower whose leader
 * has just died holds requests until it times out) does not take the whole deadline. */
#define ETCD_ATTEMPT_MIN_MS 1000

/* A watch on one key that outlives the etcd_wait that opened it: the next wait on the same key
 * goes on listening to it instead of reading the key and opening a watch again (a loop of
 * short waits cost a read and a watch each). */
/* An answer as it arrives: at most ETCD_BODY_MAX bytes, NUL-terminated. */
typedef struct body {
  char *p;
  size_t len;
  int over; /* it was longer: the transfer was cut */
} body;

typedef struct watch_stream {
  CURL *curl;    /* in the multi handle while open */
  char key[512]; /* the key watched (the caller's, without the prefix) */
  body got;      /* what has arrived since it opened */
  int changed;   /* an event, a cancel or an error arrived: look again */
  int endpoint;  /* the member it listens to (an index of endpoints) */
  struct curl_slist *hdrs;
  int done;        /* the transfer ended */
  CURLcode result; /* how, when done */
} watch_stream;

struct etcd {
  CURL *curl;
  CURLM *multi; /* drives curl and the held watch, so that etcd_interrupt can wake it */
  watch_stream w;
  atomic_int interrupted;
  char endpoints[ETCD_MAX_ENDPOINTS][BASE_HOST_MAX + 8];
  int nendpoints, cur;
  char prefix[256];
  char scheme[8];
  char *user, *password;
  char auth_header[512];     /* "Authorization: <token>", "" none */
  char err[512];             /* the last failure, one line */
  _Atomic int64_t *answered; /* etcd_opts.answered */
};

/* ---- libcurl, loaded at the first connection ----
 * Linked, libcurl and its tree (TLS, Kerberos, LDAP, ...: 28 libraries on Debian) would
 * load with every `cohort` exec, though only the etcd backend uses it; opened here,
 * only a process that connects to etcd pays for it. */

#define CURL_SONAME "libcurl.so.4"

static struct {
  CURLcode (*global_init)(long);
  CURL *(*easy_init)(void);
  CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
  CURLcode (*easy_perform)(CURL *);
  CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
  const char *(*easy_strerror)(CURLcode);
  void (*easy_cleanup)(CURL *);
  struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
  void (*slist_free_all)(struct curl_slist *);
  CURLM *(*multi_init)(void);
  CURLMcode (*multi_add_handle)(CURLM *, CURL *);
  CURLMcode (*multi_remove_handle)(CURLM *, CURL *);
  CURLMcode (*multi_perform)(CURLM *, int *);
  CURLMcode (*multi_poll)(CURLM *, struct curl_waitfd *, unsigned, int, int *);
  CURLMcode (*multi_wakeup)(CURLM *);
  CURLMsg *(*multi_info_read)(CURLM *, int *);
  CURLMcode (*multi_cleanup)(CURLM *);
  char err[256]; /* why it could not be loaded, "" when it was */
} lc;
static pthread_once_t lc_once = PTHREAD_ONCE_INIT;

static void lc_load(void) {
  void *h = dlopen(CURL_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    snprintf(lc.err, sizeof lc.err, "the etcd backend needs %s: %s", CURL_SONAME, dlerror());
    return;
  }
  struct {
    void **fn;
    const char *name;
  } syms[] = {
      {(void **)&lc.global_init, "curl_global_init"},
      {(void **)&lc.easy_init, "curl_easy_init"},
      {(void **)&lc.easy_setopt, "curl_easy_setopt"},
      {(void **)&lc.easy_perform, "curl_easy_perform"},
      {(void **)&lc.easy_getinfo, "curl_easy_getinfo"},
      {(void **)&lc.easy_strerror, "curl_easy_strerror"},
      {(void **)&lc.easy_cleanup, "curl_easy_cleanup"},
      {(void **)&lc.slist_append, "curl_slist_append"},
      {(void **)&lc.slist_free_all, "curl_slist_free_all"},
      {(void **)&lc.multi_init, "curl_multi_init"},
      {(void **)&lc.multi_add_handle, "curl_multi_add_handle"},
      {(void **)&lc.multi_remove_handle, "curl_multi_remove_handle"},
      {(void **)&lc.multi_perform, "curl_multi_perform"},
      {(void **)&lc.multi_poll, "curl_multi_poll"},
      {(void **)&lc.multi_wakeup, "curl_multi_wakeup"},
      {(void **)&lc.multi_info_read, "curl_multi_info_read"},
      {(void **)&lc.multi_cleanup, "curl_multi_cleanup"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
    if ((*syms[i].fn = dlsym(h, syms[i].name)) == NULL) {
      snprintf(lc.err, sizeof lc.err, "%s has no %s", CURL_SONAME, syms[i].name);
      return;
    }
  if (lc.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    snprintf(lc.err, sizeof lc.err, "curl_global_init failed");
}

/* 0 once libcurl is loaded and initialised (the first call does it, thread-safe);
 * -ENOSYS with e->err saying why not. */
static int lc_ready(etcd *e) {
  pthread_once(&lc_once, lc_load);
  if (lc.err[0] == '\0') return 0;
  snprintf(e->err, sizeof e->err, "%s", lc.err);
  return -ENOSYS;
}

/* ---- bytes and JSON ---- */

static char *b64_encode(const void *p, size_t n) {
  char *out = malloc(BASE_B64_LEN(n) + 1);
  if (out != NULL) base_b64_encode(p, n, out);
  return out;
}

/* Decodes s into a malloc'ed buffer (NUL-terminated for text); -1 on bad input. */
static int b64_decode(const char *s, void **out, size_t *len) {
  size_t n = strlen(s);
  if (n % 4 != 0) return -1;
  unsigned char *buf = malloc(BASE_B64_DECODED_MAX(n) + 1);
  if (buf == NULL) return -1;
  size_t got = 0;
  if (base_b64_decode(s, n, buf, &got) != 0) {
    free(buf);
    return -1;
  }
  buf[got] = '\0';
  *out = buf;
  *len = got;
  return 0;
}

/* The prefixed key, base64. */
static char *key64(const etcd *e, const char *key) {
  size_t pl = strlen(e->prefix), kl = strlen(key);
  char *full = malloc(pl + kl + 1);
  if (full == NULL) return NULL;
  memcpy(full, e->prefix, pl);
  memcpy(full + pl, key, kl + 1);
  char *b = b64_encode(full, pl + kl);
  free(full);
  return b;
}

/* Adds field = base64(p, n) to o; -ENOMEM. */
static int set_b64(json_t *o, const char *field, const void *p, size_t n) {
  char *b = b64_encode(p, n);
  if (b == NULL) return -ENOMEM;
  int rc = json_object_set_new(o, field, json_string(b));
  free(b);
  return rc == 0 ? 0 : -ENOMEM;
}

static int set_key(const etcd *e, json_t *o, const char *field, const char *key) {
  char *b = key64(e, key);
  if (b == NULL) return -ENOMEM;
  int rc = json_object_set_new(o, field, json_string(b));
  free(b);
  return rc == 0 ? 0 : -ENOMEM;
}

/* An int64 field of etcd's JSON (a string or a number); fallback when absent. */
static int64_t json_i64(const json_t *o, const char *field, int64_t fallback) {
  const json_t *v = json_object_get(o, field);
  if (json_is_integer(v)) return json_integer_value(v);
  int64_t x;
  if (json_is_string(v) && base_parse_i64(json_string_value(v), INT64_MIN, INT64_MAX, &x) == 0)
    return x;
  return fallback;
}

static json_t *i64_json(int64_t v) {
  char s[32];
  snprintf(s, sizeof s, "%lld", (long long)v);
  return json_string(s);
}

/* ---- HTTP ---- */

/* Appends k bytes at p to b: k, or 0 (which ends curl's transfer) past ETCD_BODY_MAX or out
 * of memory. */
static size_t body_append(body *b, const char *p, size_t k) {
  if (b->len + k > ETCD_BODY_MAX) {
    b->over = 1;
    return 0;
  }
  char *q = realloc(b->p, b->len + k + 1);
  if (q == NULL) return 0;
  memcpy(q + b->len, p, k);
  b->p = q;
  b->len += k;
  b->p[b->len] = '\0';
  return k;
}

static size_t on_data(char *p, size_t size, size_t n, void *arg) {
  return body_append(arg, p, size * n);
}

/* The headers of every request (freed with lc.slist_free_all). */
static struct curl_slist *headers(const etcd *e) {
  struct curl_slist *hdrs = lc.slist_append(NULL, "Content-Type: application/json");
  if (e->auth_header[0] != '\0') hdrs = lc.slist_append(hdrs, e->auth_header);
  /* etcd's "require leader" (gRPC metadata through the gateway): a member without a leader
   * answers 503 at once instead of holding the request until it times out. */
  return lc.slist_append(hdrs, "Grpc-Metadata-hasleader: true");
}

/*
 * Drives e's transfers (a request's and the held watch's) until want's has
 * ended (0, *res how), the deadline passes (-ETIMEDOUT) or etcd_interrupt
 * is called (-ECANCELED). The held watch's end is recorded whenever it comes.
 */
static int drive(etcd *e, CURL *want, int64_t deadline, CURLcode *res) {
  for (;;) {
    int running = 0, queued = 0, ended = 0;
    lc.multi_perform(e->multi, &running);
    for (CURLMsg *m; (m = lc.multi_info_read(e->multi, &queued)) != NULL;) {
      if (m->msg != CURLMSG_DONE) continue;
      if (m->easy_handle == e->w.curl) e->w.done = 1, e->w.result = m->data.result;
      if (m->easy_handle == want) ended = 1, *res = m->data.result;
    }
    if (ended || (want == e->w.curl && e->w.done)) return 0;
    if (atomic_load(&e->interrupted)) return -ECANCELED;
    int left = base_deadline_left(deadline);
    if (left <= 0) return -ETIMEDOUT;
    lc.multi_poll(e->multi, NULL, 0, left < 1000 ? left : 1000, NULL);
  }
}

/* One POST to the current endpoint, its answer to fn(arg) as it arrives; 0 with *status,
 * or a transport error (-ECANCELED: etcd_interrupt). */
static int post_once(etcd *e, const char *path, const char *req, int64_t deadline, long *status,
                     curl_write_callback fn, void *arg) {
  char url[BASE_HOST_MAX + 64];
  snprintf(url, sizeof url, "%s://%s%s", e->scheme, e->endpoints[e->cur], path);
  struct curl_slist *hdrs = headers(e);
  int left = base_deadline_left(deadline);
  lc.easy_setopt(e->curl, CURLOPT_URL, url);
  lc.easy_setopt(e->curl, CURLOPT_HTTPHEADER, hdrs);
  lc.easy_setopt(e->curl, CURLOPT_POSTFIELDS, req);
  lc.easy_setopt(e->curl, CURLOPT_TIMEOUT_MS, (long)(left > 1 ? left : 1));
  lc.easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, (long)(left > 1 ? left : 1));
  lc.easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, fn);
  lc.easy_setopt(e->curl, CURLOPT_WRITEDATA, arg);
  CURLcode cc = CURLE_OPERATION_TIMEDOUT;
  /* curl's own timeout ends the transfer; the margin only guards against one that does not */
  int rc = lc.multi_add_handle(e->multi, e->curl) == CURLM_OK ? 0 : -ENOMEM;
  if (rc == 0) rc = drive(e, e->curl, deadline + 100, &cc);
  lc.multi_remove_handle(e->multi, e->curl);
  lc.slist_free_all(hdrs);
  *status = 0;
  if (rc == -ECANCELED || rc == -ENOMEM) {
    snprintf(e->err, sizeof e->err, "%s", rc == -ECANCELED ? "interrupted" : "out of memory");
    return rc;
  }
  lc.easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, status);
  if (*status > 0 && e->answered != NULL) atomic_store(e->answered, base_now_ms());
  if (cc == CURLE_OK) return 0;
  snprintf(e->err, sizeof e->err, "%s (last tried %s)", lc.easy_strerror(cc), e->endpoints[e->cur]);
  if (cc == CURLE_OPERATION_TIMEDOUT) return -ETIMEDOUT;
  if (cc == CURLE_SSL_CERTPROBLEM || cc == CURLE_PEER_FAILED_VERIFICATION ||
      cc == CURLE_SSL_CACERT_BADFILE || cc == CURLE_SSL_CONNECT_ERROR)
    return COHORT_EAUTH;
  return -ECONNREFUSED;
}

/* etcd's error answer: an auth refusal, or a protocol error. */
static int answer_error(etcd *e, long status, const json_t *doc) {
  const char *msg = json_string_value(json_object_get(doc, "error"));
  if (msg == NULL) msg = json_string_value(json_object_get(doc, "message"));
  snprintf(e->err, sizeof e->err, "HTTP %ld from %s: %s", status, e->endpoints[e->cur],
           msg != NULL ? msg : "(no message)");
  int code = (int)json_i64(doc, "code", 0);
  /* gRPC codes: 16 unauthenticated, 7 permission denied; "user name is empty" when a
   * client without credentials meets an etcd that requires them */
  if (code == 16 || code == 7 ||
      (msg != NULL && (strstr(msg, "auth") != NULL || strstr(msg, "user name") != NULL)))
    return COHORT_EAUTH;
  /* 5 not found: "requested lease not found" (a write under a lease that expired) */
  return code == 5 ? -ENOENT : COHORT_EPROTO;
}

static int authenticate(etcd *e, int64_t deadline);
static void watch_close(etcd *e);

/* Leaves the current member for the next, which it failed; the held watch goes if it was
 * there (the next wait reads its key again), so that a member cut off without a word (its
 * watch stream silent, not closed) does not keep a wait from seeing a change. */
static void next_endpoint(etcd *e) {
  if (e->w.curl != NULL && e->w.key[0] != '\0' && e->w.endpoint == e->cur) watch_close(e);
  e->cur = (e->cur + 1) % e->nendpoints;
}

/* The deadline of one attempt: the whole of it for a request that must not be replayed once
 * sent (or with one member); else its share of the time left. */
static int64_t attempt_deadline(const etcd *e, int replay, int64_t deadline) {
  if (!replay || e->nendpoints < 2) return deadline;
  int64_t share = base_deadline_left(deadline) / e->nendpoints;
  int64_t d = base_deadline_in(share > ETCD_ATTEMPT_MIN_MS ? share : ETCD_ATTEMPT_MIN_MS);
  return d < deadline ? d : deadline;
}

/*
 * POSTs req to path, moving to the next endpoint when one cannot be
 * reached or (replay) does not answer within its share of the time, until
 * the deadline; *resp the parsed answer. An expired token is renewed once.
 */
static int request(etcd *e, const char *path, json_t *req, json_t **resp, int64_t deadline,
                   int replay) {
  char *text = json_dumps(req, JSON_COMPACT);
  if (text == NULL) return -ENOMEM;
  int rc = -ETIMEDOUT, reauth = e->user != NULL && strcmp(path, "/v3/auth/authenticate") != 0;
  e->err[0] = '\0';
  for (int tries = 0; base_deadline_left(deadline) > 0; tries++) {
    body b = {0};
    long status = 0;
    if (atomic_load(&e->interrupted)) {
      snprintf(e->err, sizeof e->err, "interrupted");
      rc = -ECANCELED;
      break;
    }
    rc = post_once(e, path, text, attempt_deadline(e, replay, deadline), &status, on_data, &b);
    if (b.over) { /* not a member failing: the next would answer the same */
      snprintf(e->err, sizeof e->err, "HTTP %ld from %s: an answer over %u bytes", status,
               e->endpoints[e->cur], ETCD_BODY_MAX);
      free(b.p);
      rc = COHORT_EPROTO;
      break;
    }
    if (rc == -ECONNREFUSED || rc == -ETIMEDOUT) {
      free(b.p);
      next_endpoint(e);
      if ((tries + 1) % e->nendpoints == 0) base_sleep_ms(tries < 8 * e->nendpoints ? 50 : 200);
      continue;
    }
    json_t *doc = rc == 0 && b.p != NULL ? json_loads(b.p, 0, NULL) : NULL;
    free(b.p);
    if (rc != 0) break;
    if (doc == NULL) {
      snprintf(e->err, sizeof e->err, "HTTP %ld from %s: an answer that is not JSON", status,
               e->endpoints[e->cur]);
      rc = COHORT_EPROTO;
      break;
    }
    if (status == 200) {
      *resp = doc;
      e->err[0] = '\0'; /* a 503 on the way is not this request's failure */
      rc = 0;
      break;
    }
    rc = answer_error(e, status, doc);
    json_decref(doc);
    if (status == 503) { /* a leader election: the request was not served; again, elsewhere */
      next_endpoint(e);
      base_sleep_ms(50);
      rc = -ETIMEDOUT;
      continue;
    }
    if (rc != COHORT_EAUTH || !reauth) break;
    reauth = 0; /* the token may have expired: once more with a new one */
    if ((rc = authenticate(e, deadline)) != 0) break;
  }
  if (rc == -ETIMEDOUT && e->err[0] == '\0')
    snprintf(e->err, sizeof e->err, "no answer before the deadline");
  free(text);
  return rc;
}

/* A request that may be sent again when its answer did not come (see etcd.h). */
static int call(etcd *e, const char *path, json_t *req, json_t **resp, int64_t deadline) {
  return request(e, path, req, resp, deadline, 1);
}

static int authenticate(etcd *e, int64_t deadline) {
  json_t *req = json_pack("{s:s, s:s}", "name", e->user, "password", e->password), *resp = NULL;
  if (req == NULL) return -ENOMEM;
  e->auth_header[0] = '\0';
  int rc = call(e, "/v3/auth/authenticate", req, &resp, deadline);
  json_decref(req);
  if (rc != 0) return rc;
  const char *token = json_string_value(json_object_get(resp, "token"));
  if (token == NULL || strlen(token) > sizeof e->auth_header - 32) {
    snprintf(e->err, sizeof e->err, "no token in the answer to authenticate from %s",
             e->endpoints[e->cur]);
    rc = COHORT_EPROTO;
  } else {
    snprintf(e->auth_header, sizeof e->auth_header, "Authorization: %s", token);
  }
  json_decref(resp);
  return rc;
}

/* ---- connecting ---- */

static int split_endpoints(etcd *e, const char *list) {
  const char *p = list;
  while (*p != '\0') {
    size_t n = strcspn(p, ",");
    char host[BASE_HOST_MAX];
    int port;
    if (n == 0 || n >= sizeof e->endpoints[0] || e->nendpoints == ETCD_MAX_ENDPOINTS)
      return -EINVAL;
    memcpy(e->endpoints[e->nendpoints], p, n);
    e->endpoints[e->nendpoints][n] = '\0';
    if (base_split_hostport(e->endpoints[e->nendpoints], host, sizeof host, &port, 0) != 0)
      return -EINVAL;
    e->nendpoints++;
    p += n;
    if (*p == ',') p++;
  }
  return e->nendpoints > 0 ? 0 : -EINVAL;
}

static int setup(etcd *e, const etcd_opts *o) {
  if (o->endpoints == NULL || split_endpoints(e, o->endpoints) != 0) {
    snprintf(e->err, sizeof e->err, "bad etcd endpoints '%.100s' (HOST:PORT,...)",
             o->endpoints ? o->endpoints : "");
    return -EINVAL;
  }
  snprintf(e->prefix, sizeof e->prefix, "%s", o->prefix != NULL ? o->prefix : "");
  e->answered = o->answered;
  snprintf(e->scheme, sizeof e->scheme, "%s", o->cacert != NULL ? "https" : "http");
  if ((o->user == NULL) != (o->password == NULL)) {
    snprintf(e->err, sizeof e->err, "an etcd user needs a password, and a password a user");
    return -EINVAL;
  }
  if (o->user != NULL &&
      ((e->user = strdup(o->user)) == NULL || (e->password = strdup(o->password)) == NULL))
    return -ENOMEM;
  if ((e->multi = lc.multi_init()) == NULL) return -ENOMEM;
  CURL **handles[2] = {&e->curl, &e->w.curl}; /* requests, the held watch */
  for (int i = 0; i < 2; i++) {
    CURL *c = *handles[i] = lc.easy_init();
    if (c == NULL) return -ENOMEM;
    lc.easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    lc.easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    if (o->cacert != NULL && o->cacert[0] != '\0') lc.easy_setopt(c, CURLOPT_CAINFO, o->cacert);
    if (o->cert != NULL) lc.easy_setopt(c, CURLOPT_SSLCERT, o->cert);
    if (o->key != NULL) lc.easy_setopt(c, CURLOPT_SSLKEY, o->key);
  }
  return 0;
}

int etcd_connect(const etcd_opts *o, int64_t deadline_ms, etcd **out, char *err, size_t errlen) {
  etcd *e = calloc(1, sizeof *e);
  if (e == NULL) return -ENOMEM;
  int rc = lc_ready(e);
  if (rc == 0) rc = setup(e, o);
  json_t *req = json_object(), *resp = NULL;
  if (rc == 0 && e->user != NULL) rc = authenticate(e, deadline_ms);
  /* A read under the prefix checks the connection and the permissions. */
  if (rc == 0 && req != NULL) rc = set_key(e, req, "key", "");
  if (rc == 0) rc = call(e, "/v3/kv/range", req, &resp, deadline_ms);
  json_decref(req);
  json_decref(resp);
  if (rc != 0) {
    if (err != NULL) snprintf(err, errlen, "etcd %s: %s", o->endpoints ? o->endpoints : "", e->err);
    etcd_close(e);
    return rc;
  }
  *out = e;
  return 0;
}

void etcd_close(etcd *e) {
  if (e == NULL) return;
  if (e->w.curl != NULL) watch_close(e);
  if (e->w.curl != NULL) lc.easy_cleanup(e->w.curl);
  if (e->curl != NULL) lc.easy_cleanup(e->curl);
  if (e->multi != NULL) lc.multi_cleanup(e->multi);
  free(e->user);
  free(e->password);
  free(e);
}

const char *etcd_endpoint(const etcd *e) {
  return e->endpoints[e->cur];
}

const char *etcd_error(const etcd *e) {
  return e->err;
}

void etcd_interrupt(etcd *e) {
  atomic_store(&e->interrupted, 1);
  lc.multi_wakeup(e->multi);
}

void etcd_resume(etcd *e) {
  atomic_store(&e->interrupted, 0);
}

/* ---- key-value ---- */

int etcd_put(etcd *e, const char *key, const void *val, size_t len, int64_t lease,
             int64_t deadline_ms) {
  json_t *req = json_object(), *resp = NULL;
  int rc = req ? set_key(e, req, "key", key) : -ENOMEM;
  if (rc == 0) rc = set_b64(req, "value", val, len);
  if (rc == 0 && lease != 0) json_object_set_new(req, "lease", i64_json(lease));
  if (rc == 0) rc = call(e, "/v3/kv/put", req, &resp, deadline_ms);
  json_decref(req);
  json_decref(resp);
  return rc;
}

/* What a counter's key holds (etcd_add): its count is the key's version. */
#define COUNTER_MARK "\001count"
#define COUNTER_MARK_B64 "AWNvdW50"

/* The value of the first kv of a range answer (a counter's count as text); -ENOENT when none. */
static int first_value(const json_t *range, void **val, size_t *len, int64_t *mod) {
  const json_t *kv = json_array_get(json_object_get(range, "kvs"), 0);
  if (kv == NULL) return -ENOENT;
  const char *v = json_string_value(json_object_get(kv, "value"));
  if (mod != NULL) *mod = json_i64(kv, "mod_revision", 0);
  if (v == NULL) v = ""; /* an empty value is left out of the JSON */
  if (strcmp(v, COUNTER_MARK_B64) != 0) return b64_decode(v, val, len) == 0 ? 0 : COHORT_EPROTO;
  char text[32];
  *len = (size_t)snprintf(text, sizeof text, "%lld", (long long)json_i64(kv, "version", 0));
  *val = strdup(text);
  return *val != NULL ? 0 : -ENOMEM;
}

static int get_rev(etcd *e, const char *key, void **val, size_t *len, int64_t *mod,
                   int64_t deadline_ms) {
  json_t *req = json_object(), *resp = NULL;
  int rc = req ? set_key(e, req, "key", key) : -ENOMEM;
  if (rc == 0) rc = call(e, "/v3/kv/range", req, &resp, deadline_ms);
  if (rc == 0) rc = first_value(resp, val, len, mod);
  json_decref(req);
  json_decref(resp);
  return rc;
}

int etcd_get(etcd *e, const char *key, void **val, size_t *len, int64_t deadline_ms) {
  return get_rev(e, key, val, len, NULL, deadline_ms);
}

int etcd_lease_of(etcd *e, const char *key, int64_t *lease, int64_t deadline_ms) {
  json_t *req = json_pack("{s:b}", "keys_only", 1), *resp = NULL;
  int rc = req ? set_key(e, req, "key", key) : -ENOMEM;
  if (rc == 0) rc = call(e, "/v3/kv/range", req, &resp, deadline_ms);
  const json_t *kv = json_array_get(json_object_get(resp, "kvs"), 0);
  if (rc == 0 && kv == NULL) rc = -ENOENT;
  if (rc == 0) *lease = json_i64(kv, "lease", 0);
  json_decref(req);
  json_decref(resp);
  return rc;
}

/* One transaction of range requests for keys[0..n); *rev (may be NULL) the revision read. */
static int get_chunk(etcd *e, const char *const *keys, size_t n, void **vals, size_t *lens,
                     int64_t *rev, int64_t deadline_ms) {
  json_t *req = json_object(), *ops = json_array(), *resp = NULL;
  int rc = req && ops ? 0 : -ENOMEM;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    json_t *range = json_object();
    rc = range ? set_key(e, range, "key", keys[i]) : -ENOMEM;
    if (rc == 0)
      rc = json_array_append_new(ops, json_pack("{s:o}", "request_range", range));
    else
      json_decref(range);
  }
  if (rc == 0) rc = json_object_set(req, "success", ops);
  if (rc == 0) rc = call(e, "/v3/kv/txn", req, &resp, deadline_ms);
  const json_t *answers = json_object_get(resp, "responses");
  if (rc == 0 && json_array_size(answers) != n) rc = COHORT_EPROTO;
  if (rc == 0 && rev != NULL) *rev = json_i64(json_object_get(resp, "header"), "revision", 0);
  for (size_t i = 0; rc == 0 && i < n; i++) {
    const json_t *range = json_object_get(json_array_get(answers, i), "response_range");
    int r = first_value(range, &vals[i], &lens[i], NULL);
    if (r == -ENOENT)
      vals[i] = NULL, lens[i] = 0;
    else
      rc = r;
  }
  json_decref(ops);
  json_decref(req);
  json_decref(resp);
  return rc;
}

int etcd_get_many(etcd *e, const char *const *keys, size_t n, void **vals, size_t *lens,
                  int64_t deadline_ms) {
  memset(vals, 0, n * sizeof *vals);
  int rc = 0;
  for (size_t at = 0; rc == 0 && at < n; at += ETCD_TXN_OPS) {
    size_t k = n - at < ETCD_TXN_OPS ? n - at : ETCD_TXN_OPS;
    rc = get_chunk(e, keys + at, k, vals + at, lens + at, NULL, deadline_ms);
  }
  if (rc != 0)
    for (size_t i = 0; i < n; i++) free(vals[i]), vals[i] = NULL;
  return rc;
}

int etcd_delete(etcd *e, const char *key, int64_t deadline_ms) {
  json_t *req = json_object(), *resp = NULL;
  int rc = req ? set_key(e, req, "key", key) : -ENOMEM;
  if (rc == 0) rc = call(e, "/v3/kv/deleterange", req, &resp, deadline_ms);
  if (rc == 0 && json_i64(resp, "deleted", 0) == 0) rc = -ENOENT;
  json_decref(req);
  json_decref(resp);
  return rc;
}

/*
 * The transaction "if key's VALUE equals expected (or, expected NULL, key
 * does not exist / its MOD revision is mod when mod > 0) put desired, else
 * read key". *ok whether the put happened; *current the value after.
 */
static int txn_put(etcd *e, const char *key, const void *expected, size_t elen, int64_t mod,
                   const void *desired, size_t dlen, int64_t lease, int *ok, void **current,
                   size_t *curlen, int64_t deadline_ms) {
  json_t *cmp = json_object(), *put = json_object(), *range = json_object(), *resp = NULL;
  int rc = cmp && put && range ? set_key(e, cmp, "key", key) : -ENOMEM;
  if (rc == 0 && expected != NULL) {
    json_object_set_new(cmp, "target", json_string("VALUE"));
    rc = set_b64(cmp, "value", expected, elen);
  } else if (rc == 0) {
    json_object_set_new(cmp, "target", json_string(mod > 0 ? "MOD" : "CREATE"));
    json_object_set_new(cmp, mod > 0 ? "mod_revision" : "create_revision", i64_json(mod));
  }
  json_object_set_new(cmp, "result", json_string("EQUAL"));
  if (rc == 0) rc = set_key(e, put, "key", key);
  if (rc == 0) rc = set_b64(put, "value", desired, dlen);
  if (rc == 0 && lease != 0) json_object_set_new(put, "lease", i64_json(lease));
  if (rc == 0) rc = set_key(e, range, "key", key);
  json_t *req = rc == 0 ? json_pack("{s:[o], s:[{s:o}], s:[{s:O}]}", "compare", cmp, "success",
                                    "request_put", put, "failure", "request_range", range)
                        : NULL;
  if (rc == 0 && req == NULL) rc = -ENOMEM;
  if (rc != 0) json_decref(cmp), json_decref(put);
  if (rc == 0) rc = call(e, "/v3/kv/txn", req, &resp, deadline_ms);
  if (rc == 0) {
    *ok = json_is_true(json_object_get(resp, "succeeded"));
    if (current != NULL && *ok) {
      *current = malloc(dlen + 1);
      if (*current == NULL)
        rc = -ENOMEM;
      else
        memcpy(*current, desired, dlen), ((char *)*current)[dlen] = '\0', *curlen = dlen;
    } else if (current != NULL) {
      const json_t *r =
          json_object_get(json_array_get(json_object_get(resp, "responses"), 0), "response_range");
      rc = first_value(r, current, curlen, NULL);
      if (rc == -ENOENT) rc = 0, *current = NULL, *curlen = 0;
    }
  }
  json_decref(range);
  json_decref(req);
  json_decref(resp);
  return rc;
}

int etcd_cas(etcd *e, const char *key, const void *expected, size_t elen, const void *desired,
             size_t dlen, int64_t lease, void **current, size_t *curlen, int64_t deadline_ms) {
  int ok;
  size_t ignored;
  if (current != NULL) *current = NULL;
  return txn_put(e, key, expected, elen, 0, desired, dlen, lease, &ok, current,
                 curlen != NULL ? curlen : &ignored, deadline_ms);
}

/*
 * A counter is its key's version: the number of puts since the key was
 * created, which etcd increments atomically with each put. Racers never
 * retry (a compare-and-set loop costs N^2/2 requests for N racers).
 */
static int put_counted(etcd *e, const char *key, int64_t lease, int64_t *count,
                       int64_t deadline_ms) {
  json_t *req = json_pack("{s:b}", "prev_kv", 1), *resp = NULL;
  int rc = req ? set_key(e, req, "key", key) : -ENOMEM;
  if (rc == 0) rc = set_b64(req, "value", COUNTER_MARK, strlen(COUNTER_MARK));
  if (rc == 0 && lease != 0) json_object_set_new(req, "lease", i64_json(lease));
  /* An attempt that timed out may have been applied: it is not sent again (a member refusing
   * it or a reset connection still moves it on, see etcd.h). */
  if (rc == 0) rc = request(e, "/v3/kv/put", req, &resp, deadline_ms, 0);
  if (rc == 0) *count = json_i64(json_object_get(resp, "prev_kv"), "version", 0) + 1;
  json_decref(req);
  json_decref(resp);
  return rc;
}

static int count_of(etcd *e, const char *key, int64_t *count, int64_t deadline_ms) {
  json_t *req = json_pack("{s:b}", "keys_only", 1), *resp = NULL;
  int rc = req ? set_key(e, req, "key", key) : -ENOMEM;
  if (rc == 0) rc = call(e, "/v3/kv/range", req, &resp, deadline_ms);
  if (rc == 0) *count = json_i64(json_array_get(json_object_get(resp, "kvs"), 0), "version", 0);
  json_decref(req);
  json_decref(resp);
  return rc;
}

int etcd_add(etcd *e, const char *key, int64_t delta, int64_t lease, int64_t *result,
             int64_t deadline_ms) {
  if (delta < 0 || delta > ETCD_ADD_MAX) return -EINVAL;
  int64_t count = 0;
  int rc = delta == 0 ? count_of(e, key, &count, deadline_ms) : 0;
  for (int64_t i = 0; rc == 0 && i < delta; i++)
    rc = put_counted(e, key, lease, &count, deadline_ms);
  if (rc == 0 && result != NULL) *result = count;
  return rc;
}

/* ---- waiting: a watch on the first key missing, held open between waits ---- */

/* Takes the watch's stream until something other than its "created" answer arrives. */
static size_t on_watch_data(char *p, size_t size, size_t n, void *arg) {
  watch_stream *w = arg;
  size_t k = size * n;
  if (body_append(&w->got, p, k) != k) return 0;
  const char *got = w->got.p;
  if (strstr(got, "\"events\"") != NULL || strstr(got, "\"canceled\"") != NULL ||
      strstr(got, "\"error\"") != NULL) {
    w->changed = 1;
    return 0; /* ends the transfer */
  }
  return k;
}

static void watch_close(etcd *e) {
  watch_stream *w = &e->w;
  if (w->key[0] != '\0') lc.multi_remove_handle(e->multi, w->curl);
  lc.slist_free_all(w->hdrs);
  free(w->got.p);
  CURL *c = w->curl;
  *w = (watch_stream){.curl = c};
}

/* Opens the held watch on key from revision rev + 1 at the current member. */
static int watch_open(etcd *e, const char *key, int64_t rev) {
  if (strlen(key) >= sizeof e->w.key) return -EINVAL;
  watch_close(e);
  json_t *create = json_pack("{s:o}", "start_revision", i64_json(rev + 1));
  json_t *req = json_pack("{s:o}", "create_request", create); /* takes create */
  char *text = NULL, url[BASE_HOST_MAX + 64];
  if (req != NULL && set_key(e, create, "key", key) == 0) text = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  if (text == NULL) return -ENOMEM;
  watch_stream *w = &e->w;
  snprintf(url, sizeof url, "%s://%s/v3/watch", e->scheme, e->endpoints[e->cur]);
  w->hdrs = headers(e);
  w->endpoint = e->cur;
  lc.easy_setopt(w->curl, CURLOPT_URL, url);
  lc.easy_setopt(w->curl, CURLOPT_HTTPHEADER, w->hdrs);
  lc.easy_setopt(w->curl, CURLOPT_COPYPOSTFIELDS, text);
  lc.easy_setopt(w->curl, CURLOPT_TIMEOUT_MS, 0L); /* as long as it is held */
  lc.easy_setopt(w->curl, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
  lc.easy_setopt(w->curl, CURLOPT_WRITEFUNCTION, on_watch_data);
  lc.easy_setopt(w->curl, CURLOPT_WRITEDATA, w);
  free(text);
  if (lc.multi_add_handle(e->multi, w->curl) != CURLM_OK) {
    lc.slist_free_all(w->hdrs);
    w->hdrs = NULL;
    return -ENOMEM;
  }
  memcpy(w->key, key, strlen(key) + 1);
  return 0;
}

/*
 * Listens to the held watch until the deadline (-ETIMEDOUT: it stays open
 * for the next wait), etcd_interrupt (-ECANCELED), or its key changed or
 * its stream ended (0: closed, look again; a stream that ended without news
 * is a member that failed us, and the next one is tried).
 */
static int watch_listen(etcd *e, int64_t deadline) {
  CURLcode cc = CURLE_OK;
  int rc = drive(e, e->w.curl, deadline, &cc);
  if (rc != 0) return rc;
  int changed = e->w.changed;
  watch_close(e);
  if (!changed) {
    e->cur = (e->cur + 1) % e->nendpoints;
    base_sleep_ms(20);
  }
  return 0;
}

/* The first of keys[0..n) that does not exist (n when all do), and the revision read. */
static int first_missing(etcd *e, const char *const *keys, size_t n, size_t *missing, int64_t *rev,
                         int64_t deadline_ms) {
  void *vals[ETCD_TXN_OPS];
  size_t lens[ETCD_TXN_OPS];
  *missing = n;
  for (size_t at = 0; at < n; at += ETCD_TXN_OPS) {
    size_t k = n - at < ETCD_TXN_OPS ? n - at : ETCD_TXN_OPS;
    memset(vals, 0, sizeof vals);
    int rc = get_chunk(e, keys + at, k, vals, lens, rev, deadline_ms);
    for (size_t i = 0; i < k; i++) {
      if (rc == 0 && vals[i] == NULL && *missing == n) *missing = at + i;
      free(vals[i]);
    }
    if (rc != 0) return rc;
    if (*missing < n) return 0;
  }
  return 0;
}

int etcd_wait(etcd *e, const char *const *keys, size_t n, int64_t deadline_ms) {
  if (atomic_load(&e->interrupted)) return -ECANCELED;
  /* The key the held watch listens to: nothing to read unless it changed. */
  if (n == 1 && e->w.key[0] != '\0' && strcmp(keys[0], e->w.key) == 0) {
    int rc = watch_listen(e, deadline_ms);
    if (rc != 0) return rc;
  }
  size_t from = 0; /* the keys before it were there: they are not read again */
  for (;;) {
    size_t missing;
    int64_t rev = 0;
    int rc = first_missing(e, keys + from, n - from, &missing, &rev, deadline_ms);
    if (rc != 0 || missing == n - from) return rc;
    from += missing;
    if ((rc = watch_open(e, keys[from], rev)) != 0) return rc;
    if ((rc = watch_listen(e, deadline_ms)) != 0) return rc;
  }
}

/* ---- leases ---- */

int etcd_lease_grant(etcd *e, int ttl_s, int64_t *id, int64_t deadline_ms) {
  json_t *req = json_pack("{s:o}", "TTL", i64_json(ttl_s)), *resp = NULL;
  int rc = req ? call(e, "/v3/lease/grant", req, &resp, deadline_ms) : -ENOMEM;
  if (rc == 0 && (*id = json_i64(resp, "ID", 0)) == 0) rc = COHORT_EPROTO;
  json_decref(req);
  json_decref(resp);
  return rc;
}

int etcd_lease_keepalive(etcd *e, int64_t id, int64_t deadline_ms) {
  json_t *req = json_pack("{s:o}", "ID", i64_json(id)), *resp = NULL;
  int rc = req ? call(e, "/v3/lease/keepalive", req, &resp, deadline_ms) : -ENOMEM;
  /* The answer is {"result": {"ID", "TTL"}}; a TTL of 0 (left out) is an expired lease. */
  if (rc == 0 && json_i64(json_object_get(resp, "result"), "TTL", 0) <= 0) rc = -ENOENT;
  json_decref(req);
  json_decref(resp);
  return rc;
}

int etcd_lease_revoke(etcd *e, int64_t id, int64_t deadline_ms) {
  json_t *req = json_pack("{s:o}", "ID", i64_json(id)), *resp = NULL;
  int rc = req ? call(e, "/v3/lease/revoke", req, &resp, deadline_ms) : -ENOMEM;
  if (rc == COHORT_EPROTO && strstr(e->err, "not found") != NULL) rc = -ENOENT;
  json_decref(req);
  json_decref(resp);
  return rc;
}

/* metrics.c - Prometheus metrics of this node and its ranks, over HTTP and to a file. */
#include "agent/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/internal.h"
#include "base/base.h"
#include "base/net.h"

/* ---- the request ---- */

/* The request line's method and target: "METHOD SP TARGET SP HTTP/1.x". */
static metrics_req request_line(const char *s, size_t n) {
  size_t m = 0;
  while (m < n && s[m] >= 'A' && s[m] <= 'Z') m++;
  if (m == 0 || m > 16 || m >= n || s[m] != ' ') return METRICS_REQ_BAD;
  size_t t = m + 1, e = t;
  while (e < n && s[e] > ' ' && s[e] < 0x7f) e++;
  if (e == t || s[t] != '/' || e >= n || s[e] != ' ') return METRICS_REQ_BAD;
  const char *v = s + e + 1;
  size_t vn = n - e - 1;
  if (vn > 0 && v[vn - 1] == '\r') vn--;
  if (vn != 8 || memcmp(v, "HTTP/1.", 7) != 0 || v[7] < '0' || v[7] > '9') return METRICS_REQ_BAD;
  int get = m == 3 && memcmp(s, "GET", 3) == 0;
  int head = m == 4 && memcmp(s, "HEAD", 4) == 0;
  if (!get && !head) return METRICS_REQ_BAD_METHOD;
  size_t path = t;
  while (path < e && s[path] != '?') path++;
  if (path - t != 8 || memcmp(s + t, "/metrics", 8) != 0) return METRICS_REQ_NOT_FOUND;
  return get ? METRICS_REQ_GET : METRICS_REQ_HEAD;
}

metrics_req agent_metrics_parse_request(const char *buf, size_t len) {
  if (memchr(buf, '\0', len) != NULL) return METRICS_REQ_BAD;
  const char *nl = memchr(buf, '\n', len);
  if (nl == NULL) return len >= METRICS_REQ_MAX ? METRICS_REQ_BAD : METRICS_REQ_PARTIAL;
  metrics_req r = request_line(buf, (size_t)(nl - buf));
  if (r == METRICS_REQ_BAD) return r;
  /* The headers end with an empty line (CRLF CRLF, or a bare LF LF). */
  for (const char *p = nl; p != NULL && p < buf + len;
       p = memchr(p + 1, '\n', (size_t)(buf + len - p - 1))) {
    const char *q = p + 1;
    if (q < buf + len && *q == '\r') q++;
    if (q < buf + len && *q == '\n') return r;
  }
  return len >= METRICS_REQ_MAX ? METRICS_REQ_BAD : METRICS_REQ_PARTIAL;
}

/* ---- the exposition ---- */

/* A label value with \, " and newlines escaped, as the format wants. */
static void label(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '\\' || *s == '"')
      fprintf(f, "\\%c", *s);
    else if (*s == '\n')
      fputs("\\n", f);
    else
      fputc(*s, f);
  }
}

static void family(FILE *f, const char *name, const char *type, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{job="...",node="...",host="..."} value */
static void node_sample(FILE *f, const job *j, const char *name, double v) {
  fprintf(f, "%s{job_id=\"", name);
  label(f, j->cl.run_id);
  fprintf(f, "\",node=\"%d\",host=\"", j->cl.plan.my_index);
  label(f, j->cl.hostname);
  fprintf(f, "\"} %.17g\n", v);
}

static void node_metrics(FILE *f, const job *j) {
  const cluster *c = &j->cl;
  static const struct {
    const char *name, *type, *help;
  } fam[] = {
      {"cohort_node_info", "gauge",
       "This agent: 1, with the job id, node rank and host as labels."},
      {"cohort_round", "gauge", "The rendezvous round this node is in."},
      {"cohort_restarts_total", "counter", "Whole-group restarts so far."},
      {"cohort_max_restarts", "gauge", "Restarts allowed (--max-restarts)."},
      {"cohort_nodes", "gauge", "Members (nodes) of the round."},
      {"cohort_world_size", "gauge", "Workers of the round on all nodes."},
      {"cohort_store_hosted", "gauge", "1 when this node hosts the job's store."},
      {"cohort_store_up", "gauge", "0 once the job's store stopped answering this node."},
      {"cohort_failed", "gauge", "1 once the job has a root cause of failure."},
      {"cohort_hung", "gauge", "1 once this node found a rank without progress (--hang-timeout)."},
  };
  double v[] = {1,
                j->round,
                j->restart,
                j->cfg->max_restarts,
                c->multinode ? c->plan.nnodes : 1,
                c->plan.world_size,
                c->store != NULL,
                !c->store_lost,
                j->report[0] != '\0',
                j->hung};
  for (size_t k = 0; k < BASE_ARRAY_LEN(fam); k++) {
    family(f, fam[k].name, fam[k].type, fam[k].help);
    node_sample(f, j, fam[k].name, v[k]);
  }
}

/* --on-failure reform: the re-forms so far and the last one's figures (once there is one). */
static void reform_metrics(FILE *f, const job *j) {
  static const struct {
    const char *name, *type, *help;
  } fam[] = {
      {"cohort_reforms_total", "counter",
       "Re-forms around survivors so far (--on-failure reform)."},
      {"cohort_reform_last_seconds", "gauge", "The last re-form: from the loss to every formed."},
      {"cohort_reform_last_steps_lost", "gauge", "The last re-form: steps done that it dropped."},
      {"cohort_reform_last_nodes_before", "gauge", "The last re-form: members (nodes) before."},
      {"cohort_reform_last_nodes_after", "gauge", "The last re-form: members (nodes) after."},
  };
  const reform *rf = &j->rf;
  const reform_record *r = &rf->last;
  double v[] = {rf->count, (double)r->duration_ms / 1000, (double)r->steps_lost, r->nodes_before,
                r->nodes_after};
  if (rf->slot == NULL) return;
  for (size_t k = 0; k < BASE_ARRAY_LEN(fam); k++) {
    if (k > 0 && (rf->count == 0 || v[k] < 0)) continue; /* none yet, or unknown */
    family(f, fam[k].name, fam[k].type, fam[k].help);
    node_sample(f, j, fam[k].name, v[k]);
  }
}

/* The per-rank families; a sample only where the value is known (-1: none). */
enum { R_RUNNING, R_STEP, R_BEAT_AGE, R_STEP_SEC, R_OUTPUT_AGE, R_HUNG, R_COUNT };

static void rank_values(const job *j, const worker *w, int64_t now, double v[R_COUNT]) {
  for (int k = 0; k < R_COUNT; k++) v[k] = -1;
  v[R_RUNNING] = w->running;
  v[R_HUNG] = j->hung && j->hung_rank == w->rank;
  if (w->last_output_ms > 0) v[R_OUTPUT_AGE] = (double)(now - w->last_output_ms) / 1000;
  if (w->prog != NULL && w->prog->beaten) {
    v[R_BEAT_AGE] = (double)(now - w->prog->last_ms) / 1000;
    if (w->prog->step >= 0) v[R_STEP] = (double)w->prog->step;
    double ms = agent_progress_step_ms(w->prog);
    if (ms > 0) v[R_STEP_SEC] = ms / 1000;
  }
}

static void rank_metrics(FILE *f, const job *j, int64_t now) {
  static const struct {
    const char *name, *help;
  } fam[R_COUNT] = {
      {"cohort_rank_running", "1 while the rank's process runs."},
      {"cohort_rank_step", "The last step the rank's progress file reported."},
      {"cohort_rank_beat_age_seconds", "Seconds since the rank's last progress report."},
      {"cohort_rank_step_seconds", "The rank's recent time per step, from its progress file."},
      {"cohort_rank_output_age_seconds", "Seconds since the rank's last line of output."},
      {"cohort_rank_hung", "1 for the rank this node found without progress."},
  };
  for (int k = 0; k < R_COUNT; k++) {
    family(f, fam[k].name, "gauge", fam[k].help);
    for (int i = 0; i < j->nworkers; i++) {
      const worker *w = &j->workers[i];
      double v[R_COUNT];
      rank_values(j, w, now, v);
      if (v[k] < 0) continue;
      fprintf(f, "%s{job_id=\"", fam[k].name);
      label(f, j->cl.run_id);
      fprintf(f, "\",node=\"%d\",rank=\"%d\",local_rank=\"%d\"} %.17g\n", j->cl.plan.my_index,
              w->rank, w->local_rank, v[k]);
    }
  }
}

char *agent_metrics_text(job *j, int64_t now) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (f == NULL) return NULL;
  node_metrics(f, j);
  reform_metrics(f, j);
  rank_metrics(f, j, now);
  if (fclose(f) != 0) {
    free(text);
    return NULL;
  }
  return text;
}

/* ---- the server ---- */

void agent_metrics_init(metrics *m) {
  memset(m, 0, sizeof *m);
  m->listen_fd = -1;
  for (int i = 0; i < METRICS_MAX_CLIENTS; i++) m->c[i].fd = -1;
}

int agent_metrics_open(metrics *m, int port, const char *file) {
  agent_metrics_init(m);
  m->file = file;
  if (port == 0) return 0;
  int fd = -1, bound = 0;
  int rc = base_tcp_listen("::", port, 16, &fd, &bound);
  if (rc != 0) rc = base_tcp_listen(NULL, port, 16, &fd, &bound); /* no IPv6 */
  if (rc != 0) return rc;
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
    rc = -errno;
    close(fd);
    return rc;
  }
  m->listen_fd = fd;
  m->port = bound;
  return 0;
}

static void client_close(metrics_client *c) {
  if (c->fd >= 0) close(c->fd);
  free(c->out);
  c->fd = -1;
  c->out = NULL;
  c->len = c->out_len = c->out_off = 0;
}

void agent_metrics_close(metrics *m) {
  for (int i = 0; i < METRICS_MAX_CLIENTS; i++) client_close(&m->c[i]);
  if (m->listen_fd >= 0) close(m->listen_fd);
  m->listen_fd = -1;
}

static int free_slot(const metrics *m) {
  for (int i = 0; i < METRICS_MAX_CLIENTS; i++)
    if (m->c[i].fd < 0) return i;
  return -1;
}

int agent_metrics_pollfds(const metrics *m, struct pollfd *pfd) {
  int n = 0;
  /* A full house leaves new connections in the backlog. */
  if (m->listen_fd >= 0 && free_slot(m) >= 0)
    pfd[n++] = (struct pollfd){.fd = m->listen_fd, .events = POLLIN};
  for (int i = 0; i < METRICS_MAX_CLIENTS; i++)
    if (m->c[i].fd >= 0)
      pfd[n++] = (struct pollfd){
          .fd = m->c[i].fd,
          .events = m->c[i].out != NULL && m->c[i].out_off < m->c[i].out_len ? POLLOUT : POLLIN};
  return n;
}

static const char *const status_line[] = {
    [METRICS_REQ_GET] = "200 OK",
    [METRICS_REQ_HEAD] = "200 OK",
    [METRICS_REQ_NOT_FOUND] = "404 Not Found",
    [METRICS_REQ_BAD_METHOD] = "405 Method Not Allowed",
    [METRICS_REQ_BAD] = "400 Bad Request",
};

/* The whole response to r, ready to write; NULL when out of memory. */
static char *response(metrics_req r, job *j, size_t *len) {
  char *body;
  if (r == METRICS_REQ_GET || r == METRICS_REQ_HEAD)
    body = agent_metrics_text(j, base_now_ms());
  else
    body = strdup(r == METRICS_REQ_NOT_FOUND    ? "not found\n"
                  : r == METRICS_REQ_BAD_METHOD ? "only GET and HEAD\n"
                                                : "bad request\n");
  if (body == NULL) return NULL;
  char *out = NULL;
  size_t blen = strlen(body);
  FILE *f = open_memstream(&out, len);
  if (f != NULL) {
    fprintf(f,
            "HTTP/1.1 %s\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            "Content-Length: %zu\r\nConnection: close\r\n%s\r\n",
            status_line[r], blen, r == METRICS_REQ_BAD_METHOD ? "Allow: GET, HEAD\r\n" : "");
    if (r != METRICS_REQ_HEAD) fwrite(body, 1, blen, f);
    if (fclose(f) != 0) {
      free(out);
      out = NULL;
    }
  }
  free(body);
  return out;
}

static void client_read(metrics_client *c, job *j) {
  ssize_t got = recv(c->fd, c->req + c->len, sizeof c->req - c->len, MSG_DONTWAIT);
  if (got < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (got <= 0) {
    client_close(c);
    return;
  }
  c->len += (size_t)got;
  metrics_req r = agent_metrics_parse_request(c->req, c->len);
  if (r == METRICS_REQ_PARTIAL) return;
  c->out = response(r, j, &c->out_len);
  if (c->out == NULL) client_close(c);
}

static void client_write(metrics_client *c) {
  ssize_t put =
      send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (put < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (put <= 0) {
    client_close(c);
    return;
  }
  c->out_off += (size_t)put;
  /* All sent: end our side, and read what the client still sends until it
   * closes (or its deadline), since closing with unread bytes would reset
   * the connection and could lose the answer. */
  if (c->out_off == c->out_len) shutdown(c->fd, SHUT_WR);
}

/* After the answer: discards the client's bytes until it closes. */
static void client_drain(metrics_client *c) {
  char sink[512];
  ssize_t got = recv(c->fd, sink, sizeof sink, MSG_DONTWAIT);
  if (got < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (got <= 0) client_close(c);
}

static void accept_all(metrics *m) {
  int slot;
  while ((slot = free_slot(m)) >= 0) {
    int fd = accept4(m->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return; /* EAGAIN: none left; other errors: try at the next poll */
    metrics_client *c = &m->c[slot];
    c->fd = fd;
    c->deadline_ms = base_now_ms() + METRICS_CLIENT_MS;
    c->len = 0;
  }
}

void agent_metrics_serve(metrics *m, const struct pollfd *pfd, int n, job *j) {
  for (int k = 0; k < n; k++) {
    if (pfd[k].revents == 0) continue;
    if (pfd[k].fd == m->listen_fd) {
      accept_all(m);
      continue;
    }
    for (int i = 0; i < METRICS_MAX_CLIENTS; i++) {
      metrics_client *c = &m->c[i];
      if (c->fd != pfd[k].fd) continue;
      if (pfd[k].revents & (POLLERR | POLLNVAL))
        client_close(c);
      else if (c->out == NULL)
        client_read(c, j);
      else if (c->out_off < c->out_len)
        client_write(c);
      else
        client_drain(c);
      break;
    }
  }
}

/* Replaces the file whole (a temporary file renamed over it), so that the
 * collector never reads half of it. */
static void write_file(const char *path, const char *text) {
  char tmp[4200];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) return;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  size_t len = strlen(text);
  int ok = write(fd, text, len) == (ssize_t)len;
  ok = close(fd) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) unlink(tmp);
}

void agent_metrics_flush(metrics *m, job *j) {
  if (m->file == NULL) return;
  char *text = agent_metrics_text(j, base_now_ms());
  if (text != NULL) write_file(m->file, text);
  free(text);
}

int agent_metrics_tick(metrics *m, job *j, int64_t now) {
  int next = -1;
  for (int i = 0; i < METRICS_MAX_CLIENTS; i++) {
    metrics_client *c = &m->c[i];
    if (c->fd < 0) continue;
    if (now >= c->deadline_ms) {
      client_close(c);
      continue;
    }
    int left = (int)(c->deadline_ms - now);
    if (next < 0 || left < next) next = left;
  }
  if (m->file != NULL) {
    if (now >= m->file_next_ms) {
      int64_t period = j->cfg->heartbeat_ms > 1000 ? j->cfg->heartbeat_ms : 1000;
      m->file_next_ms = now + period;
      agent_metrics_flush(m, j);
    }
    int left = (int)(m->file_next_ms - now);
    if (next < 0 || left < next) next = left;
  }
  return next;
}

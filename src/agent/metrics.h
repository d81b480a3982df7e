/*
 * metrics.h - `cohort run --metrics-port PORT` and `--metrics-file PATH`:
 * this node's and its ranks' state in Prometheus' text exposition format
 * (version 0.0.4), served over HTTP by the agent's own loop (no thread)
 * and written to a file for node-exporter's textfile collector.
 *
 * The server is small and bounded: at most METRICS_MAX_CLIENTS connections
 * at a time (more wait in the listen backlog), a request of at most
 * METRICS_REQ_MAX bytes, METRICS_CLIENT_MS for a connection's whole life;
 * it answers GET and HEAD of /metrics (200), any other path (404), any other
 * method (405) or anything it cannot parse (400), each with Connection:
 * close, and then closes. It is served while the workers run (the loop
 * polls it); during a rendezvous, connections wait in the backlog.
 *
 * The metrics (docs/k8s.md lists them): per node cohort_node_info, round,
 * restarts, nodes, world size, store state, failed and hung; per local rank
 * running, step, last beat's age, step time, output age and hung.
 *
 * Main thread only.
 */
#ifndef COHORT_AGENT_METRICS_H
#define COHORT_AGENT_METRICS_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#define METRICS_MAX_CLIENTS 8
#define METRICS_REQ_MAX 2048
#define METRICS_CLIENT_MS 5000

typedef struct metrics_client {
  int fd;              /* -1: free */
  int64_t deadline_ms; /* closed then, whatever its state */
  size_t len;          /* request bytes read */
  char req[METRICS_REQ_MAX];
  char *out; /* the response being written (malloc'ed), NULL while reading */
  size_t out_len, out_off;
} metrics_client;

typedef struct metrics {
  int listen_fd; /* -1: no server */
  int port;      /* the bound port */
  metrics_client c[METRICS_MAX_CLIENTS];
  const char *file;     /* --metrics-file, or NULL */
  int64_t file_next_ms; /* when the file is next rewritten */
} metrics;

/* What a request asks for. */
typedef enum metrics_req {
  METRICS_REQ_PARTIAL,    /* the headers are not complete yet */
  METRICS_REQ_GET,        /* GET /metrics */
  METRICS_REQ_HEAD,       /* HEAD /metrics */
  METRICS_REQ_NOT_FOUND,  /* GET or HEAD of another path */
  METRICS_REQ_BAD_METHOD, /* another method */
  METRICS_REQ_BAD         /* not an HTTP/1.x request */
} metrics_req;

/*
 * Parses the len bytes of a request received so far (pure; any bytes).
 * Complete once the empty line that ends the headers has come.
 */
metrics_req agent_metrics_parse_request(const char *buf, size_t len);

/* No server, no file: agent_metrics_close and the loop's calls do nothing. */
void agent_metrics_init(metrics *m);

/*
 * Listens on every address on port (0: none) and remembers file (NULL:
 * none). Returns 0 or -errno (the port is taken, ...).
 */
int agent_metrics_open(metrics *m, int port, const char *file);
void agent_metrics_close(metrics *m);

struct job;

/* Adds the server's descriptors to pfd (room for 1 + METRICS_MAX_CLIENTS);
 * returns how many. */
int agent_metrics_pollfds(const metrics *m, struct pollfd *pfd);

/* Handles what poll reported for the n descriptors agent_metrics_pollfds gave. */
void agent_metrics_serve(metrics *m, const struct pollfd *pfd, int n, struct job *j);

/*
 * The timers: closes connections past their deadline and rewrites the
 * file when due (once per heartbeat period). Returns the milliseconds until
 * the next is due, -1 for none.
 */
int agent_metrics_tick(metrics *m, struct job *j, int64_t now);

/* Rewrites the file now (the job's last state, at its end). */
void agent_metrics_flush(metrics *m, struct job *j);

/* The exposition text (malloc'ed), or NULL when out of memory. */
char *agent_metrics_text(struct job *j, int64_t now);

#endif

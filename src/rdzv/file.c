/*
 * file.c - rendezvous through a file on a shared filesystem (--rdzv-file).
 *
 * The file is small text (docs/rdzv.md):
 *
 *   cohort-rdzv 1
 *   job=<job id>
 *   node=<16 hex digits: the writing agent's node id>
 *   state=claimed | ready
 *   host=<store address>     (ready only)
 *   port=<store port>        (ready only)
 *   mac=<64 hex digits>      (with a job token: HMAC-SHA256 of all before it)
 *
 * With a token, a record without this job's MAC (forged, or written under
 * another token) counts as foreign: a joiner never takes a store address
 * from it, and a claimant replaces it as it replaces a stale file.
 *
 * Every write is a temporary file in the same directory, fsync'd, then
 * renamed (or hard-linked) into place, so a reader sees an old or a new file
 * and never a torn one. Without a node rank, hosting is decided by which
 * node first hard-links its claim to the path: link() fails with EEXIST for
 * all others, also on NFS where O_EXCL used not to be reliable. A file of
 * another job (a stale one) is replaced under a second exclusive link named
 * after the stale file's inode, so exactly one node replaces it.
 *
 * A node given --node-rank 0 always hosts and overwrites the file. So that
 * nodes without a rank can be mixed with it, a node that won the claim waits
 * a settle window and defers to a claim of its job by another node that
 * replaced its own; and publishing refuses to overwrite another node's
 * claim, so two hosts end in an error rather than in two half jobs.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "base/crypto.h"
#include "base/net.h"
#include "rdzv/internal.h"

#define FILE_MAX 4096
#define POLL_MS 100
#define DEFAULT_SETTLE_MS 1000

int rdzv_file_format(const rdzv_file_info *info, char *buf, size_t cap) {
  int n;
  unsigned long long id = (unsigned long long)info->node_id;
  if (info->ready)
    n = snprintf(buf, cap, "cohort-rdzv 1\njob=%s\nnode=%016llx\nstate=ready\nhost=%s\nport=%d\n",
                 info->job_id, id, info->host, info->port);
  else
    n = snprintf(buf, cap, "cohort-rdzv 1\njob=%s\nnode=%016llx\nstate=claimed\n", info->job_id,
                 id);
  if (n < 0 || (size_t)n >= cap) return COHORT_ELIMIT;
  return n;
}

/* Copies a value of [v, v+n) into dst (cap bytes) if it is printable without spaces. */
static int take_value(const char *v, size_t n, char *dst, size_t cap) {
  if (n == 0 || n >= cap) return -EINVAL;
  for (size_t i = 0; i < n; i++)
    if (v[i] <= ' ' || v[i] > '~') return -EINVAL;
  memcpy(dst, v, n);
  dst[n] = '\0';
  return 0;
}

int rdzv_file_parse(const char *buf, size_t len, rdzv_file_info *out) {
  memset(out, 0, sizeof *out);
  static const char head[] = "cohort-rdzv 1\n";
  if (len > FILE_MAX || len < sizeof head - 1 || memcmp(buf, head, sizeof head - 1) != 0)
    return -EINVAL;
  int have_job = 0, have_node = 0, have_state = 0, have_host = 0, have_port = 0;
  size_t i = sizeof head - 1;
  while (i < len) {
    const char *nl = memchr(buf + i, '\n', len - i);
    if (nl == NULL) return -EINVAL; /* a last line without its newline: torn or foreign */
    const char *line = buf + i;
    size_t n = (size_t)(nl - line);
    const char *eq = memchr(line, '=', n);
    if (eq == NULL) return -EINVAL;
    size_t klen = (size_t)(eq - line);
    const char *v = eq + 1;
    size_t vlen = n - klen - 1;
    char tmp[16];
    if (klen == 3 && memcmp(line, "job", 3) == 0 && !have_job) {
      if (take_value(v, vlen, out->job_id, sizeof out->job_id) != 0 ||
          !rdzv_job_id_valid(out->job_id))
        return -EINVAL;
      have_job = 1;
    } else if (klen == 4 && memcmp(line, "node", 4) == 0 && !have_node) {
      if (vlen != 16) return -EINVAL;
      uint64_t id = 0;
      for (size_t k = 0; k < 16; k++) {
        char ch = v[k];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0) return -EINVAL;
        id = id << 4 | (uint64_t)d;
      }
      out->node_id = id;
      have_node = 1;
    } else if (klen == 5 && memcmp(line, "state", 5) == 0 && !have_state) {
      if (vlen == 5 && memcmp(v, "ready", 5) == 0)
        out->ready = 1;
      else if (!(vlen == 7 && memcmp(v, "claimed", 7) == 0))
        return -EINVAL;
      have_state = 1;
    } else if (klen == 4 && memcmp(line, "host", 4) == 0 && !have_host) {
      if (take_value(v, vlen, out->host, sizeof out->host) != 0) return -EINVAL;
      have_host = 1;
    } else if (klen == 4 && memcmp(line, "port", 4) == 0 && !have_port) {
      if (take_value(v, vlen, tmp, sizeof tmp) != 0 ||
          base_parse_int(tmp, 1, 65535, &out->port) != 0)
        return -EINVAL;
      have_port = 1;
    } else {
      return -EINVAL;
    }
    i += n + 1;
  }
  if (!have_job || !have_node || !have_state) return -EINVAL;
  if (out->ready != (have_host && have_port)) return -EINVAL;
  if (!out->ready && (have_host || have_port)) return -EINVAL;
  return 0;
}

static int has_token(const char *token) {
  return token != NULL && token[0] != '\0';
}

#define MAC_LINE_LEN (4 + 2 * BASE_SHA256_LEN + 1) /* "mac=" hex "\n" */

int rdzv_file_seal(const char *token, char *buf, size_t len, size_t cap) {
  if (!has_token(token)) return (int)len;
  if (len + MAC_LINE_LEN + 1 > cap) return COHORT_ELIMIT;
  uint8_t mac[BASE_SHA256_LEN];
  int rc = base_hmac_sha256(token, strlen(token), buf, len, mac);
  if (rc != 0) return rc;
  memcpy(buf + len, "mac=", 4);
  base_hex(mac, sizeof mac, buf + len + 4);
  buf[len + MAC_LINE_LEN - 1] = '\n';
  buf[len + MAC_LINE_LEN] = '\0';
  return (int)(len + MAC_LINE_LEN);
}

/* Reads 2*n hex digits into out; returns 0 or -EINVAL. */
static int unhex(const char *s, uint8_t *out, size_t n) {
  for (size_t i = 0; i < 2 * n; i++) {
    char ch = s[i];
    int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    if (d < 0) return -EINVAL;
    out[i / 2] = (uint8_t)(i % 2 ? out[i / 2] | d : d << 4);
  }
  return 0;
}

int rdzv_file_open(const char *token, const char *buf, size_t len, rdzv_file_info *out) {
  if (!has_token(token)) {
    int rc = rdzv_file_parse(buf, len, out);
    /* A MAC line is the only thing an unsigned parse refuses that a signer writes. */
    if (rc == -EINVAL && len >= MAC_LINE_LEN && memcmp(buf + len - MAC_LINE_LEN, "mac=", 4) == 0)
      return COHORT_EAUTH;
    return rc;
  }
  memset(out, 0, sizeof *out);
  if (len < MAC_LINE_LEN) return COHORT_EAUTH;
  const char *line = buf + len - MAC_LINE_LEN;
  uint8_t mac[BASE_SHA256_LEN];
  if (memcmp(line, "mac=", 4) != 0 || line[MAC_LINE_LEN - 1] != '\n' ||
      (len > MAC_LINE_LEN && line[-1] != '\n') || unhex(line + 4, mac, sizeof mac) != 0)
    return COHORT_EAUTH;
  size_t body = len - MAC_LINE_LEN;
  if (!base_hmac_sha256_ok(token, strlen(token), buf, body, mac)) return COHORT_EAUTH;
  return rdzv_file_parse(buf, body, out);
}

/* fsyncs the directory holding path so a rename or link survives a crash. */
static void sync_dir(const char *path) {
  char *copy = strdup(path);
  if (copy == NULL) return;
  int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
  free(copy);
}

/* Writes info into a new temporary file next to path; its name goes to tmp. */
static int write_temp(const char *path, const rdzv_file_info *info, const char *token, char *tmp,
                      size_t tmplen) {
  char text[FILE_MAX];
  int len = rdzv_file_format(info, text, sizeof text);
  if (len >= 0) len = rdzv_file_seal(token, text, (size_t)len, sizeof text);
  if (len < 0) return len;
  uint8_t rnd[6];
  char hex[13];
  if (base_random_bytes(rnd, sizeof rnd) != 0) memset(rnd, 0, sizeof rnd);
  base_hex(rnd, sizeof rnd, hex);
  int n = snprintf(tmp, tmplen, "%s.tmp.%ld.%s", path, (long)getpid(), hex);
  if (n < 0 || (size_t)n >= tmplen) return -ENAMETOOLONG;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  int rc = 0;
  size_t off = 0;
  while (off < (size_t)len) {
    ssize_t w = write(fd, text + off, (size_t)len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      rc = -errno;
      break;
    }
    off += (size_t)w;
  }
  if (rc == 0 && fsync(fd) != 0) rc = -errno;
  if (close(fd) != 0 && rc == 0) rc = -errno;
  if (rc != 0) unlink(tmp);
  return rc;
}

int rdzv_file_write(const char *path, const rdzv_file_info *info, const char *token) {
  char tmp[4096];
  int rc = write_temp(path, info, token, tmp, sizeof tmp);
  if (rc != 0) return rc;
  if (rename(tmp, path) != 0) {
    rc = -errno;
    unlink(tmp);
    return rc;
  }
  sync_dir(path);
  return 0;
}

/*
 * Reads and parses path. Returns 0 (parsed), -ENOENT (absent), -EINVAL
 * (malformed), COHORT_EAUTH (not signed with token) or -errno; *st receives
 * the inode that was read.
 */
static int read_file(const char *path, const char *token, rdzv_file_info *info, struct stat *st) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -errno;
  int rc = 0;
  if (fstat(fd, st) != 0) {
    rc = -errno;
    goto out;
  }
  char buf[FILE_MAX + 1];
  size_t len = 0;
  for (;;) {
    ssize_t r = read(fd, buf + len, sizeof buf - len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rc = -errno;
      goto out;
    }
    if (r == 0) break;
    len += (size_t)r;
    if (len == sizeof buf) break; /* too long: malformed */
  }
  rc = rdzv_file_open(token, buf, len, info);
out:
  close(fd);
  return rc;
}

/*
 * link(from, to), also counting as done when the call reported an error but
 * from now has `links` names: over NFS a retransmitted LINK can fail with
 * EEXIST although the first one succeeded (the classic check, as in
 * open(2)'s note on O_EXCL). errno is kept for a real failure.
 */
static int link_ok(const char *from, const char *to, nlink_t links) {
  if (link(from, to) == 0) return 1;
  int e = errno;
  struct stat st;
  if (stat(from, &st) == 0 && st.st_nlink == links) return 1;
  errno = e;
  return 0;
}

/*
 * Tries once to make this node the host. Returns 1 (hosting), 0 (another node
 * of this job claimed it: join), -EAGAIN (retry shortly) or -errno.
 */
static int try_claim(const char *path, const char *job_id, const char *token,
                     const char *claim_tmp) {
  if (link_ok(claim_tmp, path, 2)) return 1;
  if (errno != EEXIST) return -errno;
  rdzv_file_info cur;
  struct stat st;
  int rc = read_file(path, token, &cur, &st);
  if (rc == -ENOENT) return -EAGAIN; /* removed between link and open */
  if (rc == 0 && strcmp(cur.job_id, job_id) == 0) return 0;
  if (rc != 0 && rc != -EINVAL && rc != COHORT_EAUTH) return rc;
  /* Stale (another job), malformed or unsigned: replace it, under a lock only one node can take. */
  char lock[4096];
  int n = snprintf(lock, sizeof lock, "%s.replace.%llx.%llx", path, (unsigned long long)st.st_dev,
                   (unsigned long long)st.st_ino);
  if (n < 0 || (size_t)n >= sizeof lock) return -ENAMETOOLONG;
  if (!link_ok(claim_tmp, lock, 2)) return errno == EEXIST ? -EAGAIN : -errno;
  /* Holding the lock: replace only if the path still is the stale file we read. */
  struct stat now;
  int still = stat(path, &now) == 0 && now.st_dev == st.st_dev && now.st_ino == st.st_ino;
  if (still && rename(lock, path) == 0) {
    /* The lock's name was another link to the claim: renaming it places the claim and
     * releases the lock in one step. */
    sync_dir(path);
    return 1;
  }
  rc = still ? -errno : -EAGAIN;
  unlink(lock);
  return rc;
}

int rdzv_file_discover(const rdzv_opts *o, rdzv_target *t, char *errbuf, size_t errlen) {
  if (o->rdzv_file == NULL || o->rdzv_file[0] == '\0')
    return rdzv_err(errbuf, errlen, -EINVAL, "the file method needs --rdzv-file PATH");
  if (!rdzv_job_id_valid(o->job_id))
    return rdzv_err(errbuf, errlen, -EINVAL,
                    "the file method needs a job id (to tell this run's file from a stale one)");
  const char *path = o->rdzv_file;
  int64_t deadline = rdzv_deadline(o);
  t->node_rank = o->node_rank;
  t->nnodes_min = o->nnodes_min;
  t->nnodes_max = o->nnodes_max;
  rdzv_file_info claim = {0};
  base_strlcpy(claim.job_id, o->job_id, sizeof claim.job_id);
  claim.node_id = rdzv_node_id();
  int rc = 0;
  int hosting = 0;
  if (o->node_rank == 0) {
    /* Replace whatever is there, so joiners stop trusting an old run's address at once. */
    rc = rdzv_file_write(path, &claim, o->token);
    if (rc != 0)
      return rdzv_err(errbuf, errlen, rc, "cannot write %s: %s", path, cohort_strerror(rc));
    hosting = 1;
  } else if (o->node_rank < 0) {
    char tmp[4096];
    rc = write_temp(path, &claim, o->token, tmp, sizeof tmp);
    if (rc != 0)
      return rdzv_err(errbuf, errlen, rc, "cannot write next to %s: %s", path, cohort_strerror(rc));
    for (;;) {
      rc = try_claim(path, o->job_id, o->token, tmp);
      if (rc != -EAGAIN) break;
      if (base_deadline_left(deadline) == 0) {
        rc = -ETIMEDOUT;
        break;
      }
      /* Someone else is replacing a stale file; short and jittered so racers spread out. */
      uint8_t r = 0;
      base_random_bytes(&r, 1);
      base_sleep_ms(10 + r % 20);
    }
    unlink(tmp);
    if (rc < 0)
      return rdzv_err(errbuf, errlen, rc, "cannot claim %s: %s", path, cohort_strerror(rc));
    hosting = rc == 1;
    if (hosting) {
      /* A node given --node-rank 0 may start a moment later and overwrite this claim: watch
       * for that during the settle window and join it rather than host a second store. */
      int settle = o->settle_ms > 0 ? o->settle_ms : DEFAULT_SETTLE_MS;
      int64_t end = base_now_ms() + settle;
      if (end > deadline) end = deadline;
      while (hosting && base_now_ms() < end) {
        int64_t left = end - base_now_ms();
        base_sleep_ms(left < POLL_MS ? left : POLL_MS);
        rdzv_file_info cur;
        struct stat st;
        if (read_file(path, o->token, &cur, &st) == 0 && strcmp(cur.job_id, o->job_id) == 0 &&
            cur.node_id != claim.node_id)
          hosting = 0;
      }
    }
  }
  if (hosting) {
    t->host_store = 1;
    rdzv_own_addr(o, t->host, sizeof t->host);
    rc = base_free_port(NULL, &t->port);
    if (rc != 0) return rdzv_err(errbuf, errlen, rc, "no free port: %s", cohort_strerror(rc));
    rdzv_source(t, "file %.80s: hosting the store for job %.20s", path, o->job_id);
    return 0;
  }
  /* Joining: poll until the host has written its address. */
  const char *seen = "no file";
  char other[RDZV_JOB_ID_MAX + 1] = "";
  for (;;) {
    rdzv_file_info cur;
    struct stat st;
    rc = read_file(path, o->token, &cur, &st);
    if (rc == 0 && strcmp(cur.job_id, o->job_id) == 0 && cur.ready) {
      base_strlcpy(t->host, cur.host, sizeof t->host);
      t->port = cur.port;
      char hp[BASE_HOST_MAX + 16];
      base_join_hostport(t->host, t->port, hp, sizeof hp);
      rdzv_source(t, "file %.60s: store %.60s", path, hp);
      return 0;
    }
    if (rc == 0 && strcmp(cur.job_id, o->job_id) == 0)
      seen = "claimed, store address not written";
    else if (rc == 0) {
      seen = "a stale file of job";
      base_strlcpy(other, cur.job_id, sizeof other);
    } else if (rc == -EINVAL)
      seen = "malformed contents";
    else if (rc == COHORT_EAUTH)
      seen = "a record not signed with this job's token";
    else if (rc == -ENOENT)
      seen = "no file";
    else
      seen = cohort_strerror(rc);
    int left = base_deadline_left(deadline);
    if (left == 0) break;
    base_sleep_ms(left < POLL_MS ? left : POLL_MS);
  }
  return rdzv_err(
      errbuf, errlen, -ETIMEDOUT,
      "no store address for job %.40s in %.80s before the deadline (last seen: %s%s%.40s)",
      o->job_id, path, seen, other[0] ? " " : "", other);
}

int rdzv_file_publish(const char *path, const char *job_id, const char *host, int port,
                      const char *token, char *errbuf, size_t errlen) {
  rdzv_file_info cur, info = {0};
  struct stat st;
  uint64_t self = rdzv_node_id();
  if (read_file(path, token, &cur, &st) == 0 && strcmp(cur.job_id, job_id) == 0 &&
      cur.node_id != self)
    return rdzv_err(errbuf, errlen, -EEXIST,
                    "%.80s was claimed for job %.40s by another node (%016llx%s%.60s): give every "
                    "node a --node-rank, or none",
                    path, job_id, (unsigned long long)cur.node_id, cur.ready ? ", store " : "",
                    cur.ready ? cur.host : "");
  base_strlcpy(info.job_id, job_id, sizeof info.job_id);
  info.node_id = self;
  info.ready = 1;
  base_strlcpy(info.host, host, sizeof info.host);
  info.port = port;
  int rc = rdzv_file_write(path, &info, token);
  if (rc != 0)
    return rdzv_err(errbuf, errlen, rc, "cannot write %s: %s", path, cohort_strerror(rc));
  return 0;
}

/*
 * shmbuf.c - buffers the ranks of one host can read and write in each other
 * (cohort_mem_alloc), so that a large allreduce between them needs no
 * intermediate copy (allreduce_direct in algo.c).
 *
 * Each rank's allocation is its own POSIX shared-memory object, named after
 * the host's segment (".../cohort-<job>-<restart>-<n>-<leader>-b<id>-<local
 * index>"); every local rank maps every other's, and each unlinks its name as
 * soon as all have mapped (two agreements over the whole communicator), so a
 * crash leaves nothing named in /dev/shm past the allocation itself (the
 * agent removes cohort-<job>-* names regardless). Without local peers the
 * allocation is anonymous memory. Allocating and freeing are collective, so
 * the list of allocations, and the index of each, is the same on every rank.
 * When the membership ends (cohort_comm_reform) the peers' mappings go and
 * each rank's own stays, private, in old_bufs; cohort_mem_free releases it
 * alone.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coll/coll.h"

/* The lowest rc of any rank (0 when all succeeded): every rank takes the same branch. */
static int agree(cohort_comm *c, int rc) {
  int32_t v = rc;
  int arc = c->size > 1 ? cohort_allreduce(c, &v, &v, 1, COHORT_I32, COHORT_MIN) : 0;
  return arc != 0 ? arc : v;
}

static void buf_name(cohort_comm *c, int id, int li, char *out, size_t len) {
  snprintf(out, len, "%s-b%d-%d", coll_shm_name(c->shm), id, li);
}

static int map_peer(cohort_comm *c, int id, int li, size_t map_bytes, char **out) {
  char name[300];
  buf_name(c, id, li, name, sizeof name);
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return -errno;
  struct stat st;
  int rc = fstat(fd, &st) != 0 ? -errno : (size_t)st.st_size != map_bytes ? COHORT_EPROTO : 0;
  void *p = rc == 0 ? mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (rc == 0 && p == MAP_FAILED) rc = -errno;
  close(fd);
  if (rc == 0) *out = p;
  return rc;
}

/* Creates this rank's object (named) and maps it. */
static int create_own(cohort_comm *c, int id, size_t map_bytes, char **out) {
  if (c->shm == NULL) {
    void *p = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return -errno;
    *out = p;
    return 0;
  }
  char name[300];
  buf_name(c, id, c->local.me, name, sizeof name);
  shm_unlink(name); /* a leftover of a crashed run with the same job id */
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return -errno;
  /* Reserve the pages now: a tmpfs too small for them (a container's 64 MiB /dev/shm) is an
   * error here, not a SIGBUS at the first write past what fits. */
  int rc = -posix_fallocate(fd, 0, (off_t)map_bytes);
  void *p = rc == 0 ? mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (rc == 0 && p == MAP_FAILED) rc = -errno;
  close(fd);
  if (rc != 0) shm_unlink(name);
  if (rc == 0) *out = p;
  return rc;
}

static void unmap_buf(cohort_comm *c, coll_buf *b) {
  /* A communicator of one rank has no host group: its allocation is peer[0] alone. */
  int nl = c->local.n > 0 ? c->local.n : 1;
  for (int i = 0; b->peer != NULL && i < nl; i++)
    if (b->peer[i] != NULL) munmap(b->peer[i], b->map_bytes);
  if (b->peer == NULL && b->base != NULL) munmap(b->base, b->map_bytes);
  free(b->peer);
  memset(b, 0, sizeof *b);
}

COHORT_API int cohort_mem_alloc(cohort_comm *c, size_t bytes, void **ptr) {
  if (ptr != NULL) *ptr = NULL;
  if (c == NULL || ptr == NULL || bytes == 0) return -EINVAL;
  long page = sysconf(_SC_PAGESIZE);
  int id = c->nbufs, nl = c->local.n > 0 ? c->local.n : 1, me = c->local.n > 0 ? c->local.me : 0;
  coll_buf *nb = realloc(c->bufs, (size_t)(id + 1) * sizeof *nb);
  if (nb == NULL) return agree(c, -ENOMEM);
  c->bufs = nb;
  coll_buf *b = &c->bufs[id];
  memset(b, 0, sizeof *b);
  c->nbufs++;
  b->bytes = bytes;
  b->map_bytes = (bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
  b->peer = calloc((size_t)nl, sizeof *b->peer);
  int rc = b->peer == NULL ? -ENOMEM : create_own(c, id, b->map_bytes, &b->base);
  if (rc == 0) b->peer[me] = b->base;
  rc = agree(c, rc);
  for (int i = 0; rc == 0 && c->shm != NULL && i < nl; i++)
    if (i != me) rc = map_peer(c, id, i, b->map_bytes, &b->peer[i]);
  rc = agree(c, rc);
  if (c->shm != NULL && b->base != NULL) {
    char name[300];
    buf_name(c, id, me, name, sizeof name);
    shm_unlink(name);
  }
  if (rc != 0) {
    unmap_buf(c, b);
    return rc;
  }
  c->live_bufs++;
  *ptr = b->base;
  return 0;
}

/* Frees ptr when it is an allocation of an ended membership (private now): 0, or -ENOENT. */
static int free_old(cohort_comm *c, void *ptr) {
  for (int i = 0; i < c->nold_bufs; i++) {
    if (c->old_bufs[i].base != ptr) continue;
    unmap_buf(c, &c->old_bufs[i]);
    return 0;
  }
  return -ENOENT;
}

COHORT_API int cohort_mem_free(cohort_comm *c, void *ptr) {
  if (c == NULL || ptr == NULL) return -EINVAL;
  if (free_old(c, ptr) == 0) return 0;
  size_t off = 0;
  int id = coll_buf_find(c, ptr, 0, &off);
  if (id < 0 || off != 0) return -EINVAL;
  /* Every rank frees together: no peer may still be writing into this rank's buffer. */
  int rc = agree(c, 0);
  unmap_buf(c, &c->bufs[id]);
  c->live_bufs--;
  return rc;
}

int coll_buf_find(cohort_comm *c, const void *p, size_t len, size_t *off) {
  const char *q = p;
  for (int i = 0; i < c->nbufs; i++) {
    const coll_buf *b = &c->bufs[i];
    if (b->base != NULL && q >= b->base && q + len <= b->base + b->bytes) {
      *off = (size_t)(q - b->base);
      return i;
    }
  }
  return -1;
}

int coll_bufs_shared(const cohort_comm *c) {
  return c->live_bufs > 0 && c->shm != NULL;
}

void coll_buf_release_all(cohort_comm *c) {
  for (int i = 0; i < c->nbufs; i++) unmap_buf(c, &c->bufs[i]);
  for (int i = 0; i < c->nold_bufs; i++) unmap_buf(c, &c->old_bufs[i]);
  free(c->bufs);
  free(c->old_bufs);
  c->bufs = c->old_bufs = NULL;
  c->nbufs = c->live_bufs = c->nold_bufs = 0;
}

/* A free entry of old_bufs (one freed, or a new one): its index, or -1 when out of memory. */
static int old_slot(cohort_comm *c) {
  for (int i = 0; i < c->nold_bufs; i++)
    if (c->old_bufs[i].base == NULL) return i;
  coll_buf *nb = realloc(c->old_bufs, (size_t)(c->nold_bufs + 1) * sizeof *nb);
  if (nb == NULL) return -1;
  c->old_bufs = nb;
  return c->nold_bufs++;
}

void coll_buf_orphan_all(cohort_comm *c) {
  int me = c->local.n > 0 ? c->local.me : 0;
  for (int i = 0; i < c->nbufs; i++) {
    coll_buf *b = &c->bufs[i];
    if (b->base == NULL) continue;
    int slot = old_slot(c);
    if (slot < 0) { /* cannot keep it: the memory goes (never leaks a mapping) */
      unmap_buf(c, b);
      continue;
    }
    for (int k = 0; k < (c->local.n > 0 ? c->local.n : 1); k++)
      if (k != me && b->peer[k] != NULL) munmap(b->peer[k], b->map_bytes);
    free(b->peer);
    c->old_bufs[slot] =
        (coll_buf){.base = b->base, .bytes = b->bytes, .map_bytes = b->map_bytes, .peer = NULL};
  }
  free(c->bufs);
  c->bufs = NULL;
  c->nbufs = c->live_bufs = 0;
}

/* ---- ordinary buffers: huge pages for the peers' one-sided access ---- */

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
#define COLLAPSE_PIECE ((uintptr_t)2 << 20)
#define COLLAPSE_SLOTS 4096u /* at most half of them used: 2048 pieces, 4 GiB of buffers */

/* 1 when the administrator turned transparent huge pages off ("[never]"): leave them off. */
static int thp_never(void) {
  char line[128] = "";
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "re");
  if (f == NULL) return 0;
  int never = fgets(line, sizeof line, f) != NULL && strstr(line, "[never]") != NULL;
  fclose(f);
  return never;
}

/* Piece `a`'s slot in the set: holding a (collapsed, or refused for good), a | 1 (seen once), or 0
 * (new; the caller may fill it). NULL when the set is full and `a` is not in it. */
static uintptr_t *piece_slot(cohort_comm *c, uintptr_t a) {
  if (c->collapsed == NULL) c->collapsed = calloc(COLLAPSE_SLOTS, sizeof *c->collapsed);
  if (c->collapsed == NULL) return NULL;
  size_t i = (size_t)(a / COLLAPSE_PIECE * 0x9e3779b97f4a7c15ull) % COLLAPSE_SLOTS;
  for (; c->collapsed[i] != 0; i = (i + 1) % COLLAPSE_SLOTS)
    if ((c->collapsed[i] & ~(uintptr_t)1) == a) return &c->collapsed[i];
  return c->ncollapsed < COLLAPSE_SLOTS / 2 ? &c->collapsed[i] : NULL;
}

/* Collapses the pieces [a, end), all seen once before, in one call (each call drains the page
 * lists of every CPU). EINVAL comes before that work (memory never touched, a region advised
 * MADV_NOHUGEPAGE, a kernel before 6.1): they are asked again next time, at one system call. */
static void collapse_run(cohort_comm *c, uintptr_t a, uintptr_t end) {
  if (a == end || (madvise((void *)a, end - a, MADV_COLLAPSE) != 0 && errno == EINVAL)) return;
  for (; a < end; a += COLLAPSE_PIECE) *piece_slot(c, a) = a;
}

/* 1 when every page of the piece at `a` is in memory (and mapped): collapsing it then adds no
 * memory, even where the piece reaches past the buffer into the program's other data. */
static int piece_resident(uintptr_t a) {
  unsigned char vec[COLLAPSE_PIECE / 4096];
  long page = sysconf(_SC_PAGESIZE);
  if (page != 4096 || mincore((void *)a, COLLAPSE_PIECE, vec) != 0) return 0;
  for (size_t i = 0; i < sizeof vec; i++)
    if (!(vec[i] & 1)) return 0;
  return 1;
}

void coll_buf_collapse(cohort_comm *c, const void *p, size_t len) {
  if (c->collapse && c->collapsed == NULL && thp_never()) c->collapse = 0;
  if (!c->collapse || len == 0) return;
  uintptr_t lo = (uintptr_t)p & ~(COLLAPSE_PIECE - 1), end = (uintptr_t)p + len, run = lo;
  /* A piece is collapsed the second time a buffer holding it comes by (a buffer used once is not
   * worth the copy), once: the pieces done are remembered. The pieces at either end reach past the
   * buffer into the program's other memory: only when every page of them is in memory already. */
  uintptr_t a = lo;
  for (; a < end; a += COLLAPSE_PIECE) {
    uintptr_t *slot = piece_slot(c, a);
    int fresh = slot != NULL && *slot == 0, edge = a < (uintptr_t)p || a + COLLAPSE_PIECE > end;
    if (fresh) {
      *slot = a | 1;
      c->ncollapsed++;
    }
    if (slot == NULL || fresh || *slot != (a | 1) || (edge && !piece_resident(a))) {
      collapse_run(c, run, a);
      run = a + COLLAPSE_PIECE;
    }
  }
  collapse_run(c, run, a);
}

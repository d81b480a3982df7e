/* table.c - the store's keys, shared values and per-key waiters (table.h). */
#include "store/table.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

struct store_entry {
  store_entry *next;
  uint64_t hash;
  store_blob *val;
  uint16_t klen;
  char key[]; /* klen bytes + NUL */
};

struct store_waitkey {
  store_waitkey *next;
  uint64_t hash;
  store_waiter *head;
  uint16_t klen;
  char key[];
};

static uint64_t hash_key(const store_table *t, const uint8_t *k, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull ^ t->seed;
  for (size_t i = 0; i < n; i++) {
    h ^= k[i];
    h *= 0x100000001b3ull;
  }
  return h ^ (h >> 29);
}

int store_table_init(store_table *t, size_t max_bytes) {
  memset(t, 0, sizeof *t);
  t->max_bytes = max_bytes;
  t->nbuckets = t->nwbuckets = 256;
  t->buckets = calloc(t->nbuckets, sizeof *t->buckets);
  t->wbuckets = calloc(t->nwbuckets, sizeof *t->wbuckets);
  if (t->buckets == NULL || t->wbuckets == NULL) {
    store_table_free(t);
    return -ENOMEM;
  }
  return base_random_bytes(&t->seed, sizeof t->seed);
}

void store_table_free(store_table *t) {
  for (size_t i = 0; t->buckets != NULL && i < t->nbuckets; i++) {
    store_entry *e = t->buckets[i];
    while (e != NULL) {
      store_entry *next = e->next;
      store_blob_unref(t, e->val);
      free(e);
      e = next;
    }
  }
  for (size_t i = 0; t->wbuckets != NULL && i < t->nwbuckets; i++) {
    store_waitkey *w = t->wbuckets[i];
    while (w != NULL) {
      store_waitkey *next = w->next;
      free(w);
      w = next;
    }
  }
  free(t->buckets);
  free(t->wbuckets);
  t->buckets = NULL;
  t->wbuckets = NULL;
}

store_blob *store_blob_ref(store_blob *b) {
  b->refs++;
  return b;
}

void store_blob_unref(store_table *t, store_blob *b) {
  if (b == NULL || --b->refs > 0) return;
  if (b->orphan) t->pinned_bytes -= b->len;
  free(b);
}

/* The table lets go of a value; one still being sent counts as pinned. */
static void release_value(store_table *t, store_blob *b) {
  if (b->refs > 1) {
    b->orphan = 1;
    t->pinned_bytes += b->len;
  }
  store_blob_unref(t, b);
}

static size_t entry_cost(size_t klen, size_t vlen) {
  return STORE_ENTRY_OVERHEAD + klen + 1 + vlen;
}

static store_entry **find_slot(store_table *t, const uint8_t *k, size_t n, uint64_t h) {
  store_entry **pp = &t->buckets[h & (t->nbuckets - 1)];
  for (; *pp != NULL; pp = &(*pp)->next) {
    store_entry *e = *pp;
    if (e->hash == h && e->klen == n && memcmp(e->key, k, n) == 0) return pp;
  }
  return pp;
}

store_blob *store_table_get(store_table *t, store_bytes key) {
  store_entry *e = *find_slot(t, key.p, key.len, hash_key(t, key.p, key.len));
  return e != NULL ? e->val : NULL;
}

/*
 * Doubles a chained hash table of `nb` buckets whose nodes have `next` and
 * `hash` fields; on failure the old one stays (longer chains, still correct).
 */
#define REHASH(type, tbl, nb)                                                                      \
  do {                                                                                             \
    size_t rh_n = (nb)*2;                                                                          \
    type **rh_b = calloc(rh_n, sizeof *rh_b);                                                      \
    if (rh_b == NULL) break;                                                                       \
    for (size_t rh_i = 0; rh_i < (nb); rh_i++) {                                                   \
      type *rh_x = (tbl)[rh_i];                                                                    \
      while (rh_x != NULL) {                                                                       \
        type *rh_next = rh_x->next;                                                                \
        rh_x->next = rh_b[rh_x->hash & (rh_n - 1)];                                                \
        rh_b[rh_x->hash & (rh_n - 1)] = rh_x;                                                      \
        rh_x = rh_next;                                                                            \
      }                                                                                            \
    }                                                                                              \
    free(tbl);                                                                                     \
    (tbl) = rh_b;                                                                                  \
    (nb) = rh_n;                                                                                   \
  } while (0)

int store_table_put(store_table *t, store_bytes key, const void *val, size_t vlen) {
  uint64_t h = hash_key(t, key.p, key.len);
  store_entry **pp = find_slot(t, key.p, key.len, h);
  store_entry *e = *pp;
  size_t old = e ? entry_cost(e->klen, e->val->len) : 0;
  size_t cost = entry_cost(key.len, vlen);
  if (t->data_bytes - old + cost + t->pinned_bytes > t->max_bytes) return COHORT_ELIMIT;
  store_blob *b = malloc(sizeof *b + (vlen ? vlen : 1));
  if (b == NULL) return -ENOMEM;
  b->refs = 1;
  b->len = (uint32_t)vlen;
  b->orphan = 0;
  if (vlen) memcpy(b->data, val, vlen);
  if (e != NULL) {
    release_value(t, e->val);
    e->val = b;
    t->data_bytes = t->data_bytes - old + cost;
    return 0;
  }
  e = malloc(sizeof *e + key.len + 1);
  if (e == NULL) {
    free(b);
    return -ENOMEM;
  }
  e->next = NULL;
  e->hash = h;
  e->val = b;
  e->klen = (uint16_t)key.len;
  memcpy(e->key, key.p, key.len);
  e->key[key.len] = '\0';
  *pp = e;
  t->nentries++;
  t->data_bytes += cost;
  if (t->nentries > t->nbuckets) REHASH(store_entry, t->buckets, t->nbuckets);
  return 1;
}

int store_table_del(store_table *t, store_bytes key) {
  store_entry **pp = find_slot(t, key.p, key.len, hash_key(t, key.p, key.len));
  store_entry *e = *pp;
  if (e == NULL) return -ENOENT;
  *pp = e->next;
  t->data_bytes -= entry_cost(e->klen, e->val->len);
  t->nentries--;
  release_value(t, e->val);
  free(e);
  return 0;
}

static store_waitkey **find_wslot(store_table *t, const uint8_t *k, size_t n, uint64_t h) {
  store_waitkey **pp = &t->wbuckets[h & (t->nwbuckets - 1)];
  for (; *pp != NULL; pp = &(*pp)->next) {
    store_waitkey *w = *pp;
    if (w->hash == h && w->klen == n && memcmp(w->key, k, n) == 0) return pp;
  }
  return pp;
}

int store_table_wait(store_table *t, store_bytes key, store_waiter *w) {
  uint64_t h = hash_key(t, key.p, key.len);
  store_waitkey **pp = find_wslot(t, key.p, key.len, h);
  store_waitkey *wk = *pp;
  if (wk == NULL) {
    wk = malloc(sizeof *wk + key.len + 1);
    if (wk == NULL) return -ENOMEM;
    wk->next = NULL;
    wk->hash = h;
    wk->head = NULL;
    wk->klen = (uint16_t)key.len;
    memcpy(wk->key, key.p, key.len);
    wk->key[key.len] = '\0';
    *pp = wk;
    t->nwaitkeys++;
    if (t->nwaitkeys > t->nwbuckets) REHASH(store_waitkey, t->wbuckets, t->nwbuckets);
  }
  w->wk = wk;
  w->prev = NULL;
  w->next = wk->head;
  if (wk->head != NULL) wk->head->prev = w;
  wk->head = w;
  return 0;
}

/* Frees a waitkey nobody waits on any more. */
static void drop_waitkey(store_table *t, store_waitkey *wk) {
  store_waitkey **pp = find_wslot(t, (const uint8_t *)wk->key, wk->klen, wk->hash);
  if (*pp == wk) *pp = wk->next;
  t->nwaitkeys--;
  free(wk);
}

void store_table_unwait(store_table *t, store_waiter *w) {
  store_waitkey *wk = w->wk;
  if (wk == NULL) return;
  if (w->prev != NULL)
    w->prev->next = w->next;
  else
    wk->head = w->next;
  if (w->next != NULL) w->next->prev = w->prev;
  w->prev = w->next = NULL;
  w->wk = NULL;
  if (wk->head == NULL) drop_waitkey(t, wk);
}

store_waiter *store_table_take_waiters(store_table *t, store_bytes key) {
  uint64_t h = hash_key(t, key.p, key.len);
  store_waitkey *wk = *find_wslot(t, key.p, key.len, h);
  if (wk == NULL) return NULL;
  store_waiter *list = wk->head;
  for (store_waiter *w = list; w != NULL; w = w->next) w->wk = NULL;
  drop_waitkey(t, wk);
  return list;
}

/*
 * table.h - the store server's data: keys with shared immutable values, and
 * the connections waiting for keys that do not exist yet.
 *
 * Values are reference-counted blobs that never change once made: a GET
 * answer refers to the blob instead of copying it into the connection's
 * output, so a 200 KiB rendezvous plan read by 4,096 nodes is held once.
 * Replacing or deleting a key drops the table's reference; a blob still
 * being sent stays alive (and charged, see pinned_bytes) until it is sent.
 *
 * Waiters: a WAIT parks on the first of its keys that is absent. Creating a
 * key hands back exactly the waiters of that key, so one SET costs the
 * number of its waiters, not the number of connections.
 *
 * Memory: every entry costs its key, its value and STORE_ENTRY_OVERHEAD;
 * data_bytes sums that, and put() refuses (COHORT_ELIMIT) to pass max_bytes.
 *
 * Not thread-safe: the server's loop thread owns the table.
 */
#ifndef COHORT_STORE_TABLE_H
#define COHORT_STORE_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "store/proto.h"

/* Bytes charged per entry besides its key and value (node, table slot). */
#define STORE_ENTRY_OVERHEAD 64

typedef struct store_blob {
  uint32_t refs;
  uint32_t len;
  uint8_t orphan; /* no longer in the table: its bytes count in pinned_bytes */
  uint8_t data[];
} store_blob;

/* A parked connection's link in the list of one key's waiters (intrusive). */
typedef struct store_waiter {
  struct store_waiter *prev, *next;
  struct store_waitkey *wk; /* NULL when not parked */
} store_waiter;

typedef struct store_entry store_entry;
typedef struct store_waitkey store_waitkey;

typedef struct store_table {
  store_entry **buckets;
  size_t nbuckets, nentries;
  store_waitkey **wbuckets;
  size_t nwbuckets, nwaitkeys;
  uint64_t seed;
  size_t max_bytes;
  size_t data_bytes;   /* keys + values + overhead held by entries */
  size_t pinned_bytes; /* values replaced or deleted but still being sent */
} store_table;

/* Returns 0 or -ENOMEM. */
int store_table_init(store_table *t, size_t max_bytes);
/* Frees every entry; waiters must have been removed. */
void store_table_free(store_table *t);

/* The value of key, or NULL. The blob belongs to the table: ref it to keep it. */
store_blob *store_table_get(store_table *t, store_bytes key);
/*
 * Sets key to a copy of value. Returns 1 when the key was created, 0 when
 * replaced, COHORT_ELIMIT when max_bytes would be passed, -ENOMEM.
 */
int store_table_put(store_table *t, store_bytes key, const void *val, size_t vlen);
/* Returns 0 or -ENOENT. */
int store_table_del(store_table *t, store_bytes key);

store_blob *store_blob_ref(store_blob *b);
void store_blob_unref(store_table *t, store_blob *b);

/* Parks w on key (absent). Returns 0 or -ENOMEM. */
int store_table_wait(store_table *t, store_bytes key, store_waiter *w);
/* Unparks w (no-op when not parked). */
void store_table_unwait(store_table *t, store_waiter *w);
/*
 * Detaches and returns the waiters of key as a NULL-terminated list linked
 * by ->next (each with wk == NULL), or NULL when none.
 */
store_waiter *store_table_take_waiters(store_table *t, store_bytes key);

#endif

/*
 * data.h - training batches: fake data (the seed's random tokens, attention
 * mask and answer positions) or real tokens from files.
 *
 * Batches are addressed, not streamed: sample g (a global index, counted
 * over all ranks and micro-steps) is always the same data. The data rule: a
 * position P, the samples the completed steps consumed; a step of `world`
 * ranks with `accum` micro-steps of B samples trains [P, P + world*accum*B):
 * rank r the block [P + r*accum*B, P + (r+1)*accum*B), its micro-step k the
 * B samples from P + (r*accum + k)*B; P advances by world*accum*B when the
 * step completes. A run on N ranks and a run on one rank with N-fold
 * accumulation see the same global batch, every rank a disjoint part, and a
 * world that changes between steps (a re-form) goes on from P: within an
 * epoch no sample is trained twice or skipped. P is state of the run
 * (checkpoints, the state a newcomer receives).
 *
 * Files: llm.c token shards (.bin: a header of 256 int32 — magic 20240520,
 * version 1, token count — then uint16 tokens) or plain text (each byte one
 * token). PATH may be a file or a directory of such files (sorted by name).
 * Sample g of a file stream is window (g mod W) of T+1 tokens, windows
 * stepping by T across the concatenated shards.
 */
#ifndef COHORT_GPT2_DATA_H
#define COHORT_GPT2_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "gpt2/model.h"

#define GPT2_SHARD_MAGIC 20240520
#define GPT2_SHARD_VERSION 1
#define GPT2_SHARD_HEADER_INTS 256

typedef struct gpt2_shard {
  const uint8_t *map; /* whole file mapping */
  size_t map_len;
  const uint8_t *tokens; /* first token */
  size_t ntok;
  int width;      /* bytes per token: 2 (shard) or 1 (text) */
  size_t windows; /* usable windows of T+1 tokens */
} gpt2_shard;

typedef struct gpt2_data {
  int fake;
  gpt2_head head;
  int V, T, B;
  uint64_t seed;
  gpt2_shard *shards;
  int nshards;
  size_t windows; /* total over shards */
} gpt2_data;

/* One micro-batch of B samples. */
typedef struct gpt2_batch_buf {
  int32_t *tokens, *targets, *mask; // (B, T) each
  int32_t *start, *end;             // (B)
} gpt2_batch_buf;

/*
 * Opens the data source: path NULL or "fake" for fake data, else a file or
 * directory. On error returns a negative code and writes a one-line reason
 * (naming the file) into err.
 */
int gpt2_data_open(gpt2_data *d, const char *path, gpt2_head head, int V, int B, int T,
                   uint64_t seed, char *err, size_t errlen);
void gpt2_data_close(gpt2_data *d);

int gpt2_batch_buf_alloc(gpt2_batch_buf *bb, int B, int T);
void gpt2_batch_buf_free(gpt2_batch_buf *bb);

/* The data rule (above): the first sample of micro-step k of `rank` at position pos, */
uint64_t gpt2_data_first(uint64_t pos, int rank, int accum, int B, int k);
/* and the position after a completed step of `world` ranks. */
uint64_t gpt2_data_advance(uint64_t pos, int world, int accum, int B);

/* Fills bb with samples g0 .. g0+B-1 and points batch at it. */
void gpt2_data_fill(const gpt2_data *d, uint64_t g0, gpt2_batch_buf *bb, gpt2_batch *batch);

/* Writes tokens as an llm.c shard (used by tests and docs examples). */
int gpt2_shard_write(const char *path, const uint16_t *tokens, size_t ntok);

#endif

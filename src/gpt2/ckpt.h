/*
 * ckpt.h - checkpoints of a training run: parameters, optimiser state, step,
 * data position and RNG state, in one file per step under a directory.
 *
 * File layout (host byte order, little-endian on the supported machines):
 *   gpt2_ckpt_header (magic "COHGPT2", version, configuration, counters)
 *   float params[nparams]
 *   float state[nstate]          optimiser state (AdamW: m then v; SGD: momentum)
 *   uint64_t checksum            over everything before it
 *   char end[8] = "GPT2END"
 *
 * A checkpoint is written atomically: a temporary file in the same directory,
 * fsync, rename to ckpt_<step>.bin, fsync of the directory. The newest
 * `keep` files are kept so that a damaged newest file still leaves an older
 * good one. Loading tries files from the newest down and skips (and reports)
 * any that is truncated or fails its checksum.
 */
#ifndef COHORT_GPT2_CKPT_H
#define COHORT_GPT2_CKPT_H

#include <stddef.h>
#include <stdint.h>

#define GPT2_CKPT_VERSION 1

typedef struct gpt2_ckpt_header {
  char magic[8]; /* "COHGPT2\0" */
  uint32_t version;
  uint32_t header_bytes;
  int32_t vocab, npos, layers, heads, channels, head;
  int32_t opt_kind;
  int32_t world;     /* world size that wrote it (informational) */
  uint64_t step;     /* completed steps */
  uint64_t data_pos; /* next global sample index */
  uint64_t rng;      /* RNG state of the run */
  uint64_t nparams;
  uint64_t nstate;
} gpt2_ckpt_header;

/* Writes DIR/ckpt_<step>.bin atomically and prunes to the newest `keep`.
 * Returns 0 or -errno with a one-line reason in err. */
int gpt2_ckpt_save(const char *dir, const gpt2_ckpt_header *hdr, const float *params,
                   const float *state, int keep, char *err, size_t errlen);

/*
 * Finds the newest valid checkpoint in dir whose configuration matches
 * `want` (all fields but step, data_pos, rng and world) and loads it into
 * params and state (nparams and nstate floats). Returns 1 when loaded (hdr
 * filled), 0 when there is none, or a negative code with a reason in err (a
 * checkpoint for a different configuration, an unreadable directory).
 * Damaged files are skipped; their names and the reason are appended to
 * `note` (may be NULL).
 */
int gpt2_ckpt_load_latest(const char *dir, const gpt2_ckpt_header *want, gpt2_ckpt_header *hdr,
                          float *params, float *state, char *err, size_t errlen, char *note,
                          size_t notelen);

/*
 * The same for a state whose tail holds per_rank floats for each rank of the world that wrote it
 * (PowerSGD's error feedback: want->nstate counts want->world of them). A checkpoint of another
 * world loads too: rank r's part is the writer's rank r's, zeros where the writer had no rank r;
 * the parts of ranks beyond want->world are left out. per_rank 0: gpt2_ckpt_load_latest.
 */
int gpt2_ckpt_load_latest_ranks(const char *dir, const gpt2_ckpt_header *want, size_t per_rank,
                                gpt2_ckpt_header *hdr, float *params, float *state, char *err,
                                size_t errlen, char *note, size_t notelen);

/* The checksum used by the files (exposed for tests). */
uint64_t gpt2_ckpt_hash(uint64_t h, const void *data, size_t len);

#endif

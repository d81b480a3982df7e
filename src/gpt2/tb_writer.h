/*
 * tb_writer.h - TensorBoard event files written directly, without
 * TensorFlow: scalars (loss, learning rate, throughput) that `tensorboard
 * --logdir DIR` shows as they are written.
 *
 * Format: a file events.out.tfevents.<unix time>.<host name> holding
 * TFRecords (uint64 length, masked CRC32C of the length, the bytes, masked
 * CRC32C of the bytes), each an Event protocol buffer encoded by hand. The
 * first event has file_version "brain.Event:2"; every scalar is an Event
 * with wall_time, step and a Summary with one simple_value.
 *
 * Each event is written with a single write() so a reader never sees a torn
 * record in the middle of the file, and a crash loses at most the event
 * being written.
 *
 * Errors: functions return 0 or a negative errno value (-EINVAL for bad
 * arguments, -errno of the failed system call). Thread safety: a writer is
 * used by one thread at a time; separate writers are independent.
 */
#ifndef COHORT_GPT2_TB_WRITER_H
#define COHORT_GPT2_TB_WRITER_H

#include <stddef.h>
#include <stdint.h>

typedef struct gpt2_tb_writer gpt2_tb_writer;

/* Longest tag accepted, in bytes. */
#define GPT2_TB_TAG_MAX 256

/*
 * Creates a new event file in the existing directory logdir and writes the
 * file_version event. On error *out is NULL.
 */
int gpt2_tb_open(const char *logdir, gpt2_tb_writer **out);

/* Appends one scalar. tag: non-empty UTF-8 of at most GPT2_TB_TAG_MAX bytes,
 * e.g. "train/loss". Non-finite values are written as they are. */
int gpt2_tb_add_scalar(gpt2_tb_writer *w, const char *tag, int64_t step, float value);

/* Appends several scalars of one step as a single event. */
int gpt2_tb_add_scalars(gpt2_tb_writer *w, int64_t step, size_t n, const char *const *tags,
                        const float *values);

/* Forces the written events to stable storage (fsync). */
int gpt2_tb_flush(gpt2_tb_writer *w);

/* Path of the event file (valid until close). */
const char *gpt2_tb_path(const gpt2_tb_writer *w);

/* Closes the file and frees the writer. NULL is a no-op. */
void gpt2_tb_close(gpt2_tb_writer *w);

/* CRC32C (Castagnoli) of len bytes, and TFRecord's masked form of it.
 * Exposed for the tests. */
uint32_t gpt2_tb_crc32c(const void *data, size_t len);
uint32_t gpt2_tb_masked_crc(const void *data, size_t len);

#endif

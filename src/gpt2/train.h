/*
 * train.h - the training loop of cohort-gpt2: data, forward/backward with
 * gradient accumulation, data-parallel gradient exchange, clipping, the
 * optimiser, metrics and checkpoints.
 *
 * gpt2_train() writes per-step progress lines and the final summary to
 * opts->out (stdout in the tool) and errors as one line to opts->err. It
 * returns 0 on success, 1 on a runtime failure (I/O, communication), 2 on
 * unusable options.
 */
#ifndef COHORT_GPT2_TRAIN_H
#define COHORT_GPT2_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "gpt2/model.h"
#include "gpt2/optim.h"

/* Gradient compression: the 16-bit types halve the bytes of the gradient reductions (reduced in
 * f32, rounded to the type on the wire; cohort_allreduce_wire); PowerSGD sends low-rank factors of
 * the weight matrices (powersgd.h). */
typedef enum gpt2_compress {
  GPT2_COMPRESS_NONE = 0,
  GPT2_COMPRESS_BF16,
  GPT2_COMPRESS_FP16,
  GPT2_COMPRESS_POWERSGD,
} gpt2_compress;

typedef struct gpt2_train_opts {
  gpt2_config cfg;
  int B, T;       /* per-rank micro-batch */
  int64_t steps;  /* optimiser steps */
  int grad_accum; /* micro-steps per optimiser step */
  gpt2_optim_config opt;
  float lr, min_lr_ratio, clip;
  int64_t warmup;
  gpt2_lr_schedule schedule;
  const char *data; /* NULL or "fake", or a path */
  uint64_t seed;
  const char *metrics_path;
  const char *ckpt_dir;
  int64_t ckpt_every;
  int ckpt_keep;
  const char *tb_dir;
  int zero;                    /* 0 or 1 */
  gpt2_compress grad_compress; /* how gradients travel between ranks */
  int powersgd_rank;           /* PowerSGD: columns of the factors */
  int64_t powersgd_start;      /* PowerSGD: plain exchange for the steps before this one */
  size_t bucket_bytes;         /* gradient bucket size */
  int threads;
  int quiet; /* no per-step lines */
  FILE *out, *err;
} gpt2_train_opts;

/* Defaults (124M, LM head, AdamW, fake data). */
void gpt2_train_defaults(gpt2_train_opts *o);

int gpt2_train(const gpt2_train_opts *o);

/* Bytes of parameters, gradients, optimiser state and activations a rank
 * needs for this configuration (the RSS estimate printed in the summary). */
double gpt2_train_estimate_bytes(const gpt2_train_opts *o, int world);

#endif

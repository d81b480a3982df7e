/*
 * cohort-gpt2 - GPT-2 trained data-parallel on fake data or real tokens.
 * This file only parses arguments; the work is in src/gpt2/.
 */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "gpt2/kernels.h"
#include "gpt2/train.h"
#include "tools/cli.h"

static const char usage_text[] =
    "usage: cohort-gpt2 [options]\n"
    "\n"
    "Trains GPT-2 on this machine, or data-parallel on every rank when started by\n"
    "`cohort run` (RANK/WORLD_SIZE set). Prints one line per step and a summary.\n"
    "\n"
    "model:\n"
    "  --model NAME         124M (default), 350M or tiny\n"
    "  --layers N --heads N --channels N --vocab N --positions N\n"
    "                       override the preset's sizes (positions = rows of wpe)\n"
    "  --seq-len T          tokens per sequence (default 64, at most --positions)\n"
    "  --head lm|qa         next-token loss (default) or GPT2ForQuestionAnswering's\n"
    "                       start/end loss with an attention mask (fake data only)\n"
    "training:\n"
    "  --batch B            sequences per rank per micro-step (default 4)\n"
    "  --steps N            optimiser steps (default 20)\n"
    "  --grad-accum K       micro-steps per optimiser step (default 1)\n"
    "  --optimizer adamw|sgd  (default adamw; sgd uses the seed's lr 0.01, momentum 0.5)\n"
    "  --lr X --momentum X --weight-decay X --beta1 X --beta2 X\n"
    "  --schedule cosine|const  (default: cosine for adamw, const for sgd)\n"
    "  --warmup N           linear warm-up steps (default: steps/10 up to 100 for adamw, 0 for "
    "sgd)\n"
    "  --min-lr-ratio X     cosine floor as a fraction of lr (default 0.1)\n"
    "  --grad-clip X        clip the global gradient norm to X, 0 disables (default 1.0)\n"
    "  --seed N             weights and fake data (default 1337)\n"
    "  --threads N          OpenMP and OpenBLAS threads (default OMP_NUM_THREADS or all cores)\n"
    "data:\n"
    "  --data fake|PATH     fake data (default), or llm.c .bin token shards / text files\n"
    "                       (a file or a directory of them); each rank reads its own part\n"
    "data parallelism:\n"
    "  --bucket-mb N        gradient bucket size in MiB (default 25)\n"
    "  --zero 0|1           1 shards the optimiser state across ranks (ZeRO-1)\n"
    "  --grad-compress none|bf16|fp16|powersgd[:RANK]\n"
    "                       gradients travel in 16 bits (half the bytes; reduced in f32), or\n"
    "                       as PowerSGD's rank-RANK factors of each weight matrix (default 4)\n"
    "                       with error feedback; powersgd not with --zero 1\n"
    "  --powersgd-start N   plain allreduce for the first N steps (default 10)\n"
    "output and checkpoints:\n"
    "  --metrics FILE       one JSON object per step\n"
    "  --tensorboard DIR    also write TensorBoard scalars to an event file in DIR (created)\n"
    "  --ckpt-dir DIR       checkpoint directory; the newest complete checkpoint is resumed\n"
    "  --ckpt-every K       write a checkpoint every K steps (and at the end)\n"
    "  --ckpt-keep N        checkpoints kept (default 2)\n"
    "  --quiet              no per-step lines\n"
    "  -h, --help           this text\n";

static const char prog[] = "cohort-gpt2";

/*
 * The trainer's options, and what is applied after parsing: the model sizes
 * over the preset, and the optimiser's defaults where -1 says "not given".
 */
typedef struct gpt2_args {
  gpt2_train_opts o;
  int layers, heads, channels, vocab, positions; /* 0: the preset's */
  int head, optimizer, schedule;                 /* schedule -1: the optimiser's default */
  float lr, weight_decay;                        /* -1: the optimiser's default */
  int64_t warmup, seed;                          /* -1: the default */
  int bucket_mb;                                 /* 0: the default */
} gpt2_args;

#define AT(FIELD, CTYPE) CLI_AT(gpt2_args, FIELD, CTYPE)

static int set_model(void *settings, const char *v) {
  return gpt2_config_preset(v, &((gpt2_args *)settings)->o.cfg) == 0 ? 0 : -1;
}

static const cli_choice heads[] = {{"lm", GPT2_HEAD_LM}, {"qa", GPT2_HEAD_QA}, {NULL, 0}};
static const cli_choice optimizers[] = {
    {"adamw", GPT2_OPT_ADAMW}, {"sgd", GPT2_OPT_SGD}, {NULL, 0}};
static const cli_choice compressions[] = {{"none", GPT2_COMPRESS_NONE},
                                          {"bf16", GPT2_COMPRESS_BF16},
                                          {"fp16", GPT2_COMPRESS_FP16},
                                          {"powersgd", GPT2_COMPRESS_POWERSGD},
                                          {NULL, 0}};

/* none|bf16|fp16|powersgd[:RANK], RANK 1..256. */
static int set_compress(void *settings, const char *v) {
  gpt2_train_opts *o = &((gpt2_args *)settings)->o;
  size_t name_len = strcspn(v, ":");
  for (const cli_choice *c = compressions; c->name != NULL; c++) {
    if (strlen(c->name) != name_len || strncmp(c->name, v, name_len) != 0) continue;
    o->grad_compress = (gpt2_compress)c->value;
    if (v[name_len] == '\0') return 0;
    if (c->value != GPT2_COMPRESS_POWERSGD) return -1;
    char *end = NULL;
    errno = 0;
    long r = strtol(v + name_len + 1, &end, 10);
    if (errno != 0 || end == v + name_len + 1 || *end != '\0' || r < 1 || r > 256) return -1;
    o->powersgd_rank = (int)r;
    return 0;
  }
  return -1;
}
static const cli_choice schedules[] = {
    {"cosine", GPT2_LR_COSINE}, {"const", GPT2_LR_CONST}, {NULL, 0}};

#define INT_ROW(NAME, FIELD, MIN, MAX)                                                             \
  { NAME, 0, CLI_INT, .at = AT(FIELD, int), .min = MIN, .max = MAX }
#define I64_ROW(NAME, FIELD, MIN, MAX)                                                             \
  { NAME, 0, CLI_I64, .at = AT(FIELD, int64_t), .min = MIN, .max = MAX }
#define FLOAT_ROW(NAME, FIELD, MIN, MAX)                                                           \
  { NAME, 0, CLI_FLOAT, .at = AT(FIELD, float), .fmin = MIN, .fmax = MAX }
#define STR_ROW(NAME, FIELD)                                                                       \
  { NAME, 0, CLI_STR, .at = AT(FIELD, const char *) }

static const cli_opt gpt2_opts[] = {
    {"--help", 'h', .kind = CLI_HELP_OPT},
    {"--model", 0, CLI_CUSTOM, .fn = set_model, .what = "124M, 350M or tiny"},
    INT_ROW("--layers", layers, 1, 1024),
    INT_ROW("--heads", heads, 1, 4096),
    INT_ROW("--channels", channels, 1, 65536),
    INT_ROW("--vocab", vocab, 2, 1 << 30),
    INT_ROW("--positions", positions, 1, 1 << 20),
    INT_ROW("--seq-len", o.T, 1, 1 << 20),
    {"--head", 0, CLI_CHOICE, .at = AT(head, int), .choices = heads},
    INT_ROW("--batch", o.B, 1, 1 << 20),
    I64_ROW("--steps", o.steps, 1, INT64_MAX / 2),
    INT_ROW("--grad-accum", o.grad_accum, 1, 1 << 20),
    {"--optimizer", 0, CLI_CHOICE, .at = AT(optimizer, int), .choices = optimizers},
    FLOAT_ROW("--lr", lr, 0, 1e3),
    FLOAT_ROW("--momentum", o.opt.momentum, 0, 1),
    FLOAT_ROW("--weight-decay", weight_decay, 0, 1e3),
    FLOAT_ROW("--beta1", o.opt.beta1, 0, 0.999999),
    FLOAT_ROW("--beta2", o.opt.beta2, 0, 0.999999),
    {"--schedule", 0, CLI_CHOICE, .at = AT(schedule, int), .choices = schedules},
    I64_ROW("--warmup", warmup, 0, INT64_MAX / 2),
    FLOAT_ROW("--min-lr-ratio", o.min_lr_ratio, 0, 1),
    FLOAT_ROW("--grad-clip", o.clip, 0, 1e9),
    I64_ROW("--seed", seed, 0, INT64_MAX),
    INT_ROW("--threads", o.threads, 1, 1024),
    STR_ROW("--data", o.data),
    INT_ROW("--bucket-mb", bucket_mb, 1, 1 << 16),
    INT_ROW("--zero", o.zero, 0, 1),
    {"--grad-compress", 0, CLI_CUSTOM, .fn = set_compress,
     .what = "none, bf16, fp16 or powersgd[:RANK] (RANK 1..256)"},
    I64_ROW("--powersgd-start", o.powersgd_start, 0, INT64_MAX / 2),
    STR_ROW("--metrics", o.metrics_path),
    STR_ROW("--ckpt-dir", o.ckpt_dir),
    I64_ROW("--ckpt-every", o.ckpt_every, 1, INT64_MAX / 2),
    INT_ROW("--ckpt-keep", o.ckpt_keep, 1, 1000),
    STR_ROW("--tensorboard", o.tb_dir),
    {"--quiet", 0, CLI_FLAG, .at = AT(o.quiet, int)},
};

static const cli_cmd gpt2_cmd = {
    prog, usage_text, gpt2_opts, BASE_ARRAY_LEN(gpt2_opts), CLI_NO_OPERANDS, 1};

/* The model: the preset with the sizes given over it, and its head. */
static int apply_model(gpt2_args *a) {
  gpt2_config *c = &a->o.cfg;
  if (a->layers) c->layers = a->layers;
  if (a->heads) c->heads = a->heads;
  if (a->channels) c->channels = a->channels;
  if (a->vocab) c->vocab = a->vocab;
  if (a->positions) c->npos = a->positions;
  c->head = (gpt2_head)a->head;
  const char *why = NULL;
  if (gpt2_config_check(c, &why) != 0) return cli_usage_error(prog, "%s", why);
  if (a->o.T > c->npos)
    return cli_usage_error(prog, "--seq-len %d exceeds the model's %d positions", a->o.T, c->npos);
  if (c->head == GPT2_HEAD_QA && a->o.data != NULL && strcmp(a->o.data, "fake") != 0)
    return cli_usage_error(prog, "the qa head trains on fake data only (answer positions)");
  return 0;
}

/* The optimiser and what it implies where nothing was given: the seed's SGD
 * (lr 0.01, constant, no decay, no warm-up) or AdamW's warm-up of steps/10. */
static void apply_optimizer(gpt2_args *a) {
  gpt2_train_opts *o = &a->o;
  o->opt.kind = (gpt2_opt_kind)a->optimizer;
  int sgd = o->opt.kind == GPT2_OPT_SGD;
  if (a->lr >= 0)
    o->lr = a->lr;
  else if (sgd)
    o->lr = 0.01f;
  if (a->schedule >= 0)
    o->schedule = (gpt2_lr_schedule)a->schedule;
  else if (sgd)
    o->schedule = GPT2_LR_CONST;
  if (a->weight_decay >= 0)
    o->opt.weight_decay = a->weight_decay;
  else if (sgd)
    o->opt.weight_decay = 0.0f;
  if (a->warmup >= 0)
    o->warmup = a->warmup;
  else
    o->warmup = sgd ? 0 : o->steps / 10 < 100 ? o->steps / 10 : 100;
}

/* OpenBLAS chose its fallback kernels on a CPU it does not know: start again
 * with the ones the CPU allows (gpt2_blas_better_core; the header line names
 * the kernels in use). The exec goes through the file's own path: the kernel
 * names the process (comm, what ps, top and pgrep show) after the last part
 * of that path, and "/proc/self/exe" would rename every worker "exe".
 * /proc/self/exe is the fallback. When the exec fails, go on as we are. */
static void blas_reexec(char **argv) {
  const char *core = gpt2_blas_better_core();
  if (core == NULL || setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    execv(self, argv);
  }
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");
}

int main(int argc, char **argv) {
  blas_reexec(argv);
  gpt2_args a = {.lr = -1, .weight_decay = -1, .schedule = -1, .warmup = -1, .seed = -1};
  gpt2_train_defaults(&a.o);
  a.head = a.o.cfg.head;
  a.optimizer = a.o.opt.kind;
  cli_args none;
  int rc = cli_parse(&gpt2_cmd, argc, argv, &a, &none);
  if (rc != CLI_OK) return rc == CLI_HELP ? 0 : rc;
  rc = apply_model(&a);
  if (rc != 0) return rc;
  apply_optimizer(&a);
  if (a.seed >= 0) a.o.seed = (uint64_t)a.seed;
  if (a.bucket_mb > 0) a.o.bucket_bytes = (size_t)a.bucket_mb << 20;
  if (a.o.grad_compress == GPT2_COMPRESS_POWERSGD && a.o.zero)
    return cli_usage_error(prog, "--grad-compress powersgd does not combine with --zero 1");
  return gpt2_train(&a.o);
}

/*
 * cohort-gpt2 - GPT-2 trained data-parallel on fake data or real tokens.
 * This file only parses arguments; the work is in src/gpt2/.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "gpt2/train.h"

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
    "output and checkpoints:\n"
    "  --metrics FILE       one JSON object per step\n"
    "  --tensorboard DIR    also write TensorBoard scalars to an event file in DIR\n"
    "  --ckpt-dir DIR       checkpoint directory; the newest complete checkpoint is resumed\n"
    "  --ckpt-every K       write a checkpoint every K steps (and at the end)\n"
    "  --ckpt-keep N        checkpoints kept (default 2)\n"
    "  --quiet              no per-step lines\n"
    "  -h, --help           this text\n";

enum {
  OPT_MODEL = 256,
  OPT_LAYERS,
  OPT_HEADS,
  OPT_CHANNELS,
  OPT_VOCAB,
  OPT_POSITIONS,
  OPT_SEQLEN,
  OPT_HEAD,
  OPT_BATCH,
  OPT_STEPS,
  OPT_ACCUM,
  OPT_OPTIMIZER,
  OPT_LR,
  OPT_MOMENTUM,
  OPT_WD,
  OPT_BETA1,
  OPT_BETA2,
  OPT_SCHEDULE,
  OPT_WARMUP,
  OPT_MINLR,
  OPT_CLIP,
  OPT_SEED,
  OPT_THREADS,
  OPT_DATA,
  OPT_BUCKET,
  OPT_ZERO,
  OPT_METRICS,
  OPT_CKPTDIR,
  OPT_CKPTEVERY,
  OPT_CKPTKEEP,
  OPT_TB,
  OPT_QUIET
};

static const struct option long_opts[] = {{"model", required_argument, NULL, OPT_MODEL},
                                          {"layers", required_argument, NULL, OPT_LAYERS},
                                          {"heads", required_argument, NULL, OPT_HEADS},
                                          {"channels", required_argument, NULL, OPT_CHANNELS},
                                          {"vocab", required_argument, NULL, OPT_VOCAB},
                                          {"positions", required_argument, NULL, OPT_POSITIONS},
                                          {"seq-len", required_argument, NULL, OPT_SEQLEN},
                                          {"head", required_argument, NULL, OPT_HEAD},
                                          {"batch", required_argument, NULL, OPT_BATCH},
                                          {"steps", required_argument, NULL, OPT_STEPS},
                                          {"grad-accum", required_argument, NULL, OPT_ACCUM},
                                          {"optimizer", required_argument, NULL, OPT_OPTIMIZER},
                                          {"lr", required_argument, NULL, OPT_LR},
                                          {"momentum", required_argument, NULL, OPT_MOMENTUM},
                                          {"weight-decay", required_argument, NULL, OPT_WD},
                                          {"beta1", required_argument, NULL, OPT_BETA1},
                                          {"beta2", required_argument, NULL, OPT_BETA2},
                                          {"schedule", required_argument, NULL, OPT_SCHEDULE},
                                          {"warmup", required_argument, NULL, OPT_WARMUP},
                                          {"min-lr-ratio", required_argument, NULL, OPT_MINLR},
                                          {"grad-clip", required_argument, NULL, OPT_CLIP},
                                          {"seed", required_argument, NULL, OPT_SEED},
                                          {"threads", required_argument, NULL, OPT_THREADS},
                                          {"data", required_argument, NULL, OPT_DATA},
                                          {"bucket-mb", required_argument, NULL, OPT_BUCKET},
                                          {"zero", required_argument, NULL, OPT_ZERO},
                                          {"metrics", required_argument, NULL, OPT_METRICS},
                                          {"ckpt-dir", required_argument, NULL, OPT_CKPTDIR},
                                          {"ckpt-every", required_argument, NULL, OPT_CKPTEVERY},
                                          {"ckpt-keep", required_argument, NULL, OPT_CKPTKEEP},
                                          {"tensorboard", required_argument, NULL, OPT_TB},
                                          {"quiet", no_argument, NULL, OPT_QUIET},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "cohort-gpt2: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, " (see --help)\n");
  return 2;
}

static int parse_float(const char *s, double min, double max, float *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (s[0] == '\0' || *end != '\0' || errno != 0 || !isfinite(v) || v < min || v > max) return -1;
  *out = (float)v;
  return 0;
}

int main(int argc, char **argv) {
  gpt2_train_opts o;
  gpt2_train_defaults(&o);
  int set_lr = 0, set_sched = 0, set_wd = 0, set_warmup = 0;
  int layers = 0, heads = 0, channels = 0, vocab = 0, positions = 0;
  const char *name = "";
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
    const char *a = optarg;
    int iv = 0;
    int64_t lv = 0;
    switch (c) {
    case 'h':
      fputs(usage_text, stdout);
      return 0;
    case OPT_MODEL:
      if (gpt2_config_preset(a, &o.cfg) != 0)
        return usage_error("unknown --model '%s' (124M, 350M or tiny)", a);
      break;
    case OPT_LAYERS:
      name = "--layers";
      if (base_parse_int(a, 1, 1024, &layers)) goto bad;
      break;
    case OPT_HEADS:
      name = "--heads";
      if (base_parse_int(a, 1, 4096, &heads)) goto bad;
      break;
    case OPT_CHANNELS:
      name = "--channels";
      if (base_parse_int(a, 1, 65536, &channels)) goto bad;
      break;
    case OPT_VOCAB:
      name = "--vocab";
      if (base_parse_int(a, 2, 1 << 30, &vocab)) goto bad;
      break;
    case OPT_POSITIONS:
      name = "--positions";
      if (base_parse_int(a, 1, 1 << 20, &positions)) goto bad;
      break;
    case OPT_SEQLEN:
      name = "--seq-len";
      if (base_parse_int(a, 1, 1 << 20, &o.T)) goto bad;
      break;
    case OPT_HEAD:
      if (strcmp(a, "lm") == 0) {
        o.cfg.head = GPT2_HEAD_LM;
      } else if (strcmp(a, "qa") == 0) {
        o.cfg.head = GPT2_HEAD_QA;
      } else {
        return usage_error("unknown --head '%s' (lm or qa)", a);
      }
      break;
    case OPT_BATCH:
      name = "--batch";
      if (base_parse_int(a, 1, 1 << 20, &o.B)) goto bad;
      break;
    case OPT_STEPS:
      name = "--steps";
      if (base_parse_i64(a, 1, INT64_MAX / 2, &lv)) goto bad;
      o.steps = lv;
      break;
    case OPT_ACCUM:
      name = "--grad-accum";
      if (base_parse_int(a, 1, 1 << 20, &o.grad_accum)) goto bad;
      break;
    case OPT_OPTIMIZER:
      if (strcmp(a, "adamw") == 0) {
        o.opt.kind = GPT2_OPT_ADAMW;
      } else if (strcmp(a, "sgd") == 0) {
        o.opt.kind = GPT2_OPT_SGD;
      } else {
        return usage_error("unknown --optimizer '%s' (adamw or sgd)", a);
      }
      break;
    case OPT_LR:
      name = "--lr";
      set_lr = 1;
      if (parse_float(a, 0, 1e3, &o.lr)) goto bad;
      break;
    case OPT_MOMENTUM:
      name = "--momentum";
      if (parse_float(a, 0, 1, &o.opt.momentum)) goto bad;
      break;
    case OPT_WD:
      name = "--weight-decay";
      set_wd = 1;
      if (parse_float(a, 0, 1e3, &o.opt.weight_decay)) goto bad;
      break;
    case OPT_BETA1:
      name = "--beta1";
      if (parse_float(a, 0, 0.999999, &o.opt.beta1)) goto bad;
      break;
    case OPT_BETA2:
      name = "--beta2";
      if (parse_float(a, 0, 0.999999, &o.opt.beta2)) goto bad;
      break;
    case OPT_SCHEDULE:
      set_sched = 1;
      if (strcmp(a, "cosine") == 0) {
        o.schedule = GPT2_LR_COSINE;
      } else if (strcmp(a, "const") == 0) {
        o.schedule = GPT2_LR_CONST;
      } else {
        return usage_error("unknown --schedule '%s' (cosine or const)", a);
      }
      break;
    case OPT_WARMUP:
      name = "--warmup";
      set_warmup = 1;
      if (base_parse_i64(a, 0, INT64_MAX / 2, &o.warmup)) goto bad;
      break;
    case OPT_MINLR:
      name = "--min-lr-ratio";
      if (parse_float(a, 0, 1, &o.min_lr_ratio)) goto bad;
      break;
    case OPT_CLIP:
      name = "--grad-clip";
      if (parse_float(a, 0, 1e9, &o.clip)) goto bad;
      break;
    case OPT_SEED:
      name = "--seed";
      if (base_parse_i64(a, 0, INT64_MAX, &lv)) goto bad;
      o.seed = (uint64_t)lv;
      break;
    case OPT_THREADS:
      name = "--threads";
      if (base_parse_int(a, 1, 1024, &o.threads)) goto bad;
      break;
    case OPT_DATA:
      o.data = a;
      break;
    case OPT_BUCKET:
      name = "--bucket-mb";
      if (base_parse_int(a, 1, 1 << 16, &iv)) goto bad;
      o.bucket_bytes = (size_t)iv << 20;
      break;
    case OPT_ZERO:
      name = "--zero";
      if (base_parse_int(a, 0, 1, &o.zero)) goto bad;
      break;
    case OPT_METRICS:
      o.metrics_path = a;
      break;
    case OPT_CKPTDIR:
      o.ckpt_dir = a;
      break;
    case OPT_CKPTEVERY:
      name = "--ckpt-every";
      if (base_parse_i64(a, 1, INT64_MAX / 2, &o.ckpt_every)) goto bad;
      break;
    case OPT_CKPTKEEP:
      name = "--ckpt-keep";
      if (base_parse_int(a, 1, 1000, &o.ckpt_keep)) goto bad;
      break;
    case OPT_TB:
      o.tb_dir = a;
      break;
    case OPT_QUIET:
      o.quiet = 1;
      break;
    case ':':
      return usage_error("option %s needs a value", argv[optind - 1]);
    default:
      return usage_error("unknown option '%s'", argv[optind - 1]);
    }
    continue;
  bad:
    fprintf(stderr, "cohort-gpt2: bad value '%s' for %s (see --help)\n", a, name);
    return 2;
  }
  if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);

  if (layers) o.cfg.layers = layers;
  if (heads) o.cfg.heads = heads;
  if (channels) o.cfg.channels = channels;
  if (vocab) o.cfg.vocab = vocab;
  if (positions) o.cfg.npos = positions;
  const char *why = NULL;
  if (gpt2_config_check(&o.cfg, &why) != 0) return usage_error("%s", why);
  if (o.T > o.cfg.npos) {
    fprintf(stderr, "cohort-gpt2: --seq-len %d exceeds the model's %d positions (see --help)\n",
            o.T, o.cfg.npos);
    return 2;
  }
  if (o.cfg.head == GPT2_HEAD_QA && o.data != NULL && strcmp(o.data, "fake") != 0)
    return usage_error("%s", "the qa head trains on fake data only (answer positions)");
  if (o.opt.kind == GPT2_OPT_SGD) {
    if (!set_lr) o.lr = 0.01f;
    if (!set_sched) o.schedule = GPT2_LR_CONST;
    if (!set_wd) o.opt.weight_decay = 0.0f;
    if (!set_warmup) o.warmup = 0;
  } else if (!set_warmup) {
    o.warmup = o.steps / 10 < 100 ? o.steps / 10 : 100;
  }
  return gpt2_train(&o);
}

/* model.c - GPT-2 parameters, activations, forward and backward (see model.h). */
#include "gpt2/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2/kernels.h"
#include "gpt2/rng.h"

int gpt2_config_preset(const char *name, gpt2_config *cfg) {
  gpt2_head head = cfg->head;
  if (strcmp(name, "124M") == 0) {
    *cfg = (gpt2_config){.vocab = 50257, .npos = 1024, .layers = 12, .heads = 12, .channels = 768};
  } else if (strcmp(name, "350M") == 0) {
    *cfg = (gpt2_config){.vocab = 50257, .npos = 1024, .layers = 24, .heads = 16, .channels = 1024};
  } else if (strcmp(name, "tiny") == 0) {
    *cfg = (gpt2_config){.vocab = 512, .npos = 64, .layers = 2, .heads = 4, .channels = 64};
  } else {
    return -EINVAL;
  }
  cfg->head = head;
  return 0;
}

int gpt2_config_check(const gpt2_config *cfg, const char **why) {
  if (cfg->vocab < 2 || cfg->vocab > (1 << 30)) {
    *why = "vocabulary size must be in 2..2^30";
  } else if (cfg->npos < 1 || cfg->npos > (1 << 20)) {
    *why = "number of positions must be in 1..2^20";
  } else if (cfg->layers < 1 || cfg->layers > 1024) {
    *why = "layers must be in 1..1024";
  } else if (cfg->heads < 1 || cfg->channels < 1 || cfg->channels > (1 << 16)) {
    *why = "heads and channels must be positive (channels <= 65536)";
  } else if (cfg->channels % cfg->heads != 0) {
    *why = "channels must be a multiple of heads";
  } else {
    return 0;
  }
  return -EINVAL;
}

/* Sizes of the tensors of one layer, in memory order. */
static void layer_sizes(size_t C, size_t out[GPT2_LAYER_TENSORS]) {
  size_t s[GPT2_LAYER_TENSORS] = {C, C, 3 * C * C, 3 * C, C * C,     C,
                                  C, C, 4 * C * C, 4 * C, 4 * C * C, C};
  memcpy(out, s, sizeof(s));
}

size_t gpt2_param_count(const gpt2_config *cfg) {
  size_t C = (size_t)cfg->channels, L = (size_t)cfg->layers;
  size_t ls[GPT2_LAYER_TENSORS], per = 0;
  layer_sizes(C, ls);
  for (int i = 0; i < GPT2_LAYER_TENSORS; i++) per += ls[i];
  size_t n = (size_t)cfg->vocab * C + (size_t)cfg->npos * C + L * per + 2 * C;
  if (cfg->head == GPT2_HEAD_QA) n += 2 * C + 2;
  return n;
}

/* Per-layer activation floats for B x T. */
static size_t layer_act_count(size_t B, size_t T, size_t C, size_t NH) {
  size_t BT = B * T;
  return BT * C + 2 * BT   /* ln1, mean, rstd */
         + BT * 3 * C      /* qkv */
         + B * NH * T * T  /* att */
         + BT * C + BT * C /* atty, res2 */
         + BT * C + 2 * BT /* ln2, mean, rstd */
         + 2 * BT * 4 * C  /* fch, fch_gelu */
         + BT * C;         /* res3 */
}

size_t gpt2_act_count(const gpt2_config *cfg, int Bi, int Ti) {
  size_t B = (size_t)Bi, T = (size_t)Ti, C = (size_t)cfg->channels, NH = (size_t)cfg->heads;
  size_t BT = B * T;
  size_t out = cfg->head == GPT2_HEAD_LM ? (size_t)cfg->vocab : 2;
  size_t nlse = cfg->head == GPT2_HEAD_LM ? BT : 2 * B;
  size_t nloss = cfg->head == GPT2_HEAD_LM ? BT : B;
  size_t n = BT * C; /* encoded */
  n += (size_t)cfg->layers * layer_act_count(B, T, C, NH);
  n += BT * C + 2 * BT;                                   /* lnf */
  n += BT * out + nlse + nloss;                           /* logits, lse, losses */
  n += BT * C * 2 + BT * 4 * C + BT * 3 * C + B * NH * T; /* backward scratch */
  return n;
}

double gpt2_flops_per_step(const gpt2_config *cfg, int Bi, int Ti) {
  double BT = (double)Bi * Ti, C = cfg->channels, L = cfg->layers, T = Ti;
  /* Per token: 2 FLOPs per weight of each matmul, plus q.k and att.v over
   * the (T+1)/2 keys a causal query sees on average. Backward costs twice the
   * forward. */
  double fwd = BT * (2.0 * 12.0 * C * C * L + 2.0 * 2.0 * C * (T + 1.0) / 2.0 * L);
  fwd += BT * 2.0 * C * (cfg->head == GPT2_HEAD_LM ? (double)cfg->vocab : 2.0);
  return 3.0 * fwd;
}

static void set_views(gpt2_model *m, float *base, gpt2_params *v) {
  size_t C = (size_t)m->cfg.channels;
  v->wte = base;
  v->wpe = base + (size_t)m->cfg.vocab * C;
  size_t ls[GPT2_LAYER_TENSORS];
  layer_sizes(C, ls);
  for (int l = 0; l < m->cfg.layers; l++) {
    float *p = base + m->layer_offset0 + (size_t)l * m->layer_size;
    float **f[GPT2_LAYER_TENSORS] = {
        &v->layer[l].ln1w,     &v->layer[l].ln1b,     &v->layer[l].qkvw,    &v->layer[l].qkvb,
        &v->layer[l].attprojw, &v->layer[l].attprojb, &v->layer[l].ln2w,    &v->layer[l].ln2b,
        &v->layer[l].fcw,      &v->layer[l].fcb,      &v->layer[l].fcprojw, &v->layer[l].fcprojb};
    for (int i = 0; i < GPT2_LAYER_TENSORS; i++) {
      *f[i] = p;
      p += ls[i];
    }
  }
  v->lnfw = base + m->tail_offset;
  v->lnfb = v->lnfw + C;
  if (m->cfg.head == GPT2_HEAD_QA) {
    v->qaw = v->lnfb + C;
    v->qab = v->qaw + 2 * C;
  } else {
    v->qaw = v->qab = NULL;
  }
}

static void add_tensor(gpt2_model *m, const char *name, size_t offset, int rows, int cols) {
  gpt2_tensor *t = &m->tensors[m->ntensors++];
  snprintf(t->name, sizeof(t->name), "%s", name);
  t->offset = offset;
  t->rows = rows;
  t->cols = cols;
  t->size = (size_t)rows * (size_t)cols;
  t->decay = rows > 1;
}

static void build_tensor_table(gpt2_model *m) {
  int C = m->cfg.channels;
  static const char *lnames[GPT2_LAYER_TENSORS] = {"ln1w",     "ln1b",     "qkvw",    "qkvb",
                                                   "attprojw", "attprojb", "ln2w",    "ln2b",
                                                   "fcw",      "fcb",      "fcprojw", "fcprojb"};
  int rows[GPT2_LAYER_TENSORS] = {1, 1, 3 * C, 1, C, 1, 1, 1, 4 * C, 1, C, 1};
  int cols[GPT2_LAYER_TENSORS] = {C, C, C, 3 * C, C, C, C, C, C, 4 * C, 4 * C, C};
  m->ntensors = 0;
  add_tensor(m, "wte", 0, m->cfg.vocab, C);
  add_tensor(m, "wpe", (size_t)m->cfg.vocab * (size_t)C, m->cfg.npos, C);
  size_t off = m->layer_offset0;
  for (int l = 0; l < m->cfg.layers; l++) {
    for (int i = 0; i < GPT2_LAYER_TENSORS; i++) {
      char name[32];
      snprintf(name, sizeof(name), "h%d.%s", l, lnames[i]);
      add_tensor(m, name, off, rows[i], cols[i]);
      off += (size_t)rows[i] * (size_t)cols[i];
    }
  }
  add_tensor(m, "lnfw", m->tail_offset, 1, C);
  add_tensor(m, "lnfb", m->tail_offset + (size_t)C, 1, C);
  if (m->cfg.head == GPT2_HEAD_QA) {
    add_tensor(m, "qaw", m->tail_offset + 2 * (size_t)C, 2, C);
    add_tensor(m, "qab", m->tail_offset + 4 * (size_t)C, 1, 2);
  }
}

/* The activations: views into m->acts in llm.c's order, layer by layer. */
static void set_act_views(gpt2_model *m) {
  const gpt2_config *cfg = &m->cfg;
  size_t C = (size_t)cfg->channels, L = (size_t)cfg->layers, NH = (size_t)cfg->heads;
  size_t B = (size_t)m->B, T = (size_t)m->T, BT = B * T;
  float **lp = m->layer_ptrs;
  m->ln1 = lp;
  m->ln1_mean = lp + L;
  m->ln1_rstd = lp + 2 * L;
  m->qkv = lp + 3 * L;
  m->att = lp + 4 * L;
  m->atty = lp + 5 * L;
  m->res2 = lp + 6 * L;
  m->ln2 = lp + 7 * L;
  m->ln2_mean = lp + 8 * L;
  m->ln2_rstd = lp + 9 * L;
  m->fch = lp + 10 * L;
  m->fch_gelu = lp + 11 * L;
  m->res3 = lp + 12 * L;
  float *a = m->acts;
#define TAKE(n) (a += (n), a - (n))
  m->encoded = TAKE(BT * C);
  for (size_t l = 0; l < L; l++) {
    m->ln1[l] = TAKE(BT * C);
    m->ln1_mean[l] = TAKE(BT);
    m->ln1_rstd[l] = TAKE(BT);
    m->qkv[l] = TAKE(BT * 3 * C);
    m->att[l] = TAKE(B * NH * T * T);
    m->atty[l] = TAKE(BT * C);
    m->res2[l] = TAKE(BT * C);
    m->ln2[l] = TAKE(BT * C);
    m->ln2_mean[l] = TAKE(BT);
    m->ln2_rstd[l] = TAKE(BT);
    m->fch[l] = TAKE(BT * 4 * C);
    m->fch_gelu[l] = TAKE(BT * 4 * C);
    m->res3[l] = TAKE(BT * C);
  }
  m->lnf = TAKE(BT * C);
  m->lnf_mean = TAKE(BT);
  m->lnf_rstd = TAKE(BT);
  if (cfg->head == GPT2_HEAD_LM) {
    m->logits = TAKE(BT * (size_t)cfg->vocab);
    m->lse = TAKE(BT);
    m->losses = TAKE(BT);
  } else {
    m->logits = TAKE(BT * 2);
    m->lse = TAKE(2 * B);
    m->losses = TAKE(B);
  }
  m->dres = TAKE(BT * C);
  m->dC = TAKE(BT * C);
  m->d4C = TAKE(BT * 4 * C);
  m->dqkv = TAKE(BT * 3 * C);
  m->attscratch = TAKE(B * NH * T);
#undef TAKE
}

int gpt2_model_init(gpt2_model *m, const gpt2_config *cfg, int Bi, int Ti) {
  const char *why;
  memset(m, 0, sizeof(*m));
  if (gpt2_config_check(cfg, &why) != 0 || Bi < 1 || Ti < 1 || Ti > cfg->npos) return -EINVAL;
  m->cfg = *cfg;
  m->B = Bi;
  m->T = Ti;
  size_t C = (size_t)cfg->channels, L = (size_t)cfg->layers;
  size_t ls[GPT2_LAYER_TENSORS];
  layer_sizes(C, ls);
  m->layer_size = 0;
  for (int i = 0; i < GPT2_LAYER_TENSORS; i++) m->layer_size += ls[i];
  m->layer_offset0 = ((size_t)cfg->vocab + (size_t)cfg->npos) * C;
  m->tail_offset = m->layer_offset0 + L * m->layer_size;
  m->nparams = gpt2_param_count(cfg);
  m->nacts = gpt2_act_count(cfg, Bi, Ti);

  /* Page-aligned anonymous mappings (zeroed by the kernel). */
  size_t pbytes = (m->nparams * sizeof(float) + 63) / 64 * 64;
  size_t abytes = (m->nacts * sizeof(float) + 63) / 64 * 64;
  m->params = gpt2_big_alloc(pbytes);
  m->grads = gpt2_big_alloc(pbytes);
  m->acts = gpt2_big_alloc(abytes);
  m->param_bytes = pbytes;
  m->act_bytes = abytes;
  m->p.layer = calloc(L, sizeof(gpt2_layer));
  m->g.layer = calloc(L, sizeof(gpt2_layer));
  m->tensors = calloc(4 + L * GPT2_LAYER_TENSORS + 2, sizeof(gpt2_tensor));
  m->layer_ptrs = calloc(L * 13, sizeof(float *));
  if (!m->params || !m->grads || !m->acts || !m->p.layer || !m->g.layer || !m->tensors ||
      !m->layer_ptrs) {
    gpt2_model_free(m);
    return -ENOMEM;
  }
  set_views(m, m->params, &m->p);
  set_views(m, m->grads, &m->g);
  build_tensor_table(m);

  set_act_views(m);
  return 0; /* the gradients are zero: fresh mappings */
}

void gpt2_model_free(gpt2_model *m) {
  if (m == NULL) return;
  gpt2_big_free(m->params, m->param_bytes);
  if (!m->grads_external) gpt2_big_free(m->grads, m->param_bytes);
  gpt2_big_free(m->acts, m->act_bytes);
  free(m->p.layer);
  free(m->g.layer);
  free(m->tensors);
  free(m->layer_ptrs);
  memset(m, 0, sizeof(*m));
}

void gpt2_model_init_weights(gpt2_model *m, uint64_t seed) {
  const size_t chunk = 1 << 16;
  float resid_std = 0.02f / sqrtf(2.0f * (float)m->cfg.layers);
  for (int ti = 0; ti < m->ntensors; ti++) {
    const gpt2_tensor *t = &m->tensors[ti];
    const char *dot = strchr(t->name, '.');
    const char *base = dot ? dot + 1 : t->name;
    float *p = m->params + t->offset;
    int is_ln_gain =
        strcmp(base, "ln1w") == 0 || strcmp(base, "ln2w") == 0 || strcmp(base, "lnfw") == 0;
    if (t->rows == 1) {
      /* Biases start at zero, layernorm gains at one. */
      for (size_t i = 0; i < t->size; i++) p[i] = is_ln_gain ? 1.0f : 0.0f;
      continue;
    }
    float std = (strcmp(base, "attprojw") == 0 || strcmp(base, "fcprojw") == 0) ? resid_std : 0.02f;
    size_t nchunks = (t->size + chunk - 1) / chunk;
    /* Each chunk has its own derived stream, so the result does not depend on
     * the number of threads. */
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nchunks; c++) {
      uint64_t st = gpt2_rng_derive(seed, (uint64_t)ti, (uint64_t)c, 0x1417);
      size_t end = (c + 1) * chunk < t->size ? (c + 1) * chunk : t->size;
      for (size_t i = c * chunk; i < end; i++) p[i] = std * gpt2_rng_normal(&st);
    }
  }
}

void gpt2_zero_grad(gpt2_model *m) {
  size_t n = m->nparams;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i += 4096) {
    size_t len = i + 4096 < n ? 4096 : n - i;
    memset(m->grads + i, 0, len * sizeof(float));
  }
}

void gpt2_discard_grad(gpt2_model *m) {
  m->grads_discarded = 1;
}

void gpt2_model_use_grads(gpt2_model *m, float *buf) {
  if (!m->grads_external) gpt2_big_free(m->grads, m->param_bytes);
  m->grads = buf;
  m->grads_external = 1;
  set_views(m, m->grads, &m->g);
}

int gpt2_model_own_grads(gpt2_model *m) {
  if (!m->grads_external) return 0;
  float *buf = gpt2_big_alloc(m->param_bytes);
  if (buf == NULL) return -ENOMEM;
  m->grads = buf;
  m->grads_external = 0;
  set_views(m, m->grads, &m->g);
  return 0;
}

double gpt2_forward(gpt2_model *m, const gpt2_batch *batch) {
  return gpt2_forward_wait(m, batch, NULL, NULL);
}

static int need(gpt2_param_wait wait, void *ctx, size_t lo, size_t hi) {
  return wait != NULL && wait(ctx, lo, hi, NULL, 0) != 0;
}

double gpt2_forward_wait(gpt2_model *m, const gpt2_batch *batch, gpt2_param_wait wait, void *ctx) {
  size_t B = (size_t)m->B, T = (size_t)m->T, C = (size_t)m->cfg.channels;
  size_t NH = (size_t)m->cfg.heads, V = (size_t)m->cfg.vocab, BT = B * T;
  size_t wte_end = V * C;
  if (wait && wait(ctx, 0, wte_end, batch->tokens, BT) != 0) return NAN;
  if (need(wait, ctx, wte_end, m->layer_offset0)) return NAN;
  gpt2_encoder_forward(m->encoded, batch->tokens, m->p.wte, m->p.wpe, B, T, C);
  const float *x = m->encoded; // (B, T, C) residual stream
  for (int l = 0; l < m->cfg.layers; l++) {
    const gpt2_layer *w = &m->p.layer[l];
    size_t lo = m->layer_offset0 + (size_t)l * m->layer_size;
    if (need(wait, ctx, lo, lo + m->layer_size)) return NAN;
    gpt2_layernorm_forward(m->ln1[l], m->ln1_mean[l], m->ln1_rstd[l], x, w->ln1w, w->ln1b, BT, C);
    gpt2_matmul_forward(m->qkv[l], m->ln1[l], w->qkvw, w->qkvb, BT, C, 3 * C, 0);
    gpt2_attention_forward(m->atty[l], m->att[l], m->qkv[l], batch->mask, B, T, C, NH);
    /* res2 = x + atty @ attprojw^T + b: copy the residual, then accumulate. */
    memcpy(m->res2[l], x, BT * C * sizeof(float));
    gpt2_matmul_forward(m->res2[l], m->atty[l], w->attprojw, w->attprojb, BT, C, C, 1);
    gpt2_layernorm_forward(m->ln2[l], m->ln2_mean[l], m->ln2_rstd[l], m->res2[l], w->ln2w, w->ln2b,
                           BT, C);
    gpt2_matmul_forward(m->fch[l], m->ln2[l], w->fcw, w->fcb, BT, C, 4 * C, 0);
    gpt2_gelu_forward(m->fch_gelu[l], m->fch[l], BT * 4 * C);
    memcpy(m->res3[l], m->res2[l], BT * C * sizeof(float));
    gpt2_matmul_forward(m->res3[l], m->fch_gelu[l], w->fcprojw, w->fcprojb, BT, 4 * C, C, 1);
    x = m->res3[l];
  }
  if (need(wait, ctx, m->tail_offset, m->nparams)) return NAN;
  gpt2_layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, x, m->p.lnfw, m->p.lnfb, BT, C);
  if (m->cfg.head == GPT2_HEAD_LM) {
    /* The logits in blocks of the vocabulary: each block of wte is read as soon as it is ready. */
    for (size_t j0 = 0; j0 < V; j0 += GPT2_HEAD_ROWS) {
      size_t j1 = j0 + GPT2_HEAD_ROWS < V ? j0 + GPT2_HEAD_ROWS : V;
      if (need(wait, ctx, j0 * C, j1 * C)) return NAN;
      gpt2_matmul_forward_rows(m->logits, m->lnf, m->p.wte, BT, C, V, j0, j1);
    }
    m->loss = gpt2_crossentropy_forward(m->lse, m->losses, m->logits, batch->targets, BT, V);
  } else {
    gpt2_matmul_forward(m->logits, m->lnf, m->p.qaw, m->p.qab, BT, C, 2, 0);
    m->loss = gpt2_qa_loss_forward(m->lse, m->losses, m->logits, batch->start, batch->end, B, T);
  }
  return m->loss;
}

void gpt2_backward(gpt2_model *m, const gpt2_batch *batch, float dloss, gpt2_grad_hook hook,
                   void *hook_ctx, int scatter_wte) {
  size_t B = (size_t)m->B, T = (size_t)m->T, C = (size_t)m->cfg.channels;
  size_t NH = (size_t)m->cfg.heads, V = (size_t)m->cfg.vocab, BT = B * T;
  int L = m->cfg.layers, st = m->grads_discarded; /* store: the first write of each gradient */
  m->grads_discarded = 0;
  if (st) {
    /* What backward only adds into: the lookup's rows (the head's share stores all of dwte). */
    memset(m->g.wpe, 0, (size_t)m->cfg.npos * C * sizeof(float));
    if (m->cfg.head != GPT2_HEAD_LM) memset(m->g.wte, 0, V * C * sizeof(float));
  }
  /* dres accumulates d(residual stream) from the top down. */
  if (m->cfg.head == GPT2_HEAD_LM) {
    /* dloss is per sequence-mean; each of the BT tokens carries 1/BT. */
    gpt2_crossentropy_backward(m->logits, m->lse, batch->targets, dloss / (float)BT, BT, V);
    /* dwte's head part in row blocks, each announced as soon as it is in: the exchange of the
     * largest gradient starts while the rest of the head's backward runs. */
    for (size_t j0 = 0; j0 < V; j0 += GPT2_HEAD_ROWS) {
      size_t j1 = j0 + GPT2_HEAD_ROWS < V ? j0 + GPT2_HEAD_ROWS : V;
      gpt2_matmul_backward_rows(m->g.wte, NULL, m->logits, m->lnf, BT, C, V, j0, j1, st);
      if (hook && hook(hook_ctx, GPT2_EV_HEAD, (int)j1)) return;
    }
    gpt2_matmul_backward(m->dC, NULL, NULL, m->logits, m->lnf, m->p.wte, BT, C, V, 0, 0);
  } else {
    float *dlogits = m->d4C; // (B, T, 2)
    gpt2_qa_loss_backward(dlogits, m->logits, m->lse, batch->start, batch->end, dloss / (float)B, B,
                          T);
    gpt2_matmul_backward(m->dC, m->g.qaw, m->g.qab, dlogits, m->lnf, m->p.qaw, BT, C, 2, 0, st);
    if (hook && hook(hook_ctx, GPT2_EV_HEAD, (int)V)) return; /* no head part in dwte: all in */
  }
  memset(m->dres, 0, BT * C * sizeof(float));
  const float *xlast = L > 0 ? m->res3[L - 1] : m->encoded;
  gpt2_layernorm_backward(m->dres, m->g.lnfw, m->g.lnfb, m->dC, xlast, m->p.lnfw, m->lnf_mean,
                          m->lnf_rstd, BT, C, st);
  if (hook && hook(hook_ctx, GPT2_EV_TAIL, -1)) return;
  for (int l = L - 1; l >= 0; l--) {
    const gpt2_layer *w = &m->p.layer[l];
    gpt2_layer *gw = &m->g.layer[l];
    const float *x = l > 0 ? m->res3[l - 1] : m->encoded;
    /* MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
    gpt2_matmul_backward(m->d4C, gw->fcprojw, gw->fcprojb, m->dres, m->fch_gelu[l], w->fcprojw, BT,
                         4 * C, C, 0, st);
    gpt2_gelu_backward(m->d4C, m->fch[l], m->d4C, BT * 4 * C);
    gpt2_matmul_backward(m->dC, gw->fcw, gw->fcb, m->d4C, m->ln2[l], w->fcw, BT, C, 4 * C, 0, st);
    gpt2_layernorm_backward(m->dres, gw->ln2w, gw->ln2b, m->dC, m->res2[l], w->ln2w, m->ln2_mean[l],
                            m->ln2_rstd[l], BT, C, st);
    /* Attention: res2 = x + attproj(attn(qkv(ln1(x)))) */
    gpt2_matmul_backward(m->dC, gw->attprojw, gw->attprojb, m->dres, m->atty[l], w->attprojw, BT, C,
                         C, 0, st);
    gpt2_attention_backward(m->dqkv, m->attscratch, m->dC, m->qkv[l], m->att[l], B, T, C, NH);
    gpt2_matmul_backward(m->dC, gw->qkvw, gw->qkvb, m->dqkv, m->ln1[l], w->qkvw, BT, C, 3 * C, 0,
                         st);
    gpt2_layernorm_backward(m->dres, gw->ln1w, gw->ln1b, m->dC, x, w->ln1w, m->ln1_mean[l],
                            m->ln1_rstd[l], BT, C, st);
    if (hook && hook(hook_ctx, GPT2_EV_LAYER, l)) return;
  }
  gpt2_encoder_backward(scatter_wte ? m->g.wte : NULL, m->g.wpe, m->dres, batch->tokens, B, T, C);
  if (hook) (void)hook(hook_ctx, GPT2_EV_EMBED, -1);
}

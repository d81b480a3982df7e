/*
 * test_gpt2.c - unit tests of src/gpt2: finite-difference gradient checks of
 * every kernel and of the whole model (both heads), the optimisers, data
 * files and fake data, and checkpoints (round trip, damaged files).
 *
 * Gradient checks run in float32, so they use central differences with a
 * step of 1e-2..1e-3, objectives reduced in double, and relative tolerances:
 * L = sum(out * R) for a fixed random R, compared along random directions
 * (which covers every element at once) and element by element for a few
 * entries.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpt2/ckpt.h"
#include "gpt2/data.h"
#include "gpt2/kernels.h"
#include "gpt2/model.h"
#include "gpt2/optim.h"
#include "gpt2/rng.h"
#include "tests/check.h"

static uint64_t rng_state = 42;

static float *randn(size_t n, float std) {
  float *x = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) x[i] = std * gpt2_rng_normal(&rng_state);
  return x;
}

/* max |a - b| / max |a| over n elements. */
static double max_rel_diff(const float *a, const float *b, size_t n) {
  double d = 0.0, top = 1e-30;
  for (size_t i = 0; i < n; i++) {
    d = fmax(d, fabs((double)a[i] - b[i]));
    top = fmax(top, fabs(a[i]));
  }
  return d / top;
}

static double dot(const float *a, const float *b, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

/* A differentiable scalar function of some float buffers. */
typedef double (*objective_fn)(void *ctx);

/*
 * Checks an analytic gradient `grad` of f with respect to `x` (n floats):
 * along 3 random directions and at 5 single elements. Returns the worst
 * relative error seen.
 */
static double fd_check(const char *what, objective_fn f, void *ctx, float *x, const float *grad,
                       size_t n, float h, double tol) {
  double worst = 0.0;
  float *save = malloc(n * sizeof(float));
  memcpy(save, x, n * sizeof(float));
  double gnorm = sqrt(dot(grad, grad, n));
  for (int k = 0; k < 8; k++) {
    float *d = NULL;
    size_t idx = 0;
    if (k < 3) {
      d = randn(n, 1.0f);
      double dn = sqrt(dot(d, d, n));
      for (size_t i = 0; i < n; i++) d[i] = (float)(d[i] / dn);
    } else {
      idx = (size_t)(gpt2_rng_next(&rng_state) % n);
    }
    for (size_t i = 0; i < n; i++) x[i] = save[i] + h * (d ? d[i] : (i == idx ? 1.0f : 0.0f));
    double fp = f(ctx);
    for (size_t i = 0; i < n; i++) x[i] = save[i] - h * (d ? d[i] : (i == idx ? 1.0f : 0.0f));
    double fm = f(ctx);
    memcpy(x, save, n * sizeof(float));
    double fd = (fp - fm) / (2.0 * h);
    double an = d ? dot(grad, d, n) : grad[idx];
    /* Relative to the gradient's overall scale, so tiny components are not
     * judged against float32 rounding of the objective; gradients that are
     * zero in exact arithmetic (a bias under softmax shift invariance) are
     * held to an absolute 5e-3 * tol. */
    double scale = d ? gnorm : fmax(fabs(an), gnorm / sqrt((double)n));
    double err = fabs(fd - an) / fmax(scale, 5e-3);
    if (err > worst) worst = err;
    if (err > tol) {
      fprintf(stderr, "  %s: %s: analytic %.6g numeric %.6g (rel err %.3g)\n", what,
              d ? "direction" : "element", an, fd, err);
    }
    free(d);
  }
  free(save);
  CHECK(worst <= tol);
  return worst;
}

/* ---- per-kernel checks ---- */

enum { KB = 2, KT = 5, KC = 8, KNH = 2, KV = 11 };

typedef struct kctx {
  int which;
  float *a, *b, *c; /* inputs */
  float *out, *r;   /* output and its random weights */
  size_t nout;
  float *mean, *rstd, *att, *lse, *losses;
  int32_t *tok, *mask, *tgt, *start, *end;
} kctx;

static double kernel_objective(void *p) {
  kctx *k = p;
  switch (k->which) {
  case 0:
    gpt2_layernorm_forward(k->out, k->mean, k->rstd, k->a, k->b, k->c, KB * KT, KC);
    break;
  case 1:
    gpt2_matmul_forward(k->out, k->a, k->b, k->c, KB * KT, KC, 3 * KC, 0);
    break;
  case 2:
    gpt2_attention_forward(k->out, k->att, k->a, k->mask, KB, KT, KC, KNH);
    break;
  case 3:
    gpt2_gelu_forward(k->out, k->a, KB * KT * KC);
    break;
  case 4:
    gpt2_encoder_forward(k->out, k->tok, k->a, k->b, KB, KT, KC);
    break;
  case 5:
    return gpt2_crossentropy_forward(k->lse, k->losses, k->a, k->tgt, KB * KT, KV);
  case 6:
    return gpt2_qa_loss_forward(k->lse, k->losses, k->a, k->start, k->end, KB, KT);
  }
  return dot(k->out, k->r, k->nout);
}

static void test_kernels(void) {
  const size_t N = KB * KT;
  kctx k = {0};
  k.mean = calloc(N, sizeof(float));
  k.rstd = calloc(N, sizeof(float));
  k.att = calloc(KB * KNH * KT * KT, sizeof(float));
  k.lse = calloc(N, sizeof(float));
  k.losses = calloc(N, sizeof(float));
  k.tok = calloc(N, sizeof(int32_t));
  k.mask = calloc(N, sizeof(int32_t));
  k.tgt = calloc(N, sizeof(int32_t));
  k.start = calloc(KB, sizeof(int32_t));
  k.end = calloc(KB, sizeof(int32_t));
  for (size_t i = 0; i < N; i++) {
    k.tok[i] = (int32_t)(gpt2_rng_next(&rng_state) % KV);
    k.tgt[i] = (int32_t)(gpt2_rng_next(&rng_state) % KV);
    k.mask[i] = (i % 3) != 1;
  }
  k.mask[KT] = 0; /* sequence 1: key 0 masked, so query 0 sees only masked keys */
  k.start[0] = 1, k.end[0] = 4, k.start[1] = 0, k.end[1] = 0;

  /* layernorm: d/d(inp, w, b) */
  {
    k.which = 0;
    k.a = randn(N * KC, 1.0f);
    k.b = randn(KC, 1.0f);
    k.c = randn(KC, 1.0f);
    for (size_t i = 0; i < N * KC; i++) k.a[i] += 3.0f; /* a large mean */
    k.nout = N * KC;
    k.out = calloc(k.nout, sizeof(float));
    k.r = randn(k.nout, 1.0f);
    float *di = calloc(N * KC, sizeof(float)), *dw = calloc(KC, sizeof(float)),
          *db = calloc(KC, sizeof(float));
    kernel_objective(&k);
    gpt2_layernorm_backward(di, dw, db, k.r, k.a, k.b, k.mean, k.rstd, N, KC, 0);
    fd_check("layernorm dinp", kernel_objective, &k, k.a, di, N * KC, 1e-2f, 2e-3);
    fd_check("layernorm dw", kernel_objective, &k, k.b, dw, KC, 1e-2f, 2e-3);
    fd_check("layernorm db", kernel_objective, &k, k.c, db, KC, 1e-2f, 2e-3);
    /* Accumulation: a second backward adds the same amount again. */
    float before = db[0];
    float *dw1 = malloc(KC * sizeof(float)), *db1 = malloc(KC * sizeof(float));
    memcpy(dw1, dw, KC * sizeof(float));
    memcpy(db1, db, KC * sizeof(float));
    gpt2_layernorm_backward(di, dw, db, k.r, k.a, k.b, k.mean, k.rstd, N, KC, 0);
    CHECK(fabsf(db[0] - 2.0f * before) <= 1e-5f * fabsf(before) + 1e-6f);
    /* Store: over what is there, the bits of the first backward into zeros. */
    gpt2_layernorm_backward(di, dw, db, k.r, k.a, k.b, k.mean, k.rstd, N, KC, 1);
    CHECK(memcmp(dw, dw1, KC * sizeof(float)) == 0 && memcmp(db, db1, KC * sizeof(float)) == 0);
    free(dw1), free(db1);
    free(di), free(dw), free(db), free(k.a), free(k.b), free(k.c), free(k.out), free(k.r);
  }
  /* matmul: d/d(inp, w, bias) */
  {
    k.which = 1;
    k.a = randn(N * KC, 1.0f);
    k.b = randn(3 * KC * KC, 0.5f);
    k.c = randn(3 * KC, 1.0f);
    k.nout = N * 3 * KC;
    k.out = calloc(k.nout, sizeof(float));
    k.r = randn(k.nout, 1.0f);
    float *di = calloc(N * KC, sizeof(float)), *dw = calloc(3 * KC * KC, sizeof(float)),
          *db = calloc(3 * KC, sizeof(float));
    kernel_objective(&k);
    gpt2_matmul_backward(di, dw, db, k.r, k.a, k.b, N, KC, 3 * KC, 0, 0);
    fd_check("matmul dinp", kernel_objective, &k, k.a, di, N * KC, 1e-2f, 1e-3);
    fd_check("matmul dw", kernel_objective, &k, k.b, dw, 3 * KC * KC, 1e-2f, 1e-3);
    fd_check("matmul dbias", kernel_objective, &k, k.c, db, 3 * KC, 1e-2f, 1e-3);
    /* dw and dbias in row blocks of 5 (the last one short): the same as all at once, up to the
     * rounding of sgemm's differently shaped calls. */
    float *dw2 = calloc(3 * KC * KC, sizeof(float)), *db2 = calloc(3 * KC, sizeof(float));
    for (size_t j0 = 0; j0 < 3 * KC; j0 += 5)
      gpt2_matmul_backward_rows(dw2, db2, k.r, k.a, N, KC, 3 * KC, j0,
                                j0 + 5 < 3 * KC ? j0 + 5 : 3 * KC, 0);
    CHECK(max_rel_diff(dw, dw2, 3 * KC * KC) < 1e-5);
    CHECK(memcmp(db, db2, 3 * KC * sizeof(float)) == 0);
    /* Store: over what is there (NaN), the bits of the backward into zeros. */
    for (size_t i = 0; i < 3 * KC * KC; i++) dw2[i] = NAN;
    for (size_t i = 0; i < 3 * KC; i++) db2[i] = NAN;
    gpt2_matmul_backward(NULL, dw2, db2, k.r, k.a, k.b, N, KC, 3 * KC, 0, 1);
    CHECK(memcmp(dw, dw2, 3 * KC * KC * sizeof(float)) == 0);
    CHECK(memcmp(db, db2, 3 * KC * sizeof(float)) == 0);
    free(dw2), free(db2);
    /* The forward in row blocks of w (columns of out): what the one call computes. */
    float *o1 = malloc(k.nout * sizeof(float)), *o3 = malloc(k.nout * sizeof(float));
    gpt2_matmul_forward(o1, k.a, k.b, NULL, N, KC, 3 * KC, 0);
    for (size_t j0 = 0; j0 < 3 * KC; j0 += 5)
      gpt2_matmul_forward_rows(o3, k.a, k.b, N, KC, 3 * KC, j0, j0 + 5 < 3 * KC ? j0 + 5 : 3 * KC);
    CHECK(max_rel_diff(o1, o3, k.nout) < 1e-6);
    free(o1), free(o3);
    /* accumulate=1 adds inp @ w^T + bias to what is there. */
    float *o2 = malloc(k.nout * sizeof(float));
    for (size_t i = 0; i < k.nout; i++) o2[i] = 1.0f;
    gpt2_matmul_forward(o2, k.a, k.b, k.c, N, KC, 3 * KC, 1);
    kernel_objective(&k);
    double maxd = 0;
    for (size_t i = 0; i < k.nout; i++) maxd = fmax(maxd, fabs(o2[i] - 1.0f - k.out[i]));
    CHECK(maxd < 1e-5);
    free(o2), free(di), free(dw), free(db), free(k.a), free(k.b), free(k.c), free(k.out), free(k.r);
  }
  /* attention with and without the padding mask: d/d(qkv) */
  for (int masked = 0; masked < 2; masked++) {
    k.which = 2;
    int32_t *save_mask = k.mask;
    if (!masked) k.mask = NULL;
    k.a = randn(N * 3 * KC, 1.0f);
    k.nout = N * KC;
    k.out = calloc(k.nout, sizeof(float));
    k.r = randn(k.nout, 1.0f);
    float *dq = calloc(N * 3 * KC, sizeof(float)), *scratch = calloc(KB * KNH * KT, sizeof(float));
    kernel_objective(&k);
    /* Causality: row t of the probabilities is zero beyond t and sums to 1. */
    int causal_ok = 1;
    for (size_t r = 0; r < KB * KNH; r++) {
      for (size_t t = 0; t < KT; t++) {
        double s = 0;
        for (size_t t2 = 0; t2 < KT; t2++) {
          float p = k.att[(r * KT + t) * KT + t2];
          if (t2 > t && p != 0.0f) causal_ok = 0;
          s += p;
        }
        if (fabs(s - 1.0) > 1e-5) causal_ok = 0;
      }
    }
    CHECK(causal_ok);
    if (masked) {
      /* A masked key gets (almost) no weight when the query has any
       * unmasked key: sequence 0, query 2, key 1 is masked (1 % 3 == 1). */
      CHECK(k.att[(0 * KT + 2) * KT + 1] < 1e-6f);
      CHECK(k.att[(0 * KT + 2) * KT + 0] > 1e-3f);
    }
    gpt2_attention_backward(dq, scratch, k.r, k.a, k.att, KB, KT, KC, KNH);
    fd_check(masked ? "attention (masked) dqkv" : "attention dqkv", kernel_objective, &k, k.a, dq,
             N * 3 * KC, 1e-2f, 2e-3);
    k.mask = save_mask;
    free(dq), free(scratch), free(k.a), free(k.out), free(k.r);
  }
  /* gelu */
  {
    k.which = 3;
    k.a = randn(N * KC, 2.0f);
    k.nout = N * KC;
    k.out = calloc(k.nout, sizeof(float));
    k.r = randn(k.nout, 1.0f);
    float *di = calloc(N * KC, sizeof(float));
    gpt2_gelu_backward(di, k.a, k.r, N * KC);
    fd_check("gelu", kernel_objective, &k, k.a, di, N * KC, 1e-3f, 2e-3);
    /* GELU(0) = 0, GELU(large) = x, GELU(-large) = 0. */
    float x[3] = {0.0f, 10.0f, -10.0f}, y[3];
    gpt2_gelu_forward(y, x, 3);
    CHECK(y[0] == 0.0f && fabsf(y[1] - 10.0f) < 1e-5f && fabsf(y[2]) < 1e-5f);
    free(di), free(k.a), free(k.out), free(k.r);
  }
  /* encoder: d/d(wte, wpe), with repeated tokens */
  {
    k.which = 4;
    k.a = randn(KV * KC, 1.0f);
    k.b = randn(KT * KC, 1.0f);
    k.tok[1] = k.tok[0];
    k.nout = N * KC;
    k.out = calloc(k.nout, sizeof(float));
    k.r = randn(k.nout, 1.0f);
    float *dwte = calloc(KV * KC, sizeof(float)), *dwpe = calloc(KT * KC, sizeof(float));
    gpt2_encoder_backward(dwte, dwpe, k.r, k.tok, KB, KT, KC);
    fd_check("encoder dwte", kernel_objective, &k, k.a, dwte, KV * KC, 1e-2f, 1e-3);
    fd_check("encoder dwpe", kernel_objective, &k, k.b, dwpe, KT * KC, 1e-2f, 1e-3);
    /* The scatter helper does the same as the encoder's dwte part. */
    float *dwte2 = calloc(KV * KC, sizeof(float));
    gpt2_embedding_scatter_add(dwte2, k.r, k.tok, N, KC);
    CHECK(memcmp(dwte, dwte2, KV * KC * sizeof(float)) == 0);
    free(dwte2), free(dwte), free(dwpe), free(k.a), free(k.b), free(k.out), free(k.r);
  }
  /* cross-entropy (logits scaled up to exercise the max subtraction) */
  {
    k.which = 5;
    k.a = randn(N * KV, 3.0f);
    k.a[0] = 80.0f; /* exp(80) overflows float without the max subtraction */
    double loss = kernel_objective(&k);
    CHECK(isfinite(loss));
    float *dl = malloc(N * KV * sizeof(float));
    memcpy(dl, k.a, N * KV * sizeof(float));
    gpt2_crossentropy_backward(dl, k.lse, k.tgt, 1.0f / (float)N, N, KV);
    fd_check("crossentropy", kernel_objective, &k, k.a, dl, N * KV, 1e-2f, 1e-3);
    free(dl), free(k.a);
  }
  /* QA loss */
  {
    k.which = 6;
    k.a = randn(N * 2, 2.0f);
    kernel_objective(&k);
    float *dl = calloc(N * 2, sizeof(float));
    gpt2_qa_loss_backward(dl, k.a, k.lse, k.start, k.end, 1.0f / KB, KB, KT);
    fd_check("qa loss", kernel_objective, &k, k.a, dl, N * 2, 1e-2f, 1e-3);
    free(dl), free(k.a);
  }
  free(k.mean), free(k.rstd), free(k.att), free(k.lse), free(k.losses), free(k.tok), free(k.mask),
      free(k.tgt), free(k.start), free(k.end);
}

/* ---- whole model ---- */

typedef struct mctx {
  gpt2_model *m;
  gpt2_batch *batch;
} mctx;

static double model_objective(void *p) {
  mctx *c = p;
  return gpt2_forward(c->m, c->batch);
}

static void fill_batch(gpt2_batch_buf *bb, gpt2_batch *batch, int B, int T, int V, int masked) {
  for (int i = 0; i < B * T; i++) {
    bb->tokens[i] = (int32_t)(gpt2_rng_next(&rng_state) % (uint64_t)V);
    bb->targets[i] = (int32_t)(gpt2_rng_next(&rng_state) % (uint64_t)V);
    bb->mask[i] = (int32_t)(gpt2_rng_next(&rng_state) % 2);
  }
  for (int b = 0; b < B; b++) {
    bb->start[b] = (int32_t)(gpt2_rng_next(&rng_state) % (uint64_t)T);
    bb->end[b] = (int32_t)(gpt2_rng_next(&rng_state) % (uint64_t)T);
  }
  batch->tokens = bb->tokens;
  batch->targets = bb->targets;
  batch->mask = masked ? bb->mask : NULL;
  batch->start = bb->start;
  batch->end = bb->end;
}

static void test_model_gradcheck(gpt2_head head) {
  gpt2_config cfg = {
      .vocab = 37, .npos = 12, .layers = 2, .heads = 2, .channels = 16, .head = head};
  const int B = 2, T = 7;
  gpt2_model m;
  CHECK_EQ_INT(gpt2_model_init(&m, &cfg, B, T), 0);
  CHECK_EQ_INT(m.nparams, gpt2_param_count(&cfg));
  gpt2_model_init_weights(&m, 7);
  /* Larger weights than GPT-2's 0.02 so every path carries real gradient. */
  for (size_t i = 0; i < m.nparams; i++) m.params[i] += 0.1f * gpt2_rng_normal(&rng_state);
  gpt2_batch_buf bb;
  gpt2_batch batch;
  gpt2_batch_buf_alloc(&bb, B, T);
  fill_batch(&bb, &batch, B, T, cfg.vocab, head == GPT2_HEAD_QA);
  double loss = gpt2_forward(&m, &batch);
  CHECK(isfinite(loss) && loss > 0.0);
  gpt2_zero_grad(&m);
  gpt2_backward(&m, &batch, 1.0f, NULL, NULL, 1);
  float *grads = malloc(m.nparams * sizeof(float));
  memcpy(grads, m.grads, m.nparams * sizeof(float));
  mctx c = {&m, &batch};
  char what[96];
  snprintf(what, sizeof(what), "%s model, all parameters", head == GPT2_HEAD_LM ? "lm" : "qa");
  fd_check(what, model_objective, &c, m.params, grads, m.nparams, 1e-2f, 2e-3);
  /* Every tensor on its own, so a wrong gradient of one small tensor cannot
   * hide behind the big ones. */
  for (int ti = 0; ti < m.ntensors; ti++) {
    const gpt2_tensor *t = &m.tensors[ti];
    snprintf(what, sizeof(what), "%s model, %s", head == GPT2_HEAD_LM ? "lm" : "qa", t->name);
    fd_check(what, model_objective, &c, m.params + t->offset, grads + t->offset, t->size, 1e-2f,
             5e-3);
  }
  /* Gradients accumulate across backward calls (gradient accumulation). */
  gpt2_forward(&m, &batch);
  gpt2_backward(&m, &batch, 1.0f, NULL, NULL, 1);
  double maxd = 0;
  for (size_t i = 0; i < m.nparams; i++) maxd = fmax(maxd, fabs(m.grads[i] - 2.0f * grads[i]));
  CHECK(maxd < 1e-5);
  free(grads);
  gpt2_batch_buf_free(&bb);
  gpt2_model_free(&m);
}

/* Hooks arrive in order: head, tail, layers L-1..0, embed. */
/* Layer l reports as 100 + l, the head's first n rows of dwte as 10000 + n. */
static int hook_seq[16], hook_n;
/* What the forward announced it would read: [lo, hi) pairs, ntok for the call with tokens. */
static size_t wait_seq[64][2];
static int wait_n, wait_tok_at = -1;
static size_t wait_ntok;
static int wait_stop = -1; /* record_wait stops the forward at this call, -1 never */

static int record_wait(void *ctx, size_t lo, size_t hi, const int32_t *tokens, size_t ntok) {
  (void)ctx;
  if (tokens != NULL) {
    wait_tok_at = wait_n;
    wait_ntok = ntok;
  }
  if (wait_n < 64) {
    wait_seq[wait_n][0] = lo;
    wait_seq[wait_n++][1] = hi;
  }
  return wait_n - 1 == wait_stop;
}

static int hook_stop; /* the event code at which record_hook stops backward, 0 never */

static int record_hook(void *ctx, gpt2_grad_event ev, int at) {
  (void)ctx;
  int code = ev == GPT2_EV_LAYER ? 100 + at : ev == GPT2_EV_HEAD ? 10000 + at : (int)ev;
  if (hook_n < 16) hook_seq[hook_n++] = code;
  return hook_stop != 0 && code == hook_stop;
}

/* A vocabulary of two and a bit row blocks: the LM head reports dwte's rows block by block (the
 * exchange starts on the first), and its gradient is the one a single product gives. */
static void test_head_rows(const gpt2_config *tiny) {
  gpt2_config big = *tiny;
  big.vocab = 2 * GPT2_HEAD_ROWS + 7;
  gpt2_model m;
  CHECK_EQ_INT(gpt2_model_init(&m, &big, 2, 8), 0);
  gpt2_model_init_weights(&m, 3);
  gpt2_batch_buf bb;
  gpt2_batch batch;
  gpt2_batch_buf_alloc(&bb, 2, 8);
  fill_batch(&bb, &batch, 2, 8, big.vocab, 0);
  gpt2_forward(&m, &batch);
  hook_n = 0;
  gpt2_backward(&m, &batch, 1.0f, record_hook, NULL, 1);
  int want[] = {10000 + GPT2_HEAD_ROWS, 10000 + 2 * GPT2_HEAD_ROWS, 10000 + big.vocab,
                GPT2_EV_TAIL};
  CHECK_EQ_INT(hook_n, 8);
  CHECK(memcmp(hook_seq, want, sizeof(want)) == 0);
  /* The head's dwte against one gpt2_matmul_backward over the whole vocabulary. */
  size_t BT = 16, C = (size_t)big.channels, V = (size_t)big.vocab;
  float *dw = calloc(V * C, sizeof(float));
  gpt2_zero_grad(&m);
  gpt2_forward(&m, &batch);
  gpt2_crossentropy_backward(m.logits, m.lse, batch.targets, 1.0f / (float)BT, BT, V);
  gpt2_matmul_backward(NULL, dw, NULL, m.logits, m.lnf, m.p.wte, BT, C, V, 0, 0);
  gpt2_forward(&m, &batch);
  gpt2_backward(&m, &batch, 1.0f, NULL, NULL, 0);
  CHECK(max_rel_diff(dw, m.g.wte, V * C) < 1e-5);
  free(dw);
  /* The forward announces the lookup's rows with the tokens first, then the position embedding,
   * each layer and the rest, then the head's blocks of wte; the logits are the plain forward's. */
  float *logits = malloc(BT * V * sizeof(float));
  gpt2_forward(&m, &batch);
  memcpy(logits, m.logits, BT * V * sizeof(float));
  wait_n = 0;
  gpt2_forward_wait(&m, &batch, record_wait, NULL);
  CHECK(memcmp(logits, m.logits, BT * V * sizeof(float)) == 0);
  int L = big.layers;
  CHECK_EQ_INT(wait_n, 1 + 1 + L + 1 + 3);
  CHECK_EQ_INT(wait_tok_at, 0);
  CHECK_EQ_INT((long long)wait_ntok, (long long)BT);
  CHECK(wait_seq[0][0] == 0 && wait_seq[0][1] == V * C);
  CHECK(wait_seq[1][0] == V * C && wait_seq[1][1] == m.layer_offset0);
  for (int l = 0; l < L; l++)
    CHECK(wait_seq[2 + l][0] == m.layer_offset0 + (size_t)l * m.layer_size &&
          wait_seq[2 + l][1] == m.layer_offset0 + (size_t)(l + 1) * m.layer_size);
  CHECK(wait_seq[2 + L][0] == m.tail_offset && wait_seq[2 + L][1] == m.nparams);
  size_t blk = (size_t)GPT2_HEAD_ROWS * C;
  CHECK(wait_seq[3 + L][0] == 0 && wait_seq[3 + L][1] == blk);
  CHECK(wait_seq[4 + L][0] == blk && wait_seq[4 + L][1] == 2 * blk);
  CHECK(wait_seq[5 + L][0] == 2 * blk && wait_seq[5 + L][1] == V * C);
  /* A wait that returns non-zero stops the forward there: NAN, nothing after it computed. */
  memset(m.lnf, 0, BT * C * sizeof(float));
  wait_n = 0;
  wait_stop = 2 + L; /* before the final layernorm */
  CHECK(isnan(gpt2_forward_wait(&m, &batch, record_wait, NULL)));
  wait_stop = -1;
  CHECK_EQ_INT(wait_n, 2 + L + 1);
  CHECK(m.lnf[0] == 0.0f && m.lnf[BT * C - 1] == 0.0f);
  free(logits);
  gpt2_batch_buf_free(&bb);
  gpt2_model_free(&m);
}

/* gpt2_discard_grad: a backward over gradients that hold NaN gives the bits of gpt2_zero_grad
 * then backward (T < npos: position rows no token reaches; with and without the lookup's rows in
 * dwte), and a second backward adds to them as after gpt2_zero_grad. */
static void test_discard(gpt2_head head) {
  gpt2_config cfg = {.vocab = 20, .npos = 8, .layers = 2, .heads = 2, .channels = 8, .head = head};
  gpt2_model m;
  CHECK_EQ_INT(gpt2_model_init(&m, &cfg, 2, 6), 0);
  gpt2_model_init_weights(&m, 3);
  gpt2_batch_buf bb;
  gpt2_batch batch;
  gpt2_batch_buf_alloc(&bb, 2, 6);
  fill_batch(&bb, &batch, 2, 6, cfg.vocab, head == GPT2_HEAD_QA);
  float *want = malloc(m.nparams * sizeof(float));
  for (int scatter = 0; scatter < 2; scatter++)
    for (int steps = 1; steps <= 2; steps++) {
      gpt2_zero_grad(&m);
      for (int k = 0; k < steps; k++) {
        gpt2_forward(&m, &batch);
        gpt2_backward(&m, &batch, 1.0f, NULL, NULL, scatter);
      }
      memcpy(want, m.grads, m.nparams * sizeof(float));
      for (size_t i = 0; i < m.nparams; i++) m.grads[i] = NAN;
      gpt2_discard_grad(&m);
      for (int k = 0; k < steps; k++) {
        gpt2_forward(&m, &batch);
        gpt2_backward(&m, &batch, 1.0f, NULL, NULL, scatter);
      }
      CHECK(memcmp(want, m.grads, m.nparams * sizeof(float)) == 0);
    }
  free(want);
  gpt2_batch_buf_free(&bb);
  gpt2_model_free(&m);
}

static void test_model_misc(void) {
  gpt2_config cfg;
  cfg.head = GPT2_HEAD_LM;
  CHECK_EQ_INT(gpt2_config_preset("124M", &cfg), 0);
  CHECK_EQ_INT(gpt2_param_count(&cfg), 124439808); /* GPT-2 small, as published */
  CHECK_EQ_INT(gpt2_config_preset("350M", &cfg), 0);
  CHECK_EQ_INT(gpt2_param_count(&cfg), 354823168);
  CHECK_EQ_INT(gpt2_config_preset("nope", &cfg), -EINVAL);
  const char *why = NULL;
  cfg.heads = 5;
  CHECK_EQ_INT(gpt2_config_check(&cfg, &why), -EINVAL);
  CHECK(why != NULL);

  gpt2_config tiny = {.vocab = 20, .npos = 8, .layers = 3, .heads = 2, .channels = 8};
  gpt2_model m;
  CHECK_EQ_INT(gpt2_model_init(&m, &tiny, 1, 9), -EINVAL); /* T > npos */
  CHECK_EQ_INT(gpt2_model_init(&m, &tiny, 2, 8), 0);
  gpt2_model_init_weights(&m, 1);
  /* Same seed, same weights; layernorm gains one, biases zero. */
  gpt2_model m2;
  gpt2_model_init(&m2, &tiny, 2, 8);
  gpt2_model_init_weights(&m2, 1);
  CHECK(memcmp(m.params, m2.params, m.nparams * sizeof(float)) == 0);
  CHECK(m.p.layer[1].ln1w[3] == 1.0f && m.p.layer[2].fcb[5] == 0.0f);
  gpt2_model_init_weights(&m2, 2);
  CHECK(memcmp(m.params, m2.params, m.nparams * sizeof(float)) != 0);
  /* Layer-major layout: each layer is one contiguous range. */
  CHECK(m.p.layer[1].ln1w == m.params + m.layer_offset0 + m.layer_size);
  CHECK(m.p.lnfw == m.params + m.tail_offset);
  gpt2_batch_buf bb;
  gpt2_batch batch;
  gpt2_batch_buf_alloc(&bb, 2, 8);
  fill_batch(&bb, &batch, 2, 8, tiny.vocab, 0);
  double loss = gpt2_forward(&m, &batch);
  /* A freshly initialised model predicts roughly uniformly. */
  CHECK(fabs(loss - log(20.0)) < 0.2);
  hook_n = 0;
  gpt2_backward(&m, &batch, 1.0f, record_hook, NULL, 1);
  int want[] = {10020, GPT2_EV_TAIL, 102, 101, 100, GPT2_EV_EMBED};
  CHECK_EQ_INT(hook_n, 6);
  CHECK(memcmp(hook_seq, want, sizeof(want)) == 0);
  /* A hook that returns non-zero stops backward there: layers 1 and 0 are not computed. */
  float *before = malloc(m.nparams * sizeof(float));
  memcpy(before, m.grads, m.nparams * sizeof(float));
  gpt2_forward(&m, &batch);
  hook_n = 0;
  hook_stop = 102;
  gpt2_backward(&m, &batch, 1.0f, record_hook, NULL, 1);
  hook_stop = 0;
  CHECK_EQ_INT(hook_n, 3);
  CHECK(memcmp(hook_seq, want, 3 * sizeof(int)) == 0);
  /* Layers 0 and 1 (and the embeddings' dwpe) got nothing from the stopped pass; layer 2 did. */
  size_t l2 = m.layer_offset0 + 2 * m.layer_size;
  CHECK(memcmp(m.grads + m.layer_offset0, before + m.layer_offset0,
               2 * m.layer_size * sizeof(float)) == 0);
  CHECK(memcmp(m.grads + l2, before + l2, m.layer_size * sizeof(float)) != 0);
  free(before);
  test_head_rows(&tiny);
  /* scatter_wte = 0 leaves the embedding's part of dwte to the caller:
   * adding d(encoded) by hand gives the same gradient. */
  float *g1 = malloc(m.nparams * sizeof(float));
  gpt2_zero_grad(&m);
  gpt2_forward(&m, &batch);
  gpt2_backward(&m, &batch, 1.0f, NULL, NULL, 1);
  memcpy(g1, m.grads, m.nparams * sizeof(float));
  gpt2_zero_grad(&m);
  gpt2_forward(&m, &batch);
  gpt2_backward(&m, &batch, 1.0f, NULL, NULL, 0);
  gpt2_embedding_scatter_add(m.g.wte, m.dres, batch.tokens, 16, 8);
  CHECK(memcmp(g1, m.grads, m.nparams * sizeof(float)) == 0);
  /* Determinism: the same step twice gives bitwise the same gradients. */
  gpt2_zero_grad(&m);
  gpt2_forward(&m, &batch);
  gpt2_backward(&m, &batch, 1.0f, NULL, NULL, 1);
  CHECK(memcmp(g1, m.grads, m.nparams * sizeof(float)) == 0);
  free(g1);
  test_discard(GPT2_HEAD_LM);
  test_discard(GPT2_HEAD_QA);
  gpt2_batch_buf_free(&bb);
  gpt2_model_free(&m);
  gpt2_model_free(&m2);
}

/* ---- optimisers and schedule ---- */

static void test_optim(void) {
  gpt2_config cfg = {.vocab = 4, .npos = 2, .layers = 1, .heads = 1, .channels = 2};
  gpt2_model m;
  gpt2_model_init(&m, &cfg, 1, 2);
  for (size_t i = 0; i < m.nparams; i++) {
    m.params[i] = 0.5f + 0.01f * (float)i;
    m.grads[i] = 0.1f - 0.003f * (float)i;
  }
  float *p0 = malloc(m.nparams * sizeof(float));
  memcpy(p0, m.params, m.nparams * sizeof(float));
  gpt2_optim o;
  gpt2_optim_config ac = {
      .kind = GPT2_OPT_ADAMW, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  CHECK_EQ_INT(gpt2_optim_init(&o, &ac, 0, m.nparams), 0);
  gpt2_optim_step(&o, &m, m.params, m.grads, 1.0f, 1e-2f, 1);
  gpt2_optim_step(&o, &m, m.params, m.grads, 1.0f, 1e-2f, 2);
  /* Two AdamW steps with a constant gradient g: m_hat = g and v_hat = g^2 both
   * times, so each step moves by lr * sign(g) (plus decoupled decay). */
  int ok = 1;
  for (int ti = 0; ti < m.ntensors; ti++) {
    const gpt2_tensor *t = &m.tensors[ti];
    for (size_t i = t->offset; i < t->offset + t->size; i++) {
      double p = p0[i], g = m.grads[i], wd = t->decay ? 0.1 : 0.0;
      for (int s = 0; s < 2; s++) p = p * (1 - 1e-2 * wd) - 1e-2 * g / (fabs(g) + 1e-8);
      if (fabs(p - m.params[i]) > 1e-5) ok = 0;
    }
  }
  CHECK(ok);
  gpt2_optim_free(&o);
  /* SGD with momentum 0.5, PyTorch semantics: buf = mom*buf + g. */
  memcpy(m.params, p0, m.nparams * sizeof(float));
  gpt2_optim_config sc = {.kind = GPT2_OPT_SGD, .momentum = 0.5f};
  CHECK_EQ_INT(gpt2_optim_init(&o, &sc, 0, m.nparams), 0);
  gpt2_optim_step(&o, &m, m.params, m.grads, 1.0f, 0.01f, 1);
  gpt2_optim_step(&o, &m, m.params, m.grads, 1.0f, 0.01f, 2);
  ok = 1;
  for (size_t i = 0; i < m.nparams; i++) {
    double want = p0[i] - 0.01 * m.grads[i] - 0.01 * 1.5 * m.grads[i];
    if (fabs(want - m.params[i]) > 1e-6) ok = 0;
  }
  CHECK(ok);
  gpt2_optim_free(&o);
  /* A shard updates only its range. */
  memcpy(m.params, p0, m.nparams * sizeof(float));
  CHECK_EQ_INT(gpt2_optim_init(&o, &sc, 3, 7), 0);
  CHECK_EQ_INT(o.nstate, 4);
  gpt2_optim_step(&o, &m, m.params, m.grads, 1.0f, 0.01f, 1);
  CHECK(m.params[2] == p0[2] && m.params[7] == p0[7] && m.params[3] != p0[3]);
  gpt2_optim_free(&o);
  /* The clipping factor scales the gradient: one plain SGD step. */
  memcpy(m.params, p0, m.nparams * sizeof(float));
  gpt2_optim_config plain = {.kind = GPT2_OPT_SGD};
  CHECK_EQ_INT(gpt2_optim_init(&o, &plain, 0, m.nparams), 0);
  gpt2_optim_step(&o, &m, m.params, m.grads, 0.25f, 0.1f, 1);
  CHECK(fabsf(m.params[5] - (p0[5] - 0.1f * 0.25f * m.grads[5])) < 1e-7f);
  gpt2_optim_free(&o);

  /* Schedule: warm-up, cosine to the floor, constant. */
  CHECK(fabsf(gpt2_lr_at(GPT2_LR_COSINE, 1.0f, 10, 110, 0.1f, 0) - 0.1f) < 1e-6f);
  CHECK(fabsf(gpt2_lr_at(GPT2_LR_COSINE, 1.0f, 10, 110, 0.1f, 9) - 1.0f) < 1e-6f);
  CHECK(fabsf(gpt2_lr_at(GPT2_LR_COSINE, 1.0f, 10, 110, 0.1f, 10) - 1.0f) < 1e-6f);
  CHECK(fabsf(gpt2_lr_at(GPT2_LR_COSINE, 1.0f, 10, 110, 0.1f, 60) - 0.55f) < 1e-5f);
  CHECK(fabsf(gpt2_lr_at(GPT2_LR_COSINE, 1.0f, 10, 110, 0.1f, 110) - 0.1f) < 1e-6f);
  CHECK(gpt2_lr_at(GPT2_LR_CONST, 0.01f, 0, 100, 0.1f, 50) == 0.01f);
  float v[3] = {3.0f, 4.0f, 0.0f};
  CHECK(gpt2_sumsq(v, 3) == 25.0);
  free(p0);
  gpt2_model_free(&m);
}

/* ---- data ---- */

static char tmpdir[256];

static void write_file(const char *path, const void *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  fwrite(buf, 1, len, f);
  fclose(f);
}

static void test_data(void) {
  gpt2_data d;
  gpt2_batch_buf bb, bb2;
  gpt2_batch batch;
  char err[512], path[512];
  gpt2_batch_buf_alloc(&bb, 3, 8);
  gpt2_batch_buf_alloc(&bb2, 3, 8);
  /* Fake data: reproducible by sample index, different across indices,
   * inside the vocabulary, targets = next tokens. */
  CHECK_EQ_INT(gpt2_data_open(&d, NULL, GPT2_HEAD_QA, 50, 3, 8, 5, err, sizeof(err)), 0);
  gpt2_data_fill(&d, 30, &bb, &batch);
  CHECK(batch.mask != NULL);
  gpt2_data_fill(&d, 30, &bb2, &batch);
  CHECK(memcmp(bb.tokens, bb2.tokens, 24 * sizeof(int32_t)) == 0);
  CHECK(memcmp(bb.mask, bb2.mask, 24 * sizeof(int32_t)) == 0);
  gpt2_data_fill(&d, 33, &bb2, &batch);
  CHECK(memcmp(bb.tokens, bb2.tokens, 24 * sizeof(int32_t)) != 0);
  int inrange = 1, ones = 0;
  for (int i = 0; i < 24; i++) {
    if (bb.tokens[i] < 0 || bb.tokens[i] >= 50 || (bb.mask[i] != 0 && bb.mask[i] != 1)) inrange = 0;
    if (i % 8 != 7 && bb.targets[i] != bb.tokens[i + 1]) inrange = 0;
    ones += bb.mask[i];
  }
  for (int b = 0; b < 3; b++)
    if (bb.start[b] < 0 || bb.start[b] >= 8 || bb.end[b] < 0 || bb.end[b] >= 8) inrange = 0;
  CHECK(inrange);
  CHECK(ones > 0 && ones < 24);
  /* Sample 31 of one batch equals sample 0 of a batch starting there. */
  gpt2_data_fill(&d, 31, &bb2, &batch);
  CHECK(memcmp(bb.tokens + 8, bb2.tokens, 8 * sizeof(int32_t)) == 0);
  gpt2_data_close(&d);

  /* A shard of 100 tokens 0..99: windows of 9 stepping by 8. */
  uint16_t toks[100];
  for (int i = 0; i < 100; i++) toks[i] = (uint16_t)i;
  snprintf(path, sizeof(path), "%s/a.bin", tmpdir);
  CHECK_EQ_INT(gpt2_shard_write(path, toks, 100), 0);
  CHECK_EQ_INT(gpt2_data_open(&d, path, GPT2_HEAD_LM, 128, 3, 8, 0, err, sizeof(err)), 0);
  CHECK_EQ_INT(d.windows, 12);
  gpt2_data_fill(&d, 11, &bb, &batch); /* windows 11, 0, 1 */
  CHECK(batch.mask == NULL);
  CHECK_EQ_INT(bb.tokens[0], 88);
  CHECK_EQ_INT(bb.targets[7], 96);
  CHECK_EQ_INT(bb.tokens[8], 0);
  CHECK_EQ_INT(bb.tokens[16], 8);
  CHECK_EQ_INT(bb.targets[16], 9);
  gpt2_data_close(&d);
  /* Token outside the vocabulary. */
  CHECK(gpt2_data_open(&d, path, GPT2_HEAD_LM, 64, 3, 8, 0, err, sizeof(err)) < 0);
  CHECK(strstr(err, "outside the vocabulary") != NULL && strstr(err, "token 64") != NULL);
  /* Truncated shard. */
  FILE *f = fopen(path, "r+b");
  CHECK(f != NULL);
  if (f) {
    CHECK_EQ_INT(ftruncate(fileno(f), 1024 + 150), 0);
    fclose(f);
  }
  CHECK(gpt2_data_open(&d, path, GPT2_HEAD_LM, 128, 3, 8, 0, err, sizeof(err)) < 0);
  CHECK(strstr(err, "truncated") != NULL);
  /* Wrong version. */
  int32_t hdr[256] = {GPT2_SHARD_MAGIC, 2, 0};
  snprintf(path, sizeof(path), "%s/v2.bin", tmpdir);
  write_file(path, hdr, sizeof(hdr));
  CHECK(gpt2_data_open(&d, path, GPT2_HEAD_LM, 128, 3, 8, 0, err, sizeof(err)) < 0);
  CHECK(strstr(err, "version 2") != NULL);
  /* A foreign binary file. */
  unsigned char junk[64] = {0x7f, 'E', 'L', 'F', 0, 1, 2};
  snprintf(path, sizeof(path), "%s/junk.dat", tmpdir);
  write_file(path, junk, sizeof(junk));
  CHECK(gpt2_data_open(&d, path, GPT2_HEAD_LM, 512, 3, 8, 0, err, sizeof(err)) < 0);
  CHECK(strstr(err, "neither a token shard") != NULL);
  /* Missing file. */
  snprintf(path, sizeof(path), "%s/missing.bin", tmpdir);
  CHECK_EQ_INT(gpt2_data_open(&d, path, GPT2_HEAD_LM, 512, 3, 8, 0, err, sizeof(err)), -ENOENT);
  /* Text: bytes are tokens; needs vocab >= 256. */
  const char *text = "hello, world. the quick brown fox jumps over the lazy dog.\n";
  snprintf(path, sizeof(path), "%s/t.txt", tmpdir);
  write_file(path, text, strlen(text));
  CHECK(gpt2_data_open(&d, path, GPT2_HEAD_LM, 128, 3, 8, 0, err, sizeof(err)) < 0);
  CHECK(strstr(err, "vocab") != NULL);
  CHECK_EQ_INT(gpt2_data_open(&d, path, GPT2_HEAD_LM, 256, 3, 8, 0, err, sizeof(err)), 0);
  gpt2_data_fill(&d, 1, &bb, &batch);
  CHECK_EQ_INT(bb.tokens[0], text[8]);
  CHECK_EQ_INT(bb.targets[0], text[9]);
  gpt2_data_close(&d);
  /* Too short for one window. */
  snprintf(path, sizeof(path), "%s/short.txt", tmpdir);
  write_file(path, "abc", 3);
  CHECK(gpt2_data_open(&d, path, GPT2_HEAD_LM, 256, 3, 8, 0, err, sizeof(err)) < 0);
  CHECK(strstr(err, "fewer than") != NULL);
  gpt2_batch_buf_free(&bb);
  gpt2_batch_buf_free(&bb2);
}

/* The data rule across a changing world: 3 ranks, then 2 (a shrink), then 3 again (a grow), with
 * gradient accumulation, over a shard whose windows say their index. The samples the ranks train
 * in the first epoch are each window exactly once; the step that crosses the epoch's end goes on
 * with the next epoch's first windows. */
static void test_data_rule(void) {
  enum { T = 4, B = 2, K = 2, NWIN = 61 };
  uint16_t toks[NWIN * T + 1];
  for (int i = 0; i <= NWIN * T; i++) toks[i] = (uint16_t)i;
  char path[512], err[512];
  snprintf(path, sizeof(path), "%s/rule.bin", tmpdir);
  CHECK_EQ_INT(gpt2_shard_write(path, toks, NWIN * T + 1), 0);
  gpt2_data d;
  CHECK_EQ_INT(gpt2_data_open(&d, path, GPT2_HEAD_LM, 1024, B, T, 0, err, sizeof(err)), 0);
  CHECK_EQ_INT(d.windows, NWIN);
  gpt2_batch_buf bb;
  gpt2_batch batch;
  gpt2_batch_buf_alloc(&bb, B, T);
  int seen[NWIN] = {0}, next_epoch[NWIN] = {0};
  const int worlds[] = {3, 3, 2, 2, 2, 3, 3, 3};
  uint64_t pos = 0;
  for (int step = 0; pos < NWIN; step++) {
    int world = worlds[step < 8 ? step : 7];
    for (int r = 0; r < world; r++) {
      for (int k = 0; k < K; k++) {
        uint64_t g0 = gpt2_data_first(pos, r, K, B, k);
        gpt2_data_fill(&d, g0, &bb, &batch);
        for (int b = 0; b < B; b++) {
          int w = bb.tokens[b * T] / T;
          CHECK_EQ_INT(w, (int)((g0 + (uint64_t)b) % NWIN));
          if (g0 + (uint64_t)b < NWIN)
            seen[w]++;
          else
            next_epoch[w]++;
        }
      }
    }
    pos = gpt2_data_advance(pos, world, K, B);
  }
  int once = 1, tail = 1;
  for (int w = 0; w < NWIN; w++) once &= seen[w] == 1;
  /* 2 steps of 12, 3 of 8, then 12s: 24 + 24 + 12 = 60; the step at 60 trains 60..71. */
  CHECK_EQ_INT(pos, 72);
  for (int w = 0; w < NWIN; w++) tail &= next_epoch[w] == (w < 11);
  CHECK(once);
  CHECK(tail);
  gpt2_batch_buf_free(&bb);
  gpt2_data_close(&d);
}

/* ---- checkpoints ---- */

static void test_ckpt(void) {
  char dir[512], err[512], note[1024], path[600];
  snprintf(dir, sizeof(dir), "%s/ckpt", tmpdir);
  enum { NP = 1000, NS = 2000 };
  float *p = randn(NP, 1.0f), *s = randn(NS, 1.0f);
  float *p2 = calloc(NP, sizeof(float)), *s2 = calloc(NS, sizeof(float));
  gpt2_ckpt_header h = {.vocab = 10,
                        .npos = 4,
                        .layers = 1,
                        .heads = 1,
                        .channels = 4,
                        .opt_kind = 0,
                        .world = 1,
                        .nparams = NP,
                        .nstate = NS};
  gpt2_ckpt_header got;
  /* Nothing there yet. */
  CHECK_EQ_INT(gpt2_ckpt_load_latest(dir, &h, &got, p2, s2, err, sizeof(err), note, sizeof(note)),
               0);
  for (uint64_t step = 1; step <= 3; step++) {
    h.step = step * 10;
    h.data_pos = step * 100;
    h.rng = step;
    p[0] = (float)step;
    CHECK_EQ_INT(gpt2_ckpt_save(dir, &h, p, s, 2, err, sizeof(err)), 0);
  }
  /* Only the newest two are kept; no temporary files remain. */
  snprintf(path, sizeof(path), "%s/ckpt_%012d.bin", dir, 10);
  CHECK(access(path, F_OK) != 0);
  CHECK_EQ_INT(gpt2_ckpt_load_latest(dir, &h, &got, p2, s2, err, sizeof(err), note, sizeof(note)),
               1);
  CHECK_EQ_INT(got.step, 30);
  CHECK_EQ_INT(got.data_pos, 300);
  CHECK(p2[0] == 3.0f && memcmp(p + 1, p2 + 1, (NP - 1) * sizeof(float)) == 0);
  CHECK(memcmp(s, s2, NS * sizeof(float)) == 0);
  CHECK(note[0] == '\0');
  /* Flip one byte in the middle of the newest: it is skipped, step 20 loads. */
  snprintf(path, sizeof(path), "%s/ckpt_%012d.bin", dir, 30);
  int fd = open(path, O_RDWR);
  unsigned char byte;
  CHECK(pread(fd, &byte, 1, 2000) == 1);
  byte ^= 0x10;
  CHECK(pwrite(fd, &byte, 1, 2000) == 1);
  close(fd);
  CHECK_EQ_INT(gpt2_ckpt_load_latest(dir, &h, &got, p2, s2, err, sizeof(err), note, sizeof(note)),
               1);
  CHECK_EQ_INT(got.step, 20);
  CHECK(p2[0] == 2.0f);
  CHECK(strstr(note, "checksum") != NULL);
  /* Truncate step 20 as well: nothing valid remains. */
  snprintf(path, sizeof(path), "%s/ckpt_%012d.bin", dir, 20);
  CHECK_EQ_INT(truncate(path, 3000), 0);
  CHECK_EQ_INT(gpt2_ckpt_load_latest(dir, &h, &got, p2, s2, err, sizeof(err), note, sizeof(note)),
               0);
  CHECK(strstr(note, "truncated") != NULL);
  /* A checkpoint of a different configuration is an error, not skipped. */
  h.step = 40;
  CHECK_EQ_INT(gpt2_ckpt_save(dir, &h, p, s, 5, err, sizeof(err)), 0);
  gpt2_ckpt_header other = h;
  other.channels = 8;
  CHECK(gpt2_ckpt_load_latest(dir, &other, &got, p2, s2, err, sizeof(err), note, sizeof(note)) < 0);
  CHECK(strstr(err, "different") != NULL);
  /* Per-rank parts (PowerSGD's errors): a checkpoint of 3 ranks loads on 2 (ranks 0 and 1 keep
   * theirs) and on 4 (rank 3 starts from zeros). */
  {
    enum { BASE = 100, PER = 50 };
    char rdir[512];
    snprintf(rdir, sizeof(rdir), "%s/ranks", tmpdir);
    gpt2_ckpt_header w3 = h;
    w3.world = 3;
    w3.nstate = BASE + 3 * PER;
    float *st3 = randn(BASE + 3 * PER, 1.0f), *st = calloc(BASE + 4 * PER, sizeof(float));
    CHECK_EQ_INT(gpt2_ckpt_save(rdir, &w3, p, st3, 2, err, sizeof(err)), 0);
    gpt2_ckpt_header w2 = w3;
    w2.world = 2;
    w2.nstate = BASE + 2 * PER;
    CHECK_EQ_INT(gpt2_ckpt_load_latest_ranks(rdir, &w2, PER, &got, p2, st, err, sizeof(err), note,
                                             sizeof(note)),
                 1);
    CHECK(memcmp(st, st3, (BASE + 2 * PER) * sizeof(float)) == 0);
    gpt2_ckpt_header w4 = w3;
    w4.world = 4;
    w4.nstate = BASE + 4 * PER;
    for (int i = 0; i < BASE + 4 * PER; i++) st[i] = 7.0f;
    CHECK_EQ_INT(gpt2_ckpt_load_latest_ranks(rdir, &w4, PER, &got, p2, st, err, sizeof(err), note,
                                             sizeof(note)),
                 1);
    int zeros = 1;
    for (int i = BASE + 3 * PER; i < BASE + 4 * PER; i++) zeros &= st[i] == 0.0f;
    CHECK(memcmp(st, st3, (BASE + 3 * PER) * sizeof(float)) == 0);
    CHECK(zeros);
    /* Without per-rank parts the state's size must match. */
    CHECK(gpt2_ckpt_load_latest(rdir, &w2, &got, p2, st, err, sizeof(err), note, sizeof(note)) < 0);
    /* A different shared part is another configuration. */
    w2.nstate = BASE + 1 + 2 * PER;
    CHECK(gpt2_ckpt_load_latest_ranks(rdir, &w2, PER, &got, p2, st, err, sizeof(err), note,
                                      sizeof(note)) < 0);
    free(st3), free(st);
  }
  /* The hash sees every byte. */
  CHECK(gpt2_ckpt_hash(0, "abcd", 4) != gpt2_ckpt_hash(0, "abce", 4));
  free(p), free(s), free(p2), free(s2);
}

int main(void) {
  snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_gpt2.XXXXXX");
  if (mkdtemp(tmpdir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  test_kernels();
  test_model_gradcheck(GPT2_HEAD_LM);
  test_model_gradcheck(GPT2_HEAD_QA);
  test_model_misc();
  test_optim();
  test_data();
  test_data_rule();
  test_ckpt();
  char cmd[300];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", tmpdir);
  return check_report();
}

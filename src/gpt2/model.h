/*
 * model.h - GPT-2 (pre-LN transformer, causal attention, GELU, tied
 * embeddings) with two heads: a language-model head (next-token
 * cross-entropy through the tied token embedding) and the question-answering
 * head of Hugging Face's GPT2ForQuestionAnswering (a C->2 linear layer giving
 * start and end logits per position, loss the mean of the two
 * cross-entropies).
 *
 * Parameters live in one allocation with views into it (llm.c style), laid
 * out layer-major so that each layer's parameters (and gradients) are one
 * contiguous range: wte, wpe, layer 0 .. layer L-1, ln_f, qa. Backward
 * finishes the ranges from the end of the buffer towards the start, which is
 * the order the data-parallel code communicates them in.
 *
 * Thread safety: a model is used by one thread at a time; the kernels use
 * OpenMP inside.
 */
#ifndef COHORT_GPT2_MODEL_H
#define COHORT_GPT2_MODEL_H

#include <stddef.h>
#include <stdint.h>

typedef enum gpt2_head { GPT2_HEAD_LM = 0, GPT2_HEAD_QA = 1 } gpt2_head;

typedef struct gpt2_config {
  int vocab;    /* V */
  int npos;     /* maximum sequence length (rows of wpe) */
  int layers;   /* L */
  int heads;    /* NH; channels % heads == 0 */
  int channels; /* C */
  gpt2_head head;
} gpt2_config;

/* Fills cfg from a preset name: "124M", "350M" or "tiny". -EINVAL if unknown. */
int gpt2_config_preset(const char *name, gpt2_config *cfg);
/* 0 when the configuration is usable, else -EINVAL with a reason in *why. */
int gpt2_config_check(const gpt2_config *cfg, const char **why);

/* Parameter tensors of one layer, in memory order. */
enum {
  GPT2_LN1W,
  GPT2_LN1B,
  GPT2_QKVW,
  GPT2_QKVB,
  GPT2_ATTPROJW,
  GPT2_ATTPROJB,
  GPT2_LN2W,
  GPT2_LN2B,
  GPT2_FCW,
  GPT2_FCB,
  GPT2_FCPROJW,
  GPT2_FCPROJB,
  GPT2_LAYER_TENSORS
};

typedef struct gpt2_layer {
  float *ln1w, *ln1b; // (C)
  float *qkvw;        // (3C, C)
  float *qkvb;        // (3C)
  float *attprojw;    // (C, C)
  float *attprojb;    // (C)
  float *ln2w, *ln2b; // (C)
  float *fcw;         // (4C, C)
  float *fcb;         // (4C)
  float *fcprojw;     // (C, 4C)
  float *fcprojb;     // (C)
} gpt2_layer;

/* Views into one flat buffer (parameters or gradients). */
typedef struct gpt2_params {
  float *wte;         // (V, C)
  float *wpe;         // (npos, C)
  gpt2_layer *layer;  // [L]
  float *lnfw, *lnfb; // (C)
  float *qaw;         // (2, C), QA head only
  float *qab;         // (2), QA head only
} gpt2_params;

/* One named tensor of the flat buffer. */
typedef struct gpt2_tensor {
  char name[32];
  size_t offset, size;
  int rows, cols; /* rows == 1 for vectors */
  int decay;      /* weight decay applies (matrices only) */
} gpt2_tensor;

typedef struct gpt2_batch {
  const int32_t *tokens;  // (B, T)
  const int32_t *targets; // (B, T), LM head
  const int32_t *mask;    // (B, T) key padding mask (0 hides), or NULL
  const int32_t *start;   // (B), QA head
  const int32_t *end;     // (B), QA head
} gpt2_batch;

/* Points in backward at which a range of gradients is final. */
typedef enum gpt2_grad_event {
  GPT2_EV_HEAD,  /* the head's part of dwte is in for its first `at` rows; reported one or more
                    times, with `at` growing to the vocabulary size */
  GPT2_EV_TAIL,  /* ln_f (and qa) gradients are final */
  GPT2_EV_LAYER, /* layer `at` is final */
  GPT2_EV_EMBED  /* wpe (and wte unless the caller scatters it) are final */
} gpt2_grad_event;
/* Returns 0 to go on, else backward stops there (its gradients incomplete: the step failed). */
typedef int (*gpt2_grad_hook)(void *ctx, gpt2_grad_event ev, int at);
/* Rows of dwte per GPT2_EV_HEAD report of the LM head's backward. */
#define GPT2_HEAD_ROWS 2048

typedef struct gpt2_model {
  gpt2_config cfg;
  int B, T; /* batch and sequence length the activations were sized for */
  size_t nparams;
  float *params, *grads; /* nparams each */
  int grads_external;    /* grads belongs to the caller (gpt2_model_use_grads) */
  int grads_discarded;   /* the next gpt2_backward stores its gradients (gpt2_discard_grad) */
  size_t param_bytes, act_bytes;
  gpt2_params p, g;
  gpt2_tensor *tensors;
  int ntensors;
  size_t layer_offset0, layer_size, tail_offset; /* flat ranges */

  /* Activations of the last forward pass (one allocation). */
  float *acts;
  size_t nacts;
  float *encoded; // (B, T, C)
  float **ln1, **ln1_mean, **ln1_rstd;
  float **qkv, **att, **atty, **res2;
  float **ln2, **ln2_mean, **ln2_rstd;
  float **fch, **fch_gelu, **res3;
  float *lnf, *lnf_mean, *lnf_rstd; // (B, T, C), (B, T), (B, T)
  float *logits;                    // (B, T, V) or (B, T, 2); dlogits after backward
  float *lse;                       // (B, T) or (B, 2)
  float *losses;                    // (B, T) or (B)
  /* Backward scratch. dres ends as d(encoded), read by data-parallel code. */
  float *dres, *dC, *d4C, *dqkv, *attscratch;
  float **layer_ptrs;
  double loss; /* mean loss of the last forward */
} gpt2_model;

/* Parameter count of a configuration. */
size_t gpt2_param_count(const gpt2_config *cfg);
/* Floats of activations and backward scratch for batch B x T. */
size_t gpt2_act_count(const gpt2_config *cfg, int B, int T);
/* Model FLOPs of one forward+backward of B x T tokens (matmuls + attention). */
double gpt2_flops_per_step(const gpt2_config *cfg, int B, int T);

/* Allocates parameters, gradients and activations. Returns 0 or -errno. */
int gpt2_model_init(gpt2_model *m, const gpt2_config *cfg, int B, int T);
void gpt2_model_free(gpt2_model *m);
/* GPT-2 initialisation, deterministic from seed: N(0, 0.02) weights,
 * residual projections scaled by 1/sqrt(2L), zero biases, unit LN gains. */
void gpt2_model_init_weights(gpt2_model *m, uint64_t seed);

/* Forward pass; returns the mean loss over the batch. */
double gpt2_forward(gpt2_model *m, const gpt2_batch *batch);
/* Called before the forward first reads parameters [lo, hi) of the flat buffer: the caller may
 * still be updating the others. The token embedding is announced twice: first with `tokens` (the
 * ntok tokens of the batch) for the rows the lookup reads, at the start; then, with the LM head,
 * in blocks of GPT2_HEAD_ROWS rows (tokens NULL) as the head reads them, at the end. In between
 * come the position embedding, each layer, then the rest (ln_f, the QA head). */
typedef int (*gpt2_param_wait)(void *ctx, size_t lo, size_t hi, const int32_t *tokens, size_t ntok);
/* gpt2_forward that calls wait as it goes (wait NULL: gpt2_forward). wait returns 0 to go on,
 * else the forward stops there and returns NAN (the step failed). */
double gpt2_forward_wait(gpt2_model *m, const gpt2_batch *batch, gpt2_param_wait wait, void *ctx);
/*
 * Backward pass of the last forward; adds d(dloss * mean loss)/d(params) to
 * m->grads. hook (may be NULL) is told when ranges of gradients are final;
 * when it returns non-zero, backward stops there.
 * When scatter_wte is 0 the embedding's share of dwte is not added: the
 * caller reads d(encoded) from m->dres and adds it itself.
 */
void gpt2_backward(gpt2_model *m, const gpt2_batch *batch, float dloss, gpt2_grad_hook hook,
                   void *hook_ctx, int scatter_wte);
void gpt2_zero_grad(gpt2_model *m);
/* The gradients count as zero from here without a pass over them: the next gpt2_backward stores
 * each gradient where it would add it (and zeroes only what it adds into without storing first:
 * the position embedding, and the token embedding unless the LM head stores it). What the buffer
 * holds until that backward is undefined. The same bits as gpt2_zero_grad then gpt2_backward. */
void gpt2_discard_grad(gpt2_model *m);
/* Makes buf the gradient buffer (param_bytes, page-aligned; the caller's, and still the caller's to
 * free after gpt2_model_free) and releases the model's own. The gradients are not copied: they
 * are buf's contents (each step discards them first: gpt2_discard_grad). */
void gpt2_model_use_grads(gpt2_model *m, float *buf);
/* Gives the model a gradient buffer of its own again (zero: the caller's is not copied), so the
 * caller's may be freed. Returns 0 or -ENOMEM (nothing changed). */
int gpt2_model_own_grads(gpt2_model *m);

#endif

/*
 * kernels.h - the forward and backward kernels of GPT-2 on the CPU.
 *
 * Matrix products go through BLAS (sgemm); the rest are plain C loops
 * parallelised with OpenMP. Shapes are written beside each argument: B batch,
 * T sequence length, C channels, OC output channels, NH heads, V vocabulary.
 * Tensors are row-major and contiguous.
 *
 * Determinism: for a fixed thread count every kernel produces bitwise the
 * same result on every call. Reductions over rows (bias, layernorm weight and
 * embedding gradients) are split across threads by channel, never by row, so
 * each sum is always accumulated in the same order. The resumed-run test
 * depends on this.
 *
 * Backward kernels accumulate (+=) into parameter gradients and into the
 * gradient of their input unless stated otherwise, so gradients flowing along
 * several paths (the residual stream, tied embeddings, gradient accumulation)
 * simply add up.
 */
#ifndef COHORT_GPT2_KERNELS_H
#define COHORT_GPT2_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* A function built twice on x86-64 by gcc, for AVX2 and for the baseline (SSE2), the loader
 * picking the one the CPU runs (an ifunc, as coll/reduce.c's). For loops whose every sum has a
 * fixed order (partial sums in fixed lanes, no fused multiply-add: AVX2 does not bring FMA), so
 * both give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define GPT2_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef GPT2_CLONES
#define GPT2_CLONES
#endif

/* One thread streaming an array through memory reads it about half again as fast when it asks
 * for the floats GPT2_AHEAD beyond where it reads (a software prefetch, 4 KB ahead) as with the
 * hardware's prefetcher alone: 7.5 against 5 GB/s on the 2-core Xeon of docs/gpt2.md, whose
 * passes over the gradients, the moments and PowerSGD's error are each one thread's
 * (`gpt2-psgd-rate`). The passes prefetch each stream once a cache line or so. A prefetch
 * changes no bit and never faults, past the end of an array included. */
#define GPT2_AHEAD 1024
#define GPT2_PREFETCH(p) __builtin_prefetch((p), 0, 3)

/* Additive attention score of a masked-out key. A finite constant (as in the
 * original GPT-2 code) rather than -inf: a query whose keys are all masked
 * then attends over its causal keys as if unmasked instead of producing NaN.
 * The kernel evaluates this exactly rather than adding it in float. */
#define GPT2_MASK_SCORE (-10000.0f)

/* out = wte[tok] + wpe[t] */
void gpt2_encoder_forward(float *out,            // (B, T, C)
                          const int32_t *tokens, // (B, T)
                          const float *wte,      // (V, C)
                          const float *wpe,      // (maxT, C)
                          size_t B, size_t T, size_t C);
/* dwte[tok] += dout; dwpe[t] += dout. dwte may be NULL (handled elsewhere). */
void gpt2_encoder_backward(float *dwte,           // (V, C) or NULL
                           float *dwpe,           // (maxT, C)
                           const float *dout,     // (B, T, C)
                           const int32_t *tokens, // (B, T)
                           size_t B, size_t T, size_t C);
/* Adds n rows of dout to dwte at the given tokens, in order (deterministic). */
void gpt2_embedding_scatter_add(float *dwte,           // (V, C)
                                const float *rows,     // (n, C)
                                const int32_t *tokens, // (n)
                                size_t n, size_t C);

/* out = (inp - mean) * rstd * w + b over the last axis; eps 1e-5. */
void gpt2_layernorm_forward(float *out,                     // (N, C)
                            float *mean,                    // (N)
                            float *rstd,                    // (N)
                            const float *inp,               // (N, C)
                            const float *w, const float *b, // (C)
                            size_t N, size_t C);
/* dw and db: += , or = when store_dw (the first backward after gpt2_discard_grad). */
void gpt2_layernorm_backward(float *dinp,                          // (N, C) +=
                             float *dw, float *db,                 // (C) += or =
                             const float *dout,                    // (N, C)
                             const float *inp,                     // (N, C)
                             const float *w,                       // (C)
                             const float *mean, const float *rstd, // (N)
                             size_t N, size_t C, int store_dw);

/* out = inp @ w^T + bias, or out += ... when accumulate (residual fusion). */
void gpt2_matmul_forward(float *out,        // (N, OC)
                         const float *inp,  // (N, C)
                         const float *w,    // (OC, C)
                         const float *bias, // (OC) or NULL
                         size_t N, size_t C, size_t OC, int accumulate);
/* out[:, j0:j1] = inp @ w[j0:j1]^T: rows j0..j1 of w alone (no bias), the other columns of out
 * untouched; a forward in row blocks computes what the one call does. */
void gpt2_matmul_forward_rows(float *out, const float *inp, const float *w, size_t N, size_t C,
                              size_t OC, size_t j0, size_t j1);
/* dinp (= or +=, see accumulate_dinp) dout @ w; dw += dout^T @ inp; dbias += sum(dout); with
 * store_dw, dw and dbias are written (=) instead: sgemm's beta 0, which zeroes each output just
 * before its product adds into it, where zeroing the whole buffer beforehand sends it to memory
 * and back. The same bits as adding into zeros. */
void gpt2_matmul_backward(float *dinp,       // (N, C) or NULL
                          float *dw,         // (OC, C) or NULL (with dbias)
                          float *dbias,      // (OC) or NULL
                          const float *dout, // (N, OC)
                          const float *inp,  // (N, C)
                          const float *w,    // (OC, C)
                          size_t N, size_t C, size_t OC, int accumulate_dinp, int store_dw);
/* Rows j0..j1 of dw (and of dbias) alone, bit for bit as gpt2_matmul_backward computes them: each
 * element is one sgemm over the whole of N, so a caller may do dw in row blocks. */
void gpt2_matmul_backward_rows(float *dw, float *dbias, const float *dout, const float *inp,
                               size_t N, size_t C, size_t OC, size_t j0, size_t j1, int store_dw);

/*
 * Causal multi-head self-attention with an optional padding mask on keys.
 * qkv holds q, k and v side by side; att keeps the softmax probabilities for
 * the backward pass. mask[b*T + t] == 0 hides key t of sequence b.
 */
void gpt2_attention_forward(float *out,          // (B, T, C)
                            float *att,          // (B, NH, T, T)
                            const float *qkv,    // (B, T, 3C)
                            const int32_t *mask, // (B, T) or NULL
                            size_t B, size_t T, size_t C, size_t NH);
/* dqkv is overwritten; scratch holds B*NH*T floats. */
void gpt2_attention_backward(float *dqkv,       // (B, T, 3C) =
                             float *scratch,    // (B, NH, T)
                             const float *dout, // (B, T, C)
                             const float *qkv,  // (B, T, 3C)
                             const float *att,  // (B, NH, T, T)
                             size_t B, size_t T, size_t C, size_t NH);

/* GELU, tanh approximation. backward may run in place (dinp == dout). */
void gpt2_gelu_forward(float *out, const float *inp, size_t n);
void gpt2_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/*
 * Language-model loss: per-row log-sum-exp of logits (kept for backward),
 * losses[i] = lse - logits[target]. Returns the mean loss (accumulated in
 * double).
 */
double gpt2_crossentropy_forward(float *lse,             // (N)
                                 float *losses,          // (N)
                                 const float *logits,    // (N, V)
                                 const int32_t *targets, // (N)
                                 size_t N, size_t V);
/* In place: logits becomes dlogits = (softmax - onehot) * dloss. */
void gpt2_crossentropy_backward(float *logits,          // (N, V) in: logits, out: dlogits
                                const float *lse,       // (N)
                                const int32_t *targets, // (N)
                                float dloss, size_t N, size_t V);

/*
 * Question-answering loss: logits (B, T, 2) hold start and end scores per
 * position; each is a softmax over T per sequence. Loss per sequence is the
 * mean of the two cross-entropies. lse (B, 2) is kept for backward. Returns
 * the mean over B (double accumulation).
 */
double gpt2_qa_loss_forward(float *lse,           // (B, 2)
                            float *losses,        // (B)
                            const float *logits,  // (B, T, 2)
                            const int32_t *start, // (B)
                            const int32_t *end,   // (B)
                            size_t B, size_t T);
/* dlogits = d(loss)/d(logits) * dloss (overwritten). */
void gpt2_qa_loss_backward(float *dlogits,                           // (B, T, 2)
                           const float *logits,                      // (B, T, 2)
                           const float *lse,                         // (B, 2)
                           const int32_t *start, const int32_t *end, // (B)
                           float dloss, size_t B, size_t T);

/* dst += src */
void gpt2_add_inplace(float *dst, const float *src, size_t n);

/* Large zeroed buffers: anonymous mappings with transparent huge pages
 * requested (fewer page faults and TLB misses on gigabytes of parameters and
 * optimiser state). Returns NULL on failure. */
void *gpt2_big_alloc(size_t bytes);
void gpt2_big_free(void *p, size_t bytes);

/* Microseconds of the monotonic clock. */
int64_t gpt2_now_us(void);
/* Microseconds of CPU time the calling thread has used. */
int64_t gpt2_cpu_us(void);

/* The name of the OpenBLAS kernels in use ("SkylakeX", "Haswell", ...). */
const char *gpt2_blas_core(void);

/* The OPENBLAS_CORETYPE a program should be started with, or NULL to keep
 * what OpenBLAS chose. OpenBLAS picks its kernels once, when it is loaded,
 * from the CPU's model; one that does not know the model falls back to
 * Prescott, its SSE3 kernels (Debian 12's 0.3.21 on Intel family 6 model
 * 207, the Xeons of the dev VM and the GPU node: sgemm at a third of its
 * AVX-512 rate). Then, unless OPENBLAS_CORETYPE is set: "SkylakeX" when the
 * CPU has AVX-512 F/BW/VL/DQ, "Haswell" when it has AVX2 and FMA. The tools
 * re-execute themselves with it (the variable is read at load time only). */
const char *gpt2_blas_better_core(void);

#endif

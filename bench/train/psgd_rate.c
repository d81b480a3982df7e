/*
 * psgd_rate.c - the CPU cost of PowerSGD's compression on one process, stage by stage, on the
 * matrices of a real model (src/gpt2/powersgd.c without the communication: world 2's share), and
 * of the other full passes over the gradients of a step (zeroing them, the clipping norm: a pass
 * over the gradients, "sumsq", or PowerSGD's from the factors, "psgd_sumsq", checked against it to
 * 1e-6), and of the AdamW update: over gradients stage 3 wrote ("adamw", after "stage3", which
 * writes them here), or making P Q^T as it reads it ("fused_adamw", the trainer's, which needs no
 * stage 3 beyond the factors' norm).
 *
 * usage: gpt2-psgd-rate MODEL RANK REPS
 * Prints one JSON object: for each part, the thread CPU milliseconds of one round over all the
 * groups (the median and the best of REPS rounds after a first one that warms up), the floats
 * every pass covers ("floats") the last round's sum of squares of the gradients ("norm2") and
 * hashes of the bits of the gradients and of the error buffer after it (equal across builds that
 * compute the same bits). One thread (OMP_NUM_THREADS=1) is what a rank of the shaped-link
 * benchmark runs; under `valgrind --tool=callgrind` use REPS 1 and read the instruction counts of
 * the kernels.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2/kernels.h"
#include "gpt2/model.h"
#include "gpt2/optim.h"
#include "gpt2/powersgd.h"
#include "gpt2/rng.h"

enum { PARTS = 8 };
static const char *const part_names[PARTS] = {"zero_grad", "stage1",     "stage2", "stage3",
                                              "sumsq",     "psgd_sumsq", "adamw",  "fused_adamw"};

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Gradients N(0, 1) in chunks of derived streams (quick to draw, the same on every run). */
static void fill(float *g, size_t n, uint64_t round) {
  const size_t chunk = 1 << 16;
  for (size_t a = 0; a < n; a += chunk) {
    uint64_t st = gpt2_rng_derive(0x5eed, round, a / chunk, 0);
    size_t end = a + chunk < n ? a + chunk : n;
    for (size_t i = a; i < end; i++) g[i] = gpt2_rng_normal(&st);
  }
}

/* FNV-1a over the bits: equal hashes for equal bits (kernels compared across builds). */
static uint64_t hash_floats(const float *x, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char *b = (const unsigned char *)x;
  for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* One round: a backward's worth of gradients, then the three stages of every group in the order
 * the exchange runs them, then the norm. ms[part] gets each part's thread CPU time. */
static double round_ms(gpt2_model *m, gpt2_psgd *s, gpt2_optim *o, int r, double ms[PARTS]) {
  fill(m->grads, m->nparams, (uint64_t)r);
  int64_t t0 = gpt2_cpu_us();
  gpt2_zero_grad(m);
  int64_t t1 = gpt2_cpu_us();
  fill(m->grads, m->nparams, (uint64_t)r);
  int64_t st[3] = {0, 0, 0};
  for (int grp = 0; grp < s->ngroups; grp++) {
    int64_t a = gpt2_cpu_us();
    gpt2_psgd_compute_p(s, m->grads, grp);
    int64_t b = gpt2_cpu_us();
    gpt2_psgd_compute_q(s, m->grads, grp);
    int64_t c = gpt2_cpu_us();
    gpt2_psgd_decompress(s, m->grads, grp, 2);
    int64_t d = gpt2_cpu_us();
    st[0] += b - a, st[1] += c - b, st[2] += d - c;
  }
  int64_t t2 = gpt2_cpu_us();
  double norm2 = gpt2_sumsq(m->grads, m->nparams);
  int64_t t3 = gpt2_cpu_us();
  double fused = gpt2_psgd_sumsq(s, m->grads);
  int64_t t4 = gpt2_cpu_us();
  if (fabs(fused - norm2) > 1e-6 * norm2) {
    fprintf(stderr,
            "gpt2-psgd-rate: the sum of squares of the factors is %.17g, of the gradients %.17g\n",
            fused, norm2);
    exit(1);
  }
  /* AdamW over the written P Q^T, then the same update making P Q^T as it reads it. */
  gpt2_optim_step(o, m, m->params, m->grads, 1.0f, 1e-4f, 1 + r);
  int64_t t5 = gpt2_cpu_us();
  gpt2_psgd_update(s, o, m, m->grads, 1.0f, 1e-4f, 1 + r);
  int64_t t6 = gpt2_cpu_us();
  ms[0] = (double)(t1 - t0) * 1e-3;
  for (int i = 0; i < 3; i++) ms[1 + i] = (double)st[i] * 1e-3;
  ms[4] = (double)(t3 - t2) * 1e-3;
  ms[5] = (double)(t4 - t3) * 1e-3;
  ms[6] = (double)(t5 - t4) * 1e-3;
  ms[7] = (double)(t6 - t5) * 1e-3;
  return norm2;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: gpt2-psgd-rate MODEL RANK REPS\n");
    return 2;
  }
  gpt2_config cfg = {.head = GPT2_HEAD_LM};
  int rank = atoi(argv[2]), reps = atoi(argv[3]);
  if (gpt2_config_preset(argv[1], &cfg) != 0 || rank < 1 || reps < 1) {
    fprintf(stderr, "gpt2-psgd-rate: bad model or numbers\n");
    return 2;
  }
  gpt2_model m;
  gpt2_psgd s;
  gpt2_optim o;
  gpt2_optim_config oc = {
      .kind = GPT2_OPT_ADAMW, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  if (gpt2_model_init(&m, &cfg, 1, 1) != 0 || gpt2_psgd_init(&s, &m, rank, 1) != 0 ||
      gpt2_optim_init(&o, &oc, 0, m.nparams) != 0) {
    fprintf(stderr, "gpt2-psgd-rate: out of memory\n");
    return 1;
  }
  double *ms = calloc((size_t)(reps * PARTS), sizeof(double)), norm2 = 0.0, w[PARTS];
  if (ms == NULL) return 1;
  round_ms(&m, &s, &o, 0, w); /* warms up pages, caches and Q */
  for (int r = 0; r < reps; r++) {
    norm2 = round_ms(&m, &s, &o, 1 + r, w);
    for (int p = 0; p < PARTS; p++) ms[p * reps + r] = w[p];
  }
  printf("{\"model\":\"%s\",\"rank\":%d,\"reps\":%d,\"floats\":%zu,\"compressed\":%zu,", argv[1],
         rank, reps, m.nparams, s.nerr);
  for (int p = 0; p < PARTS; p++) {
    double *x = ms + p * reps;
    qsort(x, (size_t)reps, sizeof(double), cmp);
    printf("\"%s_ms\":[%.1f,%.1f],", part_names[p], x[reps / 2], x[0]);
  }
  printf("\"norm2\":%.17g,\"grad_hash\":\"%016llx\",\"error_hash\":\"%016llx\"}\n", norm2,
         (unsigned long long)hash_floats(m.grads, m.nparams),
         (unsigned long long)hash_floats(s.err, s.nerr));
  free(ms);
  gpt2_optim_free(&o);
  gpt2_psgd_free(&s);
  gpt2_model_free(&m);
  return 0;
}

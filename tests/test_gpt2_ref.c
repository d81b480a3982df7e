/*
 * test_gpt2_ref.c - compares cohort-gpt2's model with an independent PyTorch
 * implementation (tests/gpt2_reference.py, float64): the C side builds a
 * small model for each head, runs forward and backward on a batch (with the
 * attention mask for the QA head) and two steps of each optimiser, and dumps
 * weights, batch and results; the script rebuilds the model from the same
 * weights and checks loss, logits, every gradient and the updated weights.
 *
 * usage: test_gpt2_ref PYTHON SCRIPT
 *
 * Dump layout: uint64 n, n bytes of JSON describing the model and the arrays,
 * then the arrays back to back (little-endian float32 / int32).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpt2/data.h"
#include "gpt2/model.h"
#include "gpt2/optim.h"
#include "gpt2/rng.h"
#include "tests/check.h"

typedef struct arr {
  const char *name, *dtype;
  const void *data;
  size_t count;
} arr;

static int write_dump(const char *path, const gpt2_model *m, const arr *arrays, int narrays,
                      const char *extra) {
  size_t cap = 1 << 16, len = 0;
  char *js = malloc(cap);
  len += (size_t)snprintf(js + len, cap - len,
                          "{\"vocab\":%d,\"npos\":%d,\"layers\":%d,\"heads\":%d,\"channels\":%d,"
                          "\"head\":\"%s\",\"B\":%d,\"T\":%d,%s,\"tensors\":[",
                          m->cfg.vocab, m->cfg.npos, m->cfg.layers, m->cfg.heads, m->cfg.channels,
                          m->cfg.head == GPT2_HEAD_LM ? "lm" : "qa", m->B, m->T, extra);
  for (int i = 0; i < m->ntensors; i++) {
    const gpt2_tensor *t = &m->tensors[i];
    len +=
        (size_t)snprintf(js + len, cap - len,
                         "%s{\"name\":\"%s\",\"offset\":%zu,\"rows\":%d,\"cols\":%d,\"decay\":%d}",
                         i ? "," : "", t->name, t->offset, t->rows, t->cols, t->decay);
  }
  len += (size_t)snprintf(js + len, cap - len, "],\"arrays\":[");
  for (int i = 0; i < narrays; i++) {
    len +=
        (size_t)snprintf(js + len, cap - len, "%s{\"name\":\"%s\",\"dtype\":\"%s\",\"count\":%zu}",
                         i ? "," : "", arrays[i].name, arrays[i].dtype, arrays[i].count);
  }
  len += (size_t)snprintf(js + len, cap - len, "]}");
  FILE *f = fopen(path, "wb");
  if (f == NULL) {
    free(js);
    return -1;
  }
  uint64_t n = len;
  int ok = fwrite(&n, sizeof(n), 1, f) == 1 && fwrite(js, 1, len, f) == len;
  for (int i = 0; i < narrays; i++)
    ok = ok && fwrite(arrays[i].data, 4, arrays[i].count, f) == arrays[i].count;
  ok = fclose(f) == 0 && ok;
  free(js);
  return ok ? 0 : -1;
}

static int run_reference(const char *python, const char *script, const char *dump) {
  pid_t pid = fork();
  if (pid == 0) {
    execl(python, python, script, dump, (char *)NULL);
    perror(python);
    _exit(127);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void check_head(const char *python, const char *script, gpt2_head head) {
  gpt2_config cfg = {
      .vocab = 53, .npos = 16, .layers = 2, .heads = 4, .channels = 32, .head = head};
  const int B = 3, T = 11;
  gpt2_model m;
  CHECK_EQ_INT(gpt2_model_init(&m, &cfg, B, T), 0);
  gpt2_model_init_weights(&m, 99);
  uint64_t st = 5;
  /* Perturb beyond the initialisation so that attention and layernorm
   * gains do real work. */
  for (size_t i = 0; i < m.nparams; i++) m.params[i] += 0.05f * gpt2_rng_normal(&st);
  gpt2_data d;
  gpt2_batch_buf bb;
  gpt2_batch batch;
  char err[256];
  CHECK_EQ_INT(gpt2_data_open(&d, NULL, head, cfg.vocab, B, T, 3, err, sizeof(err)), 0);
  gpt2_batch_buf_alloc(&bb, B, T);
  gpt2_data_fill(&d, 0, &bb, &batch);
  /* Make sure one sequence has a query whose keys are all masked. */
  bb.mask[0] = 0;
  size_t nout = (size_t)B * T * (head == GPT2_HEAD_LM ? (size_t)cfg.vocab : 2);
  float *params0 = malloc(m.nparams * sizeof(float));
  memcpy(params0, m.params, m.nparams * sizeof(float));
  float loss = (float)gpt2_forward(&m, &batch);
  float *logits = malloc(nout * sizeof(float));
  memcpy(logits, m.logits, nout * sizeof(float));
  gpt2_zero_grad(&m);
  gpt2_backward(&m, &batch, 1.0f, NULL, NULL, 1);

  /* Two steps of each optimiser from the same weights and gradients. */
  float *adamw = malloc(m.nparams * sizeof(float)), *sgd = malloc(m.nparams * sizeof(float));
  gpt2_optim o;
  gpt2_optim_config ac = {
      .kind = GPT2_OPT_ADAMW, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  memcpy(adamw, params0, m.nparams * sizeof(float));
  gpt2_optim_init(&o, &ac, 0, m.nparams);
  gpt2_optim_step(&o, &m, adamw, m.grads, 1.0f, 1e-3f, 1);
  gpt2_optim_step(&o, &m, adamw, m.grads, 1.0f, 1e-3f, 2);
  gpt2_optim_free(&o);
  gpt2_optim_config sc = {.kind = GPT2_OPT_SGD, .momentum = 0.5f};
  memcpy(sgd, params0, m.nparams * sizeof(float));
  gpt2_optim_init(&o, &sc, 0, m.nparams);
  gpt2_optim_step(&o, &m, sgd, m.grads, 1.0f, 0.01f, 1);
  gpt2_optim_step(&o, &m, sgd, m.grads, 1.0f, 0.01f, 2);
  gpt2_optim_free(&o);

  arr arrays[] = {
      {"params", "f32", params0, m.nparams},
      {"tokens", "i32", bb.tokens, (size_t)B * T},
      {"targets", "i32", bb.targets, (size_t)B * T},
      {"mask", "i32", bb.mask, (size_t)B * T},
      {"start", "i32", bb.start, (size_t)B},
      {"end", "i32", bb.end, (size_t)B},
      {"loss", "f32", &loss, 1},
      {"logits", "f32", logits, nout},
      {"grads", "f32", m.grads, m.nparams},
      {"adamw", "f32", adamw, m.nparams},
      {"sgd", "f32", sgd, m.nparams},
  };
  char path[64];
  snprintf(path, sizeof(path), "/tmp/gpt2_ref_%d_%d.bin", (int)getpid(), (int)head);
  const char *extra = "\"masked\":1,\"adamw\":{\"lr\":1e-3,\"beta1\":0.9,\"beta2\":0.95,"
                      "\"eps\":1e-8,\"weight_decay\":0.1,\"steps\":2},"
                      "\"sgd\":{\"lr\":0.01,\"momentum\":0.5,\"steps\":2}";
  CHECK_EQ_INT(write_dump(path, &m, arrays, (int)(sizeof(arrays) / sizeof(arrays[0])), extra), 0);
  int rc = run_reference(python, script, path);
  if (rc != 0)
    fprintf(stderr, "reference comparison for the %s head failed (exit %d)\n",
            head == GPT2_HEAD_LM ? "lm" : "qa", rc);
  CHECK_EQ_INT(rc, 0);
  unlink(path);
  free(params0), free(logits), free(adamw), free(sgd);
  gpt2_batch_buf_free(&bb);
  gpt2_data_close(&d);
  gpt2_model_free(&m);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: test_gpt2_ref PYTHON SCRIPT\n");
    return 2;
  }
  check_head(argv[1], argv[2], GPT2_HEAD_LM);
  check_head(argv[1], argv[2], GPT2_HEAD_QA);
  return check_report();
}

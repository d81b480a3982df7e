/* train.c - the training loop of cohort-gpt2 (see train.h). */
#include "gpt2/train.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "gpt2/ckpt.h"
#include "gpt2/data.h"
#include "gpt2/ddp.h"
#include "gpt2/kernels.h"
#include "gpt2/rng.h"
#include "gpt2/state.h"
#include "gpt2/tb_writer.h"

#ifdef _OPENMP
#include <omp.h>
#endif

void gpt2_train_defaults(gpt2_train_opts *o) {
  memset(o, 0, sizeof(*o));
  gpt2_config_preset("124M", &o->cfg);
  o->cfg.head = GPT2_HEAD_LM;
  o->B = 4;
  o->T = 64;
  o->steps = 20;
  o->grad_accum = 1;
  o->powersgd_rank = 4;
  o->powersgd_start = 10;
  o->opt = (gpt2_optim_config){.kind = GPT2_OPT_ADAMW,
                               .beta1 = 0.9f,
                               .beta2 = 0.95f,
                               .eps = 1e-8f,
                               .momentum = 0.5f,
                               .weight_decay = 0.1f};
  o->lr = 6e-4f;
  o->min_lr_ratio = 0.1f;
  o->clip = 1.0f;
  o->warmup = -1;
  o->schedule = GPT2_LR_COSINE;
  o->seed = 1337;
  o->ckpt_every = 0;
  o->ckpt_keep = 2;
  o->bucket_bytes = 25u << 20;
  o->threads = 0;
  o->out = stdout;
  o->err = stderr;
}

static double now_s(void) {
  return (double)gpt2_now_us() * 1e-6;
}

double gpt2_train_estimate_bytes(const gpt2_train_opts *o, int world) {
  double np = (double)gpt2_param_count(&o->cfg);
  double state = (o->opt.kind == GPT2_OPT_ADAMW ? 2.0 : 1.0) * np;
  if (o->zero && world > 1) state /= world;
  double acts = (double)gpt2_act_count(&o->cfg, o->B, o->T);
  return 4.0 * (2.0 * np + state + acts);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y ? 1 : 0;
}

static double median(double *v, size_t n) {
  if (n == 0) return 0.0;
  qsort(v, n, sizeof(double), cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Whether this process was started ahead of its membership (a late node's worker under
 * `--on-failure reform`: COHORT_AWAIT_FORM=1, no rank yet; the agent's first `form` gives it). */
static int started_ahead(void) {
  const char *ahead = getenv("COHORT_AWAIT_FORM");
  return getenv("COHORT_CONTROL_FD") != NULL && ahead != NULL && strcmp(ahead, "1") == 0;
}

/* Creates the communicator when started as one of several ranks, as a rank of a job that re-forms
 * (it may grow), or ahead of its membership (it blocks until the agent's first `form`). */
static int make_comm(cohort_comm **comm, FILE *errf) {
  *comm = NULL;
  const char *ws = getenv("WORLD_SIZE");
  int ahead = started_ahead();
  if (!ahead && (getenv("RANK") == NULL || ws == NULL)) return 0;
  if (!ahead && strcmp(ws, "1") == 0 && getenv("COHORT_CONTROL_FD") == NULL) return 0;
  int rc = cohort_comm_create_from_env(comm);
  if (rc != 0 && ahead) {
    fprintf(errf, "cohort-gpt2: cannot join the job (started ahead of its membership): %s\n",
            cohort_strerror(rc));
    return rc;
  }
  if (rc != 0) {
    fprintf(errf, "cohort-gpt2: cannot join the job (RANK=%s WORLD_SIZE=%s): %s\n", getenv("RANK"),
            ws, cohort_strerror(rc));
    return rc;
  }
  return 0;
}

/* What the phases of a run return: 0 to go on, else the reason to stop (the run's exit status is
 * 1 for RUN_FAIL and RUN_COMM, 2 for RUN_USAGE; RUN_COMM also prints the communicator's error). */
enum { RUN_OK = 0, RUN_FAIL = 1, RUN_USAGE = 2, RUN_COMM = 3 };

/* One optimiser step's figures, for the step report. */
typedef struct step_stats {
  uint64_t step; /* 1-based */
  int world;     /* the ranks that trained it */
  int late;      /* reported by a rank 0 that received the step with the state (a re-form) */
  double loss, gnorm, step_s, tok_s, gflops, comm_ms, hidden;
  double wire_mb, ratio; /* MB this rank handed to the collectives; f32 bytes / wire bytes */
  /* The main thread's CPU time over the step (cpu_ms), split into forward, backward and the
   * rest (compute_ms), the compression (compress_ms) and the norm and update (update_ms); the
   * wall time it waited for the exchange (exposed_ms). */
  double cpu_ms, compute_ms, compress_ms, update_ms, exposed_ms;
  float lr;
} step_stats;

/* Everything one run holds; zero-initialised, and train_free() is safe at any point of set-up. */
typedef struct train_run {
  const gpt2_train_opts *o;
  FILE *out, *errf;
  int rank, world, threads;
  cohort_comm *comm;
  /* Re-form (docs/gpt2.md): reform when the job's agent re-forms it (COHORT_CONTROL_FD), newcomer
   * when started into a running job (COHORT_NEWCOMER=1: the state comes from a survivor). */
  int reform, newcomer;
  int ahead;           /* started ahead of its membership (COHORT_AWAIT_FORM=1) */
  gpt2_ddp_opts dopts; /* the exchange's options, to set it up again for a new world */
  gpt2_model model;
  gpt2_data data;
  gpt2_batch_buf bb;
  gpt2_ddp ddp;
  /* The checkpoint's optimiser state is the whole state; with ZeRO it is assembled in full_state
   * (nfull floats), else state points into the optimiser. */
  float *state, *full_state;
  size_t nfull;
  gpt2_ckpt_header want; /* what a checkpoint of this run must match */
  uint64_t start_step;
  uint64_t done; /* completed steps */
  uint64_t pos;  /* the data position P: samples the completed steps consumed (data.h) */
  int in_step;   /* the exchange failed inside a step (not between two) */
  int exchanged; /* the current step's gradient exchange has completed */
  /* After a step whose exchange completed but which failed after it: this rank's own state
   * (PowerSGD's error) as that step left it, which is right when another rank completed the
   * step (every rank's part was in its sums). */
  float *own_after;
  int own_after_valid;
  int stateful; /* this process holds the run's state (a newcomer: once it has received it) */
  /* Catching up (docs/gpt2.md "Re-form"): the ranks from contrib on joined without state; they
   * take part in every reduction with -0.0 while the state streams to them from the donors (a
   * snapshot of step catch_step), keep each step's averaged gradients, and replay them once it is
   * in. contrib: the ranks that train a step (the lowest; world when nobody catches up). */
  int contrib;
  int catching; /* this rank catches up */
  int ready;    /* every catching-up rank has the state (the step's agreed flag) */
  cohort_stream *stream;
  void *snap;        /* a donor's snapshot (every rank not new) */
  size_t snap_bytes; /* the state's bytes, every piece */
  gpt2_state_head snap_head;
  step_stats snap_last;
  struct replay_step *replay;
  size_t nreplay;
  int32_t *zero_tok; /* a catching-up rank's tokens: row 0, each adding -0.0 */
  uint64_t catch_step;
  double catch_t0;
  /* The last completed step's report (every rank keeps it; it travels with the state, so that
   * a rank 0 that receives a step writes its line), and the last step this process reported as
   * rank 0, or its metrics file had when it opened it. */
  step_stats last;
  uint64_t reported;
  /* Tests only (COHORT_GPT2_TEST_FAIL=K:PATH): step K, once completed here and once PATH exists,
   * fails as if its last collective had (0: none). */
  uint64_t test_fail_step;
  const char *test_fail_path;
  /* When this process began, had its model and data set up, and joined its first membership. */
  double t_start, t_setup, t_member;
  int outputs_open;
  FILE *metrics;
  gpt2_tb_writer *tb;
  uint64_t global_batch; /* sequences per optimiser step over all ranks */
  double tokens_per_step, flops_micro;
  double *step_times; /* [steps + 1] */
  size_t ntimes;
  double last_loss, comm_total, exposed_total;
  double wire_total, f32_total; /* bytes handed to the collectives over the steps run */
  char err[512];
} train_run;

/* A step a catching-up rank took part in: its averaged gradients and the update's figures. */
typedef struct replay_step {
  float *g;
  float gscale, lr;
  int64_t t;
} replay_step;

static void catch_up_drop(train_run *r);

static void train_free(train_run *r) {
  catch_up_drop(r);
  gpt2_tb_close(r->tb);
  free(r->own_after);
  free(r->step_times);
  gpt2_big_free(r->full_state, r->nfull * sizeof(float));
  gpt2_ddp_free(&r->ddp);
  gpt2_batch_buf_free(&r->bb);
  gpt2_data_close(&r->data);
  gpt2_model_free(&r->model);
  cohort_comm_destroy(r->comm);
  memset(r, 0, sizeof *r);
}

static int set_threads(int threads) {
#ifdef _OPENMP
  if (threads > 0) omp_set_num_threads(threads);
  threads = omp_get_max_threads();
#else
  threads = 1;
#endif
  /* OpenBLAS runs single-threaded inside our OpenMP slices (kernels.c). */
  openblas_set_num_threads(1);
  return threads;
}

/* What a checkpoint of this run must match (its world's PowerSGD errors: the state's tail). */
static void set_want(train_run *r) {
  const gpt2_train_opts *o = r->o;
  r->want = (gpt2_ckpt_header){.vocab = o->cfg.vocab,
                               .npos = o->cfg.npos,
                               .layers = o->cfg.layers,
                               .heads = o->cfg.heads,
                               .channels = o->cfg.channels,
                               .head = (int32_t)o->cfg.head,
                               .opt_kind = (int32_t)o->opt.kind,
                               .world = r->world,
                               .nparams = r->model.nparams,
                               .nstate = r->nfull};
}

/* The ranks that train a step (the lowest), and what depends on them: the global batch. */
static void set_contrib(train_run *r, int contrib) {
  r->contrib = contrib;
  r->global_batch = (uint64_t)r->o->B * (uint64_t)r->o->grad_accum * (uint64_t)contrib;
  r->tokens_per_step = (double)r->global_batch * r->o->T;
}

/* The data parallelism over the current communicator, and what depends on the world: the global
 * batch, the checkpoint's layout and the buffer that assembles it. After a re-form `old` is the
 * exchange of the membership that ended: its state carries over, then it is freed. */
static int setup_exchange(train_run *r, gpt2_ddp *old) {
  const gpt2_train_opts *o = r->o;
  int rc = gpt2_ddp_init(&r->ddp, r->comm, &r->model, &o->opt, &r->dopts);
  if (old != NULL && rc == 0)
    gpt2_ddp_adopt_state(&r->ddp, old);
  else if (old != NULL)
    gpt2_ddp_free(old);
  if (rc != 0) {
    fprintf(r->errf, "cohort-gpt2: cannot set up the data parallelism: %s\n",
            rc == -EINVAL ? "PowerSGD not with --zero 1" : strerror(-rc));
    return rc == -EINVAL ? RUN_USAGE : RUN_FAIL;
  }
  /* Not when the membership ended meanwhile: the re-form that follows sets it up again. */
  if (r->ddp.shared_rc != 0 && r->ddp.shared_rc != COHORT_ERESHAPED && r->rank == 0)
    fprintf(r->errf,
            "cohort-gpt2: gradients in private memory (cohort_mem_alloc: %s): no single-copy "
            "allreduce between this host's ranks\n",
            cohort_strerror(r->ddp.shared_rc));
  set_contrib(r, r->world);
  gpt2_big_free(r->full_state, r->nfull * sizeof(float));
  r->full_state = NULL;
  r->nfull = gpt2_ddp_full_state_floats(&r->ddp);
  r->state = gpt2_ddp_whole_state(&r->ddp);
  set_want(r);
  if (r->state == NULL && o->ckpt_dir != NULL) {
    r->full_state = gpt2_big_alloc(r->nfull * sizeof(float));
    if (r->full_state == NULL) {
      fprintf(r->errf, "cohort-gpt2: out of memory\n");
      return RUN_FAIL;
    }
    r->state = r->full_state;
  }
  return RUN_OK;
}

/* Tests only: COHORT_GPT2_TEST_FAIL=K:PATH (test_fail below). */
static void test_fail_from_env(train_run *r) {
  const char *v = getenv("COHORT_GPT2_TEST_FAIL");
  char *end = NULL;
  unsigned long long k = v != NULL ? strtoull(v, &end, 10) : 0;
  if (k == 0 || end == NULL || *end != ':' || end[1] == '\0') return;
  r->test_fail_step = k;
  r->test_fail_path = end + 1;
}

/* The model, data and batch buffers: nothing of them depends on the membership, so a worker
 * started ahead has them ready before it joins. */
static int setup_local(train_run *r) {
  const gpt2_train_opts *o = r->o;
  int rc = gpt2_model_init(&r->model, &o->cfg, o->B, o->T);
  if (rc != 0) {
    fprintf(r->errf, "cohort-gpt2: cannot allocate the model: %s\n", strerror(-rc));
    return RUN_FAIL;
  }
  rc = gpt2_data_open(&r->data, o->data, o->cfg.head, o->cfg.vocab, o->B, o->T, o->seed, r->err,
                      sizeof r->err);
  if (rc != 0) {
    fprintf(r->errf, "cohort-gpt2: %s\n", r->err);
    return RUN_USAGE;
  }
  if (gpt2_batch_buf_alloc(&r->bb, o->B, o->T) != 0) {
    fprintf(r->errf, "cohort-gpt2: out of memory\n");
    return RUN_FAIL;
  }
  r->flops_micro = gpt2_flops_per_step(&o->cfg, o->B, o->T);
  r->last_loss = NAN;
  r->step_times = calloc((size_t)o->steps + 1, sizeof(double));
  return r->step_times == NULL ? RUN_FAIL : RUN_OK;
}

/* The model, data, batch buffers, then the communicator (a newcomer's hello says it is ready to
 * join) and the data parallelism. */
static int train_setup(train_run *r) {
  const gpt2_train_opts *o = r->o;
  r->t_start = now_s();
  r->threads = set_threads(o->threads);
  const char *nc = getenv("COHORT_NEWCOMER");
  r->reform = getenv("COHORT_CONTROL_FD") != NULL;
  if (r->reform && o->zero) {
    fprintf(r->errf, "cohort-gpt2: --zero 1 cannot re-form: each rank holds a shard of the "
                     "optimiser state that a lost rank takes with it (use --zero 0, or "
                     "--on-failure restart)\n");
    return RUN_USAGE;
  }
  int rc = setup_local(r);
  if (rc != RUN_OK) return rc;
  r->t_setup = now_s();
  if (make_comm(&r->comm, r->errf) != 0) return RUN_FAIL;
  r->t_member = now_s();
  r->world = 1;
  if (r->comm != NULL) {
    r->rank = cohort_comm_rank(r->comm);
    r->world = cohort_comm_size(r->comm);
  }
  r->reform = r->reform && r->comm != NULL;
  r->newcomer = r->reform && nc != NULL && strcmp(nc, "1") == 0;
  r->ahead = r->reform && started_ahead();
  if (r->reform) test_fail_from_env(r);
  int psgd = o->grad_compress == GPT2_COMPRESS_POWERSGD;
  r->dopts = (gpt2_ddp_opts){
      .bucket_bytes = o->bucket_bytes,
      .accum = o->grad_accum,
      .zero = o->zero,
      .wire = o->grad_compress == GPT2_COMPRESS_BF16   ? COHORT_BF16
              : o->grad_compress == GPT2_COMPRESS_FP16 ? COHORT_F16
                                                       : COHORT_F32,
      .powersgd_rank = psgd ? o->powersgd_rank : 0,
      .powersgd_start = o->powersgd_start,
      .seed = o->seed,
      .atomic = r->reform,
  };
  if (!r->newcomer) gpt2_model_init_weights(&r->model, o->seed); /* a newcomer receives them */
  return setup_exchange(r, NULL);
}

/* Rank 0 loads the newest complete checkpoint, if any; every rank learns its step. */
static int load_checkpoint(train_run *r, double resume[3]) {
  const gpt2_train_opts *o = r->o;
  if (o->ckpt_dir != NULL && r->rank == 0) {
    gpt2_ckpt_header got;
    char note[1024];
    /* PowerSGD's errors are per rank: a checkpoint of another world loads (ckpt.h). */
    int rc = gpt2_ckpt_load_latest_ranks(o->ckpt_dir, &r->want, gpt2_ddp_own_state_floats(&r->ddp),
                                         &got, r->model.params, r->state, r->err, sizeof r->err,
                                         note, sizeof note);
    if (note[0]) fprintf(r->errf, "cohort-gpt2: %s\n", note);
    if (rc < 0) {
      fprintf(r->errf, "cohort-gpt2: %s\n", r->err);
      return RUN_FAIL;
    }
    if (rc == 1) {
      resume[0] = 1.0;
      resume[1] = (double)got.step;
      resume[2] = (double)got.data_pos; /* exact: below 2^53 */
    }
  }
  /* found, step, data position: summed over ranks = rank 0's */
  return gpt2_ddp_sum(&r->ddp, resume, 3) != 0 ? RUN_COMM : RUN_OK;
}

/* Resumes from a checkpoint (rank 0's, handed out), and makes the parameters identical on every
 * rank before the first step. */
static int train_resume(train_run *r) {
  double resume[3] = {0.0, 0.0, 0.0};
  int st = load_checkpoint(r, resume);
  if (st != RUN_OK) return st;
  r->start_step = (uint64_t)resume[1];
  r->pos = (uint64_t)resume[2];
  if (gpt2_ddp_broadcast(&r->ddp, r->model.params, r->model.nparams) != 0) return RUN_COMM;
  if (resume[0] != 0.0) {
    if (gpt2_ddp_broadcast(&r->ddp, r->state, r->nfull) != 0) return RUN_COMM;
    if (r->state == r->full_state) gpt2_ddp_state_set(&r->ddp, r->full_state);
    const char *restarts = getenv("TORCHELASTIC_RESTART_COUNT");
    if (r->rank == 0)
      fprintf(r->out, "resumed from %s at step %llu%s%s%s\n", r->o->ckpt_dir,
              (unsigned long long)r->start_step, restarts ? " (restart " : "",
              restarts ? restarts : "", restarts ? ")" : "");
  }
  int same = 0;
  if (gpt2_ddp_check_params(&r->ddp, &same) != 0) return RUN_COMM;
  if (!same) {
    fprintf(r->errf, "cohort-gpt2: rank %d: parameters differ between ranks after the broadcast\n",
            r->rank);
    return RUN_FAIL;
  }
  return RUN_OK;
}

/* The step of a metrics file's last line (0: none, or no file). */
static uint64_t metrics_last_step(const char *path) {
  FILE *f = fopen(path, "re");
  if (f == NULL) return 0;
  char buf[4096]; /* several lines */
  long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  long from = size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0;
  size_t n = size > 0 && fseek(f, from, SEEK_SET) == 0 ? fread(buf, 1, sizeof buf - 1, f) : 0;
  fclose(f);
  buf[n] = '\0';
  uint64_t last = 0;
  for (const char *p = buf; (p = strstr(p, "{\"step\":")) != NULL; p++)
    last = strtoull(p + 8, NULL, 10);
  return last;
}

/* Rank 0's metrics file (appended to on resume) and TensorBoard events, and the banner. */
static int open_outputs(train_run *r) {
  const gpt2_train_opts *o = r->o;
  if (r->rank != 0 || r->outputs_open) return RUN_OK;
  r->outputs_open = 1;
  if (o->metrics_path != NULL) {
    /* Appending (a resume, or the rank 0 of a re-formed job): the steps a lost rank 0 wrote. */
    if (r->start_step > 0) r->reported = metrics_last_step(o->metrics_path);
    r->metrics = fopen(o->metrics_path, r->start_step > 0 ? "ae" : "we");
    if (r->metrics == NULL) {
      fprintf(r->errf, "cohort-gpt2: cannot open %s: %s\n", o->metrics_path, strerror(errno));
      return RUN_FAIL;
    }
  }
  if (o->tb_dir != NULL) {
    int rc = gpt2_tb_open(o->tb_dir, &r->tb);
    if (rc != 0) {
      fprintf(r->errf, "cohort-gpt2: cannot write TensorBoard events to %s: %s\n", o->tb_dir,
              strerror(-rc));
      return RUN_FAIL;
    }
  }
  static const char *const compress_names[] = {"", " bf16", " fp16", " powersgd"};
  const char *mode = gpt2_ddp_mode(&r->ddp);
  char psgd[64] = "";
  if (o->grad_compress == GPT2_COMPRESS_POWERSGD)
    snprintf(psgd, sizeof psgd, ":%d from step %lld", o->powersgd_rank,
             (long long)o->powersgd_start + 1);
  fprintf(r->out,
          "cohort-gpt2: %s head, %zu parameters (L=%d H=%d C=%d V=%d), B=%d T=%d accum=%d "
          "world=%d%s%s%s%s, %s, %d threads, OpenBLAS %s kernels, parameters identical on all "
          "ranks\n",
          o->cfg.head == GPT2_HEAD_LM ? "lm" : "qa", r->model.nparams, o->cfg.layers, o->cfg.heads,
          o->cfg.channels, o->cfg.vocab, o->B, o->T, o->grad_accum, r->world,
          strcmp(mode, "zero-1") == 0 ? " zero-1" : "",
          r->world > 1 ? compress_names[o->grad_compress] : "",
          strcmp(mode, "split") == 0 ? " split" : "", psgd,
          o->opt.kind == GPT2_OPT_ADAMW ? "AdamW" : "SGD", r->threads, gpt2_blas_core());
  fflush(r->out);
  return RUN_OK;
}

/* The K micro-steps' forward and backward, the gradients exchanged as backward goes; adds their
 * losses to *loss_sum. */
static int micro_steps(train_run *r, uint64_t step, double *loss_sum) {
  const gpt2_train_opts *o = r->o;
  const int K = o->grad_accum;
  for (int k = 0; k < K; k++) {
    gpt2_batch batch;
    uint64_t g0 = gpt2_data_first(r->pos, r->rank, K, o->B, k);
    gpt2_data_fill(&r->data, g0, &r->bb, &batch);
    /* The first forward finishes the last update (split exchange) as it reads the parameters;
     * what it did not read (the token embedding without the LM head) is settled as the
     * gradients are zeroed. */
    *loss_sum += gpt2_forward_wait(&r->model, &batch, gpt2_ddp_param_wait, &r->ddp);
    if (r->ddp.err) return RUN_COMM;
    if (k == 0 && gpt2_ddp_zero_grad(&r->ddp) != 0) return RUN_COMM;
    int scatter = gpt2_ddp_begin_backward(&r->ddp, (int64_t)step, k == K - 1, batch.tokens);
    /* Summed over the ranks that train: the mean over the global batch. */
    gpt2_backward(&r->model, &batch, 1.0f / (float)(K * r->contrib), gpt2_ddp_hook, &r->ddp,
                  scatter);
    if (r->ddp.err) break; /* backward stopped: finish says why */
  }
  return RUN_OK;
}

/* A catching-up rank's part of the step's exchange: every bucket launched in backward's order
 * (the head's rows, the tail, the layers from the top, the embeddings), its gradients and its rows
 * of the embedding lookup -0.0 on token 0. x + -0.0 == x for every x (-0.0 and +0.0 included),
 * so every sum is the one of the ranks that train. */
static int identity_steps(train_run *r, uint64_t step) {
  gpt2_model *m = &r->model;
  const int K = r->o->grad_accum;
  size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)m->cfg.channels;
  if (r->zero_tok == NULL) r->zero_tok = calloc(BT, sizeof(int32_t));
  if (r->zero_tok == NULL) return RUN_FAIL;
  for (int k = 0; k < K && r->ddp.err == 0; k++) {
    if (k == 0 && gpt2_ddp_zero_grad(&r->ddp) != 0) return RUN_COMM;
    gpt2_ddp_begin_backward(&r->ddp, (int64_t)step, k == K - 1, r->zero_tok);
    for (size_t i = 0; k == 0 && i < m->nparams; i++) m->grads[i] = -0.0f;
    for (size_t i = 0; i < BT * C; i++) m->dres[i] = -0.0f;
    gpt2_ddp_hook(&r->ddp, GPT2_EV_HEAD, m->cfg.vocab);
    gpt2_ddp_hook(&r->ddp, GPT2_EV_TAIL, -1);
    for (int l = m->cfg.layers - 1; l >= 0; l--) gpt2_ddp_hook(&r->ddp, GPT2_EV_LAYER, l);
    gpt2_ddp_hook(&r->ddp, GPT2_EV_EMBED, -1);
  }
  return RUN_OK;
}

/* A catching-up rank keeps the step's averaged gradients and the update's figures, to replay
 * them once its state is in. */
static int keep_replay(train_run *r, float gscale, float lr, int64_t t) {
  replay_step *n = realloc(r->replay, (r->nreplay + 1) * sizeof *n);
  if (n != NULL) r->replay = n;
  size_t bytes = r->model.nparams * sizeof(float);
  float *g = n != NULL ? gpt2_big_alloc(bytes) : NULL;
  if (g == NULL) {
    fprintf(r->errf, "cohort-gpt2: rank %d: out of memory keeping a step to replay\n", r->rank);
    return RUN_FAIL;
  }
  memcpy(g, r->model.grads, bytes);
  r->replay[r->nreplay++] = (replay_step){.g = g, .gscale = gscale, .lr = lr, .t = t};
  return RUN_OK;
}

/* The step's loss summed over the ranks, and while ranks catch up whether every one of them has
 * its state (a second element of the same reduction: every rank sees the same answer). */
static int sum_loss(train_run *r, double *loss) {
  int polled = r->catching ? cohort_comm_state_stream_poll(r->stream, NULL) : 1;
  double x[2] = {*loss, polled != 1};
  if (gpt2_ddp_sum(&r->ddp, x, r->contrib < r->world ? 2 : 1) != 0) return RUN_COMM;
  if (polled < 0) {
    fprintf(r->errf, "cohort-gpt2: rank %d: the state stream from the donors failed: %s\n", r->rank,
            cohort_strerror(polled));
    return RUN_FAIL;
  }
  r->ready = r->contrib < r->world && x[1] == 0.0;
  *loss = x[0] / r->contrib;
  return RUN_OK;
}

/* Forward and backward of the K micro-steps (gradients exchanged as backward goes), the global
 * loss, clipping and the optimiser update (a catching-up rank: kept for its replay). */
static int train_step(train_run *r, uint64_t step, step_stats *st) {
  const gpt2_train_opts *o = r->o;
  const int K = o->grad_accum;
  double t0 = now_s();
  int64_t c0 = gpt2_cpu_us();
  double loss = 0.0;
  int rc = r->catching ? identity_steps(r, step) : micro_steps(r, step, &loss);
  if (rc != RUN_OK) return rc;
  if (gpt2_ddp_finish_backward(&r->ddp) != 0) return RUN_COMM;
  r->exchanged = 1;
  loss = r->catching ? -0.0 : loss / K;
  if ((rc = sum_loss(r, &loss)) != RUN_OK) return rc;
  if (!isfinite(loss)) {
    if (r->rank == 0)
      fprintf(r->errf, "cohort-gpt2: loss is %f at step %llu; stopping\n", loss,
              (unsigned long long)step + 1);
    return RUN_FAIL;
  }
  double gnorm = 0.0;
  int64_t c1 = gpt2_cpu_us();
  if (gpt2_ddp_grad_norm(&r->ddp, &gnorm) != 0) return RUN_COMM;
  float gscale = 1.0f;
  if (o->clip > 0.0f && gnorm > o->clip) gscale = (float)(o->clip / (gnorm + 1e-6));
  int64_t warmup = o->warmup >= 0 ? o->warmup : 0;
  float lr = gpt2_lr_at(o->schedule, o->lr, warmup, o->steps, o->min_lr_ratio, (int64_t)step);
  if (r->catching) {
    if ((rc = keep_replay(r, gscale, lr, (int64_t)step + 1)) != RUN_OK) return rc;
  } else {
    if (gpt2_ddp_step(&r->ddp, gscale, lr, (int64_t)step + 1) != 0) return RUN_COMM;
    /* Re-forming, the step is complete (all of its update applied) or not at all. */
    if (r->reform && gpt2_ddp_commit(&r->ddp) != 0) return RUN_COMM;
  }
  double step_s = now_s() - t0;
  int64_t c2 = gpt2_cpu_us();
  double comm_ms = r->ddp.comm_ms;
  /* The share of the communication window that backward covered. */
  double hidden = comm_ms > 0.0 ? 1.0 - r->ddp.exposed_ms / comm_ms : 1.0;
  *st = (step_stats){.step = step + 1,
                     .world = r->contrib,
                     .loss = loss,
                     .gnorm = gnorm,
                     .step_s = step_s,
                     .tok_s = r->tokens_per_step / step_s,
                     .gflops = r->flops_micro * K / step_s * 1e-9,
                     .comm_ms = comm_ms,
                     .hidden = hidden < 0.0 ? 0.0 : hidden,
                     .wire_mb = r->ddp.wire_bytes * 1e-6,
                     .ratio = r->ddp.wire_bytes > 0 ? r->ddp.f32_bytes / r->ddp.wire_bytes : 1.0,
                     .lr = lr,
                     .cpu_ms = (double)(c2 - c0) * 1e-3,
                     .compute_ms = (double)(c1 - c0) * 1e-3 - r->ddp.compress_ms,
                     .compress_ms = r->ddp.compress_ms,
                     .update_ms = (double)(c2 - c1) * 1e-3,
                     .exposed_ms = r->ddp.exposed_ms};
  r->wire_total += r->ddp.wire_bytes;
  r->f32_total += r->ddp.f32_bytes;
  r->step_times[r->ntimes++] = step_s;
  if (step > r->start_step) {
    r->comm_total += comm_ms;
    r->exposed_total += r->ddp.exposed_ms;
  }
  r->last_loss = loss;
  r->pos = gpt2_data_advance(r->pos, r->contrib, K, o->B);
  return RUN_OK;
}

/* One JSON object per line, the step first (what `cohort plot` and the tests key on). */
static int write_metrics(train_run *r, const step_stats *st) {
  json_t *j = json_pack(
      "{s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:f}", "step",
      (json_int_t)st->step, "loss", st->loss, "lr", (double)st->lr, "grad_norm", st->gnorm,
      "step_ms", st->step_s * 1e3, "tokens_per_s", st->tok_s, "gflops", st->gflops, "comm_ms",
      st->comm_ms, "hidden_frac", st->hidden, "world", st->world, "wire_mb", st->wire_mb,
      "compress_ratio", st->ratio, "cpu_ms", st->cpu_ms, "compute_ms", st->compute_ms,
      "compress_ms", st->compress_ms, "update_ms", st->update_ms, "exposed_ms", st->exposed_ms);
  int rc = j == NULL ? -1 : json_dumpf(j, r->metrics, JSON_COMPACT | JSON_REAL_PRECISION(17));
  json_decref(j);
  if (rc != 0 || fputc('\n', r->metrics) == EOF || fflush(r->metrics) != 0) {
    fprintf(r->errf, "cohort-gpt2: writing %s: %s\n", r->o->metrics_path,
            j == NULL ? "a figure is not finite" : strerror(errno));
    return RUN_FAIL;
  }
  return RUN_OK;
}

static int write_tb(train_run *r, const step_stats *st) {
  static const char *const tags[] = {"train/loss",   "train/lr",          "train/grad_norm",
                                     "perf/step_ms", "perf/tokens_per_s", "perf/gflops",
                                     "comm/comm_ms", "comm/hidden_frac"};
  const float vals[] = {(float)st->loss,           st->lr,           (float)st->gnorm,
                        (float)(st->step_s * 1e3), (float)st->tok_s, (float)st->gflops,
                        (float)st->comm_ms,        (float)st->hidden};
  int rc = gpt2_tb_add_scalars(r->tb, (int64_t)st->step, 8, tags, vals);
  if (rc != 0) {
    fprintf(r->errf, "cohort-gpt2: writing %s: %s\n", gpt2_tb_path(r->tb), strerror(-rc));
    return RUN_FAIL;
  }
  return RUN_OK;
}

/* Rank 0 reports a step: a line on stdout, a JSON line, TensorBoard scalars. */
static int report_step(train_run *r, const step_stats *st) {
  if (r->rank != 0) return RUN_OK;
  if (!r->o->quiet) {
    fprintf(r->out,
            "step %5llu/%lld | loss %.6f | lr %.3e | norm %.3f | %8.1f ms | %9.1f tok/s | "
            "%6.1f GFLOP/s | comm %6.1f ms (%3.0f%% hidden) | wire %.2f MB (%.2fx) | cpu %.0f ms: "
            "compute %.0f compress %.0f update %.0f | waited %.0f ms%s\n",
            (unsigned long long)st->step, (long long)r->o->steps, st->loss, st->lr, st->gnorm,
            st->step_s * 1e3, st->tok_s, st->gflops, st->comm_ms, st->hidden * 100.0, st->wire_mb,
            st->ratio, st->cpu_ms, st->compute_ms, st->compress_ms, st->update_ms, st->exposed_ms,
            st->late ? " | received with the state" : "");
    fflush(r->out);
  }
  int rc = r->metrics != NULL ? write_metrics(r, st) : RUN_OK;
  if (rc == RUN_OK && r->tb != NULL) rc = write_tb(r, st);
  if (rc == RUN_OK) r->reported = st->step;
  return rc;
}

/* Every ckpt_every steps and at the last: the whole state is gathered on every rank (ZeRO), rank 0
 * writes it. */
static int maybe_checkpoint(train_run *r, uint64_t done) {
  const gpt2_train_opts *o = r->o;
  if (o->ckpt_dir == NULL || o->ckpt_every <= 0 ||
      (done % (uint64_t)o->ckpt_every != 0 && done != (uint64_t)o->steps))
    return RUN_OK;
  if (r->state == r->full_state && gpt2_ddp_state_get(&r->ddp, r->full_state) != 0) return RUN_COMM;
  if (r->rank != 0) return RUN_OK;
  gpt2_ckpt_header h = r->want;
  h.step = done;
  h.data_pos = r->pos;
  h.rng = o->seed; /* batches and weights derive from the seed alone */
  if (gpt2_ckpt_save(o->ckpt_dir, &h, r->model.params, r->state, o->ckpt_keep, r->err,
                     sizeof r->err) != 0) {
    fprintf(r->errf, "cohort-gpt2: %s\n", r->err);
    return RUN_FAIL;
  }
  return RUN_OK;
}

/* Rank 0's last line: medians over the steps run (the first pays for page faults and thread
 * start-up, so it is left out when there are others), memory against the estimate. */
static void print_summary(train_run *r) {
  const gpt2_train_opts *o = r->o;
  if (r->ntimes == 0) {
    /* Resumed from a checkpoint of the last step: nothing ran, so there is no loss to show. */
    fprintf(r->out,
            "summary: 0 steps run: the checkpoint resumed is already at step %llu of %lld\n",
            (unsigned long long)r->start_step, (long long)o->steps);
    return;
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double rss = (double)ru.ru_maxrss * 1024.0;
  double est = gpt2_train_estimate_bytes(o, r->world);
  double *times = r->ntimes > 1 ? r->step_times + 1 : r->step_times;
  size_t nt = r->ntimes > 1 ? r->ntimes - 1 : r->ntimes;
  double med = median(times, nt);
  fprintf(r->out,
          "summary: %zu steps, final loss %.6f, median step %.1f ms, %.1f tok/s (global), %.1f "
          "GFLOP/s/rank, comm %.1f ms/step (%.0f%% hidden), wire %.2f MB/step (compression "
          "%.2fx), peak RSS %.1f MiB (estimate %.1f MiB = params+grads+optimizer+activations, "
          "ratio %.2f)\n",
          r->ntimes, r->last_loss, med * 1e3, med > 0 ? r->tokens_per_step / med : 0.0,
          med > 0 ? r->flops_micro * o->grad_accum / med * 1e-9 : 0.0,
          nt > 0 ? r->comm_total / (double)nt : 0.0,
          r->comm_total > 0 ? 100.0 * (1.0 - r->exposed_total / r->comm_total) : 100.0,
          r->wire_total * 1e-6 / (double)r->ntimes,
          r->wire_total > 0 ? r->f32_total / r->wire_total : 1.0, rss / 1048576.0, est / 1048576.0,
          rss / est);
}

/* ---- re-form (docs/gpt2.md "Re-form") ---- */

/* What the ranks of a new membership agree on when they (re)join: each rank's completed steps (-1:
 * no state) and whether the exchange failed inside a step. */
typedef struct join_view {
  int64_t max;         /* the highest completed step: where the run goes on */
  int old_world;       /* the world of the membership that ended (0: none, a first start) */
  int behind, dropped; /* survivors behind it (they receive the state); a step in flight lost */
  int nnew;            /* ranks that receive the state */
  /* The ranks without state catch up while the others train (start_catch_up): every rank may,
   * none is behind, and those with state are the lowest. */
  int catch_up;
} join_view;

/* Whether this rank may catch up a newcomer in the background: the plain exchange (the others'
 * sums are not bit for bit those of the ranks that train with -0.0 added: docs/gpt2.md), unless
 * COHORT_GPT2_CATCH_UP=0 (the state transfer that blocks every rank). */
static int may_catch_up(const train_run *r) {
  const char *e = getenv("COHORT_GPT2_CATCH_UP");
  return strcmp(gpt2_ddp_mode(&r->ddp), "plain") == 0 && (e == NULL || strcmp(e, "0") != 0);
}

static void view_of(const int64_t *all, int world, join_view *v) {
  *v = (join_view){.max = -1, .catch_up = 1};
  for (int i = 0; i < world; i++) {
    if (all[4 * i] > v->max) v->max = all[4 * i];
    if (all[4 * i + 2] > v->old_world) v->old_world = (int)all[4 * i + 2];
    v->catch_up &= all[4 * i + 3] != 0;
  }
  int first_new = world;
  for (int i = 0; i < world; i++) {
    v->behind += all[4 * i] >= 0 && all[4 * i] < v->max;
    v->nnew += all[4 * i] < v->max;
    v->dropped |= all[4 * i] == v->max && all[4 * i + 1] != 0;
    if (all[4 * i] < v->max && first_new == world) first_new = i;
    if (all[4 * i] == v->max && i > first_new) v->catch_up = 0;
  }
  v->catch_up &= v->max >= 0 && v->behind == 0 && v->nnew > 0 && v->nnew < world;
}

static int agree(train_run *r, int64_t mine, int old_world, join_view *v) {
  int64_t me[4] = {mine, r->in_step, old_world, may_catch_up(r)};
  int64_t *all = calloc((size_t)r->world * 4, sizeof(int64_t));
  if (all == NULL) return RUN_FAIL;
  int rc = r->world > 1 ? cohort_allgather(r->comm, me, all, 4, COHORT_I64) : 0;
  if (r->world == 1) memcpy(all, me, sizeof me);
  if (rc != 0) {
    free(all);
    gpt2_ddp_fail(&r->ddp, rc, "allgather of the completed steps");
    return RUN_COMM;
  }
  view_of(all, r->world, v);
  free(all);
  return RUN_OK;
}

/* ---- catching up: the state streams while the ranks with it train (docs/gpt2.md "Re-form") ----
 */

/* Ends the stream (if it runs), frees the snapshot and the steps kept: a re-form, or the end. */
static void catch_up_drop(train_run *r) {
  if (r->stream != NULL) cohort_comm_state_stream_end(r->comm, r->stream);
  r->stream = NULL;
  gpt2_big_free(r->snap, r->snap_bytes);
  r->snap = NULL;
  for (size_t i = 0; i < r->nreplay; i++)
    gpt2_big_free(r->replay[i].g, r->model.nparams * sizeof(float));
  free(r->replay);
  r->replay = NULL;
  r->nreplay = 0;
  r->catching = r->ready = 0;
  free(r->zero_tok);
  r->zero_tok = NULL;
}

/* The ranks without state (the highest: nnew of them) catch up: every rank with state (a donor)
 * copies it into a snapshot and streams its share of it to them in the background; they take part
 * in every step's reductions from here on without training (train_step). */
static int start_catch_up(train_run *r, int64_t mine, const join_view *v, double t0) {
  r->catching = mine < 0;
  set_contrib(r, r->world - v->nnew);
  if (!r->catching) r->snap_last = r->last;
  cohort_iov last = {&r->snap_last, sizeof r->snap_last};
  int n;
  cohort_iov *iov = gpt2_state_pieces(&r->model, &r->ddp, &r->snap_head, (uint64_t)v->max, r->pos,
                                      r->o->seed, last, &n);
  if (iov == NULL) {
    fprintf(r->errf, "cohort-gpt2: rank %d: the state: %s\n", r->rank, strerror(-n));
    return RUN_FAIL;
  }
  r->snap_bytes = 0;
  for (int i = 0; i < n; i++) r->snap_bytes += iov[i].len;
  if (!r->catching) { /* a donor: every rank not new */
    char *p = r->snap = gpt2_big_alloc(r->snap_bytes);
    for (int i = 0; i < n && p != NULL; p += iov[i++].len) {
      memcpy(p, iov[i].base, iov[i].len);
      iov[i].base = p;
    }
  }
  int rc = !r->catching && r->snap == NULL
               ? -ENOMEM
               : cohort_comm_state_stream_begin(r->comm, iov, n, &r->stream);
  free(iov);
  if (rc != 0) {
    gpt2_ddp_fail(&r->ddp, rc, "state stream");
    return RUN_COMM;
  }
  r->catch_step = (uint64_t)v->max;
  r->catch_t0 = now_s();
  if (r->catching) r->done = r->catch_step;
  r->start_step = r->done;
  r->in_step = 0;
  if (r->rank == 0) {
    fprintf(r->out,
            "cohort-gpt2: re-formed (epoch %d): world %d -> %d at step %lld (step in flight %s), "
            "%d rank(s) catching up: %zu bytes of state streaming from %d rank(s) while they "
            "train, %.3f s in all\n",
            cohort_comm_epoch(r->comm), v->old_world, r->world, (long long)v->max,
            v->dropped ? "dropped" : "none", v->nnew, r->snap_bytes, r->contrib, now_s() - t0);
    fflush(r->out);
  }
  return open_outputs(r);
}

/* A catching-up rank whose state is in: replays the steps it kept through the optimiser's own
 * code (the bits of the others' updates), from the snapshot's data position. */
static int replay(train_run *r) {
  if (gpt2_state_check(&r->snap_head, &r->model, &r->ddp) != 0 ||
      r->snap_head.step + r->nreplay != r->done) {
    fprintf(r->errf, "cohort-gpt2: rank %d: the state streamed does not fit this model\n", r->rank);
    return RUN_FAIL;
  }
  uint64_t pos = r->snap_head.data_pos;
  for (size_t i = 0; i < r->nreplay; i++) {
    const replay_step *k = &r->replay[i];
    memcpy(r->model.grads, k->g, r->model.nparams * sizeof(float));
    if (gpt2_ddp_step(&r->ddp, k->gscale, k->lr, k->t) != 0 || gpt2_ddp_commit(&r->ddp) != 0)
      return RUN_COMM;
    pos = gpt2_data_advance(pos, r->contrib, r->o->grad_accum, r->o->B);
  }
  r->pos = pos;
  r->stateful = 1;
  cohort_comm_set_step(r->comm, (int64_t)r->done);
  fprintf(r->out,
          "cohort-gpt2: rank %d (newcomer%s): caught up: snapshot of step %llu (%zu bytes) in, "
          "replayed %zu step(s), %.3f s after it began\n",
          r->rank, r->ahead ? ", started ahead" : "", (unsigned long long)r->catch_step,
          r->snap_bytes, r->nreplay, now_s() - r->catch_t0);
  fflush(r->out);
  return RUN_OK;
}

/* Every rank, at the step boundary where all agreed that the catching-up ranks have their state:
 * they replay, and every rank trains from the next step on; the parameters are checked. */
static int catch_up_finish(train_run *r) {
  /* A donor's thread has the receivers' answers a moment after they said so. */
  for (int i = 0; i < 60000 && cohort_comm_state_stream_poll(r->stream, NULL) == 0; i++)
    usleep(1000);
  double stream_s = now_s() - r->catch_t0;
  int rc = cohort_comm_state_stream_end(r->comm, r->stream);
  r->stream = NULL;
  if (rc != 0) {
    fprintf(r->errf, "cohort-gpt2: rank %d: the state stream: %s\n", r->rank, cohort_strerror(rc));
    return RUN_FAIL;
  }
  int st = r->catching ? replay(r) : RUN_OK;
  size_t replayed = (size_t)(r->done - r->catch_step);
  int first = r->contrib;
  catch_up_drop(r);
  set_contrib(r, r->world);
  int same = 0;
  if (st == RUN_OK && gpt2_ddp_check_params(&r->ddp, &same) != 0) st = RUN_COMM;
  if (st == RUN_OK && !same) {
    fprintf(r->errf, "cohort-gpt2: rank %d: parameters differ between ranks after catching up\n",
            r->rank);
    st = RUN_FAIL;
  }
  if (st == RUN_OK && r->rank == 0) {
    fprintf(r->out,
            "cohort-gpt2: rank(s) %d-%d caught up: received %zu bytes of state in the background "
            "from %d rank(s) (the snapshot of step %llu, in at most %.3f s), replayed %zu "
            "step(s), contribute from step %llu\n",
            first, r->world - 1, r->snap_bytes, first, (unsigned long long)r->catch_step, stream_s,
            replayed, (unsigned long long)r->done + 1);
    fflush(r->out);
  }
  return st;
}

/* The run's last step is done while ranks still catch up: the ranks wait together for the state
 * (an agreed flag every 10 ms, 600 s at most), then finish it. */
static int catch_up_drain(train_run *r) {
  for (int i = 0; i < 60000; i++) {
    double x = r->catching && cohort_comm_state_stream_poll(r->stream, NULL) != 1;
    if (gpt2_ddp_sum(&r->ddp, &x, 1) != 0) return RUN_COMM;
    if (x == 0.0) return catch_up_finish(r);
    int polled = r->catching ? cohort_comm_state_stream_poll(r->stream, NULL) : 0;
    if (polled < 0) {
      fprintf(r->errf, "cohort-gpt2: rank %d: the state stream from the donors failed: %s\n",
              r->rank, cohort_strerror(polled));
      return RUN_FAIL;
    }
    usleep(10000);
  }
  fprintf(r->errf, "cohort-gpt2: rank %d: the state stream did not end within 600 s\n", r->rank);
  return RUN_FAIL;
}

/* The state from the lowest rank at the agreed step to every rank without it (newcomers, survivors
 * behind), sent from and received into the model's and the exchange's own buffers. *moved: the
 * bytes each of them received (every piece, the step's report included). */
static int receive_state(train_run *r, int64_t mine, const join_view *v, double *xfer_s,
                         size_t *moved) {
  int receiver = mine < v->max;
  if (receiver) cohort_comm_mark_new(r->comm); /* also one whose stream ended before it caught up */
  gpt2_state_head head;
  int n;
  cohort_iov last = {&r->last, sizeof r->last}; /* step_stats: plain numbers */
  cohort_iov *iov =
      gpt2_state_pieces(&r->model, &r->ddp, &head, r->done, r->pos, r->o->seed, last, &n);
  if (iov == NULL) {
    fprintf(r->errf, "cohort-gpt2: rank %d: the state: %s\n", r->rank, strerror(-n));
    return RUN_FAIL;
  }
  *moved = 0;
  for (int i = 0; i < n; i++) *moved += iov[i].len;
  double t0 = now_s();
  int rc = r->world > 1 ? cohort_comm_state_transferv(r->comm, iov, n) : 0;
  *xfer_s = now_s() - t0;
  free(iov);
  if (rc != 0) {
    gpt2_ddp_fail(&r->ddp, rc, "state transfer");
    return RUN_COMM;
  }
  if (receiver) {
    if (gpt2_state_check(&head, &r->model, &r->ddp) != 0) {
      fprintf(r->errf, "cohort-gpt2: rank %d: the state received does not fit this model\n",
              r->rank);
      return RUN_FAIL;
    }
    /* This rank's own part: as the failed step left it when another rank completed that step,
     * else none. */
    gpt2_ddp_own_state_set(
        &r->ddp, mine >= 0 && mine + 1 == v->max && r->own_after_valid ? r->own_after : NULL);
    r->done = head.step;
    r->pos = head.data_pos;
  }
  r->start_step = r->done;
  r->stateful = 1;
  r->own_after_valid = 0;
  return RUN_OK;
}

/* Joins the current membership: agree on the step, hand the state to the ranks without it, check
 * that every rank holds the same parameters. With no state anywhere: the checkpoint. */
static int train_join(train_run *r, int old_world, double t0) {
  int64_t mine = r->stateful && !cohort_comm_is_new(r->comm, r->rank) ? (int64_t)r->done : -1;
  join_view v;
  int st = agree(r, mine, old_world, &v);
  if (st != RUN_OK) return st;
  if (v.max < 0) {
    if (r->rank == 0)
      fprintf(r->out, "cohort-gpt2: no rank of the job has its state: resuming from %s\n",
              r->o->ckpt_dir ? r->o->ckpt_dir : "the start (no --ckpt-dir)");
    st = train_resume(r);
    r->stateful = st == RUN_OK;
    return st;
  }
  if (v.catch_up) return start_catch_up(r, mine, &v, t0);
  double xfer_s = 0.0, t1 = now_s();
  size_t bytes = 0;
  int first = r->newcomer && !r->stateful; /* a newcomer receiving its first state */
  st = receive_state(r, mine, &v, &xfer_s, &bytes);
  double t2 = now_s();
  int same = 0;
  if (st == RUN_OK && gpt2_ddp_check_params(&r->ddp, &same) != 0) st = RUN_COMM;
  if (st == RUN_OK && !same) {
    fprintf(r->errf,
            "cohort-gpt2: rank %d: parameters differ between ranks after the state "
            "transfer\n",
            r->rank);
    st = RUN_FAIL;
  }
  if (st != RUN_OK) return st;
  if (first) { /* where a newcomer's time went (docs/gpt2.md "Re-form") */
    fprintf(r->out,
            "cohort-gpt2: rank %d (newcomer%s): set up %.3f s, joined the membership %.3f s "
            "later, exchange set up %.3f s, state %zu bytes in %.3f s (%.2f GB/s), checked "
            "%.3f s: %.3f s in all\n",
            r->rank, r->ahead ? ", started ahead" : "", r->t_setup - r->t_start,
            r->t_member - r->t_setup, t1 - r->t_member, bytes, xfer_s,
            xfer_s > 0 ? (double)bytes / xfer_s * 1e-9 : 0.0, now_s() - t2, now_s() - r->t_start);
    fflush(r->out);
  }
  /* Rank 0 may be a newcomer (a replacement takes its predecessor's place): the line comes from
   * what the ranks agreed on. */
  if (r->rank == 0 && v.old_world > 0) {
    fprintf(r->out,
            "cohort-gpt2: re-formed (epoch %d): world %d -> %d at step %lld (step in flight %s), "
            "%d rank(s) received %zu bytes of state in %.3f s, %.3f s in all\n",
            cohort_comm_epoch(r->comm), v.old_world, r->world, (long long)v.max,
            v.dropped  ? "dropped"
            : v.behind ? "kept"
                       : "none",
            v.nnew, v.nnew ? bytes : 0, xfer_s, now_s() - t0);
    fflush(r->out);
  }
  r->in_step = 0;
  st = open_outputs(r);
  /* Every step has its line once: a rank 0 that received the step it goes on from (it was behind,
   * or is new) writes its line from the report that came with the state, unless its metrics have
   * it (a lost rank 0 wrote it). */
  if (st == RUN_OK && r->rank == 0 && v.max > 0 && r->last.step == (uint64_t)v.max &&
      r->reported < r->last.step) {
    step_stats late = r->last;
    late.late = 1;
    st = report_step(r, &late);
  }
  return st;
}

/* The membership ended (COHORT_ERESHAPED): keep the state of the last completed step, re-form the
 * communicator, set the exchange up for the new world and join it. Bounded: the agent stops a job
 * that keeps losing ranks (cohort_comm_reform then fails). */
static int train_reform(train_run *r) {
  double t0 = now_s();
  int old_world = r->world;
  catch_up_drop(r); /* a rank still catching up receives the state of the new membership */
  for (int round = 0; round < 64; round++) {
    int rc = cohort_comm_reform(r->comm);
    if (rc == COHORT_ERESHAPED) continue; /* it ended again while connecting: the next one */
    if (rc != 0) {
      fprintf(r->errf, "cohort-gpt2: rank %d: re-form failed: %s\n", r->rank,
              cohort_comm_error_message(r->comm)[0] ? cohort_comm_error_message(r->comm)
                                                    : cohort_strerror(rc));
      return RUN_FAIL;
    }
    if (gpt2_model_own_grads(&r->model) != 0) return RUN_FAIL;
    /* The state stays where it is: the new exchange takes over the old one's buffers. */
    gpt2_ddp old = r->ddp;
    memset(&r->ddp, 0, sizeof r->ddp);
    r->rank = cohort_comm_rank(r->comm);
    r->world = cohort_comm_size(r->comm);
    int st = setup_exchange(r, &old);
    if (st == RUN_OK) st = train_join(r, old_world, t0);
    if (st != RUN_COMM || r->ddp.err != COHORT_ERESHAPED) return st;
  }
  fprintf(r->errf, "cohort-gpt2: rank %d: 64 re-forms in a row without a step: giving up\n",
          r->rank);
  return RUN_FAIL;
}

/* A step failed after its exchange: keeps this rank's own state as the exchange left it. */
static void keep_own_after(train_run *r) {
  size_t n = gpt2_ddp_own_state_floats(&r->ddp);
  if (!r->exchanged || n == 0 || !r->ddp.kept_valid) return;
  if (r->own_after == NULL) r->own_after = malloc(n * sizeof(float));
  if (r->own_after == NULL) return; /* then it starts from zero, as a newcomer's */
  gpt2_ddp_own_state_get(&r->ddp, r->own_after);
  r->own_after_valid = 1;
}

/* Tests (COHORT_GPT2_TEST_FAIL=K:PATH): this rank's step K completed all its collectives; once
 * PATH exists (the test made it when the other ranks completed K too: 60 s at most) it fails
 * as if the last had not, once. So this survivor is behind the others at the re-form it starts
 * (docs/gpt2.md "Re-form"): it must receive step K's state, and compute nothing again. */
static int test_fail(train_run *r) {
  r->test_fail_step = 0;
  for (int i = 0; i < 60000 && access(r->test_fail_path, F_OK) != 0; i++) usleep(1000);
  gpt2_ddp_fail(&r->ddp, COHORT_ERESHAPED, "test: a completed step made to fail");
  return RUN_COMM;
}

/* One step, its report and checkpoint. Re-forming, what a failing exchange would change is kept
 * first and put back when it fails: the state is then the last completed step's. */
static int train_one(train_run *r) {
  uint64_t step = r->done;
  step_stats st;
  /* Alone, no exchange would see the membership end (a node joining): ask between steps. */
  if (r->reform && r->world == 1) {
    int rc = cohort_barrier(r->comm);
    if (rc != 0) {
      gpt2_ddp_fail(&r->ddp, rc, "barrier");
      return RUN_COMM;
    }
  }
  if (r->reform && gpt2_ddp_keep(&r->ddp, (int64_t)step) != 0) {
    fprintf(r->errf, "cohort-gpt2: out of memory\n");
    return RUN_FAIL;
  }
  r->in_step = 1;
  r->exchanged = r->own_after_valid = 0;
  int rc = train_step(r, step, &st);
  if (rc == RUN_OK && r->test_fail_step == step + 1) rc = test_fail(r);
  if (rc != RUN_OK) {
    if (r->reform) keep_own_after(r);
    if (r->reform) gpt2_ddp_rollback(&r->ddp);
    return rc;
  }
  r->in_step = 0;
  r->done = step + 1;
  r->last = st;
  if (r->comm != NULL && r->reform) cohort_comm_set_step(r->comm, (int64_t)r->done);
  cohort_progress((int64_t)step + 1); /* the step, for cohort run's --hang-timeout */
  rc = report_step(r, &st);
  if (rc == RUN_OK) rc = maybe_checkpoint(r, step + 1);
  if (rc == RUN_OK && r->ready) rc = catch_up_finish(r);
  return rc;
}

static int reshaped(const train_run *r, int rc) {
  return rc == RUN_COMM && r->reform && r->ddp.err == COHORT_ERESHAPED;
}

/* After the last step: every rank holds the same parameters. */
static int final_check(train_run *r, int *finished) {
  int st = r->contrib < r->world ? catch_up_drain(r) : RUN_OK;
  if (st != RUN_OK) return st;
  int same = 0;
  if (gpt2_ddp_check_params(&r->ddp, &same) != 0) return RUN_COMM;
  if (!same) {
    fprintf(r->errf, "cohort-gpt2: rank %d: parameters diverged between ranks\n", r->rank);
    return RUN_FAIL;
  }
  *finished = 1;
  return RUN_OK;
}

static int train_loop(train_run *r) {
  r->done = r->start_step;
  for (int finished = 0; !finished;) {
    int rc = r->done < (uint64_t)r->o->steps ? train_one(r) : final_check(r, &finished);
    if (reshaped(r, rc)) rc = train_reform(r);
    if (rc != RUN_OK) return rc;
  }
  if (r->rank == 0) print_summary(r);
  return RUN_OK;
}

int gpt2_train(const gpt2_train_opts *o) {
  train_run r = {.o = o, .out = o->out, .errf = o->err};
  int rc = train_setup(&r);
  /* A newcomer receives the state from the running job; the others start or resume. */
  if (rc == RUN_OK) rc = r.newcomer ? train_join(&r, 0, now_s()) : train_resume(&r);
  if (r.newcomer && reshaped(&r, rc)) rc = train_reform(&r);
  r.stateful = rc == RUN_OK && !r.catching; /* a rank catching up: once it has replayed */
  if (rc == RUN_OK) rc = open_outputs(&r);
  if (rc == RUN_OK) rc = train_loop(&r);
  if (rc == RUN_COMM)
    fprintf(r.errf, "cohort-gpt2: rank %d: %s\n", r.rank,
            r.ddp.errmsg[0] ? r.ddp.errmsg : "communication failed");
  int status = rc == RUN_USAGE ? 2 : rc != RUN_OK ? 1 : 0;
  if (r.metrics != NULL && fclose(r.metrics) != 0 && status == 0) {
    fprintf(r.errf, "cohort-gpt2: writing %s: %s\n", o->metrics_path, strerror(errno));
    status = 1;
  }
  r.metrics = NULL;
  /* A failing rank aborts the communicator so its peers fail fast too. */
  if (r.comm != NULL && status != 0) cohort_comm_abort(r.comm);
  train_free(&r);
  return status;
}

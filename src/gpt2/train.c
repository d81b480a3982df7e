/* train.c - the training loop of cohort-gpt2 (see train.h). */
#include "gpt2/train.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "gpt2/kernels.h"
#include "gpt2/rng.h"
#include "gpt2/run.h"

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

static void train_free(train_run *r) {
  gpt2_catch_up_drop(r);
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

/* The ranks that train a step, and what depends on them: the global batch, this rank's data, the
 * rank that writes checkpoints. */
void gpt2_run_set_contrib(train_run *r, int contrib, int slot, int writer) {
  r->contrib = contrib;
  r->slot = slot;
  r->writer = writer;
  r->global_batch = (uint64_t)r->o->B * (uint64_t)r->o->grad_accum * (uint64_t)contrib;
  r->tokens_per_step = (double)r->global_batch * r->o->T;
}

/* The data parallelism over the current communicator, and what depends on the world: the global
 * batch, the checkpoint's layout and the buffer that assembles it. After a re-form `old` is the
 * exchange of the membership that ended: its state carries over, then it is freed. */
int gpt2_run_setup_exchange(train_run *r, gpt2_ddp *old) {
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
  gpt2_run_set_contrib(r, r->world, r->rank, 0);
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

/* Tests only: COHORT_GPT2_TEST_STEP_MS=N, each step sleeps N ms first (a slow step, so that a
 * test can reach one early). */
static void test_step_from_env(train_run *r) {
  const char *v = getenv("COHORT_GPT2_TEST_STEP_MS");
  long ms = v != NULL ? strtol(v, NULL, 10) : 0;
  r->test_step_ms = ms > 0 && ms <= 60000 ? (int)ms : 0;
}

/* COHORT_GROW_BREAK: the share of a step within which a node joining breaks it, 0 to 1; unset or
 * empty: derived from the world (grow_break -1). A malformed value: RUN_USAGE. */
static int grow_break_from_env(train_run *r) {
  const char *l = getenv("LOCAL_WORLD_SIZE");
  long n = l != NULL ? strtol(l, NULL, 10) : 1;
  r->node_ranks = n >= 1 && n <= 1 << 20 ? (int)n : 1;
  r->grow_break = -1.0;
  const char *v = getenv("COHORT_GROW_BREAK");
  if (v == NULL || v[0] == '\0') return RUN_OK;
  char *end = NULL;
  double f = strtod(v, &end);
  if (end == v || *end != '\0' || !(f >= 0.0 && f <= 1.0)) {
    fprintf(r->errf, "cohort-gpt2: COHORT_GROW_BREAK=%.40s is not a share of a step from 0 to 1\n",
            v);
    return RUN_USAGE;
  }
  r->grow_break = f;
  return RUN_OK;
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
  r->t_start = gpt2_now_s();
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
  r->t_setup = gpt2_now_s();
  if (make_comm(&r->comm, r->errf) != 0) return RUN_FAIL;
  r->t_member = gpt2_now_s();
  r->world = 1;
  if (r->comm != NULL) {
    r->rank = cohort_comm_rank(r->comm);
    r->world = cohort_comm_size(r->comm);
  }
  r->reform = r->reform && r->comm != NULL;
  /* A node joining ends no step but one barely begun (open_break_window): the ranks re-form after
   * the step they agree on (sum_loss). */
  if (r->reform && (rc = cohort_comm_defer_grow(r->comm, 1)) != 0) {
    fprintf(r->errf, "cohort-gpt2: %s\n", cohort_strerror(rc));
    return RUN_USAGE;
  }
  if (r->reform && (rc = grow_break_from_env(r)) != RUN_OK) return rc;
  r->newcomer = r->reform && nc != NULL && strcmp(nc, "1") == 0;
  r->ahead = r->reform && started_ahead();
  if (r->reform) test_fail_from_env(r);
  if (r->reform) test_step_from_env(r);
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
  return gpt2_run_setup_exchange(r, NULL);
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
int gpt2_run_resume(train_run *r) {
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
int gpt2_run_open_outputs(train_run *r) {
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
    uint64_t g0 = gpt2_data_first(r->pos, r->slot, K, o->B, k);
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

/* The step's loss summed over the ranks and, re-forming, whether every catching-up rank has its
 * state and whether a node's joining is pending on some rank (more elements of the same
 * reduction: every rank sees the same answers, at the same step). */
static int sum_loss(train_run *r, double *loss) {
  int polled = r->catching ? cohort_comm_state_stream_poll(r->stream, NULL) : 1;
  double x[3] = {*loss, gpt2_catch_up_pending(r, polled),
                 r->reform && cohort_comm_grow_pending(r->comm) == 1};
  if (gpt2_ddp_sum(&r->ddp, x, r->reform ? 3 : 1) != 0) return RUN_COMM;
  if (polled < 0) {
    fprintf(r->errf, "cohort-gpt2: rank %d: the state stream from the donors failed: %s\n", r->rank,
            cohort_strerror(polled));
    return RUN_FAIL;
  }
  r->ready = r->contrib < r->world && x[1] == 0.0;
  r->grow = x[2] != 0.0;
  *loss = x[0] / r->contrib;
  return RUN_OK;
}

/* Forward and backward of the K micro-steps (gradients exchanged as backward goes), the global
 * loss, clipping and the optimiser update (a catching-up rank: kept for its replay). */
static int train_step(train_run *r, uint64_t step, step_stats *st) {
  const gpt2_train_opts *o = r->o;
  const int K = o->grad_accum;
  double t0 = gpt2_now_s();
  int64_t c0 = gpt2_cpu_us();
  if (r->test_step_ms > 0) usleep((useconds_t)r->test_step_ms * 1000u);
  double loss = 0.0;
  int rc = r->catching ? gpt2_catch_up_steps(r, step) : micro_steps(r, step, &loss);
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
    if ((rc = gpt2_catch_up_keep(r, gscale, lr, (int64_t)step + 1)) != RUN_OK) return rc;
  } else {
    if ((rc = gpt2_catch_up_release(r)) != RUN_OK) return rc; /* a donor's share copied */
    if (gpt2_ddp_step(&r->ddp, gscale, lr, (int64_t)step + 1) != 0) return RUN_COMM;
    /* Re-forming, the step is complete (all of its update applied) or not at all. */
    if (r->reform && gpt2_ddp_commit(&r->ddp) != 0) return RUN_COMM;
  }
  double step_s = gpt2_now_s() - t0;
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
int gpt2_run_report_step(train_run *r, const step_stats *st) {
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
 * writes it and says how long the gather and the write took (time the steps' lines leave out).
 * While rank 0 catches up (it has no state yet) the lowest rank with the state writes it. */
static int maybe_checkpoint(train_run *r, uint64_t done) {
  const gpt2_train_opts *o = r->o;
  if (o->ckpt_dir == NULL || o->ckpt_every <= 0 ||
      (done % (uint64_t)o->ckpt_every != 0 && done != (uint64_t)o->steps))
    return RUN_OK;
  double t0 = gpt2_now_s();
  if (r->state == r->full_state && gpt2_ddp_state_get(&r->ddp, r->full_state) != 0) return RUN_COMM;
  if (r->rank != r->writer) return RUN_OK;
  gpt2_ckpt_header h = r->want;
  h.step = done;
  h.data_pos = r->pos;
  h.rng = o->seed; /* batches and weights derive from the seed alone */
  if (gpt2_ckpt_save(o->ckpt_dir, &h, r->model.params, r->state, o->ckpt_keep, r->err,
                     sizeof r->err) != 0) {
    fprintf(r->errf, "cohort-gpt2: %s\n", r->err);
    return RUN_FAIL;
  }
  if (!o->quiet) {
    fprintf(r->out, "checkpoint: step %llu written in %.3f s\n", (unsigned long long)done,
            gpt2_now_s() - t0);
    fflush(r->out);
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

/* As a step begins, the window within which a node joining breaks it rather than waits for its
 * end (docs/gpt2.md "Re-form", item 3): a share of the last step's time. Breaking costs the ranks
 * that train (contrib) the part of the step done, deferring costs each newcomer the part still to
 * do (its state streams only once it is in): for a share f of the step done, contrib * f against
 * newcomers * (1 - f), so breaking is cheaper while f < newcomers / (contrib + newcomers). RUN_COMM
 * when a grow pending since the last boundary ends the membership now. */
static int open_break_window(train_run *r) {
  if (!r->reform || r->ntimes == 0) return RUN_OK;
  double f = r->grow_break >= 0.0 ? r->grow_break
                                  : (double)r->node_ranks / (double)(r->contrib + r->node_ranks);
  int ms = f >= 1.0 ? INT_MAX : (int)(f * r->step_times[r->ntimes - 1] * 1e3); /* 1: every grow */
  int rc = cohort_comm_grow_break_for(r->comm, ms);
  if (rc != 1) return RUN_OK;
  gpt2_ddp_fail(&r->ddp, COHORT_ERESHAPED, "a node joins as the step begins");
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
  int rc = open_break_window(r);
  if (rc == RUN_OK) rc = train_step(r, step, &st);
  if (rc == RUN_OK && r->test_fail_step == step + 1) rc = gpt2_run_test_fail(r);
  if (rc != RUN_OK) {
    if (r->reform) gpt2_run_keep_own_after(r);
    if (r->reform) gpt2_ddp_rollback(&r->ddp);
    return rc;
  }
  r->in_step = 0;
  r->done = step + 1;
  r->last = st;
  if (r->comm != NULL && r->reform) cohort_comm_set_step(r->comm, (int64_t)r->done);
  cohort_progress((int64_t)step + 1); /* the step, for cohort run's --hang-timeout */
  rc = gpt2_run_report_step(r, &st);
  if (rc == RUN_OK) rc = maybe_checkpoint(r, step + 1);
  if (rc == RUN_OK && r->ready) rc = gpt2_catch_up_finish(r);
  return rc;
}

static int reshaped(const train_run *r, int rc) {
  return rc == RUN_COMM && r->reform && r->ddp.err == COHORT_ERESHAPED;
}

/* After the last step: every rank holds the same parameters. */
static int final_check(train_run *r, int *finished) {
  int st = r->contrib < r->world ? gpt2_catch_up_drain(r) : RUN_OK;
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
    /* A node joins: every rank completed this step and re-forms after it (none is behind), once
     * every rank is through the step's collectives (the barrier's result aside: a rank through it
     * may have closed its connections already). */
    int grow = rc == RUN_OK && r->grow;
    r->grow = 0;
    if (grow && r->world > 1) cohort_barrier(r->comm);
    if (grow || reshaped(r, rc)) rc = gpt2_run_reform(r);
    if (rc != RUN_OK) return rc;
  }
  if (r->rank == 0) print_summary(r);
  return RUN_OK;
}

int gpt2_train(const gpt2_train_opts *o) {
  train_run r = {.o = o, .out = o->out, .errf = o->err};
  int rc = train_setup(&r);
  /* A newcomer receives the state from the running job (its membership and exchange were set up
   * with the rest: its join's line, as rank 0, counts from here); the others start or resume. */
  r.t_formed = r.t_exchange = gpt2_now_s();
  if (rc == RUN_OK) rc = r.newcomer ? gpt2_run_join(&r, 0, r.t_formed) : gpt2_run_resume(&r);
  if (r.newcomer && reshaped(&r, rc)) rc = gpt2_run_reform(&r);
  r.stateful = rc == RUN_OK && !r.catching; /* a rank catching up: once it has replayed */
  if (rc == RUN_OK) rc = gpt2_run_open_outputs(&r);
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

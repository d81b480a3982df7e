/* train.c - the training loop of cohort-gpt2 (see train.h). */
#include "gpt2/train.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "gpt2/ckpt.h"
#include "gpt2/data.h"
#include "gpt2/ddp.h"
#include "gpt2/kernels.h"
#include "gpt2/rng.h"
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
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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

/* Creates the communicator when started as one of several ranks. */
static int make_comm(cohort_comm **comm, FILE *errf) {
  *comm = NULL;
  const char *ws = getenv("WORLD_SIZE");
  if (getenv("RANK") == NULL || ws == NULL || strcmp(ws, "1") == 0) return 0;
  int rc = cohort_comm_create_from_env(comm);
  if (rc != 0) {
    fprintf(errf, "cohort-gpt2: cannot join the job (RANK=%s WORLD_SIZE=%s): %s\n", getenv("RANK"),
            ws, cohort_strerror(rc));
    return rc;
  }
  return 0;
}

int gpt2_train(const gpt2_train_opts *o) {
  FILE *out = o->out, *errf = o->err;
  int status = 1;
  int rank = 0, world = 1;
  cohort_comm *comm = NULL;
  gpt2_model model;
  gpt2_data data;
  gpt2_batch_buf bb;
  gpt2_ddp ddp;
  FILE *metrics = NULL;
  gpt2_tb_writer *tb = NULL;
  double *step_times = NULL;
  float *full_state = NULL;
  size_t nfull = 0;
  char err[512] = "";
  int have_model = 0, have_data = 0, have_bb = 0, have_ddp = 0;

  int threads = o->threads;
#ifdef _OPENMP
  if (threads > 0) omp_set_num_threads(threads);
  threads = omp_get_max_threads();
#else
  threads = 1;
#endif
  /* OpenBLAS runs single-threaded inside our OpenMP slices (kernels.c). */
  openblas_set_num_threads(1);

  int rc = make_comm(&comm, errf);
  if (rc != 0) return 1;
  if (comm != NULL) {
    rank = cohort_comm_rank(comm);
    world = cohort_comm_size(comm);
  }
  rc = gpt2_model_init(&model, &o->cfg, o->B, o->T);
  if (rc != 0) {
    fprintf(errf, "cohort-gpt2: cannot allocate the model: %s\n", strerror(-rc));
    goto out;
  }
  have_model = 1;
  rc = gpt2_data_open(&data, o->data, o->cfg.head, o->cfg.vocab, o->B, o->T, o->seed, err,
                      sizeof(err));
  if (rc != 0) {
    fprintf(errf, "cohort-gpt2: %s\n", err);
    status = 2;
    goto out;
  }
  have_data = 1;
  if (gpt2_batch_buf_alloc(&bb, o->B, o->T) != 0) {
    fprintf(errf, "cohort-gpt2: out of memory\n");
    goto out;
  }
  have_bb = 1;
  rc = gpt2_ddp_init(&ddp, comm, &model, &o->opt, o->bucket_bytes, o->zero, o->grad_accum);
  if (rc != 0) {
    fprintf(errf, "cohort-gpt2: cannot allocate the optimiser state: %s\n", strerror(-rc));
    goto out;
  }
  have_ddp = 1;
  gpt2_model_init_weights(&model, o->seed);

  /* The checkpoint's optimiser state is the whole state; with ZeRO it is
   * assembled in a temporary buffer. */
  nfull = gpt2_ddp_full_state_floats(&ddp);
  float *state = gpt2_ddp_whole_state(&ddp);
  if (state == NULL && o->ckpt_dir != NULL) {
    full_state = gpt2_big_alloc(nfull * sizeof(float));
    if (full_state == NULL) {
      fprintf(errf, "cohort-gpt2: out of memory\n");
      goto out;
    }
    state = full_state;
  }

  /* Rank 0 resumes from the newest complete checkpoint and hands it out. */
  uint64_t start_step = 0;
  gpt2_ckpt_header want = {.vocab = o->cfg.vocab,
                           .npos = o->cfg.npos,
                           .layers = o->cfg.layers,
                           .heads = o->cfg.heads,
                           .channels = o->cfg.channels,
                           .head = (int32_t)o->cfg.head,
                           .opt_kind = (int32_t)o->opt.kind,
                           .world = world,
                           .nparams = model.nparams,
                           .nstate = nfull};
  double resume[2] = {0.0, 0.0}; /* found, step: summed over ranks = rank 0's */
  if (o->ckpt_dir != NULL && rank == 0) {
    gpt2_ckpt_header got;
    char note[1024];
    rc = gpt2_ckpt_load_latest(o->ckpt_dir, &want, &got, model.params, state, err, sizeof(err),
                               note, sizeof(note));
    if (note[0]) fprintf(errf, "cohort-gpt2: %s\n", note);
    if (rc < 0) {
      fprintf(errf, "cohort-gpt2: %s\n", err);
      goto out;
    }
    if (rc == 1) {
      resume[0] = 1.0;
      resume[1] = (double)got.step;
    }
  }
  if (gpt2_ddp_sum(&ddp, resume, 2) != 0) goto comm_failed;
  start_step = (uint64_t)resume[1];
  /* Identical parameters everywhere before the first step. */
  if (gpt2_ddp_broadcast(&ddp, model.params, model.nparams) != 0) goto comm_failed;
  if (resume[0] != 0.0) {
    if (gpt2_ddp_broadcast(&ddp, state, nfull) != 0) goto comm_failed;
    if (state == full_state) gpt2_ddp_state_set(&ddp, full_state);
    const char *restarts = getenv("TORCHELASTIC_RESTART_COUNT");
    if (rank == 0)
      fprintf(out, "resumed from %s at step %llu%s%s%s\n", o->ckpt_dir,
              (unsigned long long)start_step, restarts ? " (restart " : "",
              restarts ? restarts : "", restarts ? ")" : "");
  }
  int same = 0;
  if (gpt2_ddp_check_params(&ddp, &same) != 0) goto comm_failed;
  if (!same) {
    fprintf(errf, "cohort-gpt2: rank %d: parameters differ between ranks after the broadcast\n",
            rank);
    goto out;
  }

  if (o->metrics_path != NULL && rank == 0) {
    metrics = fopen(o->metrics_path, start_step > 0 ? "ae" : "we");
    if (metrics == NULL) {
      fprintf(errf, "cohort-gpt2: cannot open %s: %s\n", o->metrics_path, strerror(errno));
      goto out;
    }
  }
  if (o->tb_dir != NULL && rank == 0) {
    rc = gpt2_tb_open(o->tb_dir, &tb);
    if (rc != 0) {
      fprintf(errf, "cohort-gpt2: cannot write TensorBoard events to %s: %s\n", o->tb_dir,
              strerror(-rc));
      goto out;
    }
  }

  const int K = o->grad_accum;
  const uint64_t global_batch = (uint64_t)o->B * (uint64_t)K * (uint64_t)world;
  const double tokens_per_step = (double)global_batch * o->T;
  const double flops_micro = gpt2_flops_per_step(&o->cfg, o->B, o->T);
  const int64_t warmup = o->warmup >= 0 ? o->warmup : 0;
  step_times = calloc((size_t)o->steps + 1, sizeof(double));
  if (step_times == NULL) goto out;
  size_t ntimes = 0;
  double last_loss = NAN, comm_total = 0.0, exposed_total = 0.0;

  if (rank == 0) {
    fprintf(out,
            "cohort-gpt2: %s head, %zu parameters (L=%d H=%d C=%d V=%d), B=%d T=%d accum=%d "
            "world=%d%s, %s, %d threads, parameters identical on all ranks\n",
            o->cfg.head == GPT2_HEAD_LM ? "lm" : "qa", model.nparams, o->cfg.layers, o->cfg.heads,
            o->cfg.channels, o->cfg.vocab, o->B, o->T, K, world, ddp.zero ? " zero-1" : "",
            o->opt.kind == GPT2_OPT_ADAMW ? "AdamW" : "SGD", threads);
    fflush(out);
  }

  for (uint64_t step = start_step; step < (uint64_t)o->steps; step++) {
    double t0 = now_s();
    gpt2_zero_grad(&model);
    double loss_sum = 0.0;
    for (int k = 0; k < K; k++) {
      gpt2_batch batch;
      uint64_t g0 = step * global_batch + ((uint64_t)rank * K + (uint64_t)k) * (uint64_t)o->B;
      gpt2_data_fill(&data, g0, &bb, &batch);
      loss_sum += gpt2_forward(&model, &batch);
      int scatter = gpt2_ddp_begin_backward(&ddp, k == K - 1, batch.tokens);
      gpt2_backward(&model, &batch, 1.0f / (float)(K * world), gpt2_ddp_hook, &ddp, scatter);
    }
    if (gpt2_ddp_finish_backward(&ddp) != 0) goto comm_failed;
    double loss = loss_sum / K;
    if (gpt2_ddp_sum(&ddp, &loss, 1) != 0) goto comm_failed;
    loss /= world;
    if (!isfinite(loss)) {
      if (rank == 0)
        fprintf(errf, "cohort-gpt2: loss is %f at step %llu; stopping\n", loss,
                (unsigned long long)step + 1);
      goto out;
    }
    double gnorm = 0.0;
    if (gpt2_ddp_grad_norm(&ddp, &gnorm) != 0) goto comm_failed;
    float gscale = 1.0f;
    if (o->clip > 0.0f && gnorm > o->clip) gscale = (float)(o->clip / (gnorm + 1e-6));
    float lr = gpt2_lr_at(o->schedule, o->lr, warmup, o->steps, o->min_lr_ratio, (int64_t)step);
    if (gpt2_ddp_step(&ddp, gscale, lr, (int64_t)step + 1) != 0) goto comm_failed;
    double t1 = now_s();
    double step_s = t1 - t0;
    double tok_s = tokens_per_step / step_s;
    double gflops = flops_micro * K / step_s * 1e-9;
    double comm_ms = ddp.comm_ms;
    /* The share of the communication window that backward covered. */
    double hidden = comm_ms > 0.0 ? 1.0 - ddp.exposed_ms / comm_ms : 1.0;
    if (hidden < 0.0) hidden = 0.0;
    step_times[ntimes++] = step_s;
    if (step > start_step) {
      comm_total += comm_ms;
      exposed_total += ddp.exposed_ms;
    }
    last_loss = loss;
    if (rank == 0) {
      if (!o->quiet) {
        fprintf(out,
                "step %5llu/%lld | loss %.6f | lr %.3e | norm %.3f | %8.1f ms | %9.1f tok/s | "
                "%6.1f GFLOP/s | comm %6.1f ms (%3.0f%% hidden)\n",
                (unsigned long long)step + 1, (long long)o->steps, loss, lr, gnorm, step_s * 1e3,
                tok_s, gflops, comm_ms, hidden * 100.0);
        fflush(out);
      }
      if (metrics != NULL) {
        fprintf(metrics,
                "{\"step\":%llu,\"loss\":%.17g,\"lr\":%.9g,\"grad_norm\":%.9g,\"step_ms\":%.3f,"
                "\"tokens_per_s\":%.3f,\"gflops\":%.3f,\"comm_ms\":%.3f,\"hidden_frac\":%.4f,"
                "\"world\":%d}\n",
                (unsigned long long)step + 1, loss, lr, gnorm, step_s * 1e3, tok_s, gflops, comm_ms,
                hidden, world);
        fflush(metrics);
      }
      if (tb != NULL) {
        static const char *const tags[] = {"train/loss",   "train/lr",          "train/grad_norm",
                                           "perf/step_ms", "perf/tokens_per_s", "perf/gflops",
                                           "comm/comm_ms", "comm/hidden_frac"};
        const float vals[] = {(float)loss,           lr,           (float)gnorm,
                              (float)(step_s * 1e3), (float)tok_s, (float)gflops,
                              (float)comm_ms,        (float)hidden};
        rc = gpt2_tb_add_scalars(tb, (int64_t)step + 1, 8, tags, vals);
        if (rc != 0) {
          fprintf(errf, "cohort-gpt2: writing %s: %s\n", gpt2_tb_path(tb), strerror(-rc));
          goto out;
        }
      }
    }
    if (o->ckpt_dir != NULL && o->ckpt_every > 0 &&
        ((step + 1) % (uint64_t)o->ckpt_every == 0 || step + 1 == (uint64_t)o->steps)) {
      if (state == full_state && gpt2_ddp_state_get(&ddp, full_state) != 0) goto comm_failed;
      if (rank == 0) {
        gpt2_ckpt_header h = want;
        h.step = step + 1;
        h.data_pos = (step + 1) * global_batch;
        h.rng = o->seed; /* batches and weights derive from the seed alone */
        rc = gpt2_ckpt_save(o->ckpt_dir, &h, model.params, state, o->ckpt_keep, err, sizeof(err));
        if (rc != 0) {
          fprintf(errf, "cohort-gpt2: %s\n", err);
          goto out;
        }
      }
    }
  }

  if (gpt2_ddp_check_params(&ddp, &same) != 0) goto comm_failed;
  if (!same) {
    fprintf(errf, "cohort-gpt2: rank %d: parameters diverged between ranks\n", rank);
    goto out;
  }
  if (rank == 0 && ntimes == 0) {
    /* Resumed from a checkpoint of the last step: nothing ran, so there is no loss to show. */
    fprintf(out, "summary: 0 steps run: the checkpoint resumed is already at step %llu of %lld\n",
            (unsigned long long)start_step, (long long)o->steps);
  } else if (rank == 0) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double rss = (double)ru.ru_maxrss * 1024.0;
    double est = gpt2_train_estimate_bytes(o, world);
    /* The first step pays for page faults and thread start-up. */
    double *times = ntimes > 1 ? step_times + 1 : step_times;
    size_t nt = ntimes > 1 ? ntimes - 1 : ntimes;
    double med = median(times, nt);
    fprintf(out,
            "summary: %zu steps, final loss %.6f, median step %.1f ms, %.1f tok/s (global), %.1f "
            "GFLOP/s/rank, comm %.1f ms/step (%.0f%% hidden), peak RSS %.1f MiB (estimate %.1f "
            "MiB = params+grads+optimizer+activations, ratio %.2f)\n",
            ntimes, last_loss, med * 1e3, med > 0 ? tokens_per_step / med : 0.0,
            med > 0 ? flops_micro * K / med * 1e-9 : 0.0, nt > 0 ? comm_total / (double)nt : 0.0,
            comm_total > 0 ? 100.0 * (1.0 - exposed_total / comm_total) : 100.0, rss / 1048576.0,
            est / 1048576.0, rss / est);
  }
  status = 0;
  goto out;
comm_failed:
  fprintf(errf, "cohort-gpt2: rank %d: %s\n", rank,
          ddp.errmsg[0] ? ddp.errmsg : "communication failed");
  status = 1;
out:
  if (metrics != NULL && fclose(metrics) != 0 && status == 0) {
    fprintf(errf, "cohort-gpt2: writing %s: %s\n", o->metrics_path, strerror(errno));
    status = 1;
  }
  gpt2_tb_close(tb);
  free(step_times);
  if (full_state) gpt2_big_free(full_state, nfull * sizeof(float));
  if (have_ddp) gpt2_ddp_free(&ddp);
  if (have_bb) gpt2_batch_buf_free(&bb);
  if (have_data) gpt2_data_close(&data);
  if (have_model) gpt2_model_free(&model);
  /* A failing rank aborts the communicator so its peers fail fast too. */
  if (comm != NULL && status != 0) cohort_comm_abort(comm);
  cohort_comm_destroy(comm);
  return status;
}

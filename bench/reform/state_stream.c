/*
 * state_stream.c - one rank of bench/reform/stream.py: the background state
 * stream (cohort_comm_state_stream_begin) alone, nothing else on the links.
 * Not a test.
 *
 * usage: bench_state_stream STORE JOB RANK SIZE NEWMASK MIB [copy]
 * The ranks in NEWMASK (bit r: rank r) are new, the others donors; the
 * donors fill MIB MiB with a pattern, the new ranks receive it (copy: the
 * donors stream from a copy of their share, COHORT_STREAM_COPY). Prints, on
 * rank 0: "stream <seconds> <bad>" where seconds is the slowest new rank's,
 * from the begin to its poll saying 1, and bad counts wrong bytes and failed
 * calls over all ranks; exits 1 when bad is not 0.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cohort/cohort.h"

static unsigned char pat(size_t i) {
  return (unsigned char)((i * 131u + 7u) % 251u);
}

/* The stream on this rank: its seconds (a new rank's; 0 on a donor) and the wrong bytes. */
static int stream_once(cohort_comm *c, unsigned char *buf, size_t bytes, int isnew, unsigned flags,
                       double *sec) {
  int bad = 0;
  cohort_iov iov = {buf, bytes};
  cohort_stream *s = NULL;
  int64_t t0 = base_now_ms();
  int rc = cohort_comm_state_stream_begin_flags(c, &iov, 1, flags, &s);
  if (rc != 0) {
    fprintf(stderr, "bench_state_stream: begin: %s\n", cohort_strerror(rc));
    return 1;
  }
  int st = 0;
  for (int i = 0; i < 600000 && (st = cohort_comm_state_stream_poll(s, NULL)) == 0; i++)
    usleep(1000); /* 1 ms: the figure's resolution, at most 600 s */
  *sec = isnew ? (double)(base_now_ms() - t0) / 1e3 : 0;
  rc = cohort_comm_state_stream_end(c, s);
  if (st != 1 || rc != 0) {
    fprintf(stderr, "bench_state_stream: the stream: %s\n", cohort_strerror(st != 1 ? st : rc));
    bad++;
  }
  for (size_t i = 0; isnew && i < bytes; i++) bad += buf[i] != pat(i);
  return bad;
}

int main(int argc, char **argv) {
  if (argc != 7 && !(argc == 8 && strcmp(argv[7], "copy") == 0)) {
    fprintf(stderr, "usage: bench_state_stream STORE JOB RANK SIZE NEWMASK MIB [copy]\n");
    return 2;
  }
  int rank = atoi(argv[3]), size = atoi(argv[4]);
  unsigned newmask = (unsigned)strtoul(argv[5], NULL, 0);
  size_t bytes = (size_t)strtoull(argv[6], NULL, 10) << 20;
  if (size < 2 || rank < 0 || rank >= size || bytes == 0) {
    fprintf(stderr, "bench_state_stream: bad arguments\n");
    return 2;
  }
  int isnew = newmask >> rank & 1;
  cohort_comm_config cfg = {.rank = rank,
                            .size = size,
                            .store_addr = argv[1],
                            .job_id = argv[2],
                            .timeout_ms = 60000,
                            .transport = COHORT_TRANSPORT_TCP};
  cohort_comm *c = NULL;
  int rc = cohort_comm_create(&cfg, &c);
  if (rc != 0) {
    fprintf(stderr, "bench_state_stream: rank %d: create: %s\n", rank, cohort_strerror(rc));
    return 1;
  }
  unsigned char *buf = malloc(bytes);
  if (buf == NULL) return 1;
  for (size_t i = 0; i < bytes; i++) buf[i] = isnew ? 0 : pat(i);
  if (isnew) cohort_comm_mark_new(c);
  double fig[2] = {0, 0};
  fig[1] = stream_once(c, buf, bytes, isnew, argc == 8 ? COHORT_STREAM_COPY : 0, &fig[0]);
  double all[2] = {fig[0], fig[1]};
  rc = cohort_allreduce(c, &all[0], &all[0], 1, COHORT_F64, COHORT_MAX);
  if (rc == 0) rc = cohort_allreduce(c, &all[1], &all[1], 1, COHORT_F64, COHORT_SUM);
  if (rc != 0) all[1] += 1;
  if (rank == 0) printf("stream %.3f %d\n", all[0], (int)all[1]);
  free(buf);
  cohort_comm_destroy(c);
  return all[1] != 0;
}

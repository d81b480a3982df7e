/* state.c - a rank's training state as pieces in place (see state.h). */
#include "gpt2/state.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char state_magic[8] = "COHSTAT";

static gpt2_state_head head_of(const gpt2_model *m, const gpt2_ddp *d) {
  size_t own = gpt2_ddp_own_state_floats(d);
  gpt2_state_head h = {
      .nparams = m->nparams, .nshared = gpt2_ddp_local_state_floats(d) - own, .nown = own};
  memcpy(h.magic, state_magic, sizeof h.magic);
  return h;
}

cohort_iov *gpt2_state_pieces(gpt2_model *m, gpt2_ddp *d, gpt2_state_head *head, uint64_t step,
                              uint64_t data_pos, uint64_t rng, cohort_iov extra, int *n) {
  int nd = gpt2_ddp_state_npieces(d);
  if (nd < 0) {
    *n = nd;
    return NULL;
  }
  cohort_iov *iov = malloc((size_t)(nd + 3) * sizeof *iov);
  if (iov == NULL) {
    *n = -ENOMEM;
    return NULL;
  }
  *head = head_of(m, d);
  head->step = step;
  head->data_pos = data_pos;
  head->rng = rng;
  iov[0] = (cohort_iov){head, sizeof *head};
  iov[1] = (cohort_iov){m->params, m->nparams * sizeof(float)};
  *n = 2 + gpt2_ddp_state_pieces(d, iov + 2, nd);
  iov[(*n)++] = extra;
  return iov;
}

int gpt2_state_check(const gpt2_state_head *got, const gpt2_model *m, const gpt2_ddp *d) {
  gpt2_state_head want = head_of(m, d);
  if (memcmp(got->magic, state_magic, sizeof state_magic) != 0 || got->nparams != want.nparams ||
      got->nshared != want.nshared || got->nown != want.nown)
    return -EINVAL;
  return 0;
}

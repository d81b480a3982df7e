/* state.c - a rank's training state as one buffer (see state.h). */
#include "gpt2/state.h"

#include <errno.h>
#include <string.h>

static const char state_magic[8] = "COHSTAT";

static gpt2_state_head head_of(const gpt2_model *m, const gpt2_ddp *d) {
  size_t own = gpt2_ddp_own_state_floats(d);
  gpt2_state_head h = {
      .nparams = m->nparams, .nshared = gpt2_ddp_local_state_floats(d) - own, .nown = own};
  memcpy(h.magic, state_magic, sizeof h.magic);
  return h;
}

size_t gpt2_state_bytes(const gpt2_model *m, const gpt2_ddp *d) {
  gpt2_state_head h = head_of(m, d);
  return sizeof h + (h.nparams + h.nshared + h.nown) * sizeof(float);
}

size_t gpt2_state_sent_bytes(const gpt2_model *m, const gpt2_ddp *d) {
  gpt2_state_head h = head_of(m, d);
  return sizeof h + (h.nparams + h.nshared) * sizeof(float);
}

int gpt2_state_pack(void *buf, const gpt2_model *m, gpt2_ddp *d, uint64_t step, uint64_t data_pos,
                    uint64_t rng) {
  gpt2_state_head h = head_of(m, d);
  h.step = step;
  h.data_pos = data_pos;
  h.rng = rng;
  float *f = (float *)((char *)buf + sizeof h);
  int rc = gpt2_ddp_local_state_get(d, f + h.nparams);
  if (rc != 0) return rc;
  memcpy(buf, &h, sizeof h);
  memcpy(f, m->params, h.nparams * sizeof(float));
  return 0;
}

float *gpt2_state_own(void *buf) {
  gpt2_state_head h;
  memcpy(&h, buf, sizeof h);
  return (float *)((char *)buf + sizeof h) + h.nparams + h.nshared;
}

int gpt2_state_unpack(void *buf, gpt2_model *m, gpt2_ddp *d, const float *own,
                      gpt2_state_head *head) {
  gpt2_state_head want = head_of(m, d);
  memcpy(head, buf, sizeof *head);
  if (memcmp(head->magic, state_magic, sizeof state_magic) != 0 || head->nparams != want.nparams ||
      head->nshared != want.nshared || head->nown != want.nown)
    return -EINVAL;
  float *f = (float *)((char *)buf + sizeof *head);
  memcpy(m->params, f, head->nparams * sizeof(float));
  float *mine = f + head->nparams + head->nshared;
  if (own == NULL)
    memset(mine, 0, head->nown * sizeof(float));
  else if (own != mine)
    memcpy(mine, own, head->nown * sizeof(float));
  gpt2_ddp_local_state_set(d, f + head->nparams);
  return 0;
}

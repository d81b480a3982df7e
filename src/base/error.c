/* error.c - cohort_strerror() and the library version. */
#include "cohort/cohort.h"

#include <string.h>

COHORT_API const char *cohort_strerror(int err) {
  switch (err) {
  case 0:
    return "success";
  case COHORT_EMISMATCH:
    return "ranks called different collectives (op, count, type or root differ)";
  case COHORT_EABORTED:
    return "communicator was aborted";
  case COHORT_EAUTH:
    return "authentication failed (wrong or missing job token)";
  case COHORT_EPEER:
    return "a peer failed or closed its connection";
  case COHORT_EPROTO:
    return "protocol error (malformed data from a peer)";
  case COHORT_ENOENV:
    return "cohort environment missing or malformed (run under `cohort run`)";
  case COHORT_ELIMIT:
    return "size or count limit exceeded";
  case COHORT_ERESHAPED:
    return "the membership changed (a peer was lost or joined): call cohort_comm_reform";
  case COHORT_ENOSTATE:
    return "no rank has state to hand on (load a checkpoint)";
  default:
    break;
  }
  if (err < 0 && err > -4000) {
    /* strerror() is not thread-safe; strerrordesc_np() returns static text. */
    const char *s = strerrordesc_np(-err);
    if (s != NULL) return s;
  }
  return "unknown error";
}

COHORT_API const char *cohort_version(void) {
  return COHORT_VERSION_STRING;
}

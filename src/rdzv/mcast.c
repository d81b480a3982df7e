/* mcast.c - multicast discovery (not in this build yet). */
#include <errno.h>

#include "rdzv/rdzv_internal.h"

int rdzv_mcast_discover(const rdzv_opts *opts, rdzv_target *out, char *errbuf, size_t errlen) {
  (void)opts;
  (void)out;
  return rdzv_err(errbuf, errlen, -ENOTSUP, "multicast discovery is not available in this build");
}

int rdzv_mcast_publish_start(const rdzv_opts *opts, const char *advertise_host, int store_port,
                             rdzv_mcast_pub **out, char *errbuf, size_t errlen) {
  (void)opts;
  (void)advertise_host;
  (void)store_port;
  *out = NULL;
  return rdzv_err(errbuf, errlen, -ENOTSUP, "multicast discovery is not available in this build");
}

void rdzv_mcast_publish_stop(rdzv_mcast_pub *pub) {
  (void)pub;
}

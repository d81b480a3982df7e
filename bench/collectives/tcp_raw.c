/*
 * tcp_raw.c - single-connection TCP throughput, the ceiling for a collective
 * over one link. "tcp_raw recv HOST PORT BYTES" listens, accepts one
 * connection, reads BYTES and prints "GB/s" (1e9 bytes per second, from
 * the first to the last byte); "tcp_raw send HOST PORT BYTES" connects
 * (retrying up to 5 s) and writes BYTES in 1 MiB writes.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: tcp_raw recv|send HOST PORT BYTES\n");
    return 2;
  }
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3]))};
  if (inet_pton(AF_INET, argv[2], &sa.sin_addr) != 1) {
    fprintf(stderr, "tcp_raw: bad IPv4 address %s\n", argv[2]);
    return 2;
  }
  alarm(120); /* never outlive a benchmark whose peer failed */
  long long total = atoll(argv[4]), done = 0;
  size_t chunk = 1 << 20;
  char *buf = calloc(1, chunk);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (strcmp(argv[1], "recv") == 0) {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1) != 0) {
      perror("tcp_raw: bind/listen");
      return 1;
    }
    int c = accept(fd, NULL, NULL);
    if (c < 0) return 1;
    double t0 = 0;
    while (done < total) {
      ssize_t n = read(c, buf, chunk);
      if (n <= 0) break;
      if (done == 0) t0 = now();
      done += n;
    }
    double dt = now() - t0;
    printf("%.3f\n", (double)done / dt / 1e9);
    return done == total ? 0 : 1;
  }
  int ok = -1;
  for (int i = 0; i < 100 && ok != 0; i++) {
    ok = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    if (ok != 0) {
      close(fd);
      fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      usleep(50000);
    }
  }
  if (ok != 0) {
    perror("tcp_raw: connect");
    return 1;
  }
  while (done < total) {
    size_t want = total - done < (long long)chunk ? (size_t)(total - done) : chunk;
    ssize_t n = write(fd, buf, want);
    if (n <= 0) return 1;
    done += n;
  }
  close(fd);
  return 0;
}

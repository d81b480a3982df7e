/* errfile.c - reading the message out of a TORCHELASTIC_ERROR_FILE. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"

/* Decodes the JSON string starting after its opening quote into out. */
static int json_string(const char *p, const char *end, char *out, size_t outlen) {
  size_t n = 0;
  while (p < end && *p != '"') {
    char c = *p++;
    if (c == '\\') {
      if (p >= end) return -EPROTO;
      char e = *p++;
      switch (e) {
      case 'n':
        c = ' ';
        break; /* one line in the report */
      case 't':
        c = ' ';
        break;
      case 'r':
        c = ' ';
        break;
      case 'u':
        if (end - p < 4) return -EPROTO;
        p += 4;
        c = '?';
        break;
      default:
        c = e;
        break;
      }
    }
    if (n + 1 < outlen) out[n++] = c;
  }
  if (p >= end) return -EPROTO;
  out[n] = '\0';
  return 0;
}

int agent_error_file_message(const char *path, char *out, size_t outlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  char buf[65536];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -ENODATA;
  buf[n] = '\0';
  const char *end = buf + n;
  /* torch writes {"message": {"message": "<Type>: <text>", "extraInfo": ...}}
   * (or a plain string for "message"): take the innermost "message" string. */
  const char *best = NULL;
  for (const char *p = buf; (p = strstr(p, "\"message\"")) != NULL; p++) {
    const char *q = p + 9;
    while (q < end && (*q == ' ' || *q == ':' || *q == '\n' || *q == '\t')) q++;
    if (q < end && *q == '"') best = q + 1;
  }
  if (best == NULL) return -EPROTO;
  return json_string(best, end, out, outlen);
}

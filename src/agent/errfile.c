/* errfile.c - reading the message out of a TORCHELASTIC_ERROR_FILE. */
#include "agent/errfile.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent.h"

/* Nesting of "message" objects followed at most (torch uses two levels). */
#define MESSAGE_DEPTH_MAX 8

/* Copies text as one line of at most outlen-1 bytes, ending on a whole UTF-8 character. */
static void copy_one_line(const char *text, size_t len, char *out, size_t outlen) {
  size_t n = len < outlen - 1 ? len : outlen - 1;
  /* Cut before a character whose bytes do not all fit. */
  if (n < len)
    while (n > 0 && ((unsigned char)text[n] & 0xc0) == 0x80) n--;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)text[i];
    if (c == '\n' || c == '\r' || c == '\t')
      c = ' ';
    else if (c < 0x20 || c == 0x7f)
      c = '?'; /* no terminal control sequences in the failure report */
    out[i] = (char)c;
  }
  out[n] = '\0';
}

int agent_error_json_message(const char *json, size_t len, char *out, size_t outlen) {
  if (outlen == 0) return -EINVAL;
  out[0] = '\0';
  json_t *root = json_loadb(json, len, 0, NULL);
  const json_t *m = root;
  for (int depth = 0; depth < MESSAGE_DEPTH_MAX && json_is_object(m); depth++)
    m = json_object_get(m, "message");
  int rc = -EPROTO;
  if (m != root && json_is_string(m)) {
    copy_one_line(json_string_value(m), json_string_length(m), out, outlen);
    rc = 0;
  }
  json_decref(root);
  return rc;
}

int agent_error_file_message(const char *path, char *out, size_t outlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  struct stat st;
  char *buf = NULL;
  size_t got = 0;
  int rc = 0;
  if (fstat(fd, &st) != 0) {
    rc = -errno;
  } else if (st.st_size <= 0 || st.st_size > AGENT_ERRFILE_MAX) {
    rc = st.st_size <= 0 ? -ENODATA : -EFBIG;
  } else if ((buf = malloc((size_t)st.st_size)) == NULL) {
    rc = -ENOMEM;
  }
  while (rc == 0 && got < (size_t)st.st_size) {
    ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) rc = n < 0 ? -errno : -ENODATA;
    if (n > 0) got += (size_t)n;
  }
  close(fd);
  if (rc == 0) rc = agent_error_json_message(buf, got, out, outlen);
  free(buf);
  return rc;
}

/*
 * cmd_plot.c - `cohort plot METRICS.jsonl [MORE.jsonl ...] [-o FILE.svg]`:
 * loss and throughput against step as a self-contained SVG, several runs
 * overlaid in one picture.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "plot/plot.h"
#include "tools/cli.h"
#include "tools/cohort/cmd.h"

/* Metrics files beyond this are certainly not what the trainer wrote. */
#define PLOT_MAX_FILE (1024L * 1024 * 1024)

static const char plot_usage[] =
    "usage: cohort plot METRICS.jsonl [MORE.jsonl ...] [-o FILE.svg]\n"
    "\n"
    "Draws loss and tokens_per_s against step from a training metrics file (one\n"
    "JSON object per line with step, loss and tokens_per_s, as cohort-gpt2 writes)\n"
    "into a self-contained SVG. An incomplete last line (a running job) is skipped.\n"
    "Several files (up to 8) are drawn in the same panels, one colour each, with a\n"
    "legend naming them: runs to compare.\n"
    "\n"
    "options:\n"
    "  -o, --output FILE     where to write the SVG (default, for one file: METRICS\n"
    "                        with .svg instead of .jsonl; needed for several;\n"
    "                        '-' for standard output)\n"
    "  -h, --help            show this help\n";

static int read_file(const char *path, char **data, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int rc = -errno;
    close(fd);
    return rc;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
  }
  if (st.st_size > PLOT_MAX_FILE) {
    close(fd);
    return -EFBIG;
  }
  /* The file may grow while a job runs: read what is there now. */
  size_t cap = (size_t)st.st_size + 1, n = 0;
  char *buf = malloc(cap);
  if (buf == NULL) {
    close(fd);
    return -ENOMEM;
  }
  while (n + 1 < cap) {
    ssize_t k = read(fd, buf + n, cap - 1 - n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      int rc = -errno;
      free(buf);
      close(fd);
      return rc;
    }
    if (k == 0) break;
    n += (size_t)k;
  }
  close(fd);
  buf[n] = '\0';
  *data = buf;
  *len = n;
  return 0;
}

static char *default_output(const char *in) {
  size_t n = strlen(in);
  const char *ext = NULL;
  if (n > 6 && strcmp(in + n - 6, ".jsonl") == 0)
    ext = in + n - 6;
  else if (n > 5 && strcmp(in + n - 5, ".json") == 0)
    ext = in + n - 5;
  size_t keep = ext ? (size_t)(ext - in) : n;
  char *out = malloc(keep + 5);
  if (out == NULL) return NULL;
  memcpy(out, in, keep);
  memcpy(out + keep, ".svg", 5);
  return out;
}

/* Writes through a temporary file and rename(), so that a viewer never
 * sees half a picture. */
static int write_atomic(const char *path, const char *data, size_t len) {
  size_t n = strlen(path) + 32;
  char *tmp = malloc(n);
  if (tmp == NULL) return -ENOMEM;
  snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int rc = 0;
  if (fd < 0) {
    rc = -errno;
    free(tmp);
    return rc;
  }
  for (size_t off = 0; off < len && rc == 0;) {
    ssize_t k = write(fd, data + off, len - off);
    if (k < 0 && errno != EINTR)
      rc = -errno;
    else if (k > 0)
      off += (size_t)k;
  }
  if (close(fd) != 0 && rc == 0) rc = -errno;
  if (rc == 0 && rename(tmp, path) != 0) rc = -errno;
  if (rc != 0) unlink(tmp);
  free(tmp);
  return rc;
}

static const char prog[] = "cohort plot";

static const cli_opt plot_opts[] = {
    {"--help", 'h', .kind = CLI_HELP_OPT},
    {"--output", 'o', CLI_STR, .at = 0, .what = "a file name or '-'", .flags = CLI_NONEMPTY},
};

static const cli_cmd plot_cmd = {prog,         plot_usage, plot_opts, BASE_ARRAY_LEN(plot_opts),
                                 CLI_ANYWHERE, 1};

/* One metrics file parsed into *s; returns the exit status. */
static int load(const char *input, plot_series *s) {
  char *data = NULL;
  size_t len = 0;
  int rc = read_file(input, &data, &len);
  if (rc != 0)
    return cli_error(prog, 1, "%s: %s", input,
                     rc == -EFBIG ? "larger than 1 GiB, not a metrics file" : strerror(-rc));
  char err[256];
  rc = plot_parse(data, len, s, err, sizeof err);
  free(data);
  if (rc != 0) return cli_error(prog, 1, "%s: %s", input, err);
  return 0;
}

/* The metrics files as one SVG in *svg; returns the exit status. */
static int render(char **inputs, int n, char **svg, size_t *svg_len, size_t *steps, int *partial) {
  plot_series s[PLOT_MAX_SERIES];
  int loaded = 0, rc = 0;
  *steps = 0;
  *partial = 0;
  for (; loaded < n; loaded++) {
    rc = load(inputs[loaded], &s[loaded]);
    if (rc != 0) break;
    if (s[loaded].n > *steps) *steps = s[loaded].n;
    *partial |= s[loaded].partial_last;
  }
  if (rc == 0) {
    char title[64];
    if (n > 1) snprintf(title, sizeof title, "%d runs", n);
    rc = plot_svg_many(s, (const char *const *)inputs, (size_t)n, n > 1 ? title : inputs[0], svg,
                       svg_len);
    if (rc != 0) rc = cli_error(prog, 1, "rendering failed: %s", strerror(-rc));
  }
  for (int k = 0; k < loaded; k++) free(s[k].points);
  return rc;
}

/* Writes the SVG to output ("-": standard output; NULL: beside the input). */
static int write_svg(const char *input, const char *output, const char *svg, size_t svg_len,
                     size_t steps, int partial) {
  if (output != NULL && strcmp(output, "-") == 0) {
    if (fwrite(svg, 1, svg_len, stdout) != svg_len || fflush(stdout) != 0)
      return cli_error(prog, 1, "writing to standard output failed: %s", strerror(errno));
    return 0;
  }
  char *def = output ? NULL : default_output(input);
  const char *path = output ? output : def;
  int rc = path ? write_atomic(path, svg, svg_len) : -ENOMEM;
  if (rc != 0)
    rc = cli_error(prog, 1, "%s: %s", path ? path : input, strerror(-rc));
  else
    printf("%s: wrote %s (%zu steps%s)\n", prog, path, steps,
           partial ? ", skipped an incomplete last line" : "");
  free(def);
  return rc;
}

int cmd_plot(int argc, char **argv) {
  const char *output = NULL;
  cli_args files;
  int rc = cli_parse(&plot_cmd, argc, argv, &output, &files);
  if (rc != CLI_OK) return rc == CLI_HELP ? 0 : rc;
  if (files.argc < 1 || files.argc > PLOT_MAX_SERIES)
    return cli_usage_error(prog, "expected 1 to %d metrics files, got %d", PLOT_MAX_SERIES,
                           files.argc);
  if (files.argc > 1 && output == NULL)
    return cli_usage_error(prog, "several metrics files need -o FILE.svg");
  char *svg = NULL;
  size_t svg_len = 0, steps = 0;
  int partial = 0;
  rc = render(files.argv, files.argc, &svg, &svg_len, &steps, &partial);
  if (rc != 0) return rc;
  rc = write_svg(files.argv[0], output, svg, svg_len, steps, partial);
  free(svg);
  return rc;
}

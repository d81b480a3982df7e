/*
 * fuzz_plot.c - libFuzzer target for `cohort plot`'s metrics parser and SVG
 * renderer (src/plot).
 *
 * The input is a metrics file: plot_parse() must either fail with a one-line
 * reason or return points sorted by strictly increasing step, each of which
 * plot_parse_line() accepts on its own line; the SVG of any parsed series
 * must be produced. Nothing may read out of bounds or overflow.
 *
 * Build (clang only): cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCOHORT_FUZZ=ON
 * Run: build-fuzz/fuzz_plot -max_total_time=60
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plot/plot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
  if (!ok) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[256] = "";
  plot_series s;
  int rc = plot_parse((const char *)data, size, &s, err, sizeof err);
  if (rc != 0) {
    check(rc == -EINVAL || rc == -ENOMEM);
    check(err[0] != '\0' && memchr(err, '\n', strlen(err)) == NULL);
    return 0;
  }
  check(s.n >= 1 && s.n <= s.lines);
  for (size_t i = 0; i < s.n; i++) {
    check(s.points[i].step >= 0);
    if (i > 0) check(s.points[i].step > s.points[i - 1].step);
  }
  char *svg = NULL;
  size_t len = 0;
  check(plot_svg(&s, (const char *)"fuzz", &svg, &len) == 0 && svg && strlen(svg) == len);
  free(svg);
  plot_series pair[2] = {s, s};
  const char *names[2] = {"fuzz", (const char *)"\xff<"};
  check(plot_svg_many(pair, names, 2, "pair", &svg, &len) == 0 && svg && strlen(svg) == len);
  free(svg);
  free(s.points);

  /* Each line alone, as the file parser sees it. */
  plot_point p;
  const char *line = (const char *)data;
  const uint8_t *nl = memchr(data, '\n', size);
  size_t n = nl ? (size_t)(nl - data) : size;
  rc = plot_parse_line(line, n, &p, err, sizeof err);
  check(rc == 0 || rc == PLOT_BLANK || rc == -EINVAL);
  return 0;
}

/*
 * plot.h - training curves from a metrics JSONL file as a self-contained SVG.
 *
 * The trainer appends one JSON object per line, with at least the numbers
 * "step", "loss" and "tokens_per_s" (other members are ignored). The parser
 * is pure (no I/O, no global state) so that it can be fuzzed line by line.
 *
 * Errors: functions return 0 or a negative errno-style code and, for bad
 * input, write a one-line reason into err (without a trailing newline).
 * Thread safety: no shared state.
 */
#ifndef COHORT_PLOT_PLOT_H
#define COHORT_PLOT_PLOT_H

#include <stddef.h>
#include <stdint.h>

typedef struct plot_point {
  int64_t step;
  double loss;
  double tokens_per_s;
} plot_point;

/* Returned by plot_parse_line for a line of only white space. */
#define PLOT_BLANK 1

/*
 * Parses one line (len bytes, no newline needed, NUL bytes are an error)
 * holding one JSON object. Returns 0 and fills *out, PLOT_BLANK, or -EINVAL
 * with the reason in err. Strict JSON read by jansson, except that the
 * number tokens NaN, Infinity and -Infinity (which Python's json module
 * writes) are accepted and that a \u0000 escape is refused. A repeated
 * member: the last one counts. "step" must be an integer in 0..2^53.
 */
int plot_parse_line(const char *line, size_t len, plot_point *out, char *err, size_t errlen);

typedef struct plot_series {
  plot_point *points; /* sorted by step, one point per step */
  size_t n;
  size_t lines;     /* lines that held a point */
  int partial_last; /* a final line without newline did not parse and was skipped */
} plot_series;

/*
 * Parses a whole metrics file. A final line without a trailing newline that
 * does not parse is taken as still being written and is skipped; any other
 * bad line is an error "line N: reason". When a step appears more than once
 * (a resumed run) the later line wins. A file without points is an error.
 * On success the caller frees out->points.
 */
int plot_parse(const char *data, size_t len, plot_series *out, char *err, size_t errlen);

/*
 * Renders the series as an SVG document: loss and tokens_per_s against
 * step, one panel each, each curve one <polyline> with one point per finite
 * value. title is any bytes (escaped, invalid UTF-8 replaced). On success
 * *svg is a malloc'd NUL-terminated string of *svg_len bytes.
 */
int plot_svg(const plot_series *s, const char *title, char **svg, size_t *svg_len);

/* Most series one picture takes (each one colour and one legend line). */
#define PLOT_MAX_SERIES 8

/*
 * As plot_svg for nseries series (1..PLOT_MAX_SERIES) in the same two panels,
 * over the union of their steps, each curve in its own colour, with a legend
 * giving names[k] (escaped as the title) when there is more than one. A
 * polyline of series k carries data-series="k". An empty series is -EINVAL.
 */
int plot_svg_many(const plot_series *s, const char *const *names, size_t nseries, const char *title,
                  char **svg, size_t *svg_len);

#endif

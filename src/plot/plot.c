/* plot.c - metrics JSONL reader (jansson) and SVG renderer for `cohort plot`. */
#include "plot/plot.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"

/* ---- one metrics line, read with jansson ---- */

/*
 * Python's json module writes the bare tokens NaN, Infinity and -Infinity,
 * which JSON (and so jansson) lacks. Outside strings they are rewritten into
 * strings that no input can spell: a NUL character and one letter, since an
 * input's own \u0000 is refused here (a metrics line has no use for it).
 */
static const struct {
  const char *token;
  char letter; /* the rewrite is the string "\u0000<letter>" */
  double value;
} nonfinite[] = {{"-Infinity", '-', -INFINITY}, {"Infinity", 'I', INFINITY}, {"NaN", 'N', NAN}};
#define NONFINITE_N (sizeof nonfinite / sizeof nonfinite[0])
/* A rewrite is 10 bytes for a token of at least 3: out needs 4 * len bytes. */
#define REWRITE_GROWTH 4

static size_t nonfinite_at(const char *p, size_t left) {
  for (size_t k = 0; k < NONFINITE_N; k++) {
    size_t n = strlen(nonfinite[k].token);
    if (left >= n && memcmp(p, nonfinite[k].token, n) == 0) return k;
  }
  return NONFINITE_N;
}

/* One step of the rewrite inside a string: copies an escape whole. */
static int copy_in_string(const char *line, size_t len, size_t *i, char *out, size_t *o,
                          int *in_string) {
  char ch = line[*i];
  if (ch == '\\' && *i + 1 < len) {
    if (line[*i + 1] == 'u' && len - *i >= 6 && memcmp(line + *i + 2, "0000", 4) == 0) return -1;
    out[(*o)++] = line[(*i)++];
  } else if (ch == '"') {
    *in_string = 0;
  }
  out[(*o)++] = line[(*i)++];
  return 0;
}

/* Returns 1 when a token was rewritten, 0 when none was, -1 for a \u0000 in the input. */
static int rewrite_nonfinite(const char *line, size_t len, char *out, size_t *outlen) {
  size_t o = 0;
  int in_string = 0, rewritten = 0;
  for (size_t i = 0; i < len;) {
    if (in_string) {
      if (copy_in_string(line, len, &i, out, &o, &in_string) != 0) return -1;
      continue;
    }
    size_t k = nonfinite_at(line + i, len - i);
    if (k < NONFINITE_N) {
      o += (size_t)sprintf(out + o, "\"\\u0000%c\"", nonfinite[k].letter);
      i += strlen(nonfinite[k].token);
      rewritten = 1;
      continue;
    }
    in_string = line[i] == '"';
    out[o++] = line[i++];
  }
  *outlen = o;
  return rewritten;
}

/* The number a member holds: a JSON number or a rewritten token. */
static int member_number(const json_t *v, double *out) {
  if (json_is_number(v)) {
    *out = json_number_value(v);
    return 0;
  }
  if (json_is_string(v) && json_string_length(v) == 2 && json_string_value(v)[0] == '\0') {
    for (size_t k = 0; k < NONFINITE_N; k++)
      if (json_string_value(v)[1] == nonfinite[k].letter) {
        *out = nonfinite[k].value;
        return 0;
      }
  }
  return -EINVAL;
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static int is_blank(const char *line, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r' && line[i] != '\n') return 0;
  return 1;
}

/* Decodes the line into a JSON object; the reason of a failure goes to err. */
static json_t *load_object(const char *line, size_t len, char *err, size_t errlen) {
  if (len > SIZE_MAX / REWRITE_GROWTH) {
    set_err(err, errlen, "line too long");
    return NULL;
  }
  char *text = malloc(len * REWRITE_GROWTH + 1);
  if (text == NULL) {
    set_err(err, errlen, "out of memory");
    return NULL;
  }
  size_t n = 0;
  int rewritten = rewrite_nonfinite(line, len, text, &n);
  json_t *root = NULL;
  json_error_t e;
  if (rewritten < 0) {
    set_err(err, errlen, "NUL character (\\u0000) in a string");
  } else if ((root = json_loadb(text, n, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL,
                                &e)) == NULL) {
    if (json_error_code(&e) == json_error_stack_overflow)
      set_err(err, errlen, "nested too deeply");
    else if (rewritten == 0) /* columns of the rewritten text are the line's own */
      set_err(err, errlen, "%s at column %d", e.text, e.column);
    else
      set_err(err, errlen, "%s", e.text);
  } else if (!json_is_object(root)) {
    set_err(err, errlen, "not a JSON object");
    json_decref(root);
    root = NULL;
  }
  free(text);
  return root;
}

int plot_parse_line(const char *line, size_t len, plot_point *out, char *err, size_t errlen) {
  if (memchr(line, '\0', len) != NULL) {
    set_err(err, errlen, "NUL byte in the line");
    return -EINVAL;
  }
  if (is_blank(line, len)) return PLOT_BLANK;
  json_t *root = load_object(line, len, err, errlen);
  if (root == NULL) return -EINVAL;
  static const char *const names[3] = {"step", "loss", "tokens_per_s"};
  double vals[3];
  int rc = 0;
  for (int i = 0; i < 3 && rc == 0; i++) {
    json_t *v = json_object_get(root, names[i]);
    if (v == NULL) {
      set_err(err, errlen, "missing \"%s\"", names[i]);
      rc = -EINVAL;
    } else if (member_number(v, &vals[i]) != 0) {
      set_err(err, errlen, "\"%s\" is not a number", names[i]);
      rc = -EINVAL;
    }
  }
  json_decref(root);
  if (rc != 0) return rc;
  /* 2^53: every integer up to it is exact in a double. */
  if (!(vals[0] >= 0 && vals[0] <= 9007199254740992.0) || vals[0] != floor(vals[0])) {
    set_err(err, errlen, "\"step\" must be an integer >= 0");
    return -EINVAL;
  }
  out->step = (int64_t)vals[0];
  out->loss = vals[1];
  out->tokens_per_s = vals[2];
  return 0;
}

typedef struct plot_tagged {
  plot_point p;
  size_t order; /* line order in the file */
} plot_tagged;

static int cmp_tagged(const void *a, const void *b) {
  const plot_tagged *x = a, *y = b;
  if (x->p.step != y->p.step) return (x->p.step > y->p.step) - (x->p.step < y->p.step);
  return (x->order > y->order) - (x->order < y->order);
}

int plot_parse(const char *data, size_t len, plot_series *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  size_t cap = 0, lineno = 0;
  plot_point *pts = NULL;
  for (size_t off = 0; off < len;) {
    const char *nl = memchr(data + off, '\n', len - off);
    size_t n = nl ? (size_t)(nl - (data + off)) : len - off;
    lineno++;
    plot_point pt;
    char why[160];
    int rc = plot_parse_line(data + off, n, &pt, why, sizeof why);
    off += n + (nl != NULL);
    if (rc == PLOT_BLANK) continue;
    if (rc != 0) {
      if (nl == NULL) { /* the line the trainer is still writing */
        out->partial_last = 1;
        break;
      }
      set_err(err, errlen, "line %zu: %s", lineno, why);
      free(pts);
      return -EINVAL;
    }
    if (out->n == cap) {
      size_t ncap = cap ? cap * 2 : 256;
      plot_point *np = realloc(pts, ncap * sizeof *np);
      if (np == NULL) {
        free(pts);
        set_err(err, errlen, "out of memory");
        return -ENOMEM;
      }
      pts = np;
      cap = ncap;
    }
    pts[out->n] = pt;
    out->n++;
  }
  out->lines = out->n;
  if (out->n == 0) {
    free(pts);
    set_err(err, errlen, "no metrics (expected JSON lines with step, loss and tokens_per_s)");
    return -EINVAL;
  }
  /* Sort by (step, line order) and keep the last line of each step. */
  plot_tagged *t = malloc(out->n * sizeof *t);
  if (t == NULL) {
    free(pts);
    set_err(err, errlen, "out of memory");
    return -ENOMEM;
  }
  for (size_t i = 0; i < out->n; i++) t[i] = (plot_tagged){pts[i], i};
  qsort(t, out->n, sizeof *t, cmp_tagged);
  size_t m = 0;
  for (size_t i = 0; i < out->n; i++) {
    if (i + 1 < out->n && t[i + 1].p.step == t[i].p.step) continue;
    pts[m++] = t[i].p;
  }
  free(t);
  out->points = pts;
  out->n = m;
  return 0;
}

/* ---- SVG ---- */

/* XML text: markup characters escaped; bytes that are not valid UTF-8 or
 * not allowed in XML (control characters) become '?'. */
static void sb_xml_text(base_buf *b, const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    unsigned char ch = *p;
    if (ch == '&')
      base_buf_printf(b, "&amp;");
    else if (ch == '<')
      base_buf_printf(b, "&lt;");
    else if (ch == '>')
      base_buf_printf(b, "&gt;");
    else if (ch == '"')
      base_buf_printf(b, "&quot;");
    else if (ch < 0x20 && ch != '\t')
      base_buf_printf(b, "?");
    else if (ch < 0x80)
      base_buf_printf(b, "%c", ch);
    else {
      size_t n = (ch & 0xE0) == 0xC0 ? 2 : (ch & 0xF0) == 0xE0 ? 3 : (ch & 0xF8) == 0xF0 ? 4 : 0;
      uint32_t v = n == 2 ? ch & 0x1Fu : n == 3 ? ch & 0x0Fu : ch & 0x07u;
      size_t k = 1;
      for (; k < n && (p[k] & 0xC0) == 0x80; k++) v = (v << 6) | (p[k] & 0x3Fu);
      static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
      int ok = n > 0 && k == n && v >= min[n] && v <= 0x10FFFF && !(v >= 0xD800 && v <= 0xDFFF) &&
               v != 0xFFFE && v != 0xFFFF;
      if (ok)
        base_buf_printf(b, "%.*s", (int)n, (const char *)p);
      else
        base_buf_printf(b, "?");
      p += ok ? n : 1;
      continue;
    }
    p++;
  }
}

/* A tick spacing of 1, 2 or 5 times a power of ten, about span/5. */
static double nice_step(double span) {
  double raw = span / 5.0;
  double mag = pow(10.0, floor(log10(raw)));
  double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

static void fmt_num(double v, char *out, size_t n) {
  double a = fabs(v);
  if (a >= 1e9)
    snprintf(out, n, "%.3gG", v / 1e9);
  else if (a >= 1e6)
    snprintf(out, n, "%.3gM", v / 1e6);
  else if (a >= 1e4)
    snprintf(out, n, "%.3gk", v / 1e3);
  else
    snprintf(out, n, "%.4g", v);
}

enum {
  PLOT_MAX_TICKS = 20,
  SVG_W = 900,
  PANEL_H = 280,
  MARGIN_L = 80,
  MARGIN_R = 30,
  TOP = 50,
  PLOT_H = 210,
  LEGEND_H = 18
};

static double value(const plot_point *p, int which) {
  return which == 0 ? p->loss : p->tokens_per_s;
}

/* One colour per series; a single series keeps loss blue and throughput red. */
static const char *series_color(size_t k, size_t nseries, int which) {
  static const char *palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                  "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  if (nseries == 1) return which == 0 ? palette[0] : palette[1];
  return palette[k % (sizeof palette / sizeof palette[0])];
}

/* The value range of the finite values of every series (lo > hi when there are none). */
static size_t finite_range(const plot_series *s, size_t nseries, int which, double *lo,
                           double *hi) {
  size_t finite = 0;
  *lo = INFINITY, *hi = -INFINITY;
  for (size_t k = 0; k < nseries; k++)
    for (size_t i = 0; i < s[k].n; i++) {
      double v = value(&s[k].points[i], which);
      if (!isfinite(v)) continue;
      finite++;
      if (v < *lo) *lo = v;
      if (v > *hi) *hi = v;
    }
  return finite;
}

static void polyline(base_buf *b, const plot_series *s, int which, const char *name,
                     const char *color, size_t k, size_t nseries, double xlo, double xhi, double lo,
                     double hi, int y0) {
  double pw = SVG_W - MARGIN_L - MARGIN_R;
  size_t drawn = 0;
  for (size_t i = 0; i < s->n; i++) {
    double v = value(&s->points[i], which);
    if (!isfinite(v)) continue;
    if (drawn++ == 0) {
      base_buf_printf(b, "<polyline class=\"%s\"", name);
      if (nseries > 1) base_buf_printf(b, " data-series=\"%zu\"", k);
      base_buf_printf(b, " fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
    }
    double x = MARGIN_L + ((double)s->points[i].step - xlo) / (xhi - xlo) * pw;
    double y = y0 + PLOT_H - (v - lo) / (hi - lo) * PLOT_H;
    base_buf_printf(b, "%s%.2f,%.2f", drawn > 1 ? " " : "", x, y);
  }
  if (drawn > 0) base_buf_printf(b, "\"/>\n");
}

static void panel(base_buf *b, const plot_series *s, size_t nseries, int which, const char *name,
                  double xlo, double xhi, int y0) {
  double lo, hi;
  size_t finite = finite_range(s, nseries, which, &lo, &hi), total = 0;
  for (size_t k = 0; k < nseries; k++) total += s[k].n;
  if (finite == 0) lo = 0, hi = 1;
  if (hi <= lo) {
    double pad = fabs(lo) > 0 ? fabs(lo) * 0.1 : 1.0;
    lo -= pad, hi += pad;
  }
  double pw = SVG_W - MARGIN_L - MARGIN_R;
  double ystep = nice_step(hi - lo), xstep = nice_step(xhi - xlo);
  /* Extend the value range to whole ticks so the curve fills the frame. */
  lo = floor(lo / ystep) * ystep;
  hi = ceil(hi / ystep) * ystep;

  base_buf_printf(b, "<g class=\"panel\" id=\"panel-%s\">\n", name);
  base_buf_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"14\" font-weight=\"bold\">%s</text>\n",
                  MARGIN_L, y0 - 8, name);
  base_buf_printf(b,
                  "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%d\" fill=\"none\" "
                  "stroke=\"#888\"/>\n",
                  MARGIN_L, y0, pw, PLOT_H);
  char label[32];
  /* Ticks are counted, not accumulated: near the limits of double precision
   * t += step may not move t at all. */
  for (int k = 0; k <= PLOT_MAX_TICKS; k++) {
    double t = lo + k * ystep;
    if (!(t <= hi + ystep * 1e-9)) break;
    double y = y0 + PLOT_H - (t - lo) / (hi - lo) * PLOT_H;
    fmt_num(fabs(t) < ystep * 1e-9 ? 0.0 : t, label, sizeof label);
    base_buf_printf(b,
                    "<line x1=\"%d\" y1=\"%.2f\" x2=\"%.0f\" y2=\"%.2f\" stroke=\"#ddd\"/>"
                    "<text x=\"%d\" y=\"%.2f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n",
                    MARGIN_L, y, MARGIN_L + pw, y, MARGIN_L - 6, y + 4, label);
  }
  for (int k = 0; k <= PLOT_MAX_TICKS; k++) {
    double t = ceil(xlo / xstep) * xstep + k * xstep;
    if (!(t <= xhi + xstep * 1e-9)) break;
    double x = MARGIN_L + (t - xlo) / (xhi - xlo) * pw;
    fmt_num(t, label, sizeof label);
    base_buf_printf(b,
                    "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#888\"/>"
                    "<text x=\"%.2f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
                    x, y0 + PLOT_H, x, y0 + PLOT_H + 5, x, y0 + PLOT_H + 18, label);
  }
  base_buf_printf(b, "<text x=\"%.0f\" y=\"%d\" font-size=\"11\" text-anchor=\"end\">step</text>\n",
                  MARGIN_L + pw, y0 + PLOT_H + 32);
  for (size_t k = 0; k < nseries; k++)
    polyline(b, &s[k], which, name, series_color(k, nseries, which), k, nseries, xlo, xhi, lo, hi,
             y0);
  if (finite < total)
    base_buf_printf(b,
                    "<text x=\"%.0f\" y=\"%d\" font-size=\"11\" text-anchor=\"end\" fill=\"#c00\">"
                    "%zu non-finite values not drawn</text>\n",
                    MARGIN_L + pw, y0 - 8, total - finite);
  base_buf_printf(b, "</g>\n");
}

/* A legend line per series, below the panels: its colour and its name. */
static void legend(base_buf *b, const char *const *names, size_t nseries, int y0) {
  for (size_t k = 0; k < nseries; k++) {
    int y = y0 + (int)k * LEGEND_H;
    base_buf_printf(b,
                    "<g class=\"legend\" data-series=\"%zu\"><rect x=\"%d\" y=\"%d\" width=\"24\" "
                    "height=\"4\" fill=\"%s\"/><text x=\"%d\" y=\"%d\" font-size=\"12\">",
                    k, MARGIN_L, y - 4, series_color(k, nseries, 0), MARGIN_L + 32, y);
    sb_xml_text(b, names && names[k] ? names[k] : "");
    base_buf_printf(b, "</text></g>\n");
  }
}

int plot_svg_many(const plot_series *s, const char *const *names, size_t nseries, const char *title,
                  char **svg, size_t *svg_len) {
  *svg = NULL;
  *svg_len = 0;
  if (s == NULL || nseries == 0 || nseries > PLOT_MAX_SERIES) return -EINVAL;
  int64_t first = INT64_MAX, last = INT64_MIN;
  size_t steps = 0;
  for (size_t k = 0; k < nseries; k++) {
    if (s[k].n == 0) return -EINVAL;
    if (s[k].points[0].step < first) first = s[k].points[0].step;
    if (s[k].points[s[k].n - 1].step > last) last = s[k].points[s[k].n - 1].step;
    if (s[k].n > steps) steps = s[k].n;
  }
  double xlo = (double)first, xhi = (double)last;
  if (xhi <= xlo) xlo -= 1, xhi += 1;
  base_buf b = {0};
  int legend_h = nseries > 1 ? (int)nseries * LEGEND_H + 10 : 0;
  int h = TOP + 2 * PANEL_H + legend_h;
  base_buf_printf(&b,
                  "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                  "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
                  "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                  "<title>",
                  SVG_W, h, SVG_W, h);
  sb_xml_text(&b, title ? title : "");
  base_buf_printf(&b, "</title>\n<text x=\"%d\" y=\"24\" font-size=\"16\">", MARGIN_L);
  sb_xml_text(&b, title ? title : "");
  base_buf_printf(&b, " (%zu steps, %lld..%lld)</text>\n", steps, (long long)first,
                  (long long)last);
  panel(&b, s, nseries, 0, "loss", xlo, xhi, TOP + 30);
  panel(&b, s, nseries, 1, "tokens_per_s", xlo, xhi, TOP + 30 + PANEL_H);
  if (nseries > 1) legend(&b, names, nseries, TOP + 2 * PANEL_H + 20);
  base_buf_printf(&b, "</svg>\n");
  return base_buf_take(&b, svg, svg_len);
}

int plot_svg(const plot_series *s, const char *title, char **svg, size_t *svg_len) {
  return plot_svg_many(s, NULL, 1, title, svg, svg_len);
}

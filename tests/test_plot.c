/*
 * test_plot.c - the metrics parser and SVG renderer of `cohort plot`
 * (src/plot): valid and malformed lines, partial last lines, repeated steps,
 * and a deterministic mutation fuzz of the line parser (run under ASan+UBSan
 * in CI) that must never crash or accept garbage silently.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plot/plot.h"
#include "tests/check.h"

static int parse(const char *line, plot_point *p, char *err) {
  return plot_parse_line(line, strlen(line), p, err, 160);
}

static void test_lines(void) {
  plot_point p;
  char err[160];
  CHECK_EQ_INT(parse("{\"step\": 3, \"loss\": 2.5, \"tokens_per_s\": 1e5}", &p, err), 0);
  CHECK(p.step == 3 && p.loss == 2.5 && p.tokens_per_s == 1e5);
  /* Extra members of every kind, any order, escapes, nesting. */
  CHECK_EQ_INT(parse(" {\"lr\":3e-4,\"tokens_per_s\":-0.5,\"note\":\"a\\\"b\\u00e9\\n\","
                     "\"x\":[1,{\"y\":[true,false,null]},[]],\"loss\":0,\"step\":0} ",
                     &p, err),
               0);
  CHECK(p.step == 0 && p.loss == 0 && p.tokens_per_s == -0.5);
  /* A key spelled with an escape is the same key. */
  CHECK_EQ_INT(parse("{\"\\u0073tep\":1,\"loss\":1,\"tokens_per_s\":1}", &p, err), 0);
  CHECK(p.step == 1);
  /* Python's json writes NaN and Infinity. */
  CHECK_EQ_INT(parse("{\"step\":1,\"loss\":NaN,\"tokens_per_s\":Infinity}", &p, err), 0);
  CHECK(isnan(p.loss) && isinf(p.tokens_per_s));
  CHECK_EQ_INT(parse("{\"step\":1,\"loss\":-Infinity,\"tokens_per_s\":[NaN],"
                     "\"tokens_per_s\":2,\"s\":\"NaN Infinity\"}",
                     &p, err),
               0);
  CHECK(isinf(p.loss) && p.loss < 0 && p.tokens_per_s == 2);
  /* Repeated member: the last counts. */
  CHECK_EQ_INT(parse("{\"step\":1,\"loss\":1,\"loss\":2,\"tokens_per_s\":1}", &p, err), 0);
  CHECK(p.loss == 2);
  CHECK_EQ_INT(parse("{\"step\":9007199254740992,\"loss\":1,\"tokens_per_s\":1}", &p, err), 0);
  CHECK(p.step == 9007199254740992LL);
  CHECK_EQ_INT(parse("   \t", &p, err), PLOT_BLANK);
  CHECK_EQ_INT(parse("", &p, err), PLOT_BLANK);

  const char *bad[] = {
      "[1,2]",
      "{\"step\":1,\"loss\":1}",
      "{\"step\":1,\"loss\":\"1\",\"tokens_per_s\":1}",
      "{\"step\":1.5,\"loss\":1,\"tokens_per_s\":1}",
      "{\"step\":-1,\"loss\":1,\"tokens_per_s\":1}",
      "{\"step\":1e300,\"loss\":1,\"tokens_per_s\":1}",
      "{\"step\":NaN,\"loss\":1,\"tokens_per_s\":1}",
      "{\"step\":1,\"loss\":1,\"tokens_per_s\":1",
      "{\"step\":1,\"loss\":1,\"tokens_per_s\":1}}",
      "{\"step\":1,\"loss\":1,\"tokens_per_s\":1} x",
      "{\"step\":1,\"loss\":1,\"tokens_per_s\":1,}",
      "{\"step\":01,\"loss\":1,\"tokens_per_s\":1}",
      "{\"step\":1,\"loss\":.5,\"tokens_per_s\":1}",
      "{\"step\":1,\"loss\":1.,\"tokens_per_s\":1}",
      "{\"step\":1,\"loss\":1e,\"tokens_per_s\":1}",
      "{\"step\":1,\"loss\":+1,\"tokens_per_s\":1}",
      "{\"step\":1,\"loss\":1,\"tokens_per_s\":tru}",
      "{\"step\":1,\"loss\":1,\"tokens_per_s\":1,\"s\":\"a\tb\"}",
      "{\"step\":1,\"loss\":1,\"tokens_per_s\":1,\"s\":\"\\x\"}",
      "{\"step\":1,\"loss\":1,\"tokens_per_s\":1,\"s\":\"\\u12\"}",
      "{\"step\":1,\"loss\":1,\"tokens_per_s\":1,\"s\":\"abc}",
      "{step:1,\"loss\":1,\"tokens_per_s\":1}",
      "{\"step\" 1,\"loss\":1,\"tokens_per_s\":1}",
      "{\"step\":1,\"loss\":1,\"tokens_per_s\":1,\"a\":[1,2}",
      /* The non-finite tokens are values, nothing else; a string is no number. */
      "{\"step\":1,\"loss\":\"NaN\",\"tokens_per_s\":1}",
      "{\"step\":1,\"loss\":-NaN,\"tokens_per_s\":1}",
      "{\"step\":1,\"loss\":NaNa,\"tokens_per_s\":1}",
      "{NaN:1,\"step\":1,\"loss\":1,\"tokens_per_s\":1}",
      /* A NUL character, which could spell a rewritten token, is refused. */
      "{\"step\":1,\"loss\":\"\\u0000N\",\"tokens_per_s\":1}",
      "{\"step\":1,\"loss\":1,\"tokens_per_s\":1,\"s\":\"\\u0000\"}",
      "{\"step\":1,\"loss\":1,\"tokens_per_s\":1,\"s\":\"\xff\"}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = '\0';
    int rc = parse(bad[i], &p, err);
    CHECK_EQ_INT(rc, -EINVAL);
    if (rc != -EINVAL) fprintf(stderr, "  accepted: %s\n", bad[i]);
    CHECK(err[0] != '\0' && strchr(err, '\n') == NULL);
  }
  CHECK_EQ_INT(parse("{\"step\":1,\"loss\":1,\"tokens_per_s\":1}", &p, err), 0);
  CHECK_EQ_INT(plot_parse_line("{\"step\":1,\"loss\":1,\"tokens_per_s\":1}\0", 38, &p, err, 160),
               -EINVAL);

  /* Nesting is bounded: deep input is an error, not a stack overflow. */
  size_t depth = 100000;
  char *deep = malloc(2 * depth + 64);
  strcpy(deep, "{\"step\":1,\"loss\":1,\"tokens_per_s\":1,\"a\":");
  size_t n = strlen(deep);
  memset(deep + n, '[', depth);
  memset(deep + n + depth, ']', depth);
  strcpy(deep + n + 2 * depth, "}");
  CHECK_EQ_INT(parse(deep, &p, err), -EINVAL);
  CHECK(strstr(err, "nested") != NULL);
  free(deep);
}

static void test_file(void) {
  plot_series s;
  char err[256];
  const char *good = "{\"step\":2,\"loss\":3,\"tokens_per_s\":30}\n"
                     "\n"
                     "{\"step\":0,\"loss\":1,\"tokens_per_s\":10}\n"
                     "{\"step\":1,\"loss\":2,\"tokens_per_s\":20}\n"
                     "{\"step\":1,\"loss\":5,\"tokens_per_s\":50}\n" /* resumed: wins */
                     "{\"step\":3,\"lo";                             /* being written */
  CHECK_EQ_INT(plot_parse(good, strlen(good), &s, err, sizeof err), 0);
  CHECK_EQ_INT(s.n, 3);
  CHECK_EQ_INT(s.partial_last, 1);
  CHECK(s.n == 3 && s.points[0].step == 0 && s.points[1].step == 1 && s.points[2].step == 2);
  CHECK(s.n == 3 && s.points[1].loss == 5 && s.points[1].tokens_per_s == 50);

  char *svg = NULL;
  size_t len = 0;
  CHECK_EQ_INT(plot_svg(&s, "a<b&\"c\"\x01\xff", &svg, &len), 0);
  CHECK(svg != NULL && strlen(svg) == len);
  CHECK(svg != NULL && strstr(svg, "<title>a&lt;b&amp;&quot;c&quot;?"
                                   "?</title>") != NULL);
  CHECK(svg != NULL && strstr(svg, "<polyline class=\"loss\"") != NULL);
  CHECK(svg != NULL && strstr(svg, "<polyline class=\"tokens_per_s\"") != NULL);
  free(svg);
  free(s.points);

  /* Several series in one picture: a polyline per series and panel, a legend naming each. */
  const char *two_a = "{\"step\":0,\"loss\":4,\"tokens_per_s\":10}\n"
                      "{\"step\":9,\"loss\":2,\"tokens_per_s\":12}\n";
  const char *two_b = "{\"step\":5,\"loss\":3,\"tokens_per_s\":11}\n";
  plot_series two[PLOT_MAX_SERIES + 1];
  CHECK_EQ_INT(plot_parse(two_a, strlen(two_a), &two[0], err, sizeof err), 0);
  CHECK_EQ_INT(plot_parse(two_b, strlen(two_b), &two[1], err, sizeof err), 0);
  const char *names[] = {"a.jsonl", "b<&>.jsonl"};
  CHECK_EQ_INT(plot_svg_many(two, names, 2, "runs", &svg, &len), 0);
  CHECK(svg != NULL && strstr(svg, "(2 steps, 0..9)") != NULL);
  CHECK(svg != NULL && strstr(svg, "<polyline class=\"loss\" data-series=\"1\"") != NULL);
  CHECK(svg != NULL && strstr(svg, "<polyline class=\"tokens_per_s\" data-series=\"0\"") != NULL);
  CHECK(svg != NULL && strstr(svg, ">b&lt;&amp;&gt;.jsonl</text>") != NULL);
  free(svg);
  for (int k = 2; k <= PLOT_MAX_SERIES; k++) two[k] = two[1];
  svg = NULL;
  CHECK_EQ_INT(plot_svg_many(two, names, PLOT_MAX_SERIES + 1, "many", &svg, &len), -EINVAL);
  CHECK(svg == NULL);
  two[1].n = 0;
  CHECK_EQ_INT(plot_svg_many(two, names, 2, "empty", &svg, &len), -EINVAL);
  two[1].n = 1;
  free(two[0].points);
  free(two[1].points);

  /* A complete last line without newline counts. */
  const char *nonl = "{\"step\":0,\"loss\":1,\"tokens_per_s\":10}";
  CHECK_EQ_INT(plot_parse(nonl, strlen(nonl), &s, err, sizeof err), 0);
  CHECK(s.n == 1 && s.partial_last == 0);
  CHECK_EQ_INT(plot_svg(&s, "one", &svg, &len), 0); /* a single point still renders */
  free(svg);
  free(s.points);

  /* Ranges at the limits of double precision or of the type still render
   * (and end: a tick loop that adds a step too small to move would hang). */
  const char *edge[] = {
      "{\"step\":9007199254740990,\"loss\":1e17,\"tokens_per_s\":1e308}\n"
      "{\"step\":9007199254740991,\"loss\":100000000000000016,\"tokens_per_s\":-1e308}\n",
      "{\"step\":0,\"loss\":1e-320,\"tokens_per_s\":5e-324}\n"
      "{\"step\":1,\"loss\":2e-320,\"tokens_per_s\":0}\n",
      "{\"step\":0,\"loss\":NaN,\"tokens_per_s\":Infinity}\n",
  };
  for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
    CHECK_EQ_INT(plot_parse(edge[i], strlen(edge[i]), &s, err, sizeof err), 0);
    svg = NULL;
    CHECK_EQ_INT(plot_svg(&s, "edge", &svg, &len), 0);
    CHECK(svg != NULL && len < 100000);
    free(svg);
    free(s.points);
  }

  const char *bad_mid = "{\"step\":0,\"loss\":1,\"tokens_per_s\":10}\n"
                        "garbage\n"
                        "{\"step\":1,\"loss\":1,\"tokens_per_s\":10}\n";
  CHECK_EQ_INT(plot_parse(bad_mid, strlen(bad_mid), &s, err, sizeof err), -EINVAL);
  CHECK(strncmp(err, "line 2: ", 8) == 0);
  const char *bad_last = "{\"step\":0,\"loss\":1,\"tokens_per_s\":10}\n{\"step\":1}\n";
  CHECK_EQ_INT(plot_parse(bad_last, strlen(bad_last), &s, err, sizeof err), -EINVAL);
  CHECK(strstr(err, "line 2: missing \"loss\"") != NULL);
  CHECK_EQ_INT(plot_parse("", 0, &s, err, sizeof err), -EINVAL);
  CHECK_EQ_INT(plot_parse("\n\n", 2, &s, err, sizeof err), -EINVAL);
  CHECK(strstr(err, "no metrics") != NULL);
  CHECK_EQ_INT(plot_parse("{\"st", 4, &s, err, sizeof err), -EINVAL); /* only a partial line */
}

/* Mutation fuzz: flip, insert, delete and truncate bytes of valid lines. */
static void test_fuzz(void) {
  const char *seeds[] = {
      "{\"step\": 12, \"loss\": 3.25, \"tokens_per_s\": 1.5e5, \"lr\": [0.1, {\"a\": null}]}",
      "{\"tokens_per_s\":-1E-3,\"x\":\"\\u00e9\\\\\",\"loss\":NaN,\"step\":0}",
  };
  const char alphabet[] = "{}[]\":,.-+eE0123456789 \\untrfalsNIy\t\x80\xff";
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  int accepted = 0, rejected = 0, crashed_contract = 0;
  char buf[256];
  for (int iter = 0; iter < 200000; iter++) {
    const char *seed = seeds[iter % 2];
    size_t n = strlen(seed);
    memcpy(buf, seed, n);
    int edits = 1 + iter % 4;
    for (int e = 0; e < edits; e++) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      size_t pos = (size_t)(rng >> 33) % (n + 1);
      char ch = alphabet[(rng >> 20) % (sizeof alphabet - 1)];
      switch ((rng >> 8) % 4) {
      case 0:
        if (pos < n) buf[pos] = ch;
        break;
      case 1:
        if (n < sizeof buf - 1) {
          memmove(buf + pos + 1, buf + pos, n - pos);
          buf[pos] = ch;
          n++;
        }
        break;
      case 2:
        if (pos < n) {
          memmove(buf + pos, buf + pos + 1, n - pos - 1);
          n--;
        }
        break;
      default:
        n = pos;
        break;
      }
    }
    plot_point p = {-7, -7, -7};
    char err[160] = "";
    int rc = plot_parse_line(buf, n, &p, err, sizeof err);
    if (rc == 0) {
      accepted++;
      if (p.step < 0) crashed_contract++;
    } else if (rc == -EINVAL) {
      rejected++;
      if (err[0] == '\0' || strchr(err, '\n')) crashed_contract++;
    } else if (rc != PLOT_BLANK) {
      crashed_contract++;
    }
  }
  CHECK(accepted > 0 && rejected > 0);
  CHECK_EQ_INT(crashed_contract, 0);
}

int main(void) {
  test_lines();
  test_file();
  test_fuzz();
  return check_report();
}

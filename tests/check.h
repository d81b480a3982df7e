/*
 * check.h - the assertions of cohort's test programs.
 *
 * CHECK(cond) records a failure with file and line and carries on;
 * CHECK_EQ_INT compares and prints both values. A test program ends with
 * `return check_report();`, which prints "N passed, N failed" and returns
 * non-zero when anything failed.
 */
#ifndef COHORT_TESTS_CHECK_H
#define COHORT_TESTS_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_passed_count;
static int check_failed_count;

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (cond) {                                                                                    \
      check_passed_count++;                                                                        \
    } else {                                                                                       \
      check_failed_count++;                                                                        \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                     \
    }                                                                                              \
  } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
  do {                                                                                             \
    long long check_a_ = (long long)(a), check_b_ = (long long)(b);                                \
    if (check_a_ == check_b_) {                                                                    \
      check_passed_count++;                                                                        \
    } else {                                                                                       \
      check_failed_count++;                                                                        \
      fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld vs %lld)\n", __FILE__, __LINE__, #a,    \
              #b, check_a_, check_b_);                                                             \
    }                                                                                              \
  } while (0)

#define CHECK_STREQ(a, b)                                                                          \
  do {                                                                                             \
    const char *check_a_ = (a), *check_b_ = (b);                                                   \
    if (check_a_ != NULL && check_b_ != NULL && strcmp(check_a_, check_b_) == 0) {                 \
      check_passed_count++;                                                                        \
    } else {                                                                                       \
      check_failed_count++;                                                                        \
      fprintf(stderr, "%s:%d: CHECK failed: %s == %s (\"%s\" vs \"%s\")\n", __FILE__, __LINE__,    \
              #a, #b, check_a_ ? check_a_ : "(null)", check_b_ ? check_b_ : "(null)");             \
    }                                                                                              \
  } while (0)

static inline int check_report(void) {
  printf("%d passed, %d failed\n", check_passed_count, check_failed_count);
  return check_failed_count == 0 ? 0 : 1;
}

#endif

# src/base: part of libcohort.
cohort_module(cohort_objects)

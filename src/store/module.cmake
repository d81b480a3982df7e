# src/store: part of libcohort.
cohort_module(cohort_objects)

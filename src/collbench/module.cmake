# src/collbench: the collective benchmark behind `cohort bench` (timings, the
# check against the serial reference, local ranks) and the reference itself,
# which tests/test_coll.c shares. Part of the node library (cohort_node).
cohort_module(cohort_node)

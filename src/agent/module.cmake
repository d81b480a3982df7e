# src/agent: part of the node library (cohort_node).
cohort_module(cohort_node)

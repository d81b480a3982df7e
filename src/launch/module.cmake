# src/launch: `cohort launch` below the command line (host lists, ssh
# fan-out, pre-flight). Part of the node library (cohort_node).
cohort_module(cohort_node)

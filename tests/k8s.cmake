# Where users run on Kubernetes: the agent's Prometheus metrics and
# termination message, and the controllers' pod environments.

# The metrics server's HTTP handling on loopback: answers, bounds, no
# descriptor for the workers; about 12 s.
add_test(NAME metrics_http
  COMMAND ${COHORT_PYTHON} ${CMAKE_SOURCE_DIR}/tests/test_metrics_http.py $<TARGET_FILE:cohort>)
set_tests_properties(metrics_http PROPERTIES TIMEOUT 120 LABELS "unit")

# A real Prometheus (Debian's) scrapes a 2-node job in network namespaces
# the test creates and removes (root); the hang verdict in --metrics-file and
# the root cause in the termination message; about 40 s.
add_test(NAME metrics_prom COMMAND ${CMAKE_SOURCE_DIR}/tests/test_metrics_prom.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(metrics_prom PROPERTIES TIMEOUT 300 LABELS "slow")


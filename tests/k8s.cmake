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

# The pods of the TrainJob, PyTorchJob and JobSet templates, each a network
# namespace the test creates and removes (root) with exactly the variables
# its controller sets, start a 2-pod DDP job (Debian's torch, gloo); the
# TrainJob also as Trainer's docs write it, `torchrun SCRIPT` with cohort's
# torchrun link; about 60 s.
add_test(NAME k8s_pods
  COMMAND ${COHORT_PYTHON} ${CMAKE_SOURCE_DIR}/tests/test_k8s_pods.py $<TARGET_FILE_DIR:cohort>
          ${CMAKE_SOURCE_DIR})
set_tests_properties(k8s_pods PROPERTIES TIMEOUT 400 LABELS "slow")

# `cohort status`/`stop` against a 3-node job in network namespaces the test
# creates and removes (root); about 20 s.
add_test(NAME status COMMAND ${CMAKE_SOURCE_DIR}/tests/test_status.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(status PROPERTIES TIMEOUT 180 LABELS "slow")

# The same found by UDP multicast (--discover mcast --job ID) from a fourth
# namespace; stop within 1 s.
add_test(NAME status_mcast COMMAND ${CMAKE_SOURCE_DIR}/tests/test_status_mcast.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(status_mcast PROPERTIES TIMEOUT 120 LABELS "slow")

# The same for a job whose agents met through etcd (--rdzv-backend etcd), with
# a real etcd member (users and passwords) in a namespace of its own; stop
# within 1 s, no key left in etcd.
add_test(NAME status_etcd COMMAND ${CMAKE_SOURCE_DIR}/tests/test_status_etcd.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(status_etcd PROPERTIES TIMEOUT 120 COST 30 LABELS "slow")

# cohort stacks: a Python rank's Python frames without --hang-timeout.
add_test(NAME stacks_python COMMAND ${CMAKE_SOURCE_DIR}/tests/test_stacks_python.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(stacks_python PROPERTIES TIMEOUT 60 LABELS "unit")

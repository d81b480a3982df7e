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

# The benchmarks (bench/) are not run by ctest; this checks only that they
# refuse to print a figure for a run whose workers did not start (a few
# seconds; root, for bench/multinode's namespaces).
add_test(NAME bench_refuses COMMAND ${CMAKE_SOURCE_DIR}/tests/test_bench_refuses.sh
  $<TARGET_FILE:bench_store> ${CMAKE_SOURCE_DIR})
set_tests_properties(bench_refuses PROPERTIES TIMEOUT 120 LABELS "slow")

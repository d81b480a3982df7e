# The benchmarks (bench/) are not run by ctest; this checks only that they
# refuse to print a figure for a run whose workers did not start (a few
# seconds; root, for bench/multinode's namespaces).
add_test(NAME bench_refuses COMMAND ${CMAKE_SOURCE_DIR}/tests/test_bench_refuses.sh
  $<TARGET_FILE:bench_store> ${CMAKE_SOURCE_DIR})
set_tests_properties(bench_refuses PROPERTIES TIMEOUT 120 LABELS "slow")

# bench/recovery's torchrun restart row with DDP's PowerSGD hook: 3 ranks on loopback under
# Debian's torchrun, each rank's PowerSGDState checkpointed and loaded on a restart.
add_test(NAME bench_torch_psgd COMMAND ${CMAKE_SOURCE_DIR}/tests/test_torch_ckpt_psgd.sh
  ${CMAKE_SOURCE_DIR})
set_tests_properties(bench_torch_psgd PROPERTIES TIMEOUT 600 COST 20 LABELS "slow" PROCESSORS 2
                     SKIP_RETURN_CODE 77)

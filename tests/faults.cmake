# Fault injection in multi-node cohort-gpt2 runs (network namespaces, root).
if(TARGET cohort-gpt2)
  add_test(NAME faults COMMAND ${CMAKE_SOURCE_DIR}/tests/test_faults.sh
    $<TARGET_FILE:cohort> $<TARGET_FILE:cohort-gpt2> ${CMAKE_SOURCE_DIR})
  set_tests_properties(faults PROPERTIES TIMEOUT 900 COST 170 LABELS "slow" PROCESSORS 2)
endif()

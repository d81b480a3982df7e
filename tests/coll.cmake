# Tests of src/coll (libcohort's collectives): real forked ranks on a loopback store.
add_executable(test_coll ${CMAKE_SOURCE_DIR}/tests/test_coll.c)
target_link_libraries(test_coll PRIVATE cohort_node m)
add_test(NAME coll COMMAND test_coll unit)
set_tests_properties(coll PROPERTIES TIMEOUT 300 LABELS "unit")
add_test(NAME coll_failure COMMAND test_coll failure)
set_tests_properties(coll_failure PROPERTIES TIMEOUT 120 LABELS "slow")
add_test(NAME coll_netns COMMAND ${CMAKE_SOURCE_DIR}/tests/test_coll_netns.sh $<TARGET_FILE:test_coll>
  $<TARGET_FILE:cohort>)
set_tests_properties(coll_netns PROPERTIES TIMEOUT 300 LABELS "slow" SKIP_RETURN_CODE 77)

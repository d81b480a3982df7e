# Tests of src/coll (libcohort's collectives): real forked ranks on a loopback store.
add_executable(test_coll ${CMAKE_SOURCE_DIR}/tests/test_coll.c)
target_link_libraries(test_coll PRIVATE cohort_static m)
add_test(NAME coll COMMAND test_coll unit)
set_tests_properties(coll PROPERTIES TIMEOUT 300 LABELS "unit")
add_test(NAME coll_failure COMMAND test_coll failure)
set_tests_properties(coll_failure PROPERTIES TIMEOUT 120 LABELS "slow")

# Tests of src/store (its authentication MACs included) and of
# `cohort store`, whose binary the test runs.
add_executable(test_store ${CMAKE_SOURCE_DIR}/tests/test_store.c)
target_link_libraries(test_store PRIVATE cohort_static)
add_dependencies(test_store cohort)
add_test(NAME store COMMAND test_store $<TARGET_FILE:cohort>)
set_tests_properties(store PROPERTIES TIMEOUT 120 LABELS "unit")
include(${CMAKE_SOURCE_DIR}/fuzz/fuzz.cmake)

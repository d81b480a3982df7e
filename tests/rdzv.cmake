# Tests of src/rdzv (discovery).
add_executable(test_rdzv ${CMAKE_SOURCE_DIR}/tests/test_rdzv.c)
target_link_libraries(test_rdzv PRIVATE cohort_node)
add_test(NAME rdzv COMMAND test_rdzv)
set_tests_properties(rdzv PROPERTIES TIMEOUT 120 LABELS "unit")

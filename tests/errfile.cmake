# Tests of the reader of PyTorch's error files (src/agent/errfile.c).
add_executable(test_errfile ${CMAKE_SOURCE_DIR}/tests/test_errfile.c)
target_link_libraries(test_errfile PRIVATE cohort_node)
add_test(NAME errfile COMMAND test_errfile)
set_tests_properties(errfile PROPERTIES TIMEOUT 60 LABELS "unit")

# Tests of src/base.
add_executable(test_base ${CMAKE_SOURCE_DIR}/tests/test_base.c)
target_link_libraries(test_base PRIVATE cohort_static)
add_test(NAME base COMMAND test_base)
set_tests_properties(base PROPERTIES TIMEOUT 60 LABELS "unit")

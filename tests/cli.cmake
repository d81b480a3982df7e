# Tests of the tools' option-table parser (tools/cli.c).
add_executable(test_cli ${CMAKE_SOURCE_DIR}/tests/test_cli.c ${CMAKE_SOURCE_DIR}/tools/cli.c)
target_link_libraries(test_cli PRIVATE cohort_static)
add_test(NAME cli COMMAND test_cli)
set_tests_properties(cli PROPERTIES TIMEOUT 60 LABELS "unit")

# Tests of src/store (and the SHA-256/HMAC of src/base it uses).
add_executable(test_store ${CMAKE_SOURCE_DIR}/tests/test_store.c)
target_link_libraries(test_store PRIVATE cohort_static)
add_test(NAME store COMMAND test_store)
set_tests_properties(store PROPERTIES TIMEOUT 120 LABELS "unit")

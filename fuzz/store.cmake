# libFuzzer target for the store's wire parser (clang only):
#   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCOHORT_FUZZ=ON
#   cmake --build build-fuzz --target fuzz_store_proto
#   build-fuzz/fuzz_store_proto -max_total_time=60
# The root CMakeLists.txt does not glob fuzz/, so tests/store.cmake includes
# this file. With COHORT_FUZZ a short run is also a ctest (label "fuzz").
option(COHORT_FUZZ "Build libFuzzer targets (needs clang)" OFF)
if(COHORT_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "COHORT_FUZZ=ON needs clang: -DCMAKE_C_COMPILER=clang")
  endif()
  # The parser is compiled into the target itself so that it is instrumented.
  add_executable(fuzz_store_proto ${CMAKE_SOURCE_DIR}/fuzz/fuzz_store_proto.c
    ${CMAKE_SOURCE_DIR}/src/store/store_proto.c)
  target_compile_options(fuzz_store_proto PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_store_proto PRIVATE -fsanitize=fuzzer,address,undefined)
  add_test(NAME fuzz_store_proto COMMAND fuzz_store_proto -max_total_time=20 -rss_limit_mb=1024)
  set_tests_properties(fuzz_store_proto PROPERTIES TIMEOUT 120 LABELS "fuzz")
endif()

# libFuzzer target for the metrics parser of `cohort plot` (clang only):
#   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCOHORT_FUZZ=ON
#   cmake --build build-fuzz --target fuzz_plot && build-fuzz/fuzz_plot -max_total_time=60
# Included from tests/eco.cmake (the root does not glob fuzz/).
option(COHORT_FUZZ "Build libFuzzer targets (needs clang)" OFF)
if(COHORT_FUZZ)
  add_executable(fuzz_plot ${CMAKE_SOURCE_DIR}/fuzz/fuzz_plot.c ${CMAKE_SOURCE_DIR}/src/plot/plot.c)
  target_compile_options(fuzz_plot PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_plot PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_plot PRIVATE m)
  add_test(NAME fuzz_plot COMMAND fuzz_plot -max_total_time=20 -timeout=5 -rss_limit_mb=1024)
  set_tests_properties(fuzz_plot PROPERTIES TIMEOUT 120 LABELS "fuzz")
endif()

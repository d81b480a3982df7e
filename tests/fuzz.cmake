# libFuzzer targets (only with -DCOHORT_FUZZ=ON and clang): see fuzz/fuzz.cmake.
include(${CMAKE_SOURCE_DIR}/fuzz/fuzz.cmake)

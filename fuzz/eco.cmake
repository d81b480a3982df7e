# The metrics parser's fuzz target (fuzz_plot) is defined with all the others
# in fuzz/fuzz.cmake; tests/eco.cmake includes this file.
include(${CMAKE_SOURCE_DIR}/fuzz/fuzz.cmake)

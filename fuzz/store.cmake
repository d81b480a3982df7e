# The store's fuzz target (fuzz_store_proto) is defined with all the others
# in fuzz/fuzz.cmake; tests/store.cmake includes this file.
include(${CMAKE_SOURCE_DIR}/fuzz/fuzz.cmake)

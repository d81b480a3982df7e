# src/coll: the reduction kernels are plain loops; -O3 lets the compiler vectorise them.
set_source_files_properties(${CMAKE_SOURCE_DIR}/src/coll/reduce.c
  TARGET_DIRECTORY cohort_objects PROPERTIES COMPILE_OPTIONS "-O3")

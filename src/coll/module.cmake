# src/coll: part of libcohort.
cohort_module(cohort_objects)
# The reduction kernels are plain loops; -O3 lets the compiler vectorise them.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/reduce.c
  TARGET_DIRECTORY cohort_objects PROPERTIES COMPILE_OPTIONS "-O3")

# Tests of the ecosystem pieces: manifests, TensorBoard writer, plot, install.
set(COHORT_PYTHON /usr/bin/python3)

add_executable(test_manifest ${CMAKE_SOURCE_DIR}/tests/test_manifest.c)
target_link_libraries(test_manifest PRIVATE cohort_node)
add_test(NAME manifest COMMAND test_manifest)
set_tests_properties(manifest PROPERTIES TIMEOUT 60 LABELS "unit")

add_test(NAME manifest_cli
  COMMAND ${COHORT_PYTHON} ${CMAKE_SOURCE_DIR}/tests/test_manifest.py $<TARGET_FILE:cohort>)
set_tests_properties(manifest_cli PROPERTIES TIMEOUT 120 COST 25 LABELS "unit")

# Every Kubernetes kind against the real schemas of its API (tests/schemas/,
# Debian's python3-jsonschema).
add_test(NAME manifest_schema
  COMMAND ${COHORT_PYTHON} ${CMAKE_SOURCE_DIR}/tests/test_manifest_schema.py $<TARGET_FILE:cohort>
          ${CMAKE_SOURCE_DIR}/tests/schemas)
set_tests_properties(manifest_schema PROPERTIES TIMEOUT 120 LABELS "unit")

add_test(NAME install
  COMMAND ${CMAKE_SOURCE_DIR}/tests/test_install.sh ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
set_tests_properties(install PROPERTIES TIMEOUT 300 COST 22 LABELS "slow")

# The writer is part of src/gpt2, whose module is built by its own fragment:
# compile the one file into the test.
add_executable(test_tb ${CMAKE_SOURCE_DIR}/tests/test_tb.c ${CMAKE_SOURCE_DIR}/src/gpt2/tb_writer.c)
target_link_libraries(test_tb PRIVATE m)
add_test(NAME tb COMMAND test_tb)
set_tests_properties(tb PROPERTIES TIMEOUT 60 LABELS "unit")
add_test(NAME tb_decode
  COMMAND ${COHORT_PYTHON} ${CMAKE_SOURCE_DIR}/tests/test_tb.py $<TARGET_FILE:test_tb>)
set_tests_properties(tb_decode PROPERTIES TIMEOUT 120 LABELS "unit")

add_executable(test_plot ${CMAKE_SOURCE_DIR}/tests/test_plot.c)
target_link_libraries(test_plot PRIVATE cohort_node m)
add_test(NAME plot COMMAND test_plot)
set_tests_properties(plot PROPERTIES TIMEOUT 120 LABELS "unit")
add_test(NAME plot_cli
  COMMAND ${COHORT_PYTHON} ${CMAKE_SOURCE_DIR}/tests/test_plot.py $<TARGET_FILE:cohort>)
set_tests_properties(plot_cli PROPERTIES TIMEOUT 120 LABELS "unit")

# The man pages against the programs' --version and --help.
add_test(NAME help
  COMMAND ${COHORT_PYTHON} ${CMAKE_SOURCE_DIR}/tests/test_help.py ${CMAKE_SOURCE_DIR}/docs/man
          $<TARGET_FILE_DIR:cohort>)
set_tests_properties(help PROPERTIES TIMEOUT 60 LABELS "unit")

include(${CMAKE_SOURCE_DIR}/fuzz/fuzz.cmake)

# The generated Slurm script, docker lines and Kubernetes commands run for
# real: two `cohort run` agents on loopback, the scheduler stood in for.
add_test(NAME manifest_run
  COMMAND ${COHORT_PYTHON} ${CMAKE_SOURCE_DIR}/tests/test_manifest_run.py $<TARGET_FILE_DIR:cohort>)
set_tests_properties(manifest_run PROPERTIES TIMEOUT 300 LABELS "slow")

# The trainer's --tensorboard events and --metrics file agree, and cohort plot
# draws the metrics. Registered at the end of the directory, when it is known
# whether cohort-gpt2 is built.
function(cohort_eco_gpt2_tests)
  if(TARGET cohort-gpt2)
    add_test(NAME tb_gpt2
      COMMAND ${COHORT_PYTHON} ${CMAKE_SOURCE_DIR}/tests/test_tb.py gpt2
              $<TARGET_FILE:cohort-gpt2> $<TARGET_FILE:cohort>)
    set_tests_properties(tb_gpt2 PROPERTIES TIMEOUT 300 LABELS "unit" PROCESSORS 2)
  endif()
endfunction()
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL cohort_eco_gpt2_tests)

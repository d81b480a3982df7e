# --on-failure reform, the agent's side (docs/reform.md).
add_executable(test_reform ${CMAKE_SOURCE_DIR}/tests/test_reform.c)
target_link_libraries(test_reform PRIVATE cohort_node)
add_test(NAME reform_control COMMAND test_reform)
set_tests_properties(reform_control PROPERTIES TIMEOUT 60 LABELS "unit")

# One node: a killed rank replaced while the survivors keep their processes; a
# worker that says no hello restarted with one line (tests/reform_worker.py).
add_test(NAME reform_local COMMAND ${CMAKE_SOURCE_DIR}/tests/test_reform.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR} local)
set_tests_properties(reform_local PROPERTIES TIMEOUT 180 LABELS "unit")

# Tests of src/doctor and `cohort doctor`: the fixture trees under
# tests/fixtures/doctor/, the binary's --export, --json and --check, and this machine.
add_executable(test_doctor ${CMAKE_SOURCE_DIR}/tests/test_doctor.c)
target_link_libraries(test_doctor PRIVATE cohort_node)
add_dependencies(test_doctor cohort)
add_test(NAME doctor COMMAND test_doctor ${CMAKE_SOURCE_DIR}/tests/fixtures/doctor $<TARGET_FILE:cohort>)
set_tests_properties(doctor PROPERTIES TIMEOUT 120 LABELS "unit")

# `cohort doctor --check`: each check failed and passed on the fixture trees.
add_executable(test_doctor_check ${CMAKE_SOURCE_DIR}/tests/test_doctor_check.c)
target_link_libraries(test_doctor_check PRIVATE cohort_node)
add_dependencies(test_doctor_check cohort)
add_test(NAME doctor_check COMMAND test_doctor_check ${CMAKE_SOURCE_DIR}/tests/fixtures/doctor
         $<TARGET_FILE:cohort>)
set_tests_properties(doctor_check PROPERTIES TIMEOUT 120 LABELS "unit")

# The --json output of every fixture validated against docs/doctor.schema.json.
find_program(COHORT_PYTHON3 NAMES python3)
if(COHORT_PYTHON3)
  add_test(NAME doctor_schema COMMAND ${COHORT_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/test_doctor_schema.py
           $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR}/tests/fixtures/doctor ${CMAKE_SOURCE_DIR}/docs/doctor.schema.json)
  set_tests_properties(doctor_schema PROPERTIES TIMEOUT 120 LABELS "unit")
endif()

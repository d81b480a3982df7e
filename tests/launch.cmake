# Tests of src/launch (`cohort launch`): host lists, quoting, the verdicts on
# a host's answer, and whole jobs through stand-ins for ssh and cohort,
# without a network.
add_executable(test_launch ${CMAKE_SOURCE_DIR}/tests/test_launch.c)
target_link_libraries(test_launch PRIVATE cohort_node)
add_test(NAME launch COMMAND test_launch)
set_tests_properties(launch PROPERTIES TIMEOUT 60 LABELS "unit")

# The hostfile parser under libFuzzer (only with -DCOHORT_FUZZ=ON and clang;
# see fuzz/fuzz.cmake). src/launch is not in the shared fuzz library, so the
# parser is compiled into the target itself (instrumented the same way).
include(${CMAKE_SOURCE_DIR}/fuzz/fuzz.cmake)
if(COHORT_FUZZ)
  cohort_fuzz(fuzz_hostfile ${CMAKE_SOURCE_DIR}/fuzz/fuzz_hostfile.c
    SOURCES ${CMAKE_SOURCE_DIR}/src/launch/hostfile.c)
endif()

# Real sshd servers in network namespaces the test creates and removes (root).
add_test(NAME launch_ssh COMMAND ${CMAKE_SOURCE_DIR}/tests/test_launch.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(launch_ssh PROPERTIES TIMEOUT 900 COST 110 LABELS "slow")

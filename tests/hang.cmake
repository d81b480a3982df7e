# Hung jobs: stack collection and classification, progress and stragglers
# (src/agent/stacks.c, src/agent/progress.c) on real processes.
add_executable(test_hang ${CMAKE_SOURCE_DIR}/tests/test_hang.c)
target_link_libraries(test_hang PRIVATE cohort_node)
# A libcohort worker of which one rank skips an allreduce, under cohort run.
add_executable(test_hang_worker ${CMAKE_SOURCE_DIR}/tests/test_hang_worker.c)
target_link_libraries(test_hang_worker PRIVATE cohort_static)
add_test(NAME hang COMMAND test_hang ${CMAKE_SOURCE_DIR} $<TARGET_FILE:cohort>
  $<TARGET_FILE:test_hang_worker>)
set_tests_properties(hang PROPERTIES TIMEOUT 120 LABELS "unit")

# The same on real PyTorch gloo DDP ranks (needs python3-torch): the stuck
# rank's traceback names the script's line, the other waits in backward.
add_test(NAME hang_torch COMMAND test_hang ${CMAKE_SOURCE_DIR} --torch)
set_tests_properties(hang_torch PROPERTIES TIMEOUT 400 COST 60 LABELS "slow" PROCESSORS 2)
add_test(NAME hang_run COMMAND ${CMAKE_SOURCE_DIR}/tests/test_hang_run.sh $<TARGET_FILE:cohort>
  ${CMAKE_SOURCE_DIR} $<TARGET_FILE:test_hang_worker>)
set_tests_properties(hang_run PROPERTIES TIMEOUT 600 COST 165 LABELS "slow" PROCESSORS 2)

# --straggler-factor: a rank slow on purpose reported on node 0 (one node,
# and two agents on loopback), none in an even job or with the factor 0.
add_test(NAME straggler COMMAND ${CMAKE_SOURCE_DIR}/tests/test_straggler.sh $<TARGET_FILE:cohort>
  ${CMAKE_SOURCE_DIR})
set_tests_properties(straggler PROPERTIES TIMEOUT 120 COST 26 LABELS "slow")

# Silent healthy ranks (DDP, plain collectives, a busy Python loop) are not
# hung under --hang-timeout; stuck ones still are (needs python3-torch).
add_test(NAME hang_healthy COMMAND ${CMAKE_SOURCE_DIR}/tests/test_hang_healthy.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(hang_healthy PROPERTIES TIMEOUT 400 COST 57 LABELS "slow" PROCESSORS 2)

# Reliability tests (docs/reliability.md): the store under hostile clients
# while real clients and a `cohort run` job work, and the soak of many jobs
# across network namespaces. Both are "slow": they fork dozens of processes
# and depend on wall-clock timeouts, so they are not run under ASan.
add_executable(test_adversarial ${CMAKE_SOURCE_DIR}/tests/test_adversarial.c)
target_link_libraries(test_adversarial PRIVATE cohort_static)
add_dependencies(test_adversarial cohort)
add_test(NAME adversarial COMMAND test_adversarial $<TARGET_FILE:cohort>)
set_tests_properties(adversarial PROPERTIES TIMEOUT 180 LABELS "slow")
# 200 consecutive three-node jobs (about 1.5 minutes on 2 cores), a fifth of
# them failing on purpose, then nothing may be left over.
add_test(NAME soak COMMAND ${CMAKE_SOURCE_DIR}/tests/test_soak.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR} 200)
set_tests_properties(soak PROPERTIES TIMEOUT 900 COST 240 LABELS "slow" PROCESSORS 2)

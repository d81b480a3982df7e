# Tests of the tools' option-table parser (tools/cli.c).
add_executable(test_cli ${CMAKE_SOURCE_DIR}/tests/test_cli.c ${CMAKE_SOURCE_DIR}/tools/cli.c)
target_link_libraries(test_cli PRIVATE cohort_static)
add_test(NAME cli COMMAND test_cli)
set_tests_properties(cli PROPERTIES TIMEOUT 60 LABELS "unit")

# `cohort run` with torchrun's command line, the torchrun link and seed 004's
# single-node c10d line training a DDP script (needs python3-torch).
add_test(NAME torchrun_cli COMMAND ${CMAKE_SOURCE_DIR}/tests/test_torchrun_cli.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(torchrun_cli PROPERTIES TIMEOUT 300 COST 29 LABELS "slow" PROCESSORS 2)
add_test(NAME torchrun_multinode COMMAND ${CMAKE_SOURCE_DIR}/tests/test_torchrun_multinode.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(torchrun_multinode PROPERTIES TIMEOUT 300 COST 90 LABELS "slow" PROCESSORS 2)

# Every `cohort` exec loads libc, libm, Nettle and jansson only (libcurl
# is opened by the etcd client when it connects).
add_test(NAME exec_libs COMMAND ${CMAKE_SOURCE_DIR}/tests/test_exec_libs.sh $<TARGET_FILE:cohort>)
set_tests_properties(exec_libs PROPERTIES TIMEOUT 30 LABELS "unit")

# Every exit status of cohort run brought about for real, and the one table
# of them in the README, --help and the man page (loopback only).
add_test(NAME exit_status COMMAND ${CMAKE_SOURCE_DIR}/tests/test_exit_status.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(exit_status PROPERTIES TIMEOUT 120 LABELS "unit")

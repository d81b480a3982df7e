# Tests of src/rdzv (discovery).
add_executable(test_rdzv ${CMAKE_SOURCE_DIR}/tests/test_rdzv.c)
target_link_libraries(test_rdzv PRIVATE cohort_node)
add_test(NAME rdzv COMMAND test_rdzv)
set_tests_properties(rdzv PROPERTIES TIMEOUT 120 LABELS "unit")

# Multicast between network namespaces the script creates and removes (root only; 77 = skipped).
add_executable(test_rdzv_mcast ${CMAKE_SOURCE_DIR}/tests/test_rdzv_mcast.c)
target_link_libraries(test_rdzv_mcast PRIVATE cohort_node)
add_test(NAME rdzv_mcast
  COMMAND bash ${CMAKE_SOURCE_DIR}/tests/test_rdzv_mcast.sh $<TARGET_FILE:test_rdzv_mcast>)
set_tests_properties(rdzv_mcast PROPERTIES TIMEOUT 120 LABELS "slow" SKIP_RETURN_CODE 77)

# Two agents on loopback through a rendezvous file signed with their token.
add_test(NAME rdzv_file COMMAND bash ${CMAKE_SOURCE_DIR}/tests/test_rdzv_file.sh $<TARGET_FILE:cohort>)
set_tests_properties(rdzv_file PROPERTIES TIMEOUT 120 LABELS "slow")

# The etcd client against real etcd servers on loopback (one member, a
# 3-member cluster losing one, authentication, TLS, none listening).
add_executable(test_etcd ${CMAKE_SOURCE_DIR}/tests/test_etcd.c)
target_link_libraries(test_etcd PRIVATE cohort_node)
add_test(NAME etcd_client COMMAND bash ${CMAKE_SOURCE_DIR}/tests/test_etcd.sh $<TARGET_FILE:test_etcd>)
set_tests_properties(etcd_client PROPERTIES TIMEOUT 300 COST 41 LABELS "slow")
# A job's end through etcd on loopback with a straggler stopped while the
# others leave: every agent exits 0, no key left (real etcd, no root).
add_test(NAME etcd_exit
  COMMAND bash ${CMAKE_SOURCE_DIR}/tests/test_etcd_exit.sh $<TARGET_FILE:cohort>)
set_tests_properties(etcd_exit PROPERTIES TIMEOUT 300 COST 10 LABELS "slow")
# The wait against a fake etcd (no etcd needed): a watch cut off after its
# "created" answer does not make the next wait skip the events it missed.
add_test(NAME etcd_replay COMMAND test_etcd replay -)
set_tests_properties(etcd_replay PROPERTIES TIMEOUT 60 LABELS "unit")

# cohort run --rdzv-backend etcd across network namespaces with a 3-member
# etcd cluster inside them: a job, node 0 killed, a member killed, TLS,
# passwords, etcd down (root only).
add_test(NAME etcd_run
  COMMAND bash ${CMAKE_SOURCE_DIR}/tests/test_etcd_run.sh $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(etcd_run PROPERTIES TIMEOUT 400 COST 52 LABELS "slow")

# Tests of re-forming libcohort communicators (src/coll/reform.c, control.c): real forked
# workers driven by the test playing the agent over their control channels.
add_executable(test_reform_coll ${CMAKE_SOURCE_DIR}/tests/test_reform_coll.c)
target_link_libraries(test_reform_coll PRIVATE cohort_node m)
add_test(NAME reform_coll COMMAND test_reform_coll unit)
set_tests_properties(reform_coll PROPERTIES TIMEOUT 300 LABELS "unit" PROCESSORS 2)
# kill -9 mid-allreduce, a newcomer's state transfer, the donor lost mid-transfer; and the agent's
# reshape message with a stopped rank: over TCP, shared memory, and the single-copy path.
foreach(t tcp shm single)
  add_test(NAME reform_coll_kill_${t} COMMAND test_reform_coll kill ${t})
  set_tests_properties(reform_coll_kill_${t} PROPERTIES TIMEOUT 300 LABELS "unit" PROCESSORS 2)
endforeach()
foreach(t tcp shm)
  add_test(NAME reform_coll_idle_${t} COMMAND test_reform_coll idle ${t})
  set_tests_properties(reform_coll_idle_${t} PROPERTIES TIMEOUT 120 LABELS "unit")
  add_test(NAME reform_coll_reshape_${t} COMMAND test_reform_coll reshape ${t})
  set_tests_properties(reform_coll_reshape_${t} PROPERTIES TIMEOUT 300 LABELS "unit")
  # A node joining deferred to a boundary the ranks agree on (cohort_comm_defer_grow).
  add_test(NAME reform_coll_grow_${t} COMMAND test_reform_coll grow ${t})
  set_tests_properties(reform_coll_grow_${t} PROPERTIES TIMEOUT 120 LABELS "unit")
  # A grow early in a step breaks it (cohort_comm_grow_break_for); a later one is deferred.
  add_test(NAME reform_coll_break_${t} COMMAND test_reform_coll break ${t})
  set_tests_properties(reform_coll_break_${t} PROPERTIES TIMEOUT 120 LABELS "unit")
endforeach()
# libcohort workers under the real agent: kill -9 of a rank, the survivors re-form in their own
# processes, a newcomer receives the state, the job ends well (TCP and shared memory).
add_executable(reform_coll_worker ${CMAKE_SOURCE_DIR}/tests/reform_coll_worker.c)
target_link_libraries(reform_coll_worker PRIVATE cohort_node)
add_test(NAME reform_coll_agent COMMAND ${CMAKE_SOURCE_DIR}/tests/test_reform_coll_agent.sh
  $<TARGET_FILE:cohort> $<TARGET_FILE:reform_coll_worker> ${CMAKE_SOURCE_DIR})
set_tests_properties(reform_coll_agent PROPERTIES TIMEOUT 180 LABELS "unit" PROCESSORS 2)
# The state streamed to new ranks in the background (src/coll/stream.c): pieces arrive while the
# ranks keep allreducing; a mismatch; nobody new; the donor killed mid-stream.
add_executable(test_stream ${CMAKE_SOURCE_DIR}/tests/test_stream.c)
target_link_libraries(test_stream PRIVATE cohort_node)
foreach(t tcp shm)
  add_test(NAME stream_${t} COMMAND test_stream ${t})
  set_tests_properties(stream_${t} PROPERTIES TIMEOUT 120 LABELS "unit" PROCESSORS 2)
endforeach()

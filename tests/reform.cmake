# --on-failure reform, the agent's side (docs/reform.md).
add_executable(test_reform ${CMAKE_SOURCE_DIR}/tests/test_reform.c)
target_link_libraries(test_reform PRIVATE cohort_node)
add_test(NAME reform_control COMMAND test_reform)
set_tests_properties(reform_control PROPERTIES TIMEOUT 60 LABELS "unit")

# One node: a killed rank replaced while the survivors keep their processes; a
# worker that says no hello restarted with one line (tests/reform_worker.py);
# the option's spellings, a re-form past --reform-timeout, a slot lost three
# times, and an agent on one machine that cannot host the store.
add_test(NAME reform_local COMMAND ${CMAKE_SOURCE_DIR}/tests/test_reform.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR} local)
set_tests_properties(reform_local PROPERTIES TIMEOUT 180 LABELS "unit")

# Real agents in network namespaces the test creates and removes (root): a
# node killed (and its replacement joining), a worker killed on another node,
# two nodes lost a second apart, fewer than MIN left, the store's node lost, a
# node stopped with SIGSTOP, a partition, an agent killed alone.
add_test(NAME reform_nodes COMMAND ${CMAKE_SOURCE_DIR}/tests/test_reform.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR} nodes)
set_tests_properties(reform_nodes PROPERTIES TIMEOUT 600 COST 60 LABELS "slow")

# The agent's loop during a re-form round's join (root, namespaces): the
# survivors' output keeps flowing while the join waits for a lost node.
add_test(NAME reform_relay COMMAND ${CMAKE_SOURCE_DIR}/tests/test_reform.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR} relay)
set_tests_properties(reform_relay PROPERTIES TIMEOUT 120 LABELS "slow")

# With etcd (Debian's etcd-server, a member on a namespace of its own): node 0
# lost, the survivors re-form and their workers' store moves to the new node 0;
# then members on the job's nodes and one node cut off: the majority goes on.
add_test(NAME reform_etcd COMMAND ${CMAKE_SOURCE_DIR}/tests/test_reform.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR} etcd)
set_tests_properties(reform_etcd PROPERTIES TIMEOUT 400 COST 40 LABELS "slow")

# The PyTorch example under the real agent (Debian's python3-torch, gloo):
# kill -9 of a rank, survivors re-form in place, the newcomer gets the state.
add_test(NAME reform_torch_agent COMMAND ${CMAKE_SOURCE_DIR}/tests/test_reform.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR} torch)
set_tests_properties(reform_torch_agent PROPERTIES TIMEOUT 400 COST 40 LABELS "slow" PROCESSORS 2)

# A libcohort program (cohort_comm_reform, cohort_comm_state_transfer) under
# the agent: a rank killed on one node, a node killed of two (root, namespaces).
add_executable(reform_steps_worker ${CMAKE_SOURCE_DIR}/tests/reform_steps_worker.c)
target_link_libraries(reform_steps_worker PRIVATE cohort_static)
add_test(NAME reform_agent_coll COMMAND ${CMAKE_SOURCE_DIR}/tests/test_reform.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR} coll $<TARGET_FILE:reform_steps_worker>)
set_tests_properties(reform_agent_coll PROPERTIES TIMEOUT 300 COST 20 LABELS "slow")

# cohort-gpt2 under real agents in network namespaces (root): 3 nodes x 1
# rank, node 2 killed whole and replaced at once; the survivors keep their
# processes, the newcomer receives the state, every step is trained once.
add_test(NAME reform_gpt2_nodes COMMAND ${CMAKE_SOURCE_DIR}/tests/test_gpt2_reform_netns.sh
  $<TARGET_FILE:cohort> $<TARGET_FILE:cohort-gpt2> ${CMAKE_SOURCE_DIR})
set_tests_properties(reform_gpt2_nodes PROPERTIES TIMEOUT 300 COST 10 LABELS "slow" PROCESSORS 2)
# The same with node 0's worker killed alone (its agent hosts the store and starts a new one): the
# newcomer is rank 0, below the survivors, and catches up in the background all the same.
add_test(NAME reform_gpt2_worker0 COMMAND ${CMAKE_SOURCE_DIR}/tests/test_gpt2_reform_netns.sh
  $<TARGET_FILE:cohort> $<TARGET_FILE:cohort-gpt2> ${CMAKE_SOURCE_DIR} worker0)
set_tests_properties(reform_gpt2_worker0 PROPERTIES TIMEOUT 300 COST 10 LABELS "slow" PROCESSORS 2)

# docs/reform.md's "Try it on one machine" as written (loopback, no root):
# its blocks run for cohort-gpt2 and the PyTorch example, node 2 killed by
# the PIDs cohort status shows and started again.
add_test(NAME reform_try COMMAND ${CMAKE_SOURCE_DIR}/tests/test_reform_try.sh
  $<TARGET_FILE:cohort> $<TARGET_FILE:cohort-gpt2> ${CMAKE_SOURCE_DIR})
set_tests_properties(reform_try PROPERTIES TIMEOUT 300 COST 10 LABELS "slow" PROCESSORS 2)

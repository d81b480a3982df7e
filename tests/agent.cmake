# Tests of src/agent through the `cohort run` binary.
add_executable(test_agent ${CMAKE_SOURCE_DIR}/tests/test_agent.c)
add_test(NAME agent COMMAND test_agent $<TARGET_FILE:cohort>)
set_tests_properties(agent PROPERTIES TIMEOUT 300 LABELS "unit")

# An unmodified PyTorch DDP script under `cohort run` (needs python3-torch).
add_test(NAME agent_torch_ddp COMMAND ${CMAKE_SOURCE_DIR}/tests/test_torch_ddp.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(agent_torch_ddp PROPERTIES TIMEOUT 400 COST 50 LABELS "slow" PROCESSORS 2)

# Three agents on loopback (no root) with uneven slots: global ranks, RANK and
# LOCAL_RANK, and the failure report of a rank that is not its local rank.
add_test(NAME agent_nodes COMMAND bash ${CMAKE_SOURCE_DIR}/tests/test_agent_nodes.sh
  $<TARGET_FILE:cohort>)
set_tests_properties(agent_nodes PROPERTIES TIMEOUT 180 LABELS "unit")

# Multi-node agents in network namespaces the test creates and removes (root).
add_test(NAME agent_multinode COMMAND ${CMAKE_SOURCE_DIR}/tests/test_multinode.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(agent_multinode PROPERTIES TIMEOUT 600 COST 42 LABELS "slow")

# A worker's environment under cohort run and under torchrun (needs python3-torch).
add_test(NAME agent_torchrun_env COMMAND ${CMAKE_SOURCE_DIR}/tests/test_torchrun_env.sh
  $<TARGET_FILE:cohort>)
set_tests_properties(agent_torchrun_env PROPERTIES TIMEOUT 300 COST 85 LABELS "slow" PROCESSORS 2)

# The worker environment as a pure function, against docs/torchrun-env.md.
add_executable(test_agent_env ${CMAKE_SOURCE_DIR}/tests/test_agent_env.c)
target_link_libraries(test_agent_env PRIVATE cohort_node)
add_test(NAME agent_env COMMAND test_agent_env)
set_tests_properties(agent_env PROPERTIES TIMEOUT 60 LABELS "unit")

# The node's CPUs and GPUs and the workers' count and CPU binding, on fixture
# trees the test writes (--nproc-per-node gpu|auto, --numa-binding, --cpu-bind).
add_executable(test_place ${CMAKE_SOURCE_DIR}/tests/test_place.c)
target_link_libraries(test_place PRIVATE cohort_node)
add_test(NAME place COMMAND test_place)
set_tests_properties(place PROPERTIES TIMEOUT 60 LABELS "unit")
add_test(NAME place_run COMMAND ${CMAKE_SOURCE_DIR}/tests/test_place_run.sh $<TARGET_FILE:cohort>)
set_tests_properties(place_run PROPERTIES TIMEOUT 300 LABELS "unit")

# No descendant of a worker outlives the job: setsid, double fork, nohup,
# own process group; worker exit, agent SIGKILL, unprivileged agent (root).
add_test(NAME agent_orphans COMMAND ${CMAKE_SOURCE_DIR}/tests/test_orphans.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(agent_orphans PROPERTIES TIMEOUT 120 LABELS "slow")

# NCCL variables under the names the worker's PyTorch reads (the start-up
# hook and cohort_reform; fake torch 2.11 packages, Debian's 1.13).
add_test(NAME agent_torch_env_names COMMAND /usr/bin/python3
  ${CMAKE_SOURCE_DIR}/tests/test_torch_env_names.py ${CMAKE_SOURCE_DIR} $<TARGET_FILE:cohort>)
set_tests_properties(agent_torch_env_names PROPERTIES TIMEOUT 120 LABELS "unit")

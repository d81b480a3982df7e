# `cohort run` ships cohort_reform to Python workers; PyTorch DDP workers
# (gloo, Debian's python3-torch) re-form in their own processes through
# cohort_reform against a fake agent: a rank killed, a newcomer given the
# state, a stalled rank, a survivor a step behind (docs/reform.md, "PyTorch workers").
add_test(NAME reform_torch_fake COMMAND /usr/bin/python3
  ${CMAKE_SOURCE_DIR}/tests/test_reform_torch.py ${CMAKE_SOURCE_DIR} $<TARGET_FILE:cohort>)
set_tests_properties(reform_torch_fake PROPERTIES TIMEOUT 600 COST 20 LABELS "slow" PROCESSORS 2)

# The same example under real agents with --on-failure reform in network
# namespaces the test creates and removes (root): node 2 killed, the
# survivors go on in their processes, a replacement node receives the state.
add_test(NAME reform_torch_nodes COMMAND ${CMAKE_SOURCE_DIR}/tests/test_reform_torch_netns.sh
  $<TARGET_FILE:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(reform_torch_nodes PROPERTIES TIMEOUT 600 COST 40 LABELS "slow" PROCESSORS 2)

# A worker that finished its training exits 0, never dies of SIGABRT at the
# interpreter's exit with a gloo collective still being freed (cohort_reform
# ends its process groups at exit).
add_test(NAME reform_torch_exit COMMAND /usr/bin/python3
  ${CMAKE_SOURCE_DIR}/tests/test_reform_torch_exit.py ${CMAKE_SOURCE_DIR})
set_tests_properties(reform_torch_exit PROPERTIES TIMEOUT 300 LABELS "slow" PROCESSORS 2)

# A donor's stream of the state in the background sends from its live tensors: the next
# update moves those not sent yet to new memory, with the same result (no GPU, no agent).
add_test(NAME reform_torch_catchup_live COMMAND /usr/bin/python3
  ${CMAKE_SOURCE_DIR}/tests/test_reform_catchup_live.py ${CMAKE_SOURCE_DIR})
set_tests_properties(reform_torch_catchup_live PROPERTIES TIMEOUT 60 LABELS "unit"
  SKIP_RETURN_CODE 77)

# A rank catching up with gloo computes nothing for the model: job.ddp gives the forward's
# outputs as leaves, the script's backward ends there (no GPU, no agent).
add_test(NAME reform_torch_idle COMMAND /usr/bin/python3
  ${CMAKE_SOURCE_DIR}/tests/test_reform_idle.py ${CMAKE_SOURCE_DIR})
set_tests_properties(reform_torch_idle PROPERTIES TIMEOUT 60 LABELS "unit"
  SKIP_RETURN_CODE 77)

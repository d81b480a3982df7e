# Tests of src/gpt2 and cohort-gpt2.
add_executable(test_gpt2 ${CMAKE_SOURCE_DIR}/tests/test_gpt2.c)
target_link_libraries(test_gpt2 PRIVATE gpt2)
add_test(NAME gpt2 COMMAND test_gpt2)
set_tests_properties(gpt2 PROPERTIES TIMEOUT 120 LABELS "unit" ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=passive")

# The model against an independent PyTorch implementation (Debian's
# python3-torch; /usr/bin/python3 because another python3 may come first on PATH).
set(GPT2_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with PyTorch for the gpt2 reference test")
add_executable(test_gpt2_ref ${CMAKE_SOURCE_DIR}/tests/test_gpt2_ref.c)
target_link_libraries(test_gpt2_ref PRIVATE gpt2)
add_test(NAME gpt2_reference
         COMMAND test_gpt2_ref ${GPT2_PYTHON} ${CMAKE_SOURCE_DIR}/tests/gpt2_reference.py)
set_tests_properties(gpt2_reference PROPERTIES TIMEOUT 120 COST 24 LABELS "unit" PROCESSORS 2
                     ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=passive")

# cohort-gpt2 as a program: usage errors, accumulation, kill -9 and resume.
add_executable(test_gpt2_train ${CMAKE_SOURCE_DIR}/tests/test_gpt2_train.c)
add_test(NAME gpt2_train COMMAND test_gpt2_train $<TARGET_FILE:cohort-gpt2>)
set_tests_properties(gpt2_train PROPERTIES TIMEOUT 300 COST 20 LABELS "slow" PROCESSORS 2
                     ENVIRONMENT "OMP_WAIT_POLICY=passive")

# Data parallelism across forked ranks (a store on loopback, real libcohort).
add_executable(test_gpt2_ddp ${CMAKE_SOURCE_DIR}/tests/test_gpt2_ddp.c)
target_link_libraries(test_gpt2_ddp PRIVATE cohort_static)
add_test(NAME gpt2_ddp COMMAND test_gpt2_ddp $<TARGET_FILE:cohort-gpt2>)
set_tests_properties(gpt2_ddp PROPERTIES TIMEOUT 300 LABELS "slow" PROCESSORS 2)

# PowerSGD's pieces on one process (orthonormal factors, error feedback, state).
add_executable(test_gpt2_powersgd ${CMAKE_SOURCE_DIR}/tests/test_gpt2_powersgd.c)
target_link_libraries(test_gpt2_powersgd PRIVATE gpt2)
add_test(NAME gpt2_powersgd COMMAND test_gpt2_powersgd)
set_tests_properties(gpt2_powersgd PROPERTIES TIMEOUT 60 LABELS "unit"
                     ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=passive")

# The split exchange of a 16-bit wire between forked ranks (row path, early gathers).
add_executable(test_gpt2_split ${CMAKE_SOURCE_DIR}/tests/test_gpt2_split.c)
target_link_libraries(test_gpt2_split PRIVATE gpt2)
add_test(NAME gpt2_split COMMAND test_gpt2_split)
set_tests_properties(gpt2_split PROPERTIES TIMEOUT 60 LABELS "unit"
                     ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=passive")

# The gradient buffer shared between a host's ranks (cohort_mem_alloc), and the
# fallback when /dev/shm is too small (a mount namespace with a 4 MiB tmpfs).
add_test(NAME gpt2_shm COMMAND ${CMAKE_SOURCE_DIR}/tests/test_gpt2_shm.sh
         $<TARGET_FILE:cohort> $<TARGET_FILE:cohort-gpt2>)
set_tests_properties(gpt2_shm PROPERTIES TIMEOUT 300 COST 75 LABELS "slow" PROCESSORS 2 SKIP_RETURN_CODE 77)

# Re-form (#28): the test plays the agent (control channels, a store, SIGKILL of a rank, reshape
# and form messages, a newcomer) and compares the run bit for bit with runs chained by checkpoints.
add_executable(test_gpt2_reform ${CMAKE_SOURCE_DIR}/tests/test_gpt2_reform.c)
target_link_libraries(test_gpt2_reform PRIVATE cohort_static)
add_test(NAME gpt2_reform COMMAND test_gpt2_reform $<TARGET_FILE:cohort-gpt2>)
set_tests_properties(gpt2_reform PROPERTIES TIMEOUT 600 COST 60 LABELS "slow" PROCESSORS 2)

# The same under the real agent: cohort run --on-failure reform, rank 1 killed, a replacement.
add_test(NAME gpt2_reform_agent COMMAND ${CMAKE_SOURCE_DIR}/tests/test_gpt2_reform_agent.sh
         $<TARGET_FILE:cohort> $<TARGET_FILE:cohort-gpt2>)
set_tests_properties(gpt2_reform_agent PROPERTIES TIMEOUT 300 COST 10 LABELS "slow" PROCESSORS 2)

# bench/reform: cohort_comm_state_transfer beside cohort_broadcast and memcpy (not a test):
#   build/bench_state_transfer [MIB [REPS]]
add_executable(bench_state_transfer ${CMAKE_SOURCE_DIR}/bench/reform/state_transfer.c)
target_include_directories(bench_state_transfer PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_link_libraries(bench_state_transfer PRIVATE cohort_node)

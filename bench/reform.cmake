# bench/reform: cohort_comm_state_transfer beside cohort_broadcast and memcpy (not a test):
#   build/bench_state_transfer [MIB [REPS]]
add_executable(bench_state_transfer ${CMAKE_SOURCE_DIR}/bench/reform/state_transfer.c)
target_include_directories(bench_state_transfer PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_link_libraries(bench_state_transfer PRIVATE cohort_node)
# bench/reform/stream.py: the background state stream from 2 donors beside 1, over shaped links
# in network namespaces (root); one rank of it (not a test):
#   build/bench_state_stream STORE JOB RANK SIZE NEWMASK MIB
add_executable(bench_state_stream ${CMAKE_SOURCE_DIR}/bench/reform/state_stream.c)
target_link_libraries(bench_state_stream PRIVATE cohort_node)

# Benchmark of the rendezvous store against PyTorch's TCPStore (not a test):
#   build/bench_store [REPS [OPS]]
add_executable(bench_store ${CMAKE_SOURCE_DIR}/bench/bench_store.c)
target_link_libraries(bench_store PRIVATE cohort_static)
target_compile_definitions(bench_store PRIVATE
  BENCH_STORE_TORCH_SCRIPT="${CMAKE_SOURCE_DIR}/bench/store_torch.py")

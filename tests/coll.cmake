# Tests of src/coll (libcohort's collectives): real forked ranks on a loopback store.
add_executable(test_coll ${CMAKE_SOURCE_DIR}/tests/test_coll.c)
target_link_libraries(test_coll PRIVATE cohort_node m)
add_test(NAME coll COMMAND test_coll unit)
set_tests_properties(coll PROPERTIES TIMEOUT 900 COST 190 LABELS "unit" PROCESSORS 2)
add_test(NAME coll_failure COMMAND test_coll failure)
set_tests_properties(coll_failure PROPERTIES TIMEOUT 120 LABELS "slow")
add_test(NAME coll_netns COMMAND ${CMAKE_SOURCE_DIR}/tests/test_coll_netns.sh $<TARGET_FILE:test_coll>
  $<TARGET_FILE:cohort>)
set_tests_properties(coll_netns PROPERTIES TIMEOUT 300 LABELS "slow" SKIP_RETURN_CODE 77)

# `cohort bench --mem`: the header line names the buffers' kind, and every kind gives right results
# (shared: allocated and freed collectively through cohort_mem_alloc).
add_test(NAME bench_mem COMMAND sh -c "for m in private huge shared; do \
  out=$(\"$0\" bench --nproc 2 --mem $m -b 1M -e 1M -n 2 -w 1) || exit 1; \
  echo \"$out\" | grep -q \"memory $m,\" || exit 1; \
  echo \"$out\" | grep -q 'Out of bounds values : 0 OK' || exit 1; done; \
  \"$0\" bench --nproc 2 -b 1M -e 1M -n 1 -w 0 | grep -q 'memory private,'" $<TARGET_FILE:cohort>)
set_tests_properties(bench_mem PROPERTIES TIMEOUT 60 LABELS "unit")

# bench/scale: simulated nodes against the built-in store (bench/scale/run.sh
# runs the whole comparison). The swarm also runs in CI at a small size as a
# check of the protocol (its figures are not judged there).
add_executable(swarm ${CMAKE_SOURCE_DIR}/bench/scale/swarm.c)
target_link_libraries(swarm PRIVATE cohort_node)
add_test(NAME scale_swarm COMMAND swarm --nodes 64 --hold 1 --timeout 30)
set_tests_properties(scale_swarm PROPERTIES TIMEOUT 60 LABELS "unit")
# The most nodes a job may have (RDZV_MAX_NODES): past a WAIT's 4,096 keys
# node 0's join waits for the records in slices (at 5,000 nodes it failed at
# once: "only 1 of 5000 nodes joined"), and every node reads the plan's head
# and its own page (when every node read the whole plan, 12 GB crossed the
# store at this size and the run never finished). One connection a node
# after the join, so that 16,384 nodes fit a file limit of 20,000.
add_test(NAME scale_swarm_16384
  COMMAND swarm --nodes 16384 --sweep host --hold 1 --timeout 120 --join-conn close)
set_tests_properties(scale_swarm_16384 PROPERTIES TIMEOUT 240 LABELS "slow")

# The same pattern through etcd (`--rdzv-backend etcd`): simulated nodes as
# threads running the agents' join and watch over an etcd it starts.
add_executable(swarm_etcd ${CMAKE_SOURCE_DIR}/bench/scale/swarm_etcd.c)
target_link_libraries(swarm_etcd PRIVATE cohort_node Threads::Threads)
add_test(NAME scale_swarm_etcd COMMAND swarm_etcd --nodes 16 --hold 1 --timeout 60)
set_tests_properties(scale_swarm_etcd PROPERTIES TIMEOUT 120 LABELS "slow")

# Secure by default, by hand: agents in network namespaces with a token file,
# an intruder without it, the warning without any token, --require-token
# (root).
add_test(NAME secure COMMAND ${CMAKE_SOURCE_DIR}/tests/test_secure.sh $<TARGET_FILE:cohort>
  ${CMAKE_SOURCE_DIR})
set_tests_properties(secure PROPERTIES TIMEOUT 300 LABELS "slow")

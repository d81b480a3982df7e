#!/usr/bin/env bash
# ThreadSanitizer over the threaded parts: the store server's thread (test
# store, adversarial), the agent with its store and watcher threads (agent,
# agent_multinode: multi-node watchers across namespaces), and rendezvous
# publishing threads (rdzv, rdzv_mcast: the multicast announcer), and
# libcohort's collectives with their shared-memory transport and progress
# (coll, coll_failure). The whole project is built with clang
# -fsanitize=thread in its own build directory; any report makes the test
# fail (halt_on_error).
# usage: bench/reliability/tsan.sh [BUILD_DIR] [OUT_SUMMARY_FILE]
set -u
cd "$(dirname "$0")/../.."
build=${1:-build-tsan}
out=${2:-}
cc=$(command -v clang || command -v clang-14 || true)
[ -n "$cc" ] || { echo "tsan: clang is not installed; run scripts/deps.sh" >&2; exit 1; }
cmake -S . -B "$build" -DCMAKE_C_COMPILER="$cc" -DCOHORT_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug \
  >/dev/null || exit 1
cmake --build "$build" -j "${JOBS:-2}" >/dev/null || exit 1
tests=${COHORT_TSAN_TESTS:-'^(store|adversarial|agent|agent_multinode|rdzv|rdzv_mcast|coll|coll_failure)$'}
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
start=$SECONDS
(cd "$build" && ctest --output-on-failure -j 1 -R "$tests") >"$build/tsan.log" 2>&1
rc=$?
races=$(grep -c "WARNING: ThreadSanitizer" "$build/tsan.log")
passed=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2-\1/p' "$build/tsan.log")
echo "tsan: ctest exit $rc, ThreadSanitizer reports $races, $(($SECONDS - start)) s"
grep -E "tests passed|Failed|WARNING: ThreadSanitizer" "$build/tsan.log" | head -20
[ $rc -ne 0 ] && grep -A30 "WARNING: ThreadSanitizer" "$build/tsan.log" | head -60
if [ -n "$out" ]; then echo "tests=$tests ctest_rc=$rc reports=$races" >"$out"; fi
[ $rc -eq 0 ] && [ "$races" -eq 0 ]

#!/usr/bin/env bash
# test_coll_netns.sh - libcohort between network namespaces: two emulated nodes
# (tests/netns_lib.sh: namespaces on a private bridge, 10.201.0.0/24), rank 0
# on node 0 and ranks 1 and 2 on node 1. Ranks 1 and 2 share memory, every
# other pair talks TCP over the veth links; all check their results against
# the serial reference (test_coll rank). Then the same world with
# COHORT_TRANSPORT=shm must refuse to start (the ranks are not on one host).
# A world of two ranks per node checks the hierarchical allreduce.
# Everything created is removed on exit, also on failure.
# Usage: test_coll_netns.sh TEST_COLL COHORT
set -u
TEST_COLL=$1
COHORT=$2
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "coll_netns: needs root and iproute2 to create network namespaces" >&2
  exit 77
fi
. "$(dirname "$0")/netns_lib.sh"
netns_up 2 || { echo "coll_netns: cannot create the namespaces" >&2; exit 1; }
WORK=$(mktemp -d /tmp/coll_netns.XXXXXX)
STORE_PID=
cleanup() {
  [ -n "$STORE_PID" ] && kill "$STORE_PID" 2>/dev/null
  netns_down
  rm -rf "$WORK"
}
trap cleanup EXIT

A=$(netns_addr 0)
netns_exec 0 "$COHORT" store serve --host "$A" --port 29400 >"$WORK/store.log" 2>&1 &
STORE_PID=$!
ok=0
for _ in $(seq 1 50); do
  if netns_exec 1 "$COHORT" store ping --addr "$A:29400" --timeout 1 >/dev/null 2>&1; then ok=1; break; fi
  sleep 0.1
done
[ $ok = 1 ] || { echo "coll_netns: the store in node 0 did not come up" >&2; cat "$WORK/store.log" >&2; exit 1; }

# run_world JOB TRANSPORT: starts ranks 0 (node 0), 1 and 2 (node 1); prints exit codes.
run_world() {
  local job=$1 transport=$2 pids=() r node
  for r in 0 1 2; do
    node=$((r == 0 ? 0 : 1))
    netns_exec "$node" env RANK=$r WORLD_SIZE=3 LOCAL_RANK=$((r == 0 ? 0 : r - 1)) \
      COHORT_STORE="$A:29400" COHORT_JOB_ID="$job" COHORT_TIMEOUT_MS=30000 \
      COHORT_TRANSPORT="$transport" COHORT_LOG_LEVEL=info \
      timeout 120 "$TEST_COLL" rank >"$WORK/$job.$r.log" 2>&1 &
    pids+=($!)
  done
  codes=()
  for p in "${pids[@]}"; do
    wait "$p"
    codes+=($?)
  done
}

fail=0
run_world "cn-$$-auto" auto
for r in 0 1 2; do
  if [ "${codes[$r]}" -ne 0 ]; then
    echo "FAIL: rank $r exited ${codes[$r]}" >&2; cat "$WORK/cn-$$-auto.$r.log" >&2; fail=1
  fi
done
# Rank 0 is alone on its node: all TCP. Ranks 1 and 2 share memory and reach rank 0 by TCP.
grep -q "rank 0: 0 peer(s) over shared memory, 2 over TCP" "$WORK/cn-$$-auto.0.log" || { echo "FAIL: rank 0 transports" >&2; cat "$WORK/cn-$$-auto.0.log" >&2; fail=1; }
for r in 1 2; do
  grep -Eq "rank $r: 1 peer\(s\) over shared memory( \(one-sided access\))?( \(large payloads by address\))?, 1 over TCP \(listening on 10.201.0.2:" "$WORK/cn-$$-auto.$r.log" || { echo "FAIL: rank $r transports" >&2; cat "$WORK/cn-$$-auto.$r.log" >&2; fail=1; }
done

# Two ranks per node, interleaved (ranks 0 and 2 on node 0, 1 and 3 on node 1): the large
# allreduce runs hierarchically (shared memory inside a node, a ring of the two leaders over
# TCP); threshold 0 and 4 KiB slices send every size of the matrix through it.
job=cn-$$-hier pids=()
for r in 0 1 2 3; do
  netns_exec $((r % 2)) env RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r / 2)) \
    COHORT_STORE="$A:29400" COHORT_JOB_ID="$job" COHORT_TIMEOUT_MS=30000 \
    COHORT_ALGO_THRESHOLD=0 COHORT_SLICE=4096 COHORT_LOG_LEVEL=info \
    timeout 120 "$TEST_COLL" rank >"$WORK/$job.$r.log" 2>&1 &
  pids+=($!)
done
for r in 0 1 2 3; do
  wait "${pids[$r]}"
  rc=$?
  if [ $rc -ne 0 ]; then echo "FAIL: hierarchical rank $r exited $rc" >&2; cat "$WORK/$job.$r.log" >&2; fail=1; fi
  grep -q "rank $r: hierarchical allreduce over 2 hosts (2 rank(s) here, reduce-scatter form)" "$WORK/$job.$r.log" ||
    { echo "FAIL: rank $r did not run the hierarchical allreduce" >&2; cat "$WORK/$job.$r.log" >&2; fail=1; }
done

run_world "cn-$$-shm" shm
for r in 0 1 2; do
  if [ "${codes[$r]}" -eq 0 ]; then echo "FAIL: rank $r started with COHORT_TRANSPORT=shm across hosts" >&2; fail=1; fi
done
if ls /dev/shm | grep -q "^cohort-cn-$$-"; then echo "FAIL: segments left in /dev/shm" >&2; fail=1; fi
[ $fail = 0 ] && echo "coll_netns: ok"
exit $fail

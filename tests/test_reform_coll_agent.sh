#!/usr/bin/env bash
# libcohort workers (tests/reform_coll_worker.c) under the real
# `cohort run --on-failure reform` on one node: kill -9 of rank 1 mid-training;
# ranks 0 and 2 re-form in their own processes, a newcomer takes rank 1 and
# receives the state from rank 0, training goes on, and the job ends well.
# Prints the survivors' time from the kill to ERESHAPED and the re-form's.
# usage: test_reform_coll_agent.sh COHORT_BINARY WORKER_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
worker=$(readlink -f "$2")
src=$(readlink -f "$3")
tmp=$(mktemp -d /tmp/cohort-rfcoll-XXXXXX)
. "$src/tests/check_lib.sh"
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT

# wait_for FILE TEXT [COUNT [SECONDS]]: until FILE holds TEXT on COUNT lines (default 1).
wait_for() {
  local file=$1 text=$2 count=${3:-1} end=$((SECONDS + ${4:-60}))
  while [ $SECONDS -lt $end ]; do
    [ "$(grep -cF -- "$text" "$file" 2>/dev/null)" -ge "$count" ] && return 0
    sleep 0.1
  done
  echo "timed out waiting for $count x '$text' in $file"
  return 1
}
pid_of() { sed -n "s/.*\] start pid=\([0-9]*\) rank=$2 .*/\1/p" "$1" | tail -1; }

out="$tmp/out" done="$tmp/done"
for transport in tcp shm; do
  rm -f "$done"
  COHORT_TRANSPORT=$transport REFORM_DONE=$done "$cohort" run --nproc-per-node 3 \
    --on-failure reform --run-id "rfc$$$transport" -- "$worker" >"$out.$transport" 2>&1 &
  agent=$!
  o="$out.$transport"
  wait_for "$o" "] start pid=" 3
  p0=$(pid_of "$o" 0) p1=$(pid_of "$o" 1) p2=$(pid_of "$o" 2)
  sleep 1 # training
  t_kill=$(date +%s.%N)
  kill -9 "$p1"
  check "$transport: rank 0 re-formed in its own process" wait_for "$o" "formed pid=$p0 rank=0 world=3"
  check "$transport: rank 2 re-formed in its own process" wait_for "$o" "formed pid=$p2 rank=2 world=3"
  check "$transport: a newcomer takes rank 1" wait_for "$o" "rank=1 world=3 newcomer=1"
  check "$transport: the newcomer has the state" wait_for "$o" "rank=1 ok=1 new=1 bytes="
  check "$transport: the survivors still run" kill -0 "$p0" "$p2"
  sleep 1 # training in the new membership
  touch "$done"
  wait "$agent"
  code=$?
  check "$transport: the job ends well ($code)" [ "$code" = 0 ]
  check "$transport: no worker failed" not_contains "$o" "worker: "
  # From the kill: each survivor's ERESHAPED, re-form, and the newcomer's state.
  grep -E "\] (reshape|formed|state) pid=" "$o" | while read -r line; do
    at=${line##*at=}
    echo "$transport: $line  (+$(echo "$at - $t_kill" | bc -l | xargs printf '%.3f') s after the kill)"
  done
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

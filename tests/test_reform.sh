#!/usr/bin/env bash
# `cohort run --on-failure reform` (docs/reform.md) with a worker that speaks
# the control protocol itself (tests/reform_worker.py): on one node, a killed
# rank is replaced while the survivors keep their processes, and a worker
# that takes no part is restarted with one line; across real agents in
# network namespaces this test creates and removes, a killed node, a
# replacement node, fewer than MIN nodes left and the store's node lost.
# usage: test_reform.sh COHORT_BINARY SOURCE_DIR [local|nodes]
set -u
cohort=$(readlink -f "$1")
src=$(readlink -f "$2")
part=${3:-all}
worker="$src/tests/reform_worker.py"
tmp=$(mktemp -d /tmp/cohort-reform-XXXXXX)
chmod 755 "$tmp"
pids=()
. "$src/tests/check_lib.sh"
. "$src/tests/netns_lib.sh"

cleanup() {
  netns_down
  [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

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

# pid_of FILE RANK: the pid a worker printed at its start for that rank (the last one).
pid_of() { sed -n "s/.*\] start pid=\([0-9]*\) rank=$2 .*/\1/p" "$1" | tail -1; }

# The pids of FILE's formed lines, sorted, one line.
formed_pids() { sed -n 's/.*formed pid=\([0-9]*\) .*/\1/p' "$1" | sort -n | tr '\n' ' '; }

local_tests() {
  # 1. One node, three ranks: kill -9 of rank 1. Ranks 0 and 2 keep their
  # processes; a newcomer takes rank 1; the job then ends well.
  local out="$tmp/l1" done="$tmp/l1.done"
  REFORM_DONE=$done "$cohort" run --nproc-per-node 3 --on-failure reform -- "$worker" >"$out" 2>&1 &
  local agent=$!
  wait_for "$out" "] start pid=" 3
  local p0 p1 p2
  p0=$(pid_of "$out" 0) p1=$(pid_of "$out" 1) p2=$(pid_of "$out" 2)
  sleep 0.5 # the hellos are in
  kill -9 "$p1"
  check "local: the survivors re-form" wait_for "$out" "cohort: re-formed in"
  check "local: a newcomer takes rank 1" wait_for "$out" "rank=1 world=3 newcomer=1"
  check "local: rank 0 formed in its own process" contains "$out" "formed pid=$p0 rank=0 world=3"
  check "local: rank 2 formed in its own process" contains "$out" "formed pid=$p2 rank=2 world=3"
  check "local: the survivors are still running" kill -0 "$p0" "$p2"
  touch "$done"
  wait_all 30 $agent
  check "local: the job ends well ($codes)" [ "$codes" = "0" ]

  # 2. A worker that never says hello: stopped and restarted, with one line.
  out="$tmp/l2"
  "$cohort" run --nproc-per-node 2 --on-failure reform --max-restarts 1 -- "$worker" silent >"$out" 2>&1 &
  agent=$!
  wait_for "$out" "] start pid=" 2
  kill -9 "$(pid_of "$out" 0)"
  check "silent: one line says why" wait_for "$out" \
    "rank 1 does not take part in re-forms (no hello on COHORT_CONTROL_FD): restarting"
  check "silent: the group restarts" wait_for "$out" "restarting all workers (restart 1 of 1)"
  wait_for "$out" "] start pid=" 4
  kill -9 "$(pid_of "$out" 1)"
  wait_all 30 $agent
  check "silent: the job fails once the restarts are spent ($codes)" [ "$codes" = "1" ]
  check "silent: no re-form" not_contains "$out" "re-formed"
}

if [ "$part" = local ] || [ "$part" = all ]; then local_tests; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

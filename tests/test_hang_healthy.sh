#!/usr/bin/env bash
# `cohort run --hang-timeout 5` never stops a rank that trains silently,
# and still stops one that is stuck (issue 34, item 1). Healthy and silent
# (each longer than the timeout, no line from the rank, no change to the
# script):
#  1. gloo DDP, 2 ranks, only rank 0 printing every 5 steps (DDP's steps);
#  2. plain torch.distributed.all_reduce after 2 s of compute in one call
#     each time, no rank printing (completed collectives);
#  3. a Python loop moving between its functions, no torch, no output (the
#     main thread's stack moving).
# Stuck, with the same hook on: a rank in time.sleep and a rank spinning in
# `while True: pass`, both blamed with exit 5 at their line.
# usage: test_hang_healthy.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(cd "$2" && pwd)
. "$src/tests/check_lib.sh"
tmp=$(mktemp -d /tmp/cohort-hanghealthy-XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
export TMPDIR=$tmp
py=/usr/bin/python3 # Debian's, with torch
script=$src/tests/torch/ddp_silent.py
# torch's import is silent for seconds on a loaded machine: the start-up
# limit is generous, the limit under test is the one after the first line.
hang=(--hang-timeout 5 --hang-start-timeout 120)

run() { # NAME ARGS...: the agent's exit status in $tmp/NAME.rc, its output in $tmp/NAME.out
  local name=$1
  shift
  timeout 300 "$cohort" run "$@" >"$tmp/$name.out" 2>&1
  echo $? >"$tmp/$name.rc"
}
rc() { cat "$tmp/$1.rc"; }

SILENT_MODE=ddp SILENT_STEPS=40 run ddp --nproc-per-node 2 "${hang[@]}" -- "$py" "$script"
check "silent DDP rank 1: exit 0 (got $(rc ddp))" [ "$(rc ddp)" = 0 ]
check "silent DDP rank 1: no hang" not_contains "$tmp/ddp.out" "job hung"
check "silent DDP rank 1: both ranks done" contains "$tmp/ddp.out" "done 1"

SILENT_MODE=plain SILENT_STEPS=5 SILENT_COMPUTE=2 \
  run plain --nproc-per-node 2 "${hang[@]}" -- "$py" "$script"
check "silent all_reduce ranks: exit 0 (got $(rc plain))" [ "$(rc plain)" = 0 ]
check "silent all_reduce ranks: no hang" not_contains "$tmp/plain.out" "job hung"
check "silent all_reduce ranks: done" contains "$tmp/plain.out" "done 0"

cat >"$tmp/busy.py" <<'PY'
import time
def work(): return sum(range(20000))
def rest(): time.sleep(0.005)
print("start", flush=True)
end = time.monotonic() + 12
while time.monotonic() < end:
    work(); rest()
print("done", flush=True)
PY
run busy --nproc-per-node 1 "${hang[@]}" -- "$py" "$tmp/busy.py"
check "silent busy Python loop: exit 0 (got $(rc busy))" [ "$(rc busy)" = 0 ]
check "silent busy Python loop: done" contains "$tmp/busy.out" "done"

cat >"$tmp/stuck.py" <<'PY'
import sys, time
def work(): return sum(range(20000))
print("start", flush=True)
for _ in range(50): work()
if sys.argv[1] == "sleep":
    time.sleep(600)  # STUCK-SLEEP
else:
    while True: pass  # STUCK-SPIN  # noqa: E701
PY
for mode in sleep spin; do
  run "stuck-$mode" --nproc-per-node 1 "${hang[@]}" -- "$py" "$tmp/stuck.py" $mode
  line=$(grep -n "STUCK-$(echo $mode | tr a-z A-Z)" "$tmp/stuck.py" | cut -d: -f1)
  check "stuck in $mode: exit 5 (got $(rc stuck-$mode))" [ "$(rc stuck-$mode)" = 5 ]
  check "stuck in $mode: blamed at its line" contains "$tmp/stuck-$mode.out" "stuck.py:$line"
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] || { sed 's/^/  | /' "$tmp"/*.out | tail -40; exit 1; }

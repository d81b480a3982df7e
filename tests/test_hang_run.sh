#!/usr/bin/env bash
# `cohort run --hang-timeout` on one node, with real workers:
#  1. a PyTorch gloo DDP job (tests/torch/ddp_hang.py) whose rank 1 stops in
#     its data loader (sleeping, spinning in Python, blocked on a pipe),
#     --hang-timeout 10 (--hang-start-timeout 120: torch's import alone is
#     silent for seconds on a loaded machine):
#     exit status 5, the report blames rank 1 at the script's line, rank 0
#     waits in the all_reduce, the full stacks are in --log-dir;
#  2. not hangs: silent for longer than the timeout but beating the
#     heartbeat; a job that prints nothing and beats;
#  3. SIGQUIT dumps the stacks and the job goes on;
#  4. a heartbeat replaced by a directory: one line, no crash;
#  5. --max-restarts restarts a hung job;
#  6. two nodes x two ranks in network namespaces, rank 3 (node 1) stuck,
#     --hang-timeout 10 after a start-up of up to 120 s: whichever
#     node notices, every node exits 5 and prints the report blaming rank 3.
#  7. a C libcohort worker (tests/test_hang_worker.c): silent for longer than
#     the timeout but calling collectives (libcohort beats) runs to the end;
#     one rank skipping an allreduce to sleep is blamed, the others wait in
#     cohort_allreduce.
# usage: test_hang_run.sh COHORT_BINARY SOURCE_DIR WORKER_BINARY
set -u
cohort=$(readlink -f "$1")
src=$(cd "$2" && pwd)
worker=$(readlink -f "$3")
. "$src/tests/check_lib.sh"
tmp=$(mktemp -d /tmp/cohort-hangrun-XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
export TMPDIR=$tmp PYTHON_EXEC=/usr/bin/python3
line_of() { grep -n "$2" "$1" | head -1 | cut -d: -f1; }
script=$src/tests/torch/ddp_hang.py

# 1. A stuck rank in three ways.
for mode in sleep spin pipe; do
  mark=$(echo "HANG-$mode" | tr a-z A-Z)
  HANG_RANK=1 HANG_MODE=$mode timeout 120 "$cohort" run --nproc-per-node 2 --hang-timeout 10 --hang-start-timeout 120 \
    --log-dir "$tmp/logs-$mode" -t 3 "$script" >"$tmp/$mode.out" 2>"$tmp/$mode.err"
  code=$?
  check "$mode: exit status 5 (hung), got $code" [ "$code" = 5 ]
  check "$mode: the report blames rank 1" contains "$tmp/$mode.err" "job hung: rank 1 (node 0"
  check "$mode: ... at the script's line" \
    contains "$tmp/$mode.err" "ddp_hang.py:$(line_of "$script" "$mark")"
  check "$mode: rank 0 waits in the collective" grep -q "rank 0 waiting in" "$tmp/$mode.err"
  check "$mode: the full stacks are in the log dir" [ -s "$tmp/logs-$mode/attempt0/stacks/rank1.txt" ]
  check "$mode: the report names them" contains "$tmp/$mode.err" "$tmp/logs-$mode/attempt0/stacks"
done

# 2. Not hangs. Silent for 6 s under a 3 s timeout, beating every second.
beat='for i in 1 2 3 4 5 6; do echo $i > "$COHORT_HEARTBEAT"; sleep 1; done; echo done'
timeout 60 "$cohort" run --nproc-per-node 2 --hang-timeout 3 -- sh -c "echo start; $beat" \
  >"$tmp/beat.out" 2>&1
code=$?
check "beating ranks are not hung (got $code)" [ "$code" = 0 ]
check "... and finish" contains "$tmp/beat.out" "[r1] done"
timeout 60 "$cohort" run --hang-timeout 2 -- sh -c 'for i in 1 2 3 4; do : > "$COHORT_HEARTBEAT"; sleep 1; done' \
  >"$tmp/quiet.out" 2>&1
check "a rank that prints nothing but beats finishes (got $?)" [ "$?" = 0 ] || cat "$tmp/quiet.out"
timeout 60 "$cohort" run --hang-timeout 2 -- sh -c 'echo hi; sleep 30' >"$tmp/plain.out" 2>&1
code=$?
check "a silent shell rank is hung (got $code)" [ "$code" = 5 ]
check "... its wait shows in the report" contains "$tmp/plain.out" "job hung: rank 0"

# Start-up: silent 3 s before its first line under a 1 s timeout with a 6 s start limit.
timeout 60 "$cohort" run --hang-timeout 1 --hang-start-timeout 6 -- sh -c 'sleep 3; echo up' \
  >"$tmp/start.out" 2>&1
code=$?
check "start-up silence within --hang-start-timeout: exit 0 (got $code)" [ "$code" = 0 ]
timeout 60 "$cohort" run --hang-timeout 1 --hang-start-timeout 2 -- sh -c 'sleep 30' \
  >"$tmp/start2.out" 2>&1
code=$?
check "... beyond it: hung (got $code)" [ "$code" = 5 ]

# 3. SIGQUIT: a dump, and the job goes on.
timeout 60 "$cohort" run --nproc-per-node 2 --hang-timeout 30 -- sh -c 'sleep 3; echo finished' \
  >"$tmp/quit.out" 2>&1 &
agent=$!
sleep 1.5
kill -QUIT "$agent"
wait "$agent"
code=$?
check "SIGQUIT: the job goes on (got $code)" [ "$code" = 0 ]
check "SIGQUIT: the stacks were dumped" contains "$tmp/quit.out" "cohort: stacks of rank 1"
check "SIGQUIT: and the ranks finished" contains "$tmp/quit.out" "[r1] finished"

# 4. The heartbeat turned into a directory: one line, the job ends normally.
timeout 60 "$cohort" run --hang-timeout 5 -- sh -c \
  'rm -f "$COHORT_HEARTBEAT"; mkdir "$COHORT_HEARTBEAT"; sleep 2; echo end' >"$tmp/dir.out" 2>&1
code=$?
check "heartbeat made a directory: exit 0 (got $code)" [ "$code" = 0 ]
check "... said in one line" [ "$(grep -c 'cohort: rank 0: .*director' "$tmp/dir.out")" = 1 ]

# 5. A hung job restarts like a failed one.
timeout 60 "$cohort" run --hang-timeout 2 --max-restarts 1 -- sh -c \
  'echo "attempt $TORCHELASTIC_RESTART_COUNT"; [ "$TORCHELASTIC_RESTART_COUNT" = 1 ] || sleep 30' \
  >"$tmp/re.out" 2>&1
code=$?
check "a hung job is restarted and then ends 0 (got $code)" [ "$code" = 0 ]
check "... after one restart" contains "$tmp/re.out" "[r0] attempt 1"

# 7. libcohort: its collectives beat; a rank that skips one is blamed.
STEPS=30 STEP_MS=150 timeout 60 "$cohort" run --nproc-per-node 2 --hang-timeout 2 -- "$worker" \
  >"$tmp/lc.out" 2>&1
code=$?
check "libcohort: silent 4.5 s under a 2 s timeout, collectives beating: exit 0 (got $code)" \
  [ "$code" = 0 ]
check "libcohort: ... to the end" contains "$tmp/lc.out" "[r1] done"
HANG_RANK=1 timeout 60 "$cohort" run --nproc-per-node 2 --hang-timeout 3 -- "$worker" \
  >"$tmp/lch.out" 2>&1
code=$?
check "libcohort: a rank skipping an allreduce: exit 5 (got $code)" [ "$code" = 5 ]
check "libcohort: ... it is blamed" contains "$tmp/lch.out" "job hung: rank 1 (node 0"
check "libcohort: ... the other waits in cohort_allreduce" grep -q "rank 0 waiting in.*cohort_allreduce" "$tmp/lch.out"

# 6. Two nodes: whichever node notices, every node's stacks decide the blame.
. "$src/tests/netns_lib.sh"
netns_up 2 || {
  echo "cannot create network namespaces"
  exit 1
}
M=$(netns_addr 0)
pids=()
for stuck in 3; do
  for i in 0 1; do
    netns_bg "$i" "$tmp/mn$stuck-$i" env HANG_RANK=$stuck HANG_MODE=sleep COHORT_TOKEN=hangtok \
      "$cohort" run --nnodes 2 --node-rank "$i" --master "$M:2950$stuck" --nproc-per-node 2 \
      --hang-timeout 10 --hang-start-timeout 120 "$script"
    eval "n$i=\$!"
  done
  wait_all 120 "$n0" "$n1"
  node=$((stuck / 2))
  check "2 nodes, rank $stuck stuck: both exit 5 ($codes)" [ "$codes" = "5 5" ]
  for i in 0 1; do
    check "2 nodes, rank $stuck stuck: node $i blames it" \
      contains "$tmp/mn$stuck-$i" "job hung: rank $stuck (node $node"
    check "2 nodes, rank $stuck stuck: node $i shows its line" \
      contains "$tmp/mn$stuck-$i" "ddp_hang.py:$(line_of "$script" HANG-SLEEP)"
  done
  check "2 nodes, rank $stuck stuck: the others wait in the collective" \
    grep -q "ranks [0-9,-]* waiting in" "$tmp/mn$stuck-0"
done
netns_down

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

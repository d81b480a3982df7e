#!/usr/bin/env bash
# `cohort run --hang-timeout` with real workers:
#  1. a PyTorch gloo DDP job on two nodes x two ranks in network namespaces
#     (tests/torch/ddp_hang.py) whose one rank stops in its data loader in
#     three ways, each on another rank and node (sleeping: rank 3 on node 1;
#     spinning in Python: rank 1 on node 0; blocked on a pipe: rank 2 on
#     node 1), --hang-timeout 10 (--hang-start-timeout 120: torch's import
#     alone is silent for seconds on a loaded machine): whichever node
#     notices, both nodes exit 5 soon after the rank stops, and both print
#     the report blaming that rank and node at the script's line, the other
#     three ranks waiting in DDP's all_reduce; the full stacks are in each
#     node's --log-dir, and the report names them;
#  2. not hangs: computing 20 s between lines but beating every 2 s under a
#     5 s timeout; a job that prints nothing and beats; start-up silence
#     within --hang-start-timeout;
#  3. SIGQUIT dumps the stacks and the job goes on;
#  4. a progress file replaced by a directory, deleted after beating, or filled
#     with garbage: one line each, no crash, the job ends normally;
#  5. --max-restarts restarts a hung job;
#  6. a C libcohort worker (tests/test_hang_worker.c): silent for longer than
#     the timeout but calling collectives (libcohort beats) runs to the end;
#     one rank skipping an allreduce to sleep is blamed, the others wait in
#     cohort_allreduce.
# usage: test_hang_run.sh COHORT_BINARY SOURCE_DIR WORKER_BINARY
set -u
cohort=$(readlink -f "$1")
src=$(cd "$2" && pwd)
worker=$(readlink -f "$3")
. "$src/tests/check_lib.sh"
. "$src/tests/netns_lib.sh"
tmp=$(mktemp -d /tmp/cohort-hangrun-XXXXXX)
pids=()
trap 'netns_down; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
export TMPDIR=$tmp PYTHON_EXEC=/usr/bin/python3
line_of() { grep -n "$2" "$1" | head -1 | cut -d: -f1; }
script=$src/tests/torch/ddp_hang.py

# The seconds until FILE holds TEXT, waiting at most LIMIT s: -1 if never.
seconds_until() {
  local file=$1 text=$2 end=$((SECONDS + $3))
  while [ $SECONDS -lt $end ]; do
    contains "$file" "$text" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# 1. A stuck rank in three ways, on two nodes.
netns_up 2 || {
  echo "cannot create network namespaces"
  exit 1
}
M=$(netns_addr 0)
port=29510
for spec in sleep:3:0-2 spin:1:0,2-3 pipe:2:0-1,3; do
  IFS=: read -r mode stuck others <<<"$spec"
  node=$((stuck / 2)) port=$((port + 1))
  mark=$(echo "HANG-$mode" | tr a-z A-Z)
  for i in 0 1; do
    netns_bg "$i" "$tmp/$mode-$i" env HANG_RANK=$stuck HANG_MODE=$mode COHORT_TOKEN=hangtok \
      "$cohort" run --nnodes 2 --node-rank "$i" --master "$M:$port" --nproc-per-node 2 \
      --hang-timeout 10 --hang-start-timeout 120 --log-dir "$tmp/logs-$mode-$i" -t 3 "$script"
    eval "n$i=\$!"
  done
  seconds_until "$tmp/$mode-$node" hanging 240
  stuck_at=$SECONDS
  wait_all 120 "$n0" "$n1"
  took=$((SECONDS - stuck_at))
  check "$mode: both nodes exit 5, hung ($codes)" [ "$codes" = "5 5" ]
  # 10 s of silence, up to 15 s of stacks, the nodes' verdicts gathered: well under 60 s.
  check "$mode: both nodes ended ${took} s after rank $stuck stopped" [ "$took" -le 60 ]
  for i in 0 1; do
    check "$mode: node $i blames rank $stuck on node $node" \
      contains "$tmp/$mode-$i" "job hung: rank $stuck (node $node"
    check "$mode: node $i shows its line" \
      contains "$tmp/$mode-$i" "ddp_hang.py:$(line_of "$script" "$mark")"
    check "$mode: node $i: ranks $others wait in all_reduce" \
      grep -q "cohort: ranks $others waiting in .*all_reduce" "$tmp/$mode-$i"
    check "$mode: node $i names its full stacks" \
      contains "$tmp/$mode-$i" "full stacks: $tmp/logs-$mode-$i/attempt0/stacks"
    check "$mode: node $i wrote its ranks' stacks" \
      [ -s "$tmp/logs-$mode-$i/attempt0/stacks/rank$((2 * i)).txt" ]
  done
  check "$mode: the stuck rank's full stack holds its line" \
    grep -q "ddp_hang.py.*$(line_of "$script" "$mark")" "$tmp/logs-$mode-$node/attempt0/stacks/rank$stuck.txt"
done
netns_down

# 2. Not hangs. Computing 20 s between two lines under a 5 s timeout, beating every 2 s.
beat='for i in $(seq 1 10); do echo $i > "$COHORT_PROGRESS"; sleep 2; done; echo done'
timeout 90 "$cohort" run --nproc-per-node 2 --hang-timeout 5 -- sh -c "echo start; $beat" \
  >"$tmp/beat.out" 2>&1
code=$?
check "beating ranks are not hung (got $code)" [ "$code" = 0 ]
check "... and finish" contains "$tmp/beat.out" "[r1] done"
# (through COHORT_HEARTBEAT, the progress file's earlier name, which stays)
timeout 60 "$cohort" run --hang-timeout 2 -- sh -c 'for i in 1 2 3 4; do : > "$COHORT_HEARTBEAT"; sleep 1; done' \
  >"$tmp/quiet.out" 2>&1
check "a rank that prints nothing but beats COHORT_HEARTBEAT finishes (got $?)" [ "$?" = 0 ] || cat "$tmp/quiet.out"
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

# 3. SIGQUIT: a dump, and the job goes on. The signal goes once both ranks
# run (the agent handles signals before it starts them).
timeout 60 "$cohort" run --nproc-per-node 2 --hang-timeout 30 -- sh -c 'echo up; sleep 5; echo finished' \
  >"$tmp/quit.out" 2>&1 &
agent=$!
seconds_until "$tmp/quit.out" "[r0] up" 50 && seconds_until "$tmp/quit.out" "[r1] up" 50
kill -QUIT "$agent"
wait "$agent"
code=$?
check "SIGQUIT: the job goes on (got $code)" [ "$code" = 0 ]
check "SIGQUIT: the stacks were dumped" contains "$tmp/quit.out" "cohort: stacks of rank 1"
check "SIGQUIT: and the ranks finished" contains "$tmp/quit.out" "[r1] finished"

# 4. The progress file turned into a directory: one line, the job ends normally.
timeout 60 "$cohort" run --hang-timeout 5 -- sh -c \
  'rm -f "$COHORT_PROGRESS"; mkdir "$COHORT_PROGRESS"; sleep 2; echo end' >"$tmp/dir.out" 2>&1
code=$?
check "progress file made a directory: exit 0 (got $code)" [ "$code" = 0 ]
check "... said in one line" [ "$(grep -c 'cohort: rank 0: .*director' "$tmp/dir.out")" = 1 ]
# Deleted after a beat, the rank goes on printing: its lines count again.
timeout 60 "$cohort" run --hang-timeout 2 -- sh -c \
  'echo 1 >"$COHORT_PROGRESS"; sleep 0.5; rm "$COHORT_PROGRESS"; for i in 1 2 3 4 5; do echo "line $i"; sleep 1; done' \
  >"$tmp/gone.out" 2>&1
code=$?
check "progress file deleted after a beat: exit 0 (got $code)" [ "$code" = 0 ]
check "... said in one line" [ "$(grep -c 'cohort: rank 0: progress file .* was deleted' "$tmp/gone.out")" = 1 ]
# Garbage written as beats: still beats, said once.
timeout 60 "$cohort" run --hang-timeout 2 -- sh -c \
  'for i in 1 2 3 4 5; do head -c 64 /dev/urandom >"$COHORT_PROGRESS"; sleep 1; done' \
  >"$tmp/junk.out" 2>&1
code=$?
check "progress file filled with garbage: exit 0 (got $code)" [ "$code" = 0 ]
check "... said in one line" [ "$(grep -c 'cohort: rank 0: progress file .* holds no step number' "$tmp/junk.out")" = 1 ]

# 5. A hung job restarts like a failed one.
timeout 60 "$cohort" run --hang-timeout 2 --max-restarts 1 -- sh -c \
  'echo "attempt $TORCHELASTIC_RESTART_COUNT"; [ "$TORCHELASTIC_RESTART_COUNT" = 1 ] || sleep 30' \
  >"$tmp/re.out" 2>&1
code=$?
check "a hung job is restarted and then ends 0 (got $code)" [ "$code" = 0 ]
check "... after one restart" contains "$tmp/re.out" "[r0] attempt 1"

# 6. libcohort: its collectives beat; a rank that skips one is blamed.
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


echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

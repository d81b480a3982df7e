#!/usr/bin/env bash
# `cohort run --on-failure reform` (docs/reform.md) with a worker that speaks
# the control protocol itself (tests/reform_worker.py): on one node, a killed
# rank is replaced while the survivors keep their processes, and a worker
# that takes no part is restarted with one line; across real agents in
# network namespaces this test creates and removes, a killed node, a
# replacement node, fewer than MIN nodes left and the store's node lost.
# usage: test_reform.sh COHORT_BINARY SOURCE_DIR [local|nodes|agent|relay|etcd|torch|coll WORKER]
# (agent: the kill of an agent alone, which nodes runs too)
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
  if [ -n "${KEEP:-}" ]; then echo "KEEP: the files are in $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

# wait_for FILE TEXT [COUNT [SECONDS]]: until FILE holds TEXT on COUNT lines (default 1).
wait_for() {
  local file=$1 text=$2 count=${3:-1} end=$((SECONDS + ${4:-60}))
  while [ $SECONDS -lt $end ]; do
    local n
    n=$(grep -cF -- "$text" "$file" 2>/dev/null)
    [ "${n:-0}" -ge "$count" ] && return 0
    sleep 0.1
  done
  echo "timed out waiting for $count x '$text' in $file; its agent's last lines:"
  grep "cohort:" "$file" 2>/dev/null | tail -8 | sed 's/^/  | /'
  return 1
}

# agents_said FILE...: the last lines of each agent (for a failed check: the files are removed).
agents_said() {
  local f
  for f in "$@"; do
    echo "$f, its agent's last lines:"
    grep "cohort:" "$f" 2>/dev/null | tail -6 | sed 's/^/  | /'
  done
}

# wait_re FILE REGEX [SECONDS]: until a line of FILE matches (10 s unless told).
wait_re() {
  local end=$((SECONDS + ${3:-10}))
  while [ $SECONDS -lt $end ]; do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# wait_re_n FILE REGEX COUNT SECONDS: until COUNT lines of FILE match.
wait_re_n() {
  local end=$((SECONDS + $4)) n
  while [ $SECONDS -lt $end ]; do
    n=$(grep -c -- "$2" "$1" 2>/dev/null)
    [ "${n:-0}" -ge "$3" ] && return 0
    sleep 0.1
  done
  echo "timed out waiting for $3 x /$2/ in $1; its agent's last lines:"
  grep "cohort:" "$1" 2>/dev/null | tail -8 | sed 's/^/  | /'
  return 1
}

# pid_of FILE RANK: the pid a worker printed at its start for that rank (the last one).
pid_of() { sed -n "s/.*\] start pid=\([0-9]*\) rank=$2 .*/\1/p" "$1" | tail -1; }

# first_pid FILE: the pid of the first worker FILE's agent started.
first_pid() { sed -n 's/.*\] start pid=\([0-9]*\) .*/\1/p' "$1" | head -1; }

# The pids of FILE's formed lines, sorted, one line.
formed_pids() { sed -n 's/.*formed pid=\([0-9]*\) .*/\1/p' "$1" | sort -n | tr '\n' ' '; }

local_tests() {
  # 0. The option's spellings (issue 28: torchrun-style, and PET_ON_FAILURE as for the others):
  # under reform each worker gets its control channel; a bad value is one line and status 2.
  local has_fd='test -n "$COHORT_CONTROL_FD"' how
  for how in "--on-failure reform" "--on_failure=reform" "PET_ON_FAILURE=reform"; do
    if [ "${how%%=*}" = PET_ON_FAILURE ]; then
      PET_ON_FAILURE=reform "$cohort" run -- sh -c "$has_fd" >/dev/null 2>&1
    else
      # shellcheck disable=SC2086 # the option and its value as two words, or one
      "$cohort" run $how -- sh -c "$has_fd" >/dev/null 2>&1
    fi
    check "option: $how gives the workers a control channel ($?)" [ $? = 0 ]
  done
  "$cohort" run -- sh -c "$has_fd" >/dev/null 2>&1
  check "option: restart (the default) gives none ($?)" [ $? = 1 ]
  PET_ON_FAILURE=restart "$cohort" run --on-failure reform -- sh -c "$has_fd" >/dev/null 2>&1
  check "option: the flag wins over PET_ON_FAILURE ($?)" [ $? = 0 ]
  PET_ON_FAILURE=bogus "$cohort" run -- true >"$tmp/l0" 2>&1
  check "option: a bad PET_ON_FAILURE is a usage error ($?)" [ $? = 2 ]
  check "option: ... in one line naming the variable" grep -qx \
    "cohort run: --on-failure (from PET_ON_FAILURE) takes restart or reform, not 'bogus'; see 'cohort run --help'" "$tmp/l0"

  # 1. One node, three ranks: kill -9 of rank 1. Ranks 0 and 2 keep their
  # processes; a newcomer takes rank 1; the job then ends well.
  local out="$tmp/l1" done="$tmp/l1.done"
  local job="rfl$$"
  REFORM_DONE=$done "$cohort" run --nproc-per-node 3 --on-failure reform --run-id "$job" \
    --metrics-file "$tmp/l1.prom" -- "$worker" >"$out" 2>&1 &
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
  # cohort status and the metrics show it (the snapshot and the file: once a second).
  check "local: the metrics count one" wait_re "$tmp/l1.prom" '^cohort_reforms_total{job_id="'"$job"'",node="0",.*} 1$'
  check "local: the metrics give its members" grep -q '^cohort_reform_last_nodes_after{.*} 1$' "$tmp/l1.prom"
  sleep 1.5
  "$cohort" status --job "$job" >"$tmp/l1.st" 2>&1
  "$cohort" status --job "$job" --json >"$tmp/l1.json" 2>&1
  check "local: cohort status shows the re-form" contains "$tmp/l1.st" \
    "re-forms 1, the last: round 1, nodes 1 -> 1, world 3 -> 3,"
  check "local: cohort status --json has it" python3 -c '
import json, sys
n = json.load(open(sys.argv[1]))["nodes"][0]
r = n["last_reform"]
assert n["reforms"] == 1 and r["world_before"] == 3 and r["world_after"] == 3, n
assert r["duration_ms"] is not None and r["duration_ms"] >= 0, r' "$tmp/l1.json"
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

  # 2b. The same without --max-restarts: the one line says the job fails, not "restarting".
  out="$tmp/l2b"
  "$cohort" run --nproc-per-node 2 --on-failure reform -- "$worker" silent >"$out" 2>&1 &
  agent=$!
  wait_for "$out" "] start pid=" 2
  kill -9 "$(pid_of "$out" 0)"
  wait_all 30 $agent
  check "silent, no restart left: the job fails ($codes)" [ "$codes" = "1" ]
  check "silent, no restart left: one line says the job fails" contains "$out" \
    "rank 1 does not take part in re-forms (no hello on COHORT_CONTROL_FD): the job fails together (no restart left: --max-restarts)"
  check "silent, no restart left: no line promises a restart" not_contains "$out" "restarting"

  # 2c. Across nodes (two agents on loopback): node 1's worker killed while node 0's says no
  # hello. Node 0 cannot re-form and says why; its record in the re-form round tells node 1,
  # which says another node cannot; both stop (no restart left) with the same root cause.
  local mport two=() k
  mport=$(free_port)
  for k in 0 1; do
    "$cohort" run --nnodes 2 --master "127.0.0.1:$mport" --node-rank "$k" --on-failure reform \
      --run-id "rfs$$" -- "$worker" silent >"$tmp/l2c.$k" 2>&1 &
    two+=($!)
  done
  wait_for "$tmp/l2c.1" "] start pid=" 1
  wait_for "$tmp/l2c.0" "] start pid=" 1
  kill -9 "$(first_pid "$tmp/l2c.1")"
  wait_all 30 "${two[@]}"
  check "silent, two nodes: both fail ($codes)" [ "$codes" = "1 1" ]
  check "silent, two nodes: node 0 says which rank takes no part" contains "$tmp/l2c.0" \
    "rank 0 does not take part in re-forms (no hello on COHORT_CONTROL_FD): the job fails together"
  check "silent, two nodes: node 1 says another node cannot re-form" contains "$tmp/l2c.1" \
    "another node cannot re-form (its agent says why): the job fails together"
  check "silent, two nodes: node 1 names its lost rank as the root cause" grep -q \
    "job failed: node 1 (.*): rank 1 (local rank 0, pid [0-9]*) was killed by SIGKILL" "$tmp/l2c.1"

  # 3. The PyTorch module is on the workers' path without progress files too
  # (--straggler-factor 0 and no --hang-timeout): its hooks' directory comes with re-forms.
  "$cohort" run --on-failure reform --straggler-factor 0 -- /usr/bin/python3 -c \
    'import importlib.util as u, sys; sys.exit(u.find_spec("cohort_reform") is None)' >"$tmp/l3" 2>&1
  check "module: cohort_reform importable with --straggler-factor 0 ($?)" [ $? = 0 ]

  # 4. A re-form longer than --hang-timeout is no hang: rank 0 beats its progress file each
  # step but not while it re-forms, and answers `formed` 5 s after `form` (a slow bootstrap).
  out="$tmp/l4" done="$tmp/l4.done"
  REFORM_DONE=$done REFORM_BEAT=1 REFORM_FORM_DELAY=5 "$cohort" run --nproc-per-node 2 \
    --on-failure reform --hang-timeout 2 -- "$worker" >"$out" 2>&1 &
  agent=$!
  wait_for "$out" "] start pid=" 2
  sleep 1
  p0=$(pid_of "$out" 0)
  kill -9 "$(pid_of "$out" 1)"
  check "slow re-form: it completes" wait_for "$out" "cohort: re-formed in" 1 60
  check "slow re-form: rank 0 formed in its own process" contains "$out" "formed pid=$p0 rank=0"
  sleep 1
  touch "$done"
  wait_all 30 $agent
  check "slow re-form: the job ends well ($codes)" [ "$codes" = "0" ]
  check "slow re-form: no hang reported" not_contains "$out" "job hung"

  # 5. A second loss while the first one's replacement is still starting (no hello yet, as
  # during PyTorch's import): rank 1 killed, its newcomer holds its hello back until the test
  # says; rank 2 killed meanwhile. The newcomer is no worker that "takes no part": the job
  # re-forms again without a restart, and the newcomer gets the next membership once it says
  # hello; rank 0 keeps its process throughout.
  out="$tmp/l5" done="$tmp/l5.done"
  local gate="$tmp/l5.hello"
  REFORM_DONE=$done REFORM_HELLO_AFTER=$gate "$cohort" run --nproc-per-node 3 \
    --on-failure reform -- "$worker" >"$out" 2>&1 &
  agent=$!
  wait_for "$out" "] start pid=" 3
  sleep 0.5 # the hellos are in
  p0=$(pid_of "$out" 0)
  kill -9 "$(pid_of "$out" 1)"
  check "early loss: a newcomer takes rank 1" wait_for "$out" "rank=1 world=3 newcomer=1"
  check "early loss: the first re-form completes" wait_for "$out" "cohort: re-formed in"
  p1=$(pid_of "$out" 1)
  kill -9 "$(pid_of "$out" 2)"
  check "early loss: the second loss re-forms too" \
    wait_for "$out" "cohort: re-forming without stopping the survivors" 2 30
  touch "$gate"
  check "early loss: the newcomer said hello after it" wait_for "$out" "hello pid=$p1"
  check "early loss: the second re-form completes" wait_for "$out" "cohort: re-formed in" 2 60
  check "early loss: rank 0 formed twice in its own process" \
    [ "$(grep -c "formed pid=$p0 rank=0 world=3" "$out")" = 2 ]
  check "early loss: the newcomer got the next membership" contains "$out" \
    "formed pid=$p1 rank=1 world=3"
  check "early loss: the survivors are still running" kill -0 "$p0" "$p1"
  touch "$done"
  wait_all 30 $agent
  check "early loss: the job ends well ($codes)" [ "$codes" = "0" ]
  check "early loss: nobody was restarted" not_contains "$out" "restarting"

  # 6. A loss while a worker of the first start is still starting (no hello yet, as during
  # PyTorch's import) while its siblings said theirs: rank 1 killed, rank 2 says hello only
  # once the test says. Rank 2 takes part (its program speaks): no restart; it reads the queued
  # `reshape` and `form` once it speaks, and rank 0 and rank 2 keep their processes.
  out="$tmp/l6" done="$tmp/l6.done" gate="$tmp/l6.hello"
  REFORM_DONE=$done REFORM_HELLO_AFTER=$gate REFORM_HELLO_RANK=2 "$cohort" run \
    --nproc-per-node 3 --on-failure reform -- "$worker" >"$out" 2>&1 &
  agent=$!
  wait_for "$out" "] start pid=" 3
  sleep 0.5 # ranks 0 and 1 said hello
  p0=$(pid_of "$out" 0) p2=$(pid_of "$out" 2)
  kill -9 "$(pid_of "$out" 1)"
  check "slow start: the survivors re-form" \
    wait_for "$out" "cohort: re-forming without stopping the survivors"
  check "slow start: a newcomer takes rank 1" wait_for "$out" "rank=1 world=3 newcomer=1"
  touch "$gate"
  check "slow start: rank 2 said hello" wait_for "$out" "hello pid=$p2"
  check "slow start: the re-form completes" wait_for "$out" "cohort: re-formed in" 1 60
  check "slow start: rank 0 formed in its own process" contains "$out" "formed pid=$p0 rank=0"
  check "slow start: rank 2 formed in its own process" contains "$out" "formed pid=$p2 rank=2"
  touch "$done"
  wait_all 30 $agent
  check "slow start: the job ends well ($codes)" [ "$codes" = "0" ]
  check "slow start: nobody was restarted" not_contains "$out" "restarting"

  # 7. A node whose only worker is lost: no worker here said its step, so the steps lost are
  # unknown: the agent's line says "?", as cohort status does (it said -1).
  out="$tmp/l7" done="$tmp/l7.done"
  REFORM_DONE=$done "$cohort" run --on-failure reform -- "$worker" >"$out" 2>&1 &
  agent=$!
  wait_for "$out" "] start pid=" 1
  sleep 0.5
  kill -9 "$(pid_of "$out" 0)"
  check "alone: the newcomer re-forms" wait_for "$out" "cohort: re-formed in"
  check "alone: the steps lost are unknown" contains "$out" "world 1 -> 1, steps lost ?"
  touch "$done"
  wait_all 30 $agent
  check "alone: the job ends well ($codes)" [ "$codes" = "0" ]

  # 8. A re-form that does not finish within --reform-timeout: the survivors answer `formed` 5 s
  # late, the limit is 2 s. The job fails together, the report naming the limit and the loss.
  out="$tmp/l8" done="$tmp/l8.done"
  REFORM_DONE=$done REFORM_FORM_DELAY=5 "$cohort" run --nproc-per-node 2 --on-failure reform \
    --reform-timeout 2 -- "$worker" >"$out" 2>&1 &
  agent=$!
  wait_for "$out" "] start pid=" 2
  sleep 0.5
  p1=$(pid_of "$out" 1)
  kill -9 "$p1"
  wait_all 30 $agent
  touch "$done"
  check "re-form deadline: the job fails ($codes)" [ "$codes" = "1" ]
  check "re-form deadline: the report names the limit and the loss" grep -q \
    "the re-form did not finish within 2 s (--reform-timeout); losses in order: 1) rank 1 (local rank 1, pid $p1) was killed by SIGKILL" "$out"
  check "re-form deadline: no re-form completed" not_contains "$out" "re-formed in"

  # 9. A rank slot lost again and again: the third loss of local rank 1 ends the re-forms, and
  # (no restart left) the job fails, its report naming each loss in order.
  out="$tmp/l9" done="$tmp/l9.done"
  REFORM_DONE=$done "$cohort" run --nproc-per-node 2 --on-failure reform -- "$worker" >"$out" 2>&1 &
  agent=$!
  wait_for "$out" "] start pid=" 2
  for k in 1 2 3; do
    sleep 0.5
    kill -9 "$(pid_of "$out" 1)"
    [ "$k" = 3 ] || wait_for "$out" "cohort: re-formed in" "$k" 30
  done
  wait_all 30 $agent
  touch "$done"
  check "lost again: the job fails ($codes)" [ "$codes" = "1" ]
  check "lost again: one line says why" contains "$out" \
    "local rank 1 was lost 3 times: the job fails together (no restart left: --max-restarts)"
  check "lost again: two re-forms before" [ "$(grep -c "cohort: re-formed in" "$out")" = 2 ]
  check "lost again: the report names the three losses in order" grep -q \
    "losses in order: 1) rank 1 (local rank 1, pid [0-9]*) was killed by SIGKILL (signal 9); 2) rank 1 .*; 3) rank 1 " "$out"

  # 10. Several agents on one machine (docs/reform.md, "Try it on one machine"): an agent given
  # --master on this machine and no --node-rank takes itself for node 0; when the port is taken
  # (node 0's agent is there already) it says how the others join.
  out="$tmp/l10"
  /usr/bin/python3 -c '
import socket, subprocess, sys
s = socket.socket()
s.bind(("0.0.0.0", 0))
s.listen()
port = s.getsockname()[1]
r = subprocess.run([sys.argv[1], "run", "--nnodes", "2", "--master", "127.0.0.1:%d" % port,
                    "--join-timeout", "5", "--", "true"], stderr=subprocess.PIPE, text=True)
sys.stdout.write(r.stderr)' "$cohort" >"$out" 2>&1
  check "one machine: the port is taken" contains "$out" "cannot host the rendezvous store on port"
  check "one machine: the line says how the other agents join" contains "$out" \
    "give the other agents --node-rank 1, 2, ... and they join it"
}

if [ "$part" = local ] || [ "$part" = all ]; then local_tests; fi

# ---- several nodes: real agents in network namespaces ----

HB=2 # --heartbeat-timeout, seconds
# agents N FIRST JOB MINMAX EXTRA...: starts agents on nodes FIRST..N-1 (node 0 hosts the store),
# outputs in $tmp/JOB.<node>; their PIDs in agent[node].
agent=()
agents() {
  local n=$1 first=$2 job=$3 nn=$4 i
  shift 4
  for ((i = first; i < n; i++)); do
    local rank=()
    [ "$i" -eq 0 ] && rank=(--node-rank 0)
    REFORM_DONE="$tmp/$job.done" netns_agent "$i" "$tmp/$job.$i" --nnodes "$nn" "${rank[@]}" \
      --master "$M:29500" --job "$job" --heartbeat-timeout $HB --on-failure reform "$@" -- "$worker"
    agent[$i]=$!
  done
}

# started JOB N: every node's worker of job JOB (nodes 0..N-1) has started.
started() {
  local i
  for ((i = 0; i < $2; i++)); do wait_for "$tmp/$1.$i" "] start pid=" || return 1; done
}

# kill_node I: kill -9 of everything in node I's namespace (its agent and workers), now.
kill_node() {
  local p
  for p in $(ip netns pids "$(netns_node "$1")"); do kill -9 "$p" 2>/dev/null; done
}

# since FILE T0: seconds from T0 (date +%s.%N) to the first "formed ... at=" line of FILE.
since() {
  local at
  at=$(sed -n 's/.*formed pid=.* at=\([0-9.]*\).*/\1/p' "$1" | head -1)
  [ -n "$at" ] && python3 -c "print('%.2f' % ($at - $2))"
}

# unchanged FILE: every pid of FILE's formed lines is one its workers started with.
unchanged() {
  local p
  for p in $(formed_pids "$1"); do grep -q "\] start pid=$p " "$1" || return 1; done
  [ -n "$(formed_pids "$1")" ]
}

# exit_gap A B: once both PIDs (children) ended, 60 s at most, the seconds from B's end to A's.
exit_gap() {
  local ta="" tb="" end=$((SECONDS + 60))
  while [ $SECONDS -lt $end ] && { [ -z "$ta" ] || [ -z "$tb" ]; }; do
    [ -z "$ta" ] && ! kill -0 "$1" 2>/dev/null && ta=$(date +%s.%N)
    [ -z "$tb" ] && ! kill -0 "$2" 2>/dev/null && tb=$(date +%s.%N)
    sleep 0.02
  done
  python3 -c "print('%.2f' % (${ta:-1e9} - ${tb:-0}))"
}

node_tests() {
  netns_up 4 || { echo "cannot create network namespaces"; exit 1; }
  M=$(netns_addr 0)

  # 1. kill -9 of a whole node (agent and worker): the survivors re-form without
  # it after the heartbeat timeout, in their own processes; a replacement node
  # started with the same command line joins the running job.
  agents 3 0 k 2:3
  started k 3 || return
  sleep 1
  local t0
  t0=$(date +%s.%N)
  kill_node 2
  check "node lost: node 0 re-forms" wait_for "$tmp/k.0" "re-formed in" 1 30
  check "node lost: node 1 re-forms" wait_for "$tmp/k.1" "re-formed in" 1 30
  echo "measured: kill -9 of a node -> survivors' formed: node 0 $(since "$tmp/k.0" "$t0") s, node 1 $(since "$tmp/k.1" "$t0") s (--heartbeat-timeout $HB)"
  check "node lost: world 3 -> 2" contains "$tmp/k.1" "formed pid=$(first_pid "$tmp/k.1") rank=1 world=2"
  check "node lost: node 0's worker kept its process" unchanged "$tmp/k.0"
  check "node lost: node 1's worker kept its process" unchanged "$tmp/k.1"
  agents 3 2 k 2:3
  check "replacement: the survivors re-form with it" wait_for "$tmp/k.0" "re-formed in" 2 60
  check "replacement: its worker is a newcomer, rank 2" wait_for "$tmp/k.2" "rank=2 world=3 newcomer=1"
  check "replacement: node 1 formed again in the same process" \
    [ "$(grep -c "formed pid=$(first_pid "$tmp/k.1") rank=1 world=3" "$tmp/k.1")" = 1 ]
  check "replacement: survivors kept their processes" unchanged "$tmp/k.0"
  touch "$tmp/k.done"
  wait_all 30 "${agent[0]}" "${agent[1]}" "${agent[2]}"
  check "replacement: the job ends well ($codes)" [ "$codes" = "0 0 0" ]

  # 2. kill -9 of a worker on node 1: a newcomer takes its place, nobody else restarts.
  agents 2 0 w 2
  started w 2 || return
  sleep 1
  kill -9 "$(first_pid "$tmp/w.1")"
  check "worker lost: both nodes re-form" wait_for "$tmp/w.0" "re-formed in" 1 30
  check "worker lost: a newcomer takes rank 1" wait_for "$tmp/w.1" "rank=1 world=2 newcomer=1"
  check "worker lost: node 0's worker kept its process" unchanged "$tmp/w.0"
  touch "$tmp/w.done"
  wait_all 30 "${agent[0]}" "${agent[1]}"
  check "worker lost: the job ends well ($codes)" [ "$codes" = "0 0" ]

  # 3. Two losses a second apart: 4 nodes, MIN 2; nodes 3 and 2 killed 1 s apart.
  agents 4 0 t 2:4
  started t 4 || return
  sleep 1
  kill_node 3
  sleep 1
  kill_node 2
  check "two losses: the survivors re-form" wait_for "$tmp/t.1" "world=2 at=" 1 60
  check "two losses: node 0's worker kept its process" unchanged "$tmp/t.0"
  check "two losses: node 1's worker kept its process" unchanged "$tmp/t.1"
  touch "$tmp/t.done"
  wait_all 30 "${agent[0]}" "${agent[1]}"
  check "two losses: the job ends well ($codes)" [ "$codes" = "0 0" ]

  # 4. Fewer than MIN left: the job fails together, the report names the loss.
  agents 3 0 f 3
  started f 3 || return
  sleep 1
  kill_node 2
  # Node 0 keeps the store until node 1 has left; node 2, named lost, leaves no exit key to
  # wait for (it waited 3 s for it): node 0 ends soon after node 1 (tens of ms measured).
  local gap
  gap=$(exit_gap "${agent[0]}" "${agent[1]}")
  echo "measured: node 1's exit -> node 0's: $gap s"
  check "fewer than MIN: node 0 waits for no lost node ($gap s)" \
    python3 -c "import sys; sys.exit(not $gap < 1.5)"
  wait_all 60 "${agent[0]}" "${agent[1]}"
  check "fewer than MIN: both fail ($codes)" [ "$codes" = "1 1" ]
  # --nnodes 3 (no MIN:MAX, as a newcomer may give it): the report says how to go on with fewer.
  check "fewer than MIN: the report says why" grep -q \
    "fewer than MIN nodes left (2 of 3: --nnodes 3 keeps no fewer; --nnodes MIN:3 lets the job go on with MIN); losses in order: 1) node [0-9] (node2)" "$tmp/f.0"
  check "fewer than MIN: no re-form" not_contains "$tmp/f.1" "re-formed"

  # 4b. The same with --nnodes 2:3, one node of two lost: the elastic range's words.
  agents 2 0 g 2:3
  started g 2 || return
  sleep 1
  kill_node 1
  wait_all 60 "${agent[0]}"
  check "fewer than MIN, elastic: node 0 fails ($codes)" [ "$codes" = "1" ]
  check "fewer than MIN, elastic: the report says why" grep -q \
    "fewer than MIN nodes left (1 of at least 2); losses in order: 1) node 1 (node1)" "$tmp/g.0"

  # 5. The store's node lost (built-in store): the others fail together and say why.
  agents 2 0 s 1:2
  started s 2 || return
  sleep 1
  kill_node 0
  wait_all 60 "${agent[1]}"
  check "store lost: node 1 fails ($codes)" [ "$codes" = "1" ]
  check "store lost: the report says a re-form needs it" contains "$tmp/s.1" \
    "a re-form needs the store's node"

  # 6. A node stopped (SIGSTOP, agent and worker): lost after the heartbeat timeout.
  agents 3 0 p 2:3
  started p 3 || return
  sleep 1
  local p
  for p in $(ip netns pids "$(netns_node 2)"); do kill -STOP "$p"; done
  check "stopped node: the survivors re-form" wait_for "$tmp/p.1" "world=2 at=" 1 30
  check "stopped node: the survivors kept their processes" unchanged "$tmp/p.0"
  kill_node 2
  touch "$tmp/p.done"
  wait_all 30 "${agent[0]}" "${agent[1]}"
  check "stopped node: the job ends well ($codes)" [ "$codes" = "0 0" ]

  # 7. A partition (built-in store): node 2 cut off. The side with the store
  # goes on; node 2 loses the store and stops with a clear report.
  agents 3 0 q 2:3
  started q 3 || return
  sleep 1
  netns_link 2 down
  check "partition: the majority re-forms" wait_for "$tmp/q.1" "world=2 at=" 1 30
  wait_all 60 "${agent[2]}"
  check "partition: the minority stops ($codes)" [ "$codes" = "1" ]
  check "partition: the minority says it lost the store" contains "$tmp/q.2" \
    "which holds the rendezvous store, is lost"
  check "partition: the majority kept its processes" unchanged "$tmp/q.0"
  netns_link 2 up
  touch "$tmp/q.done"
  wait_all 30 "${agent[0]}" "${agent[1]}"
  check "partition: the majority ends well ($codes)" [ "$codes" = "0 0" ]

  # 8a. A loss while another node's worker of the first start has not said hello yet (slow to
  # start): node 0's worker said hello, so the job's program speaks (the store's ahead keys);
  # node 2's worker takes part: it forms in its own process once it speaks, no restart.
  agents 2 0 h 2:3
  REFORM_DONE="$tmp/h.done" REFORM_HELLO_AFTER="$tmp/h.hello" REFORM_HELLO_RANK=any \
    netns_agent 2 "$tmp/h.2" --nnodes 2:3 --master "$M:29500" --job h --heartbeat-timeout $HB \
    --on-failure reform -- "$worker"
  agent[2]=$!
  started h 3 || return
  sleep 1
  kill_node 1
  check "slow start, nodes: node 0 re-forms without stopping" \
    wait_for "$tmp/h.0" "re-forming without stopping the survivors" 1 30
  touch "$tmp/h.hello"
  check "slow start, nodes: node 2's worker formed in its own process" \
    wait_for "$tmp/h.2" "formed pid=$(first_pid "$tmp/h.2") rank=" 1 30
  touch "$tmp/h.done"
  wait_all 30 "${agent[0]}" "${agent[2]}"
  check "slow start, nodes: the job ends well ($codes)" [ "$codes" = "0 0" ]
  check "slow start, nodes: nobody was restarted" not_contains "$tmp/h.2" "restarting"

  # 8. A node lost again and again (its replacements die too): the third loss
  # of node2 fails the job together, the report naming the losses in order.
  agents 3 0 g 2:3
  started g 3 || return
  local n
  for n in 1 2; do
    kill_node 2
    wait_for "$tmp/g.0" "re-formed in" $((2 * n - 1)) 30 || return
    agents 3 2 g 2:3
    wait_for "$tmp/g.0" "re-formed in" $((2 * n)) 60 || return
  done
  kill_node 2
  wait_all 60 "${agent[0]}" "${agent[1]}"
  check "node lost again: the survivors fail together ($codes)" [ "$codes" = "1 1" ]
  check "node lost again: the report says so" grep -q \
    "node [0-9] (node2) was lost 3 times; losses in order: 1) node [0-9] (node2).*; 2) node [0-9] (node2).*; 3) node [0-9] (node2)" \
    "$tmp/g.0"

  # 9. A replacement admitted as the job ends: its worker, started ahead, is still joining
  # (REFORM_FORM_DELAY: as torch's process group waits for peers) when the members' workers
  # finish. It is stopped as not needed and every node ends 0, before --reform-timeout (40 s)
  # would have failed the job.
  REFORM_AWAIT=1 agents 3 0 e 2:3 --reform-timeout 40
  started e 3 || return
  kill_node 2
  wait_for "$tmp/e.0" "re-formed in" 1 30 || return
  REFORM_AWAIT=1 REFORM_FORM_DELAY=120 agents 3 2 e 2:3 --reform-timeout 40
  wait_for "$tmp/e.2" "the workers started ahead said hello" 1 30 || return
  wait_for "$tmp/e.2" ", round " 1 30 || return # joined: its worker has `form`, and waits
  touch "$tmp/e.done"
  wait_all 30 "${agent[0]}" "${agent[1]}" "${agent[2]}"
  check "late at the end: every node ends 0 ($codes)" [ "$codes" = "0 0 0" ]
  check "late at the end: the replacement says its workers were not needed" \
    contains "$tmp/e.2" "the job finished as this node joined it"
  check "late at the end: no node reports a failure" \
    not grep -q "job failed" "$tmp/e.0" "$tmp/e.1" "$tmp/e.2"

  # 10. A worker that dies after the job's training ended (SIGABRT 1 s after the others exited
  # 0, as a crash at exit): there is nothing to re-form around. Its agent says so instead of
  # re-forming, and every node fails together, naming that death (as torchrun's would).
  agents 2 0 f 2:3
  REFORM_DONE_ABORT=1 agents 3 2 f 2:3
  started f 3 || return
  touch "$tmp/f.done"
  wait_all 30 "${agent[0]}" "${agent[1]}" "${agent[2]}"
  check "crash after the end: every node fails ($codes)" [ "$codes" = "1 1 1" ]
  check "crash after the end: node 2 says the training had ended" \
    contains "$tmp/f.2" "after the job's training ended"
  check "crash after the end: node 2 does not re-form" \
    not_contains "$tmp/f.2" "re-forming without stopping"
  check "crash after the end: node 0's report names the SIGABRT" \
    grep -q "job failed: node [0-9] (node2): rank [0-9] .*SIGABRT" "$tmp/f.0"
}

# agent_pid I: node I's agent (the cohort process whose parent is no cohort: not its guard).
agent_pid() {
  local p
  for p in $(ip netns pids "$(netns_node "$1")"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = cohort ] || continue
    [ "$(cat "/proc/$(ps -o ppid= -p "$p" | tr -d ' ')/comm" 2>/dev/null)" = cohort ] && continue
    echo "$p"
    return 0
  done
  return 1
}

# kill -9 of node 2's agent alone (issue 28: "kill -9 ... of an agent"): its worker goes with it
# (its guard kills it, else its parent-death signal), the loss is named at once (by the guard,
# or by a survivor whose connection to the worker closed), and the survivors re-form without
# node 2 in their own processes; a replacement then joins.
agent_lost_tests() {
  netns_down
  netns_up 3 || { echo "cannot create network namespaces"; exit 1; }
  M=$(netns_addr 0)
  agents 3 0 a 2:3
  started a 3 || return
  sleep 1
  local victim w2
  victim=$(agent_pid 2)
  w2=$(first_pid "$tmp/a.2")
  check "agent lost: node 2's agent found ($victim)" [ -n "$victim" ]
  kill -9 "$victim"
  check "agent lost: the loss is named" wait_re "$tmp/a.0" \
    "re-forming without stopping the survivors: \(node [12] (node2): its agent died\|node [01] (node[01]): rank [01] lost a peer\)" 15
  check "agent lost: node 0 re-forms at world 2" wait_for "$tmp/a.0" "rank=0 world=2 at=" 1 30
  check "agent lost: node 1 re-forms at world 2" wait_for "$tmp/a.1" "rank=1 world=2 at=" 1 30
  check "agent lost: node 0's worker kept its process" unchanged "$tmp/a.0"
  check "agent lost: node 1's worker kept its process" unchanged "$tmp/a.1"
  check "agent lost: node 2's worker went with its agent" wait_gone "$w2"
  agents 3 2 a 2:3
  check "agent lost: the replacement joins" wait_for "$tmp/a.0" "re-formed in" 2 60
  check "agent lost: ... as a newcomer, rank 2" wait_for "$tmp/a.2" "rank=2 world=3 newcomer=1"
  touch "$tmp/a.done"
  wait_all 30 "${agent[0]}" "${agent[1]}" "${agent[2]}"
  check "agent lost: the job ends well ($codes)" [ "$codes" = "0 0 0" ]
}

# wait_gone PID: until PID is gone (10 s).
wait_gone() {
  local end=$((SECONDS + 10))
  while kill -0 "$1" 2>/dev/null; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.1
  done
}

# The agent's loop while it joins a re-form round: a node crashes whole and
# node 0's worker finds its peer gone at once (`broken`), so the round waits
# the heartbeat timeout for the lost node; node 0's worker prints a line
# each step meanwhile, and those lines come out while the agent waits (before
# its line for the new round), not all at once after it.
relay_tests() {
  netns_up 2 || { echo "cannot create network namespaces"; exit 1; }
  M=$(netns_addr 0)
  local i
  for i in 0 1; do
    REFORM_DONE="$tmp/r.done" REFORM_TICKS=1 REFORM_BROKEN="$tmp/r.broken$i" \
      netns_agent "$i" "$tmp/r.$i" --nnodes 1:2 --master "$M:29500" --job r \
      --heartbeat-timeout 4 --on-failure reform -- "$worker"
    agent[$i]=$!
  done
  started r 2 || return
  sleep 1
  # Its link goes first, so that no FIN of its dying sockets reaches node 0 (which
  # can end the round at once): the round must wait the heartbeat timeout.
  netns_link 1 down
  netns_crash 1
  touch "$tmp/r.broken0"
  check "relay: node 0 re-forms alone" wait_for "$tmp/r.0" "re-formed in" 1 60
  local first_tick new_round
  first_tick=$(grep -n "\] between pid=" "$tmp/r.0" | head -1 | cut -d: -f1)
  new_round=$(grep -n "cohort: node 0 of 1 .*round 1$" "$tmp/r.0" | head -1 | cut -d: -f1)
  check "relay: the worker printed while the agent joined" [ -n "$first_tick" ] && [ -n "$new_round" ]
  check "relay: its lines came out during the join (line ${first_tick:-?} < ${new_round:-?})" \
    [ "${first_tick:-0}" -lt "${new_round:-0}" ]
  touch "$tmp/r.done"
  wait_all 30 "${agent[0]}"
  check "relay: node 0 ends well ($codes)" [ "$codes" = "0" ]
}

# With etcd (one member on a namespace of its own) any node may be lost, node 0
# included: the survivors re-form and their workers' store moves to the new node 0.
etcd_tests() {
  # A lease of 2 s was once let expire, it seems, on the survivors of a CI run at load 13 (both
  # ended 1; the files were gone): etcd's own fsync and keep-alives share the loaded machine.
  local HB=5
  . "$src/tests/etcd_lib.sh"
  etcd_find || return 1
  netns_up 4 || { echo "cannot create network namespaces"; exit 1; }
  local a3 i
  a3=$(netns_addr 3)
  etcd_member 3 e3 "http://$a3:2379" "http://$a3:2380" "e3=http://$a3:2380"
  etcd_ready 3 "http://$a3:2379" || return 1
  for i in 0 1 2; do
    REFORM_DONE="$tmp/e.done" netns_agent "$i" "$tmp/e.$i" --rdzv-backend etcd \
      --rdzv-endpoint "$a3:2379" --rdzv-id "e$$" --nnodes 2:3 --heartbeat-timeout $HB \
      --on-failure reform -- "$worker"
    agent[$i]=$!
  done
  started e 3 || return
  sleep 1
  local zero=-1 others=()
  for i in 0 1 2; do
    if grep -q "cohort: node 0 of 3 " "$tmp/e.$i"; then zero=$i; else others+=("$i"); fi
  done
  check "etcd: one node is node 0" [ "$zero" -ge 0 ]
  kill_node "$zero"
  for i in "${others[@]}"; do
    check "etcd: node $i re-forms without node 0" wait_for "$tmp/e.$i" "world=2 at=" 1 30
    check "etcd: node $i's worker kept its process" unchanged "$tmp/e.$i"
  done
  local old new
  old=$(sed -n 's/.*\] start pid=.* store=\(.*\)/\1/p' "$tmp/e.${others[0]}" | head -1)
  new=$(sed -n 's/.*formed pid=.* store=\(.*\)/\1/p' "$tmp/e.${others[0]}" | head -1)
  check "etcd: the workers' store moved ($old -> $new)" [ -n "$new" ] && [ "$new" != "$old" ]
  touch "$tmp/e.done"
  wait_all 30 "${agent[${others[0]}]}" "${agent[${others[1]}]}"
  check "etcd: the survivors end well ($codes)" [ "$codes" = "0 0" ] ||
    agents_said "$tmp/e.${others[0]}" "$tmp/e.${others[1]}"

  # The replacement asks the job to take it in; should it join that round first it would plan it
  # (etcd: the first node to join plans) and wait for the members. Before, it planned as a first
  # start (MIN, then the last call) and a survivor later than that was left out; here one
  # survivor's agent is stopped for 2.5 s while the replacement asks, past --last-call 0.5.
  for i in 0 1 2; do
    REFORM_DONE="$tmp/eg.done" netns_agent "$i" "$tmp/eg.$i" --rdzv-backend etcd \
      --rdzv-endpoint "$a3:2379" --rdzv-id "eg$$" --nnodes 2:3 --heartbeat-timeout $HB \
      --last-call 0.5 --on-failure reform -- "$worker"
    agent[$i]=$!
  done
  started eg 3 || return
  sleep 1
  kill_node 2
  for i in 0 1; do
    check "etcd grow: node $i re-forms without node 2" wait_for "$tmp/eg.$i" "world=2 at=" 1 30
  done
  local slow=0
  grep -q "cohort: node 0 of 2 " "$tmp/eg.0" && slow=1 # not the workers' store
  kill -STOP "${agent[$slow]}"
  REFORM_DONE="$tmp/eg.done" netns_agent 2 "$tmp/eg.2b" --rdzv-backend etcd \
    --rdzv-endpoint "$a3:2379" --rdzv-id "eg$$" --nnodes 2:3 --heartbeat-timeout $HB \
    --last-call 0.5 --on-failure reform -- "$worker"
  agent[2]=$!
  sleep 2.5
  kill -CONT "${agent[$slow]}"
  for i in 0 1; do
    check "etcd grow: node $i re-forms with the replacement" \
      wait_for "$tmp/eg.$i" "world=3 at=" 1 60
  done
  check "etcd grow: the stopped survivor was not left out" \
    not_contains "$tmp/eg.$slow" "was left out of the re-form"
  # A member plans the round (the replacement let one join first), so the newcomer comes last
  # and a libcohort worker catches up rather than taking a blocking transfer as rank 0.
  check "etcd grow: the replacement is the last node" contains "$tmp/eg.2b" "cohort: node 2 of 3 "
  check "etcd grow: the survivors kept their processes" unchanged "$tmp/eg.0" &&
    check "etcd grow: ... node 1 too" unchanged "$tmp/eg.1"
  touch "$tmp/eg.done"
  wait_all 30 "${agent[0]}" "${agent[1]}" "${agent[2]}"
  check "etcd grow: the job ends well ($codes)" [ "$codes" = "0 0 0" ] ||
    agents_said "$tmp/eg.0" "$tmp/eg.1" "$tmp/eg.2b"

  # A node stopped (SIGSTOP) past its lease, then continued: the others re-formed without it;
  # it finds itself named lost and ends alone saying so (before, it re-formed as a survivor:
  # `reshape` to its worker, then a join that etcd refused, "requested lease not found").
  for i in 0 1 2; do
    REFORM_DONE="$tmp/es.done" netns_agent "$i" "$tmp/es.$i" --rdzv-backend etcd \
      --rdzv-endpoint "$a3:2379" --rdzv-id "es$$" --nnodes 2:3 --heartbeat-timeout $HB \
      --on-failure reform -- "$worker"
    agent[$i]=$!
  done
  started es 3 || return
  sleep 1
  local late=0 p
  grep -q "cohort: node 0 of 3 " "$tmp/es.0" && late=1
  local stopped
  stopped=$(ip netns pids "$(netns_node $late)")
  for p in $stopped; do kill -STOP "$p"; done
  local rest=()
  for i in 0 1 2; do [ "$i" = "$late" ] || rest+=("$i"); done
  check "etcd stopped node: the others re-form without it" \
    wait_for "$tmp/es.${rest[0]}" "world=2 at=" 1 30
  for p in $stopped; do kill -CONT "$p"; done
  wait_all 30 "${agent[$late]}"
  check "etcd stopped node: it ends alone ($codes)" [ "$codes" = "1" ]
  check "etcd stopped node: it says it was declared lost" contains "$tmp/es.$late" \
    "this node was declared lost while it did not answer"
  check "etcd stopped node: its worker got no reshape" not_contains "$tmp/es.$late" "] reshape pid="
  touch "$tmp/es.done"
  wait_all 30 "${agent[${rest[0]}]}" "${agent[${rest[1]}]}"
  check "etcd stopped node: the others end well ($codes)" [ "$codes" = "0 0" ] ||
    agents_said "$tmp/es.${rest[0]}" "$tmp/es.${rest[1]}"
}

# The PyTorch example (examples/reform_ddp.py through cohort_reform, Debian's
# torch, gloo) under the real agent: kill -9 of rank 1 at step 5; the
# survivors re-form in their processes, the newcomer receives the state, and
# every rank ends with the same parameters.
torch_tests() {
  /usr/bin/python3 -c "import torch" 2>/dev/null || { echo "python3-torch is needed"; return 1; }
  local out="$tmp/pt"
  "$cohort" run --nproc-per-node 3 --on-failure reform --no-python /usr/bin/python3 \
    "$src/examples/reform_ddp.py" --steps 40 --step-time 0.1 >"$out" 2>&1 &
  local agent=$!
  check "torch: rank 1 reaches step 5" wait_for "$out" "step=5 rank=1 " 1 120 || return
  local p0 p1 p2
  p0=$(sed -n 's/.*joined epoch=0 rank=0 .* pid=\([0-9]*\) .*/\1/p' "$out")
  p1=$(sed -n 's/.*joined epoch=0 rank=1 .* pid=\([0-9]*\) .*/\1/p' "$out")
  p2=$(sed -n 's/.*joined epoch=0 rank=2 .* pid=\([0-9]*\) .*/\1/p' "$out")
  kill -9 "$p1"
  check "torch: the survivors re-form" wait_for "$out" "cohort: re-formed in" 1 120
  # The replacement may be in the first re-form, or (started ahead, not yet said hello) in the
  # next one: the survivors first re-form 3 -> 2, then 2 -> 3.
  check "torch: rank 0 re-formed in its own process" \
    wait_re "$out" "reformed epoch=[1-9][0-9]* rank=0 world=3 pid=$p0 " 120
  check "torch: rank 2 re-formed in its own process" \
    wait_re "$out" "reformed epoch=[1-9][0-9]* rank=2 world=3 pid=$p2 " 30
  # At its join, or caught up in the background (docs/reform.md, "Catching up in the background").
  check "torch: the newcomer received the state" \
    wait_re "$out" "\(joined\|caught\) epoch=[1-9][0-9]* rank=1 world=3 pid=[0-9]* step=[0-9]* received=[1-9]" 30
  wait_all 180 $agent
  check "torch: the job ends well ($codes)" [ "$codes" = "0" ]
  check "torch: every rank ends with the same parameters" \
    [ "$(sed -n 's/.*done step=40 .* params=\(.*\)/\1/p' "$out" | sort -u | wc -l)" = 1 ]
  check "torch: three ranks finished" [ "$(grep -c "done step=40 " "$out")" = 3 ]
}

# A libcohort program (tests/reform_steps_worker.c: cohort_comm_reform and
# cohort_comm_state_transfer) under the agent: kill -9 of rank 1 on one node,
# then of a whole node of two (over TCP).
coll_tests() {
  local bin=$1 out="$tmp/c1"
  "$cohort" run --nproc-per-node 3 --on-failure reform -- "$bin" 80 >"$out" 2>&1 &
  local agent=$!
  wait_for "$out" "] start pid=" 3 || return
  sleep 1
  local p0 p2
  p0=$(sed -n 's/.*\] start pid=\([0-9]*\) rank=0 .*/\1/p' "$out")
  p2=$(sed -n 's/.*\] start pid=\([0-9]*\) rank=2 .*/\1/p' "$out")
  kill -9 "$(sed -n 's/.*\] start pid=\([0-9]*\) rank=1 .*/\1/p' "$out")"
  check "coll: rank 0 re-forms in its own process" wait_for "$out" "reformed pid=$p0 rank=0 size=3" 1 60
  check "coll: rank 2 re-forms in its own process" wait_for "$out" "reformed pid=$p2 rank=2 size=3" 1 60
  check "coll: a newcomer takes rank 1" wait_for "$out" "rank=1 size=3 new=1" 1 60
  check "coll: the agent sees the re-form done" wait_for "$out" "cohort: re-formed in" 1 60
  wait_all 60 $agent
  check "coll: the job ends well ($codes)" [ "$codes" = "0" ]
  check "coll: every rank ends at step 80" [ "$(grep -c "done pid=[0-9]* rank=[0-2] size=3 step=80" "$out")" = 3 ]

  # A second loss before the first one's replacement created its communicator (its hello):
  # rank 1 killed, its newcomer holds back; rank 2 killed meanwhile. The newcomer's bootstrap
  # finds its first membership ended and joins the next; rank 0 keeps its process.
  out="$tmp/c2"
  REFORM_HELLO_AFTER="$tmp/c2.hello" "$cohort" run --nproc-per-node 3 --on-failure reform \
    -- "$bin" 80 >"$out" 2>&1 &
  agent=$!
  wait_for "$out" "] start pid=" 3 || return
  sleep 1
  p0=$(sed -n 's/.*\] start pid=\([0-9]*\) rank=0 .*/\1/p' "$out")
  p2=$(sed -n 's/.*\] start pid=\([0-9]*\) rank=2 .*/\1/p' "$out")
  kill -9 "$(sed -n 's/.*\] start pid=\([0-9]*\) rank=1 .*/\1/p' "$out")"
  check "coll early loss: a newcomer starts for rank 1" wait_for "$out" "] wait pid=" 1 60
  local p1
  p1=$(sed -n 's/.*\] wait pid=\([0-9]*\).*/\1/p' "$out" | head -1)
  kill -9 "$p2"
  check "coll early loss: the second loss re-forms too" \
    wait_for "$out" "cohort: re-forming without stopping the survivors" 2 30
  touch "$tmp/c2.hello"
  check "coll early loss: the newcomer joins as rank 1" wait_for "$out" "start pid=$p1 rank=1 size=3 new=1" 1 60
  check "coll early loss: rank 0 re-forms in its own process" wait_for "$out" "reformed pid=$p0 rank=0 size=3" 1 60
  wait_all 60 $agent
  check "coll early loss: the job ends well ($codes)" [ "$codes" = "0" ]
  check "coll early loss: every rank ends at step 80" [ "$(grep -c "done pid=[0-9]* rank=[0-2] size=3 step=80" "$out")" = 3 ]
  check "coll early loss: nobody was restarted" not_contains "$out" "restarting"

  netns_up 2 || { echo "cannot create network namespaces"; exit 1; }
  M=$(netns_addr 0)
  local i
  for i in 0 1; do
    netns_bg "$i" "$tmp/cn.$i" "$cohort" run --nnodes 1:2 --nproc-per-node 2 --master "$M:29500" \
      --job cn --heartbeat-timeout $HB --on-failure reform -- "$bin" 150
    agent[$i]=$!
  done
  started cn 2 || return
  sleep 1
  kill_node 1
  check "coll nodes: node 0's ranks re-form without node 1" wait_for "$tmp/cn.0" "size=2 epoch=1" 2 60
  check "coll nodes: node 0's ranks kept their processes" [ "$(unchanged_coll "$tmp/cn.0")" = ok ]
  wait_all 60 "${agent[0]}"
  check "coll nodes: node 0 ends well ($codes)" [ "$codes" = "0" ]
  check "coll nodes: both ranks end at step 150" [ "$(grep -c "done pid=[0-9]* rank=[01] size=2 step=150" "$tmp/cn.0")" = 2 ]

  # A node that dies whole (no guard left to report it) and its replacement started at once,
  # with a heartbeat timeout of 30 s:
  # the survivors' collectives (or node 0's agent, by the lost agent's socket) find the loss at
  # once, so the job re-forms with the replacement long before the timeout (0.2 s measured; bound
  # 15 s). Its
  # workers start ahead (libcohort says hello with await_form=1): the survivors may re-form
  # without it first, then with it.
  for i in 0 1; do
    netns_bg "$i" "$tmp/cr.$i" "$cohort" run --nnodes 1:2 --nproc-per-node 2 --master "$M:29501" \
      --job cr --heartbeat-timeout 30 --on-failure reform -- "$bin" 150
    agent[$i]=$!
  done
  started cr 2 || return
  sleep 1
  netns_crash 1
  netns_bg 1 "$tmp/cr.1b" "$cohort" run --nnodes 1:2 --nproc-per-node 2 --master "$M:29501" \
    --job cr --heartbeat-timeout 30 --on-failure reform -- "$bin" 150
  agent[1]=$!
  # Which report comes first is a race of two FINs: the workers' sockets (the survivors'
  # collectives report the lost peer) and the agent's (node 0's agent sees it died). Either
  # names the loss at once; neither waits for the heartbeat timeout.
  check "coll fast: node 0's agent names the loss at once (the survivors' report or the lost agent's socket)" \
    wait_re "$tmp/cr.0" "re-forming without stopping the survivors: \(node 0 (node0): rank\|node 1 (node1): its agent died\)" 15
  check "coll fast: node 0's ranks re-form with the replacement" wait_re_n "$tmp/cr.0" "reformed pid=[0-9]* rank=[01] size=4 epoch=[12] " 2 15
  check "coll fast: the replacement's workers started ahead" grep -q "cohort: starting the workers ahead" "$tmp/cr.1b"
  check "coll fast: node 0's ranks kept their processes" [ "$(unchanged_coll "$tmp/cr.0")" = ok ]
  wait_all 60 "${agent[0]}" "${agent[1]}"
  check "coll fast: both nodes end well ($codes)" [ "$codes" = "0 0" ]

  # One node: rank 1 exits 0 mid-run without a goodbye while rank 0 asks for a next membership:
  # the job fails together naming it (before, rank 0 waited for a `form` that never came).
  out="$tmp/c0"
  REFORM_NO_DESTROY=1 REFORM_EXIT_AT=10 REFORM_EXIT_CODE=0 "$cohort" run --nproc-per-node 2 \
    --on-failure reform -- "$bin" 20 >"$out" 2>&1 &
  wait_all 30 $!
  check "no goodbye, one node, status 0 mid-run: it fails ($codes)" [ "$codes" = "1" ]
  check "no goodbye, one node, status 0 mid-run: the report names the finisher" contains "$out" \
    "rank 0 lost a peer that finished (exited 0 without a goodbye)"

  # Rank 1 leaves without a goodbye (no cohort_comm_destroy, REFORM_NO_DESTROY): at the end of
  # the job, exit 0, it is a finisher and no loss (rank 0, between steps, finds its connection
  # closed); mid-run with status 3 it is a loss named as its own exit; mid-run with status 0,
  # while rank 0 still needs it, the job fails together naming the finisher.
  local c port=29502
  for c in end:20:0 mid:10:3 zero:10:0; do
    local name=${c%%:*} rest=${c#*:}
    for i in 0 1; do
      REFORM_NO_DESTROY=1 REFORM_EXIT_AT=${rest%%:*} REFORM_EXIT_CODE=${rest#*:} netns_bg "$i" \
        "$tmp/cg$name.$i" "$cohort" run --nnodes 1:2 --master "$M:$port" --job "cg$name" \
        --heartbeat-timeout $HB --on-failure reform -- "$bin" 20
      agent[$i]=$!
    done
    port=$((port + 1))
    wait_all 60 "${agent[0]}" "${agent[1]}"
    case $name in
    end)
      check "no goodbye, at the end: both nodes end well ($codes)" [ "$codes" = "0 0" ]
      check "no goodbye, at the end: rank 1 left without it" contains "$tmp/cgend.1" "leaves pid="
      check "no goodbye, at the end: no re-form" not_contains "$tmp/cgend.0" "re-form"
      ;;
    mid)
      check "no goodbye, status 3: the job re-forms and ends well ($codes)" [ "$codes" = "0 0" ]
      check "no goodbye, status 3: node 0's re-form names the exit" contains "$tmp/cgmid.0" \
        "re-forming without stopping the survivors: node 1 (node1): rank 1 (local rank 0, pid"
      ;;
    zero)
      check "no goodbye, status 0 mid-run: both fail ($codes)" [ "$codes" = "1 1" ]
      check "no goodbye, status 0 mid-run: the report names the finisher" contains \
        "$tmp/cgzero.1" "rank 0 lost a peer that finished (exited 0 without a goodbye)"
      ;;
    esac
  done
}

# unchanged_coll FILE: "ok" when every reformed pid of FILE is one that started.
unchanged_coll() {
  local p
  for p in $(sed -n 's/.*reformed pid=\([0-9]*\) .*/\1/p' "$1"); do
    grep -q "\] start pid=$p " "$1" || return
  done
  echo ok
}

# With etcd members on the job's three nodes, node 2 cut off: the side with
# etcd's majority re-forms without it; node 2 loses etcd and stops, saying so.
etcd_partition_tests() {
  . "$src/tests/etcd_lib.sh"
  etcd_find || return 1
  netns_up 3 || { echo "cannot create network namespaces"; exit 1; }
  local i a cluster="" eps=""
  for i in 0 1 2; do
    a=$(netns_addr "$i")
    cluster="$cluster${cluster:+,}m$i=http://$a:2380"
    eps="$eps${eps:+,}$a:2379"
  done
  for i in 0 1 2; do
    a=$(netns_addr "$i")
    etcd_member "$i" "m$i" "http://$a:2379" "http://$a:2380" "$cluster"
  done
  for i in 0 1 2; do etcd_ready "$i" "http://$(netns_addr "$i"):2379" || return 1; done
  for i in 0 1 2; do
    REFORM_DONE="$tmp/x.done" netns_agent "$i" "$tmp/x.$i" --rdzv-backend etcd \
      --rdzv-endpoint "$eps" --rdzv-id "x$$" --nnodes 2:3 --heartbeat-timeout $HB \
      --on-failure reform -- "$worker"
    agent[$i]=$!
  done
  started x 3 || return
  sleep 1
  netns_link 2 down
  check "etcd partition: node 0 re-forms without node 2" wait_for "$tmp/x.0" "world=2 at=" 1 60
  check "etcd partition: node 1 re-forms without node 2" wait_for "$tmp/x.1" "world=2 at=" 1 60
  wait_all 90 "${agent[2]}"
  check "etcd partition: node 2 stops ($codes)" [ "$codes" = "1" ]
  check "etcd partition: node 2 says it lost etcd" contains "$tmp/x.2" "this node lost etcd"
  check "etcd partition: the majority kept its processes" unchanged "$tmp/x.0"
  netns_link 2 up
  touch "$tmp/x.done"
  wait_all 30 "${agent[0]}" "${agent[1]}"
  check "etcd partition: the majority ends well ($codes)" [ "$codes" = "0 0" ]
}

if [ "$part" = nodes ] || [ "$part" = all ]; then node_tests; fi
if [ "$part" = nodes ] || [ "$part" = all ] || [ "$part" = agent ]; then agent_lost_tests; fi
if [ "$part" = coll ]; then coll_tests "$4"; fi
if [ "$part" = relay ] || [ "$part" = all ]; then relay_tests; fi
if [ "$part" = torch ] || [ "$part" = all ]; then torch_tests; fi
if [ "$part" = etcd ] || [ "$part" = all ]; then
  netns_down
  etcd_tests
  netns_down
  etcd_partition_tests
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

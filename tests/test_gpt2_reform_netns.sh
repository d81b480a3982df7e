#!/usr/bin/env bash
# cohort-gpt2 under real agents with `cohort run --on-failure reform`, in
# network namespaces this test creates and removes: 3 nodes x 1 rank, the
# built-in store on node 0. Once rank 0 has done 20 steps, every process of
# node 2's namespace (agent and worker) gets SIGKILL and a replacement node is
# started at once with the same command line. The workers of nodes 0 and 1
# keep their processes (the same PIDs before and after, and until the end);
# the replacement's worker is started ahead of its membership (COHORT_AWAIT_FORM:
# its model and data set up before its agent joins the job) and is a newcomer
# that joins by a grow, which drops no step, and receives the state in the
# background while the survivors train; rank 0's metrics have every step exactly once
# (none recomputed, none skipped), the last ones at world 3; every agent
# exits 0. Then the same membership schedule (the worlds of the live run's
# metrics) runs in advance, as runs chained by checkpoints: the final
# checkpoints are the same bytes and every step's loss the same.
# With `worker0` the loss is node 0's worker alone (kill -9; its agent, which
# hosts the store, lives): node 0's agent starts a new worker, which is rank 0
# and a newcomer below the survivors' ranks. It catches up in the background
# as a replacement in the last place does (rank 0's line says `catching up`,
# then `rank(s) 0-0 caught up`), the workers of nodes 1 and 2 keep their
# processes, and the run equals the schedule run in advance as above.
# usage: test_gpt2_reform_netns.sh COHORT COHORT-GPT2 SOURCE_DIR [worker0]
set -u
cohort=$(readlink -f "$1")
gpt2=$(readlink -f "$2")
src=$(readlink -f "$3")
mode=${4:-node2}
tmp=$(mktemp -d /tmp/cohort-gpt2-reform-netns-XXXXXX)
chmod 755 "$tmp"
pids=()
. "$src/tests/check_lib.sh"
. "$src/tests/netns_lib.sh"
if [ "$(id -u)" != 0 ]; then echo "needs root (network namespaces)"; exit 1; fi
cleanup() {
  netns_down
  [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

STEPS=300
agent=()
# The trainer's arguments but --steps, the metrics and the checkpoints (a constant learning rate:
# the runs chained below stop early, and a schedule or warm-up over --steps would differ).
train=(--model tiny --seq-len 32 --batch 2 --data /usr/share/common-licenses/GPL-3 --quiet
  --schedule const --warmup 2 --ckpt-every 100000)
# agent_on I: node I's agent (node 0 hosts the store), output in $tmp/n<I>; rank 0's metrics.
# COHORT_GROW_BREAK=0: a grow is always deferred (else one early in a step breaks it).
agent_on() {
  local rank=()
  [ "$1" -eq 0 ] && rank=(--node-rank 0)
  COHORT_GROW_BREAK=0 OMP_NUM_THREADS=1 \
    netns_agent "$1" "$tmp/n$1" --nnodes 2:3 "${rank[@]}" --master "$M:29500" \
    --job g --heartbeat-timeout 2 --on-failure reform -- "$gpt2" "${train[@]}" --steps $STEPS \
    --metrics "$tmp/m.jsonl" --ckpt-dir "$tmp/live"
  agent[$1]=$!
}

# worker_of PID: the cohort-gpt2 worker of the agent PID started (the shell of netns_bg runs
# the agent, which runs the worker).
worker_of() {
  local a
  a=$(pgrep -P "$1" -x cohort | head -1)
  [ -n "$a" ] && pgrep -P "$a" -x cohort-gpt2 | head -1
}

steps_done() { [ -s "$tmp/m.jsonl" ] && wc -l <"$tmp/m.jsonl" || echo 0; }

netns_up 3 || { echo "cannot create network namespaces"; exit 1; }
M=$(netns_addr 0)
for i in 0 1 2; do agent_on "$i"; done
for _ in $(seq 1200); do
  [ "$(steps_done)" -ge 20 ] && break
  sleep 0.1
done
check "20 steps before the kill" [ "$(steps_done)" -ge 20 ]
w0=$(worker_of "${agent[0]}")
w1=$(worker_of "${agent[1]}")
w2=$(worker_of "${agent[2]}")
check "the workers of nodes 0, 1 and 2 found ($w0, $w1, $w2)" [ -n "$w0" ] && [ -n "$w1" ] && [ -n "$w2" ]

# reformed_keeping I J: node 0's agent re-forms (120 s at most), the workers of nodes I and J
# keep their processes (w0, w1, w2 as started), and every agent exits 0 at the job's end.
reformed_keeping() {
  local i
  for _ in $(seq 1200); do
    grep -q "cohort: re-formed in" "$tmp/n0" 2>/dev/null && break
    sleep 0.1
  done
  check "node 0's agent re-formed" contains "$tmp/n0" "cohort: re-formed in"
  for i in "$@"; do
    local was="w$i"
    check "node $i's worker kept its process" [ "$(worker_of "${agent[$i]}")" = "${!was}" ]
  done
  wait_all 300 "${agent[0]}" "${agent[1]}" "${agent[2]}"
  check "every agent exits 0 ($codes)" [ "$codes" = "0 0 0" ]
}

# Node 2 lost whole (agent and worker) as a machine dies (netns_crash: its agent's guard cannot
# name the loss first), and a replacement node started at once.
lose_node2() {
  netns_crash 2
  wait "${agent[2]}" 2>/dev/null
  mv "$tmp/n2" "$tmp/n2.lost"
  agent_on 2
  reformed_keeping 0 1
  # A survivor's word that its peer's connection closed needs no finisher's word: the store
  # said at once that node 2's agent went (its will). (Killed one by one, its guard could name
  # the loss first: netns_crash stops them all first.)
  check "the agents knew node 2's agent gone from the store" \
    contains "$tmp/n0" "an agent of the job left the store without finishing"
  # At the re-form (with a survivor a step behind when the loss caught one: 2 ranks), or in the
  # background while the survivors train (docs/gpt2.md "Catching up").
  check "rank 0 says a new rank received the state" \
    grep -qE "cohort-gpt2: re-formed \(epoch [0-9]*\): world [23] -> 3 .* [12] rank\(s\) received [1-9][0-9]* bytes|cohort-gpt2: rank\(s\) 2-2 caught up: received [1-9][0-9]* bytes" "$tmp/n0"
  # The replacement joins by a grow (world 2 -> 3) unless the loss's re-form took it in already
  # (world 3 -> 3): then the survivors finish the step in flight and re-form after it (none is a
  # step behind), and the newcomer alone catches up in the background (docs/gpt2.md "Re-form",
  # item 3).
  grow='cohort-gpt2: re-formed \(epoch [0-9]*\): world 2 -> 3 '
  if grep -E "$grow" "$tmp/n0"; then
    check "the grow dropped no step and the newcomer alone catches up" \
      grep -qE "$grow""at step [0-9]* \(step in flight none\), 1 rank\(s\) catching up: " "$tmp/n0"
  else
    grep -E "cohort-gpt2: re-formed" "$tmp/n0"
    echo "(the loss's re-form took the replacement in: no grow this time)"
  fi
  check "rank 0's summary (the process that started)" contains "$tmp/n0" "summary: "
  check "the replacement's worker started ahead, then its agent joined" /usr/bin/python3 - "$tmp/n2" <<'PY'
import sys
text = open(sys.argv[1]).read()
marks = ["cohort: starting the workers ahead", "the workers started ahead said hello: joining",
         "cohort: the workers started ahead joined in", "(newcomer, started ahead): "]
at = [text.find(m) for m in marks]
print(dict(zip(marks, at)))
sys.exit(0 if -1 not in at and at == sorted(at) else 1)
PY
}

# Node 0's worker lost alone: its agent starts a new one, rank 0 and new.
lose_worker0() {
  kill -9 "$w0"
  reformed_keeping 1 2
  # Node 0's new worker is rank 0 and new: it catches up while the others train (before, it took
  # the blocking transfer: `1 rank(s) received`), unless the loss caught a survivor a step behind,
  # which needs the state at once (`2 rank(s) received`: docs/gpt2.md "Catching up", item 1).
  grep -E "cohort-gpt2: re-formed|caught up" "$tmp/n0"
  check "rank 0, the new worker, catches up in the background" \
    grep -qE "cohort-gpt2: re-formed \(epoch [0-9]*\): world [23] -> 3 at step [0-9]* \(step in flight [a-z]*\), (1 rank\(s\) catching up: [1-9][0-9]* bytes|2 rank\(s\) received)" "$tmp/n0"
  if grep -q "1 rank(s) catching up" "$tmp/n0"; then
    check "rank 0 says it caught up" \
      grep -qE "cohort-gpt2: rank\(s\) 0-0 caught up: received [1-9][0-9]* bytes .* from 2 rank\(s\)" "$tmp/n0"
    check "... and it is the new worker" grep -qE "cohort-gpt2: rank 0 \(newcomer(, started ahead)?\): caught up: snapshot of step [0-9]*" "$tmp/n0"
  fi
  check "rank 0's summary (the new worker)" contains "$tmp/n0" "summary: "
}

if [ "$mode" = worker0 ]; then lose_worker0; else lose_node2; fi
check "every step once, the last ones at world 3" /usr/bin/python3 - "$tmp/m.jsonl" $STEPS <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step"] for r in rows]
ok = steps == list(range(1, int(sys.argv[2]) + 1)) and rows[-1]["world"] == 3
if not ok:
    print("steps", steps[:5], "...", len(steps), "worlds", [r["world"] for r in rows][-5:])
sys.exit(0 if ok else 1)
PY

# The schedule in advance: for each run of steps at one world in the live metrics, that many
# nodes from the last checkpoint to its last step (--on-failure restart: no control channel).
schedule=$(/usr/bin/python3 - "$tmp/m.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
parts = []
for r in rows:
    if parts and parts[-1][0] == r["world"]:
        parts[-1][1] = r["step"]
    else:
        parts.append([r["world"], r["step"]])
print(" ".join("%d:%d" % (w, s) for w, s in parts))
PY
)
echo "the live run's schedule (world:last step): $schedule"
part=0
for ws in $schedule; do
  w=${ws%:*} to=${ws#*:} chain=()
  part=$((part + 1))
  for i in $(seq 0 $((w - 1))); do
    rank=()
    [ "$i" -eq 0 ] && rank=(--node-rank 0)
    OMP_NUM_THREADS=1 netns_agent "$i" "$tmp/c$part.n$i" --nnodes "$w" "${rank[@]}" \
      --master "$M:$((29600 + part))" --job "c$part" -- "$gpt2" "${train[@]}" --steps "$to" \
      --metrics "$tmp/chain.jsonl" --ckpt-dir "$tmp/chain"
    chain+=($!)
  done
  wait_all 300 "${chain[@]}"
  check "the chained run $part ($w nodes to step $to) exits 0 ($codes)" \
    [ "$codes" = "$(printf '0 %.0s' $(seq "$w") | sed 's/ $//')" ]
done
last=$(printf 'ckpt_%012d.bin' $STEPS)
check "the final checkpoint equals the schedule run in advance" \
  cmp "$tmp/live/$last" "$tmp/chain/$last"
check "every step's loss and world equal the schedule run in advance" /usr/bin/python3 - \
  "$tmp/m.jsonl" "$tmp/chain.jsonl" <<'PY'
import json, sys
live, chain = ([(r["step"], r["loss"], r["world"]) for r in map(json.loads, open(p))]
               for p in sys.argv[1:])
diff = [(a, b) for a, b in zip(live, chain) if a != b]
print(len(live), "steps live,", len(chain), "chained; first differences:", diff[:3])
sys.exit(0 if live == chain else 1)
PY
if [ "$failed" -ne 0 ]; then tail -n 8 "$tmp/n0" "$tmp/n1" "$tmp/n2"; fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

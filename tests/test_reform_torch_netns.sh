#!/usr/bin/env bash
# PyTorch DDP workers (examples/reform_ddp.py through cohort_reform, Debian's
# torch 1.13, gloo) under real agents with `cohort run --on-failure reform`,
# in network namespaces this test creates and removes: 3 nodes x 1 rank, the
# built-in store on node 0. kill -9 of node 2 (agent and worker) mid-training:
# the workers of nodes 0 and 1 keep their PIDs and go on with world size 2,
# no completed step recomputed; a replacement node started with the same
# command line joins: its worker receives the state and the three finish with
# the same parameters; every agent exits 0 (it catches up in the background while
# the survivors train, or takes the state at its join when a survivor was a step
# behind: docs/reform.md; the trained samples follow on, none twice, none skipped).
# Then node 2 is killed again and
# its replacement started at once: it starts its worker ahead (counted
# pending), so the survivors re-form without it at once and take it in with a
# second re-form once its worker said hello. Prints the seconds from the kill
# to the survivors' next step and from the replacement's start to its first
# step.
# usage: test_reform_torch_netns.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(readlink -f "$2")
tmp=$(mktemp -d /tmp/cohort-reform-torch-XXXXXX)
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

HB=2 # --heartbeat-timeout, seconds
STEPS=800
agent=()
# agent_on I: node I's agent (node 0 hosts the store), output in $tmp/n<I>.
agent_on() {
  local rank=()
  [ "$1" -eq 0 ] && rank=(--node-rank 0)
  netns_agent "$1" "$tmp/n$1" --nnodes 2:3 "${rank[@]}" --master "$M:29500" --job pt \
    --heartbeat-timeout $HB --on-failure reform --no-python /usr/bin/python3 \
    "$src/examples/reform_ddp.py" --steps $STEPS --step-time 0.03
  agent[$1]=$!
}

# wait_re FILE REGEX [SECONDS]: until a line of FILE matches (60 s at most).
wait_re() {
  local end=$((SECONDS + ${3:-60}))
  while [ $SECONDS -lt $end ]; do
    grep -qE -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "timed out waiting for /$2/ in $1"
  tail -5 "$1"
  return 1
}

# field FILE KIND KEY: KEY's value on FILE's first KIND line ("joined", "done").
field() { sed -n "s/.*\] $2 .* $3=\([^ ]*\).*/\1/p" "$1" | head -1; }

# Reads the nodes' outputs: survivors' PIDs, step order, positions, timings.
analyse() {
  python3 - "$@" <<'EOF'
import re, sys
t0, t_new, files = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
def steps(f):
    out = []
    for line in open(f):
        m = re.search(r"\] (step=\d+ .* time=\S+)$", line.rstrip("\n"))
        if m:  # a line whole (kill -9 may cut a line short)
            out.append(dict(w.split("=", 1) for w in m.group(1).split() if "=" in w))
    return out
bad = []
for f in files[:2]:  # the survivors'; files[2]: the last replacement's; then the killed ones'
    s = steps(f)
    pids = {x["pid"] for x in s}
    if len(pids) != 1:
        bad.append("%s: steps printed by pids %s, not one process" % (f, sorted(pids)))
    for a, b in zip(s, s[1:]):
        if int(b["step"]) <= int(a["step"]):
            bad.append("%s: step %s after step %s (recomputed)" % (f, b["step"], a["step"]))
        elif int(b["step"]) == int(a["step"]) + 1 and \
                int(b["position"]) - int(a["position"]) != 4 * int(b["trainers"]):
            bad.append("%s: step %s moved the position by %d with %s ranks training"
                       % (f, b["step"], int(b["position"]) - int(a["position"]), b["trainers"]))
    after = [float(x["time"]) for x in s if x["world"] == "2" and float(x["time"]) > t0]
    print("%s: kill -9 of node 2 -> this survivor's next step: %.2f s"
          % (f.split("/")[-1], min(after) - t0) if after else "%s: no step with world 2" % f)
new = [float(x["time"]) for x in steps(files[2]) if float(x["time"]) > t_new]
if new:
    print("replacement started -> its first step: %.2f s" % (min(new) - t_new))
# The samples each step's training ranks took (catching=0), over every worker's lines (the
# killed ones' too): one after another from the position before the step, none twice, none
# skipped. A step whose lines are not all there (a worker killed before it printed) is left out.
by_step, ends, trainers = {}, {}, {}
for f in files:
    for x in steps(f):
        ends.setdefault(int(x["step"]), set()).add(int(x["position"]))
        trainers.setdefault(int(x["step"]), set()).add(int(x["trainers"]))
        if x["catching"] == "0":
            lo, hi = (int(v) for v in x["samples"].split(":"))
            by_step.setdefault(int(x["step"]), []).append((lo, hi))
checked = 0
for s in sorted(by_step):
    if len(ends[s]) != 1 or len(trainers[s]) != 1:
        bad.append("step %d: positions %s, ranks training %s: not one each"
                   % (s, sorted(ends[s]), sorted(trainers[s])))
        continue
    if s - 1 not in ends or len(by_step[s]) != min(trainers[s]):
        continue
    checked += 1
    cur, end = min(ends[s - 1]), min(ends[s])
    for lo, hi in sorted(by_step[s]):
        if lo != cur:
            bad.append("step %d: trained samples %s do not follow on from %d"
                       % (s, sorted(by_step[s]), cur))
            break
        cur = hi
    else:
        if cur != end:
            bad.append("step %d: trained samples end at %d, the position says %d" % (s, cur, end))
print("the trained samples of %d steps follow on, none twice, none skipped" % checked)
for b in bad[:10]:
    print("BAD: " + b)
sys.exit(1 if bad else 0)
EOF
}

netns_up 3 || { echo "cannot create network namespaces"; exit 1; }
M=$(netns_addr 0)
for i in 0 1 2; do agent_on "$i"; done
for i in 0 1 2; do check "node $i trains" wait_re "$tmp/n$i" "\] step=20 " 120 || exit 1; done
pid0=$(field "$tmp/n0" joined pid)
pid1=$(field "$tmp/n1" joined pid)

# kill -9 of node 2's namespace: its agent and its worker.
t0=$(date +%s.%N)
for p in $(ip netns pids "$(netns_node 2)"); do kill -9 "$p" 2>/dev/null; done
wait "${agent[2]}" 2>/dev/null
check "node 0's worker goes on with world 2 in its process" \
  wait_re "$tmp/n0" "\] step=[0-9]+ rank=0 world=2 pid=$pid0 " 60
check "node 1's worker goes on with world 2 in its process" \
  wait_re "$tmp/n1" "\] step=[0-9]+ rank=1 world=2 pid=$pid1 " 60
check "node 0's agent re-formed" contains "$tmp/n0" "re-formed in"

# A replacement node with the same command line: a newcomer given the state.
mv "$tmp/n2" "$tmp/n2.lost"
t_new=$(date +%s.%N)
agent_on 2
check "the replacement's worker joins as rank 2 of 3" \
  wait_re "$tmp/n2" "\] joined epoch=[0-9]+ rank=2 world=3 " 120
# given_state FILE: "caught" (it caught up in the background) or "joined" (given the state at its
# join: a survivor was a step behind), and the bytes, from FILE's first line of either with bytes.
given_state() {
  wait_re "$1" "\] (caught|joined) epoch=[0-9]+ rank=2 world=3 .*received=[1-9]" 120 >/dev/null
  sed -En 's/.*\] (caught|joined) epoch=[0-9]+ rank=2 world=3 .* received=([1-9][0-9]*).*/\1 \2/p' \
    "$1" | head -1
}
read -r how received <<<"$(given_state "$tmp/n2")"
check "the replacement received the state ($how, $received bytes)" [ "${received:-0}" -gt 0 ]
echo "the replacement: $how ($received bytes; caught: in the background, joined: at its join)"
check "node 0's worker goes on with world 3 in its process" \
  wait_re "$tmp/n0" "\] step=[0-9]+ rank=0 world=3 pid=$pid0 " 60
check "the replacement started its worker ahead of its membership" \
  contains "$tmp/n2" "cohort: starting the workers ahead"

# kill -9 of node 2 again and its replacement started at once: the survivors re-form without
# it at once (it counts as pending in their round while its worker starts ahead: its
# interpreter and imports cost them nothing), then take it in once its worker said hello.
wait_re "$tmp/n2" "\] step=[0-9]+ rank=2 world=3 " 60
for p in $(ip netns pids "$(netns_node 2)"); do kill -9 "$p" 2>/dev/null; done
wait "${agent[2]}" 2>/dev/null
mv "$tmp/n2" "$tmp/n2.lost2"
t_new=$(date +%s.%N)
agent_on 2
check "the second replacement joins as rank 2 of 3" \
  wait_re "$tmp/n2" "\] joined epoch=[0-9]+ rank=2 world=3 " 120
check "it started its worker ahead" contains "$tmp/n2" "cohort: starting the workers ahead"
read -r how received <<<"$(given_state "$tmp/n2")"
check "it received the state ($how, $received bytes)" [ "${received:-0}" -gt 0 ]
echo "the second replacement: $how ($received bytes)"
wait_all 300 "${agent[0]}" "${agent[1]}" "${agent[2]}"
forms=$(grep -o "re-formed in .* nodes [0-9] -> [0-9]" "$tmp/n0" | sed 's/.*nodes //' | tr '\n' ,)
check "node 0's re-forms: without each lost node first, then with its replacement ($forms)" \
  [ "$forms" = "3 -> 2,2 -> 3,3 -> 2,2 -> 3," ]
check "the job ends well on every node ($codes)" [ "$codes" = "0 0 0" ]
for i in 0 1 2; do check "node $i finished $STEPS steps" contains "$tmp/n$i" "] done step=$STEPS "; done
params=$(for i in 0 1 2; do field "$tmp/n$i" done params; echo; done | sort -u | grep -c .)
check "the three ranks end with the same parameters" [ "$params" = 1 ]
check "survivors kept their processes, no completed step recomputed, no sample twice or skipped" \
  analyse "$t0" "$t_new" "$tmp/n0" "$tmp/n1" "$tmp/n2" "$tmp/n2.lost" "$tmp/n2.lost2"
echo "state sent to the replacement: $received bytes"

# A node killed while the survivors compute (a long step with no collective left in it): each
# survivor's cohort_reform watches its process group's connections and tells its agent at once,
# so the agents re-form within seconds, not at the step's end (STEP2) nor at the heartbeat
# timeout (HB2). The bound of WATCH_S only tells the watch from those two.
HB2=14 STEP2=20 WATCH_S=8
watch_on() {
  local rank=()
  [ "$1" -eq 0 ] && rank=(--node-rank 0)
  netns_agent "$1" "$tmp/w$1" --nnodes 2:3 "${rank[@]}" --master "$M:29501" --job pw \
    --heartbeat-timeout $HB2 --on-failure reform --no-python /usr/bin/python3 \
    "$src/examples/reform_ddp.py" --steps 2 --step-time $STEP2
  agent[$1]=$!
}
for i in 0 1 2; do watch_on "$i"; done
for i in 0 1 2; do check "watch: node $i trains" wait_re "$tmp/w$i" "\] step=1 " 120 || exit 1; done
sleep 2 # well inside step 2's body: its collectives are done, the sleep is not
# The node dies whole: killed one by one, its agent's guard could publish "its agent died"
# first, a fast path of its own, and the re-form would not go through the watch.
netns_crash 2
wait "${agent[2]}" 2>/dev/null
check "watch: the agents re-form within $WATCH_S s (step $STEP2 s, heartbeat timeout $HB2 s)" \
  wait_re "$tmp/w0" "re-forming without stopping the survivors: node [0-9] .*lost a peer" $WATCH_S
told=$(cat "$tmp/w0" "$tmp/w1" | grep -c "a peer's connection closed during the step")
check "watch: a survivor's worker told its agent that a peer's connection closed ($told)" \
  [ "$told" -ge 1 ]
wait_all 120 "${agent[0]}" "${agent[1]}"
check "watch: the two survivors finish ($codes)" [ "$codes" = "0 0" ]
check "watch: node 0's worker ends at world 2" contains "$tmp/w0" "] done step=2 rank=0 world=2 "

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

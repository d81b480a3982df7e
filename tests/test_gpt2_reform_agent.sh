#!/usr/bin/env bash
# test_gpt2_reform_agent.sh - cohort-gpt2 under the real agent with
# `cohort run --on-failure reform` (docs/reform.md, docs/gpt2.md "Re-form").
#
# Three ranks on this host train; once 20 steps are done, rank 1 (found by
# its RANK in /proc/PID/environ among the agent's children) is killed with
# SIGKILL. The agent starts a replacement in its slot (COHORT_NEWCOMER=1);
# the survivors keep their processes: rank 0 prints its re-form line while
# ranks 0 and 2 are the same PIDs as before the kill. The replacement, rank 1
# between the survivors, catches up in the background while ranks 0 and 2
# train. The job ends with exit 0, rank 0's summary, and a metrics file with
# every step exactly once (none recomputed, none skipped), at world 3 but the
# steps the survivors trained alone while it caught up (world 2), which follow
# the re-form.
# Usage: test_gpt2_reform_agent.sh COHORT COHORT-GPT2
set -u
COHORT=$1
GPT2=$2
. "$(dirname "$0")/check_lib.sh"
tmp=$(mktemp -d /tmp/test_gpt2_reform_agent.XXXXXX)
STEPS=400
AGENT=
cleanup() {
  [ -n "$AGENT" ] && kill -9 "$AGENT" 2>/dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

# The agent's child whose environment says RANK=$1.
rank_pid() {
  local p
  for p in $(pgrep -P "$AGENT"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$1"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

steps_done() { [ -s "$tmp/m.jsonl" ] && wc -l <"$tmp/m.jsonl" || echo 0; }

OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive "$COHORT" run --nproc-per-node 3 --on-failure reform \
  --log-dir "$tmp/logs" -- "$GPT2" --model tiny --seq-len 32 --batch 2 --steps $STEPS \
  --data /usr/share/common-licenses/GPL-3 --quiet --metrics "$tmp/m.jsonl" \
  >"$tmp/run.out" 2>"$tmp/run.err" &
AGENT=$!
for _ in $(seq 600); do
  [ "$(steps_done)" -ge 20 ] && break
  sleep 0.1
done
R0=$(rank_pid 0)
R1=$(rank_pid 1)
R2=$(rank_pid 2)
check "three ranks found among the agent's children" test -n "$R0" -a -n "$R1" -a -n "$R2"
check "20 steps done before the kill" test "$(steps_done)" -ge 20
kill -9 "$R1"
LOG0=$tmp/logs/attempt0/rank0.log
for _ in $(seq 600); do
  grep -q "re-formed (epoch 1)" "$LOG0" 2>/dev/null && break
  sleep 0.1
done
# The bytes moved: the state's head (56), the parameters and AdamW's m and v (3 x 136960 floats)
# and the last step's report that travels with them (136). The replacement is rank 1, below a rank
# with state, and catches up in the background all the same (before, the state came at the join);
# when the loss caught a survivor a step behind, the state comes at the join, to both
# (docs/gpt2.md "Catching up", item 1).
check "rank 0 says it re-formed 3 -> 3 and the new rank catches up" \
  grep -qE "re-formed \(epoch 1\): world 3 -> 3 at step [0-9]* \(step in flight [a-z]*\), (1 rank\(s\) catching up: 1643712 bytes|2 rank\(s\) received 1643712 bytes)" "$LOG0"
check "rank 0 kept its process" kill -0 "$R0"
check "rank 2 kept its process" kill -0 "$R2"
timeout 300 tail --pid="$AGENT" -f /dev/null
wait "$AGENT"
status=$?
AGENT=
check "the job ends with exit 0" test "$status" -eq 0
check "the agent re-formed without stopping the survivors" \
  contains "$tmp/run.err" "re-forming without stopping the survivors"
check "the replacement has its log" test -e "$tmp/logs/attempt0/rank1.round1.log"
check "the replacement received as many bytes" \
  grep -qE "caught up: snapshot of step [0-9]* \(1643712 bytes\) in|state 1643712 bytes" \
  "$tmp/logs/attempt0/rank1.round1.log"
if grep -q "1 rank(s) catching up" "$LOG0"; then
  check "rank 0 says rank 1 caught up" grep -qE "rank\(s\) 1-1 caught up: received 1643712 bytes" "$LOG0"
fi
check "rank 0's summary (the same process that started)" contains "$LOG0" "summary: "
check "every step once, at world 3 but one run of world 2" /usr/bin/python3 - "$tmp/m.jsonl" $STEPS <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step"] for r in rows]
worlds = "".join(str(r["world"]) for r in rows)
ok = steps == list(range(1, int(sys.argv[2]) + 1)) and worlds.strip("3").strip("2") == ""
ok = ok and worlds.startswith("3") and worlds.endswith("3")
if not ok:
    print("steps", steps[:5], "...", len(steps), "worlds", worlds)
sys.exit(0 if ok else 1)
EOF
if [ "$failed" -ne 0 ]; then
  tail -n 5 "$tmp/run.err" "$LOG0"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

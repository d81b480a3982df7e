#!/usr/bin/env bash
# `cohort status`, `stacks` and `stop` from outside a running job: a 3-node job (2 ranks each) in
# network namespaces this test creates and removes, queried from a fourth.
# usage: test_status.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(readlink -f "$2")
. "$src/tests/netns_lib.sh"
. "$src/tests/check_lib.sh"
tmp=$(mktemp -d /tmp/cohort-status-XXXXXX)
pids=()
cleanup() {
  netns_down
  rm -rf "$tmp"
}
trap cleanup EXIT

netns_up 4 || { echo "cannot create network namespaces"; exit 1; }
M=$(netns_addr 0)
export COHORT_TOKEN=status-test-token
# Each rank writes its progress file once with step RANK+10 (--hang-timeout gives
# the file); rank 5 says goodbye and exits 0 after a while; the others sleep.
WORK='echo "up $RANK"; echo $((RANK + 10)) >"$COHORT_PROGRESS"
if [ "$RANK" = 5 ]; then sleep 3; exit 0; fi; exec sleep 60'
for i in 0 1 2; do
  netns_agent "$i" "$tmp/a$i" --nnodes 3 --node-rank "$i" --master "$M:29500" --nproc-per-node 2 \
    --heartbeat-timeout 5 --max-restarts 2 --hang-timeout 120 -- sh -c "$WORK"
  eval "a$i=\$!"
done
status() { netns_exec 3 "$cohort" status --master "$M:29500" "$@"; }

# 1. six running ranks, with their pids and plausible ages (polled: the job starts under load).
for _ in $(seq 1 40); do
  status >"$tmp/st1" 2>&1
  [ "$(grep -Ec ' running .* 1[0-5] +[0-9.]+s ' "$tmp/st1")" = 6 ] && break
  sleep 0.25
done
check "status lists 6 running ranks" [ "$(grep -c ' running ' "$tmp/st1")" = 6 ]
check "the job line counts 3 of 3 nodes" contains "$tmp/st1" "3 of 3 nodes joined, round 0, running"
check "every node is listed by host" eval 'contains "$tmp/st1" "host node0" && contains "$tmp/st1" "host node1" && contains "$tmp/st1" "host node2"'
# Each listed pid is a live rank (namespaces share the pid space); uptime under 60 s.
ok=1
while read -r rank local pid state up rest; do
  # The rank's process: its shell, or the sleep it became.
  case "$(cat /proc/"$pid"/comm 2>/dev/null)" in sh | sleep) ;; *) ok=0 ;; esac
  case $up in *s) ;; *) ok=0 ;; esac
  [ "${up%%.*}" -lt 60 ] 2>/dev/null || ok=0
done < <(grep ' running ' "$tmp/st1" | sed 's/<//')
check "listed pids are the ranks' processes, ages plausible" [ $ok = 1 ]
check "each rank shows its progress step and the beat's age" grep -Eq '^ +3 +1 +[0-9]+ +running +[0-9.]+s +[0-9.]+s +13 +[0-9.]+s ' "$tmp/st1"
check "the rank with the lowest step is marked furthest behind" grep -Eq '^ +0 +0 .* <$' "$tmp/st1"

# 2. --json validates against the schema.
status --json >"$tmp/js" 2>"$tmp/js.err"
check "--json exits 0" [ $? = 0 ]
check "--json validates (docs/status.schema.json)" python3 "$src/tests/test_status.py" schema \
  "$src/docs/status.schema.json" "$tmp/js" 6

# 3. --watch redraws in place on a terminal.
netns_exec 3 python3 "$src/tests/test_status.py" watch 2.5 "$cohort" status --master "$M:29500" \
  --watch 0.5 >"$tmp/watch"
frames=$(head -1 "$tmp/watch")
check "--watch redrew several frames ($frames)" [ "${frames:-0}" -ge 2 ]
check "--watch frames hold the table" contains "$tmp/watch" "3 of 3 nodes joined"
check "--watch marks the rank furthest behind" grep -q ' <$' "$tmp/watch"

# 4. a rank that exits shows its code.
for _ in $(seq 1 40); do
  status >"$tmp/st2" 2>&1
  grep -q ' exited 0 ' "$tmp/st2" && break
  sleep 0.25
done
check "the rank that exited shows its code" grep -Eq '^ +5 +1 +[0-9]+ +exited 0 ' "$tmp/st2"

# 5. a wrong token is refused in one line; an unknown job ends within its timeout.
netns_exec 3 "$cohort" status --master "$M:29500" --token wrong >"$tmp/tok" 2>&1
rc=$?
check "wrong token: non-zero exit ($rc)" [ $rc = 1 ]
check "wrong token: one line naming the token" eval '[ "$(wc -l <"$tmp/tok")" = 1 ] && contains "$tmp/tok" "refused the token"'
start=$SECONDS
status --job nosuch --timeout 1 >"$tmp/unk" 2>&1
rc=$?
check "unknown job: exit 1 ($rc)" [ $rc = 1 ]
check "unknown job: one line" eval '[ "$(wc -l <"$tmp/unk")" = 1 ] && contains "$tmp/unk" "no job nosuch"'
check "unknown job: within its timeout (1 s; bound 10 s)" [ $((SECONDS - start)) -le 10 ]
netns_exec 3 "$cohort" status --master "$(netns_addr 2):29599" --timeout 1 >"$tmp/none" 2>&1
rc=$?
check "no store there: exit 1 in one line ($rc)" eval '[ $rc = 1 ] && [ "$(wc -l <"$tmp/none")" = 1 ]'

# 6. cohort stacks: every running rank's stack, grouped by place, and the job goes on.
netns_exec 3 "$cohort" stacks --master "$M:29500" >"$tmp/stacks" 2>"$tmp/stacks.err"
rc=$?
check "stacks exits 0 ($rc)" [ $rc = 0 ]
check "stacks: a section for each of the 5 running ranks" [ "$(grep -c '^== rank [0-4], node [0-2] (node[0-2]), pid [0-9]*, ' "$tmp/stacks")" = 5 ]
check "stacks: every stack is in the sleep" [ "$(grep -c '^#[0-9].*nanosleep' "$tmp/stacks")" -ge 5 ]
check "stacks: one line per place first" grep -Eq '^ranks 0-4 in .*nanosleep' "$tmp/stacks"
status >"$tmp/st3" 2>&1
check "the job still runs after stacks" [ "$(grep -c ' running ' "$tmp/st3")" = 5 ]

# 7. cohort stop: every node ends (no restart tried, exit 4), each printing who and why; while
# node 2's agent is SIGSTOPped, the stop is published but not acknowledged: exit 1, not 0;
# once it continues, the stop is acknowledged by every node: exit 0.
netns_exec 3 "$cohort" stop --master "$M:29500" --job nosuch --timeout 1 >"$tmp/stopunk" 2>&1
rc=$?
check "stop of an unknown job: exit 1 in one line ($rc)" eval '[ $rc = 1 ] && [ "$(wc -l <"$tmp/stopunk")" = 1 ]'
# Node 2's agent itself (its guard is a cohort too, the agent's child).
agent2=
for p in $(ip netns pids "$(netns_node 2)"); do
  [ "$(cat /proc/$p/comm 2>/dev/null)" = cohort ] || continue
  pp=$(awk '{print $4}' /proc/$p/stat 2>/dev/null)
  [ "$(cat /proc/$pp/comm 2>/dev/null)" = cohort ] || agent2=$p
done
start=$SECONDS
kill -STOP $agent2
netns_exec 3 "$cohort" stop --master "$M:29500" --reason "maintenance window" --timeout 1 \
  >"$tmp/stop0" 2>&1
rc=$?
kill -CONT $agent2
check "stop with node 2 frozen: exit 1, node 2 named ($rc)" \
  eval '[ $rc = 1 ] && grep -q "node 2 has not acknowledged" "$tmp/stop0"'
netns_exec 3 "$cohort" stop --master "$M:29500" --reason "maintenance window" >"$tmp/stop" 2>&1
rc=$?
check "stop exits 0 once every node acknowledged ($rc)" [ $rc = 0 ]
wait_all 15 $a0 $a1 $a2
check "every agent exits with the stopped status 4 ($codes)" [ "$codes" = "4 4 4" ]
check "the nodes stopped within 5 s ($((SECONDS - start)) s)" [ $((SECONDS - start)) -le 5 ]
for i in 0 1 2; do
  check "node $i prints who stopped it and why" contains "$tmp/a$i" "cohort: stopped by $(id -un)@node3: maintenance window"
  check "node $i tries no restart" not_contains "$tmp/a$i" "restarting"
done
# 8. a job of one machine alone: found through its user's directory, stacks too; stopped like
# any other (exit 4), but not while its agent (and store) is SIGSTOPped: exit 1, not 0.
xdg="$tmp/xdg"
mkdir -m 700 "$xdg"
solo_env() { XDG_RUNTIME_DIR=$xdg env -u COHORT_TOKEN "$@"; }
XDG_RUNTIME_DIR=$xdg env -u COHORT_TOKEN "$cohort" run --run-id solo --nproc-per-node 2 -- sh -c 'echo up; exec sleep 30' >"$tmp/solo" 2>&1 &
solo=$!
pids+=($solo)
for _ in $(seq 1 40); do
  solo_env "$cohort" status >"$tmp/so1" 2>&1
  [ "$(grep -c ' running ' "$tmp/so1")" = 2 ] && break
  sleep 0.25
done
check "one machine alone: status without options lists its 2 ranks" [ "$(grep -c ' running ' "$tmp/so1")" = 2 ]
check "one machine alone: the job line" contains "$tmp/so1" "job solo: 1 of 1 nodes joined, round 0, running"
solo_env "$cohort" stacks >"$tmp/so2" 2>&1
check "one machine alone: stacks of both ranks" [ "$(grep -c '^== rank [01], node 0' "$tmp/so2")" = 2 ]
solo_env "$cohort" status --job other >"$tmp/so4" 2>&1
rc=$?
check "one machine alone: an unknown job in one line ($rc)" eval '[ $rc = 1 ] && [ "$(wc -l <"$tmp/so4")" = 1 ]'
kill -STOP $solo
solo_env "$cohort" stop --reason frozen --timeout 2 >"$tmp/so3" 2>&1
rc=$?
kill -CONT $solo
check "one machine alone, agent SIGSTOPped: stop exits 1 in one line ($rc)" \
  eval '[ $rc = 1 ] && [ "$(wc -l <"$tmp/so3")" = 1 ]'
solo_env "$cohort" stop --reason "one machine" >"$tmp/so6" 2>&1
rc=$?
check "one machine alone: stop exits 0 ($rc)" [ $rc = 0 ]
wait_all 10 $solo
check "one machine alone: its agent exits 4 ($codes)" [ "$codes" = 4 ]
check "one machine alone: the agent prints who stopped it and why" \
  contains "$tmp/solo" "cohort: stopped by $(id -un)@$(hostname): one machine"
check "one machine alone: the job's file is gone with it" [ -z "$(ls "$xdg/cohort")" ]

echo "$passed passed, $failed failed"
[ $failed = 0 ]

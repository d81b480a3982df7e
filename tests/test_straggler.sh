#!/usr/bin/env bash
# `cohort run --straggler-factor`: ranks that write step numbers to their
# progress file ($COHORT_PROGRESS), one of them four times slower per step
# (sleep 0.4 s against 0.1 s), all running for the same few seconds:
#   one node of 4 ranks: node 0 reports the slow rank once, with its node and
#   factor; an even job reports nothing; --straggler-factor 0 reports
#   nothing; two agents on loopback (2 x 2 ranks), the slow rank on node 1:
#   node 0 reports it naming node 1, node 1 prints no report; the worker
#   gets COHORT_PROGRESS without --hang-timeout, but not the stack hooks,
#   and none of it with the factor 0; bad values: one line, exit 2.
# usage: test_straggler.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(cd "$2" && pwd)
. "$src/tests/check_lib.sh"
tmp=$(mktemp -d /tmp/cohort-straggler-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/steps.sh" <<'SH'
d=0.1; [ "$RANK" = "$SLOW" ] && d=0.4
end=$(( $(date +%s) + 6 )); s=0
while [ "$(date +%s)" -lt "$end" ]; do sleep $d; s=$((s + 1)); echo $s > "$COHORT_PROGRESS"; done
SH
reports() { grep -c "straggler:" "$1"; } # reports FILE: how many straggler lines FILE holds

SLOW=2 "$cohort" run --nproc-per-node 4 --no-python sh "$tmp/steps.sh" >"$tmp/one.out" 2>&1
check "one node, rank 2 slow: the job ends well" [ $? = 0 ]
check "... rank 2 is reported on node 0" grep -q "straggler: rank 2 (node 0, host .*) takes [0-9.]*x the other ranks' median step time" "$tmp/one.out"
check "... once" [ "$(reports "$tmp/one.out")" = 1 ]

SLOW=none "$cohort" run --nproc-per-node 4 --no-python sh "$tmp/steps.sh" >"$tmp/even.out" 2>&1
check "an even job: no straggler" [ "$(reports "$tmp/even.out")" = 0 ]

SLOW=2 "$cohort" run --straggler-factor 0 --nproc-per-node 4 --no-python sh "$tmp/steps.sh" >"$tmp/off.out" 2>&1
check "--straggler-factor 0: nothing reported" [ "$(reports "$tmp/off.out")" = 0 ]

# Two nodes on loopback: node 0 hosts the store at --master.
port=$(free_port)
M=(--nnodes 2 --master "127.0.0.1:$port" --token "t-$$" --nproc-per-node 2)
SLOW=3 "$cohort" run "${M[@]}" --node-rank 1 --no-python sh "$tmp/steps.sh" >"$tmp/n1.out" 2>&1 &
n1=$!
SLOW=3 "$cohort" run "${M[@]}" --node-rank 0 --no-python sh "$tmp/steps.sh" >"$tmp/n0.out" 2>&1
rc0=$?
wait "$n1"
rc1=$?
check "two nodes: both end well (got $rc0 $rc1)" [ "$rc0 $rc1" = "0 0" ]
check "... node 0 reports rank 3 on node 1" grep -q "straggler: rank 3 (node 1, host .*) takes" "$tmp/n0.out"
check "... once" [ "$(reports "$tmp/n0.out")" = 1 ]
check "... node 1 reports nothing" [ "$(reports "$tmp/n1.out")" = 0 ]

env_of() {
  "$cohort" run "$@" --no-python sh -c \
    'echo "p=${COHORT_PROGRESS:-none} hb=${COHORT_HEARTBEAT:-none} pp=${PYTHONPATH:-none}"' 2>/dev/null
}
check "the progress file without --hang-timeout" env_of | grep -q "p=/.*/progress-0 hb=/.*/progress-0 pp=none"
check "... also as COHORT_HEARTBEAT, its earlier name" env_of | grep -Eq "p=([^ ]+) hb=\1 "
check "... none with --straggler-factor 0" env_of --straggler-factor 0 | grep -q "p=none hb=none pp=none"
check "... and the stack hooks with --hang-timeout" env_of --hang-timeout 60 | grep -q "p=/.*/progress-0 hb=/.*/progress-0 pp=/"

for bad in abc -1 0.5 1 2000 nan; do
  "$cohort" run --straggler-factor "$bad" --no-python true >"$tmp/bad.out" 2>&1
  rc=$?
  check "--straggler-factor $bad: exit 2 (got $rc)" [ $rc = 2 ]
  check "... one line" [ "$(wc -l <"$tmp/bad.out")" = 1 ]
done

if [ "$failed" -gt 0 ]; then for f in "$tmp"/*.out; do echo "--- $f"; tail -n 5 "$f"; done; fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

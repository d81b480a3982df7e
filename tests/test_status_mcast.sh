#!/usr/bin/env bash
# `cohort status`, `stacks` and `stop --discover mcast --job ID`: a 3-node
# job (2 ranks each) whose agents found each other by UDP multicast, in
# network namespaces on a bridge this test creates and removes, queried from
# a fourth namespace that knows only the job id and the token: status lists
# the six ranks, stacks answers, a wrong token and an unknown job get one
# line, and stop ends every node (stopped status 4, the reason printed); the
# time from the stop command's start to the last agent's exit is printed and
# held under 5 s.
# usage: test_status_mcast.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(readlink -f "$2")
. "$src/tests/netns_lib.sh"
. "$src/tests/check_lib.sh"
tmp=$(mktemp -d /tmp/cohort-status-mcast-XXXXXX)
pids=()
cleanup() {
  netns_down
  rm -rf "$tmp"
}
trap cleanup EXIT
netns_up 4 || { echo "cannot create network namespaces"; exit 1; }
export COHORT_TOKEN=status-mcast-token
J=(--discover mcast --job mjob)
for i in 0 1 2; do
  netns_agent "$i" "$tmp/a$i" "${J[@]}" --nnodes 3 --nproc-per-node 2 --net off \
    -- sh -c 'echo "up $RANK"; exec sleep 60'
  eval "a$i=\$!"
done
q() { netns_exec 3 "$cohort" "$@"; }

for _ in $(seq 1 60); do
  q status "${J[@]}" >"$tmp/st" 2>&1
  [ "$(grep -c ' running ' "$tmp/st")" = 6 ] && break
  sleep 0.25
done
check "status by multicast lists 6 running ranks" [ "$(grep -c ' running ' "$tmp/st")" = 6 ]
check "... and the job line" contains "$tmp/st" "job mjob: 3 of 3 nodes joined, round 0, running"
q stacks "${J[@]}" >"$tmp/stacks" 2>&1
check "stacks by multicast: every rank" [ "$(grep -c '^== rank [0-5], node [0-2]' "$tmp/stacks")" = 6 ]
q status "${J[@]}" --token wrong --timeout 2 >"$tmp/tok" 2>&1
rc=$?
check "a wrong token: exit 1 in one line ($rc)" eval '[ $rc = 1 ] && [ "$(wc -l <"$tmp/tok")" = 1 ]'
start=$SECONDS
q status --discover mcast --job other --timeout 1 >"$tmp/unk" 2>&1
rc=$?
check "an unknown job: exit 1 in one line ($rc)" eval '[ $rc = 1 ] && [ "$(wc -l <"$tmp/unk")" = 1 ]'
check "... within its timeout (1 s; bound 10 s)" [ $((SECONDS - start)) -le 10 ]
q status --discover mcast >"$tmp/nojob" 2>&1
check "--discover mcast without --job: exit 2" [ $? = 2 ]

stop_checked "$tmp/stop" "cohort: stopped by $(id -un)@node3: by multicast" "$a0 $a1 $a2" \
  q stop "${J[@]}" --reason "by multicast"

if [ "$failed" -gt 0 ]; then for f in "$tmp"/a* "$tmp"/st "$tmp"/stop; do echo "--- $f"; tail -n 5 "$f"; done; fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

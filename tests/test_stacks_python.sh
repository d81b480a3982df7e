#!/usr/bin/env bash
# `cohort stacks` shows a Python rank's Python frames by default, without
# --hang-timeout (issue 34, item 4): the function the rank waits in, by name.
# usage: test_stacks_python.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(cd "$2" && pwd)
. "$src/tests/check_lib.sh"
tmp=$(mktemp -d /tmp/cohort-pystacks-XXXXXX)
mkdir -m 700 "$tmp/xdg"
export XDG_RUNTIME_DIR=$tmp/xdg
unset COHORT_TOKEN
printf 'import time\ndef waiting_here():\n    time.sleep(60)\nprint("up", flush=True)\nwaiting_here()\n' >"$tmp/w.py"
"$cohort" run --nproc-per-node 1 -- /usr/bin/python3 "$tmp/w.py" >"$tmp/run" 2>&1 &
agent=$!
trap 'kill -9 $agent 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do grep -q up "$tmp/run" 2>/dev/null && break; sleep 0.1; done
"$cohort" stacks >"$tmp/stacks" 2>&1
check "stacks: exit 0 (got $?)" [ $? = 0 ] 
check "stacks: the Python function the rank waits in" grep -q "waiting_here" "$tmp/stacks"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] || { cat "$tmp/stacks"; exit 1; }

#!/usr/bin/env bash
# `cohort stacks` shows a Python rank's Python frames by default, without
# --hang-timeout (issue 34, item 4): the function the rank waits in, by name.
# With the hook off (--straggler-factor 0, no --hang-timeout) it says so in
# one line instead of showing only C frames silently.
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
agent=
trap 'kill -9 $agent 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
# stacks_of NAME AGENT-ARGS...: runs the script under an agent, then `cohort stacks`
# into $tmp/NAME (its status in $tmp/NAME.rc); stops the agent.
stacks_of() {
  local name=$1
  shift
  "$cohort" run "$@" --nproc-per-node 1 -- /usr/bin/python3 "$tmp/w.py" >"$tmp/$name.run" 2>&1 &
  agent=$!
  for _ in $(seq 100); do grep -q up "$tmp/$name.run" 2>/dev/null && break; sleep 0.1; done
  "$cohort" stacks >"$tmp/$name" 2>&1
  echo $? >"$tmp/$name.rc"
  kill -TERM "$agent" 2>/dev/null
  wait "$agent" 2>/dev/null
  agent=
}
stacks_of on
check "stacks: exit 0 (got $(cat "$tmp/on.rc"))" [ "$(cat "$tmp/on.rc")" = 0 ]
check "stacks: the Python function the rank waits in" grep -q "waiting_here" "$tmp/on"
check "stacks: no 'no Python frames' note with the hook on" not_contains "$tmp/on" "no Python frames"
stacks_of off --straggler-factor 0
check "hook off: stacks exit 0 (got $(cat "$tmp/off.rc"))" [ "$(cat "$tmp/off.rc")" = 0 ]
check "hook off: one line says why there are no Python frames" \
  contains "$tmp/off" "(no Python frames for this rank: the agent's Python stack hook is off (--straggler-factor 0 and no --hang-timeout))"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] || { cat "$tmp/on" "$tmp/off"; exit 1; }

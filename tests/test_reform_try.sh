#!/usr/bin/env bash
# docs/reform.md's "Try it on one machine", run as a new user runs it: its
# shell blocks, taken from the page itself (only the port made free and the
# steps fewer), on loopback. cohort-gpt2 then the PyTorch example: three
# agents, node 2's agent and worker killed with the PIDs `cohort status`
# shows, the survivors re-form in their processes at world 2, the same
# `node 2` started again joins at world 3, and the run ends well. A page
# whose commands no longer work (a flag renamed, a step left out) fails here.
# usage: test_reform_try.sh COHORT COHORT-GPT2 SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
gpt2=$(readlink -f "$2")
src=$(readlink -f "$3")
tmp=$(mktemp -d /tmp/cohort-reform-try-XXXXXX)
. "$src/tests/check_lib.sh"
cleanup() {
  local p
  for p in $(jobs -p); do # each a subshell running node(): its agent, then itself
    # shellcheck disable=SC2046 # one word per PID
    kill $(ps -o pid= --ppid "$p") "$p" 2>/dev/null
  done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
PATH=$(dirname "$cohort"):$(dirname "$gpt2"):$PATH
ln -s "$src/examples" "$tmp/examples" # the PyTorch block names examples/ from the repository's root

# block N [STEPS]: the page's Nth ```sh block of the section, the port free, STEPS steps (300).
port=$(free_port)
block() {
  /usr/bin/python3 - "$src/docs/reform.md" "$1" "$port" "${2:-300}" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
sec = text.split("## Try it on one machine", 1)[1].split("\n## ", 1)[0]
code = re.findall(r"```sh\n(.*?)```", sec, re.S)[int(sys.argv[2])]
code = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:" + sys.argv[3], code)
print(re.sub(r"--steps \d+", "--steps " + sys.argv[4], code))
EOF
}

# pids_of NODE FILE: the agent's and the worker's PIDs of NODE in `cohort status` output FILE.
pids_of() {
  awk -v n="$1" '$1 == "node" { on = ($2 == n) } on && $1 == "node" { a = $6 }
    on && / running / { print a, $3; exit }' "$2"
}

# try NAME N: block 0 (token, node(), three nodes, cohort status), with block N's node() (the
# PyTorch one) when N > 0; node 2 lost and started again. The PyTorch run has 600 steps of
# 0.05 s: its replacement imports torch (seconds on a loaded machine) and must join before the
# survivors finish.
try() {
  local name=$1 b
  mkdir -p "$tmp/$name"
  cd "$tmp/$name" || return
  local more=""
  if ! b=$(block 0) || { [ "$2" != 0 ] && ! more=$(block "$2" 600); }; then
    check "$name: docs/reform.md has the section's blocks" false
    return
  fi
  # The PyTorch block's node() instead of the first block's.
  [ -z "$more" ] || b=$more$'\n'$(sed '/^node() {  # node R/,/^}/d' <<<"$b")
  ln -sfn "$tmp/examples" examples
  eval "$b" >status1 2>&1
  local end=$((SECONDS + 60))
  while [ "$(grep -c ' running ' status1)" != 3 ] && [ $SECONDS -lt $end ]; do
    sleep 0.2
    cohort status --master "127.0.0.1:$port" >status1 2>&1
  done
  local ap wp
  read -r ap wp <<<"$(pids_of 2 status1)"
  check "$name: cohort status shows node 2's agent and worker ($ap, $wp)" \
    test -n "$ap" -a -n "$wp" || return
  local p0
  read -r _ p0 <<<"$(pids_of 0 status1)"
  kill -9 "$ap" "$wp"
  check "$name: the survivors re-form at world 2" wait_line node0.log "nodes 3 -> 2, world 3 -> 2"
  mv node2.log node2.lost.log
  node 2 &
  check "$name: the replacement joins at world 3" wait_line node0.log "nodes 2 -> 3, world 2 -> 3"
  check "$name: ... its worker started ahead" wait_line node2.log "the workers started ahead joined"
  check "$name: rank 0 kept its process ($p0)" kill -0 "$p0"
  wait
  check "$name: node 0's agent ended well" not grep -q "job failed" node0.log
  cd "$tmp" || return
}

# wait_line FILE TEXT: until FILE holds TEXT (60 s).
wait_line() {
  for _ in $(seq 300); do
    grep -qF -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}

try gpt2 0
check "gpt2: rank 0 ended the run" grep -q "summary: 300 steps" "$tmp/gpt2/node0.log"
try torch 1
check "torch: rank 0 ended the run" grep -q "done step=600 rank=0 world=3" "$tmp/torch/node0.log"

if [ "$failed" -ne 0 ]; then # what a rare failure needs to be understood
  for f in "$tmp"/*/node*.log; do
    echo "== ${f#"$tmp"/} (last lines)"
    tail -n 12 "$f"
  done
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

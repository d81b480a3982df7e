#!/usr/bin/env bash
# Every exit status of `cohort run`, each brought about for real, and the
# one table of them the same in the README, `cohort run --help` and the man
# page (issue 34 item 5, issue 30 items 4 and 13); `cohort status`, `stop`
# and `stacks` with no job exit 1, as their help says. Loopback only.
# usage: test_exit_status.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(cd "$2" && pwd)
. "$src/tests/check_lib.sh"
tmp=$(mktemp -d /tmp/cohort-exit-XXXXXX)
mkdir -m 700 "$tmp/xdg"
export XDG_RUNTIME_DIR=$tmp/xdg # this test's one-machine jobs alone
unset COHORT_TOKEN COHORT_REQUIRE_TOKEN
bg=()
trap 'for p in "${bg[@]}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp"' EXIT

# A free loopback port (each use takes a new one).
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# expect STATUS WHAT ARGS...: `cohort ARGS` exits STATUS.
expect() {
  local want=$1 what=$2
  shift 2
  timeout 60 "$cohort" "$@" >"$tmp/out" 2>&1
  local rc=$?
  check "$what: exit $want (got $rc)" [ "$rc" = "$want" ] || tail -3 "$tmp/out"
}

expect 0 "every worker succeeded" run -- true
expect 1 "a worker failed" run -- false
expect 2 "usage error" run --no-such-flag -- true
expect 2 "a required token missing" run --require-token --nnodes 2 --node-rank 1 \
  --master "127.0.0.1:$(port)" --join-timeout 2 -- true
p=$(port)
python3 -c "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', $p)); s.listen()
open(sys.argv[1], 'w').close(); time.sleep(60)" "$tmp/taken" &
bg+=($!)
for _ in $(seq 100); do [ -e "$tmp/taken" ] && break; sleep 0.1; done
expect 3 "internal error (the store's port is taken)" run --nnodes 2 --node-rank 0 \
  --master "127.0.0.1:$p" --join-timeout 2 -- true

"$cohort" run --nproc-per-node 1 -- sleep 30 >"$tmp/stopped" 2>&1 &
agent=$!
bg+=($agent)
for _ in $(seq 100); do "$cohort" status >/dev/null 2>&1 && break; sleep 0.1; done
"$cohort" stop --reason exit-test >/dev/null 2>&1
wait "$agent"
rc=$?
check "stopped by cohort stop: exit 4 (got $rc)" [ "$rc" = 4 ]

expect 5 "hung" run --hang-timeout 1 -- sh -c 'echo up; sleep 30'

p=$(port)
expect 6 "rendezvous: node 0 alone until --join-timeout" run --nnodes 2 --node-rank 0 \
  --master "127.0.0.1:$p" --join-timeout 2 -- true
expect 6 "rendezvous: no node 0 (joiner)" run --nnodes 2 --node-rank 1 \
  --master "127.0.0.1:$(port)" --join-timeout 2 -- true
p=$(port)
# 10 s: under ASan at a load of 26, 4 s ran out before the poller below connected.
"$cohort" run --nnodes 2 --node-rank 0 --master "127.0.0.1:$p" --token right \
  --join-timeout 10 -- true >"$tmp/host" 2>&1 &
host=$!
bg+=($host)
# Once node 0's store listens (a fixed sleep let a slow start turn this into
# "connection refused", the same exit status for another reason).
python3 -c "import socket, sys, time
for _ in range(600):
    try:
        socket.create_connection(('127.0.0.1', $p), 1).close(); sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(1)"
check "rendezvous: node 0's store listens" [ $? = 0 ]
expect 6 "rendezvous: a wrong token (joiner)" run --nnodes 2 --node-rank 1 \
  --master "127.0.0.1:$p" --token wrong --join-timeout 2 -- true
check "rendezvous: the joiner was refused for its token" grep -q "refused our token" "$tmp/out"
wait "$host"
rc=$?
check "rendezvous: its node 0, alone until --join-timeout: exit 6 (got $rc)" [ "$rc" = 6 ]

printf 'echo hi\n' >"$tmp/noexec"
chmod 644 "$tmp/noexec"
expect 126 "command not executable" run -- "$tmp/noexec"
expect 127 "command not found" run -- "$tmp/no-such-command"

"$cohort" run --nproc-per-node 1 -- sleep 30 >"$tmp/term" 2>&1 &
agent=$!
bg+=($agent)
for _ in $(seq 100); do grep -q . "$tmp/xdg/cohort/"* 2>/dev/null && break; sleep 0.1; done
kill -TERM "$agent"
wait "$agent"
rc=$?
check "stopped by signal 15: exit 143 (got $rc)" [ "$rc" = 143 ]

for cmd in status stop stacks; do
  expect 1 "$cmd with no job" "$cmd" --timeout 1
done

# The one table: the statuses README, --help and man page list, the same.
statuses="0 1 2 3 4 5 6 126 127 128+N"
readme=$(sed -n '/^- Exit status/,/^  `cohort status`/p' "$src/README.md" |
  grep -oE '^  \| [0-9N+]+ \|' | tr -d '| ' | xargs)
help=$("$cohort" run --help | sed -n '/^exit status:/,$p' | grep -oE '^  [0-9N+]+ ' | xargs)
man=$(sed -n '/^.B cohort run/,/^.PP/p' "$src/docs/man/cohort.1" | grep -A1 '^.TP' |
  grep -oE '^.B [0-9N+]+$' | cut -c4- | xargs)
check "README lists every status ($readme)" [ "$readme" = "$statuses" ]
check "cohort run --help lists every status ($help)" [ "$help" = "$statuses" ]
check "the man page lists every status ($man)" [ "$man" = "$statuses" ]

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# No descendant of a worker outlives its job (issue 34, item 2), whatever
# it does to leave: its own session (setsid), a double fork, nohup, its own
# process group. Each of the four records its pid and sleeps; then:
#  1. the worker exits 3: the agent exits 1, and none of the four is left;
#  2. the worker exits 0: the same with exit 0;
#  3. the agent is SIGKILLed: none of the four is left (the guard kills the
#     job's cgroup), and the cgroup is removed;
#  4. an agent run by an unprivileged user (no cgroup of its own): case 1
#     again, by the agent's walk of its descendants alone.
# Needs root (cgroups, setpriv). usage: test_orphans.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(cd "$2" && pwd)
. "$src/tests/check_lib.sh"
tmp=$(mktemp -d /tmp/cohort-orphans-XXXXXX)
chmod 755 "$tmp"
agent=
cleanup() {
  [ -n "$agent" ] && kill -9 "$agent" 2>/dev/null
  for f in "$tmp"/*/pid-*; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# The worker: four escapees, each writing its pid to DIR/pid-<route>.
cat >"$tmp/worker.sh" <<'SH'
d=$1 code=$2
setsid sh -c "echo \$\$ > $d/pid-setsid; exec sleep 300" &
( sh -c "echo \$\$ > $d/pid-double; exec sleep 300" & )
nohup sh -c "echo \$\$ > $d/pid-nohup; exec sleep 300" >/dev/null 2>&1 &
python3 -c "import os; os.setpgid(0, 0); open('$d/pid-pgrp', 'w').write(str(os.getpid())); os.execvp('sleep', ['sleep', '300'])" &
for _ in $(seq 100); do [ "$(ls $d | grep -c pid-)" = 4 ] && break; sleep 0.1; done
echo escaped
[ "$code" = wait ] && exec sleep 300
exit "$code"
SH

# Whether process PID is gone (or a zombie), waiting up to 10 s.
gone() {
  local s
  for _ in $(seq 100); do
    s=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
    [ -z "$s" ] || [ "$s" = Z ] && return 0
    sleep 0.1
  done
  return 1
}

all_gone() { # DIR CASE
  check "$2: the four escapees started" [ "$(ls "$1" | grep -c pid-)" = 4 ]
  for route in setsid double nohup pgrp; do
    [ -f "$1/pid-$route" ] || continue
    check "$2: the $route escapee is gone" gone "$(cat "$1/pid-$route")"
  done
}

for code in 3 0; do
  d=$tmp/exit$code
  mkdir -m 777 "$d"
  timeout 60 "$cohort" run --nproc-per-node 1 -- sh "$tmp/worker.sh" "$d" $code >"$d.out" 2>&1
  rc=$?
  want=$([ $code = 0 ] && echo 0 || echo 1)
  check "worker exits $code: agent exits $want (got $rc)" [ $rc = "$want" ]
  all_gone "$d" "worker exits $code"
done

d=$tmp/sigkill
mkdir -m 777 "$d"
"$cohort" run --nproc-per-node 1 -- sh "$tmp/worker.sh" "$d" wait >"$d.out" 2>&1 &
agent=$!
for _ in $(seq 100); do contains "$d.out" escaped 2>/dev/null && break; sleep 0.1; done
check "agent SIGKILL: the worker started its escapees" contains "$d.out" escaped
kill -9 "$agent"
wait "$agent" 2>/dev/null
all_gone "$d" "agent SIGKILL"
check "agent SIGKILL: its cgroup is removed" \
  [ -z "$(find /sys/fs/cgroup -maxdepth 3 -name "cohort-$agent" 2>/dev/null)" ]
agent=

d=$tmp/user
mkdir -m 777 "$d"
timeout 60 setpriv --reuid=65534 --regid=65534 --clear-groups \
  "$cohort" run --nproc-per-node 1 -- sh "$tmp/worker.sh" "$d" 3 >"$d.out" 2>&1
rc=$?
check "unprivileged agent: exit 1 (got $rc)" [ $rc = 1 ]
all_gone "$d" "unprivileged agent"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] || { tail -5 "$tmp"/*.out; exit 1; }

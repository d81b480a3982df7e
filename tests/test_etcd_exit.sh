#!/usr/bin/env bash
# A job's end through etcd with a straggler: four `cohort run --rdzv-backend
# etcd` agents on loopback (Debian's etcd-server, one member this script
# starts and removes). One agent's worker ends at once, the others' after
# 2 s; once that agent has counted itself done (the round's "ndone" key
# exists) it is stopped (SIGSTOP) until the other three have exited, then
# continued. Every agent must exit 0: a node that finished is never taken
# for lost, though the others' leases took their heartbeat and done keys
# with them when they left (before: the straggler found neither "alldone"
# nor node 0's keys and failed a job that succeeded with "node 0 ... lost").
# Then no key of the job is left in etcd (the last node to leave removes
# the end's records). A second job without a straggler: every agent exits 0
# and no key is left.
# usage: test_etcd_exit.sh COHORT_BINARY
set -u
cohort=$(readlink -f "$1")
here=$(cd "$(dirname "$0")" && pwd)
. "$here/check_lib.sh"
. "$here/etcd_lib.sh"
etcd_find || exit 1
tmp=$(mktemp -d /tmp/cohort-etcdexit-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
cp=$(free_port) pp=$(free_port)
etcd_member - e "http://127.0.0.1:$cp" "http://127.0.0.1:$pp" "e=http://127.0.0.1:$pp"
etcd_ready - "http://127.0.0.1:$cp" || exit 1
ctl() { ETCDCTL_API=3 "$etcdctl" --endpoints "127.0.0.1:$cp" "$@"; }
keys_of() { ctl get --prefix "/cohort/$1/" --keys-only 2>/dev/null | grep -c .; }

# agent ID I CMD...: agent I of job ID in the background, its PID in agent_pid and pids
agent() {
  local id=$1 i=$2
  shift 2
  "$cohort" run --rdzv-backend etcd --rdzv-endpoint "127.0.0.1:$cp" --rdzv-id "$id" \
    --nnodes 4 --token "t-$$" --heartbeat-timeout 5 --join-timeout 60 --no-python "$@" \
    >"$tmp/$id.$i.log" 2>&1 &
  agent_pid=$!
  pids+=($!)
}
# wait_for_pid PID SECONDS: appends the agent's exit status, or "timeout" (then it is killed),
# and a space to $codes (in this shell: a substitution's could not wait for it)
wait_for_pid() {
  local p=$1 end=$((SECONDS + $2))
  while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.05; done
  if kill -0 "$p" 2>/dev/null; then
    kill -CONT "$p" 2>/dev/null
    kill -9 "$p" 2>/dev/null
    wait "$p" 2>/dev/null
    codes+="timeout "
    return
  fi
  wait "$p"
  codes+="$? "
}

# 1. The straggler: agent 0 (whichever node index the rendezvous gives it).
id=exit$$
agent "$id" 0 true
slow=$agent_pid
others=()
for i in 1 2 3; do
  agent "$id" "$i" sleep 2
  others+=($agent_pid)
done
counted=0
for _ in $(seq 1 600); do # 60 s at most
  if ctl get --prefix "/cohort/$id/" --keys-only 2>/dev/null | grep -q '/0/ndone$'; then
    counted=1
    break
  fi
  sleep 0.1
done
check "the straggler counted itself done" [ "$counted" = 1 ]
kill -STOP "$slow"
codes=""
for p in "${others[@]}"; do wait_for_pid "$p" 60; done
check "the other three agents exit 0 while the straggler is stopped (got $codes)" \
  [ "$codes" = "0 0 0 " ]
kill -CONT "$slow"
codes=""
wait_for_pid "$slow" 60
code=${codes% }
check "the straggler, continued after the others left, exits 0 (got $code)" [ "$code" = 0 ]
check "... and reports nothing lost" not grep -q "lost" "$tmp/$id.0.log"
[ "$code" = 0 ] || tail -n 5 "$tmp/$id.0.log"
check "... no key of the job left in etcd" [ "$(keys_of "$id")" = 0 ]

# 2. No straggler.
id=plain$$
all=()
for i in 0 1 2 3; do
  agent "$id" "$i" true
  all+=($agent_pid)
done
codes=""
for p in "${all[@]}"; do wait_for_pid "$p" 60; done
check "4 agents through etcd, no straggler: every one exits 0 (got $codes)" [ "$codes" = "0 0 0 0 " ]
check "... no key of the job left in etcd" [ "$(keys_of "$id")" = 0 ]

echo "$passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$passed" -ge 7 ]

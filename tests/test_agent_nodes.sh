#!/usr/bin/env bash
# test_agent_nodes.sh - three `cohort run` agents on loopback (no root, no
# namespaces) meeting through a rendezvous file, with uneven slots: 2, 1 and
# 3 workers. Every worker's global rank (the sum of the earlier nodes' slots
# plus its local rank), RANK and LOCAL_RANK apart, the group and world sizes,
# and the failure report of a worker that is not local rank = rank: the same
# root cause on every node, naming the global rank and the local rank, and
# each node's lines for the workers it stopped.
# Usage: test_agent_nodes.sh COHORT
set -u
cohort=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/check_lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/up"
# Each worker prints its environment and marks itself up. Global rank 4 (node 2,
# local rank 1) fails once all six are up, so every node has workers to stop;
# the others wait (bounded) to be stopped.
worker='echo "R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK GW=$GROUP_WORLD_SIZE"
mktemp "$UP/w.XXXXXX" >/dev/null
if [ "$GROUP_RANK" = 2 ] && [ "$LOCAL_RANK" = 1 ]; then
  i=0
  while [ "$(ls "$UP" | wc -l)" -lt 6 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
  echo boom >&2
  exit 3
fi
exec sleep 30'
agent() { # NODE_RANK NPROC
  UP="$tmp/up" timeout 120 "$cohort" run --net off --nnodes 3 --node-rank "$1" \
    --nproc-per-node "$2" --rdzv-file "$tmp/rdzv" --job nodes --token T0ken --join-timeout 60 \
    -- sh -c "$worker" >"$tmp/n$1" 2>&1
  echo "rc=$?" >>"$tmp/n$1"
}
agent 1 1 &
p1=$!
agent 2 3 &
p2=$!
agent 0 2
wait "$p1" "$p2"

# The plan: node n's first rank is the sum of the slots before it (0, 2, 3).
slots=(2 1 3)
first=0
for n in 0 1 2; do
  for ((l = 0; l < slots[n]; l++)); do
    r=$((first + l))
    check "node $n local rank $l is rank $r" \
      contains "$tmp/n$n" "[r$r] R=$r L=$l W=6 LW=${slots[n]} G=$n GW=3"
  done
  first=$((first + slots[n]))
done

# The root cause, the same on every node: the global rank, its local rank, how it ended.
for n in 0 1 2; do
  check "node $n: the agent exits non-zero" not contains "$tmp/n$n" "rc=0"
  check "node $n: the cause names node 2, rank 4, local rank 1" \
    grep -qE '^cohort: job failed: node 2 \(.*\): rank 4 \(local rank 1, pid [0-9]+\) exited with code 3$' \
    "$tmp/n$n"
  check "node $n: the cause quotes rank 4's last line" contains "$tmp/n$n" "cohort: last lines of rank 4:"
  check "node $n: ... which is boom" contains "$tmp/n$n" "cohort:   | boom"
done
# What each node did: its other workers stopped, by global rank.
for r in 0 1; do
  check "node 0 stopped rank $r after the remote cause" \
    grep -qE "^cohort: node 0: rank $r: stopped by cohort \(SIGTERM\) after node 2 \(.*\): rank 4 " \
    "$tmp/n0"
done
check "node 1 stopped rank 2 after the remote cause" \
  grep -qE "^cohort: node 1: rank 2: stopped by cohort \(SIGTERM\) after node 2 \(.*\): rank 4 " \
  "$tmp/n1"
for r in 3 5; do
  check "node 2 stopped rank $r after its own rank 4" \
    contains "$tmp/n2" "cohort: node 2: rank $r: stopped by cohort (SIGTERM) after rank 4 failed"
done

# --net auto (the default) with node 0 at 127.0.0.1: the settings each agent
# says it added name the interface its workers' sockets get (lo: every node
# is on this machine), not this machine's default route's.
net_worker='echo "N=$NCCL_SOCKET_IFNAME G=$GLOO_SOCKET_IFNAME U=${UCX_NET_DEVICES:-none}"'
net_port=$(free_port)
net_agent() { # NODE_RANK
  timeout 120 "$cohort" run --nnodes 2 --node-rank "$1" --master "127.0.0.1:$net_port" --job net \
    --token T0ken --join-timeout 60 -- sh -c "$net_worker" >"$tmp/net$1" 2>&1
  echo "rc=$?" >>"$tmp/net$1"
}
net_agent 1 &
p1=$!
net_agent 0
wait "$p1"
for n in 0 1; do
  check "net: node $n exits 0" contains "$tmp/net$n" "rc=0"
  check "net: node $n's workers get lo" contains "$tmp/net$n" "[r$n] N=lo G=lo U=lo"
  said=$(sed -n 's/^cohort: network settings added: //p' "$tmp/net$n")
  got=$(sed -n "s/^\[r$n\] N=\([^ ]*\) G=\([^ ]*\) U=\(.*\)$/NCCL_SOCKET_IFNAME=\1 GLOO_SOCKET_IFNAME=\2 UCX_NET_DEVICES=\3/p" "$tmp/net$n")
  for v in $got; do
    check "net: node $n says it added $v (it said: $said)" eval 'case " $said " in *" $v "*) true ;; *) false ;; esac'
  done
done

if [ "$failed" != 0 ] || [ -n "${SHOW:-}" ]; then
  for n in 0 1 2 net0 net1; do
    echo "--- node $n"
    cat "$tmp/n$n" 2>/dev/null || cat "$tmp/$n"
  done
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

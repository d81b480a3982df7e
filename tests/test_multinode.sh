#!/usr/bin/env bash
# Multi-node `cohort run`: real agents in network namespaces that this test
# creates (and removes): rendezvous, start orders, DNS names that appear late,
# tokens, fail-together across nodes, lost agents and links, restarts.
# usage: test_multinode.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(readlink -f "$2")
. "$src/tests/netns_lib.sh"
tmp=$(mktemp -d /tmp/cohort-mn-XXXXXX)
pids=()

. "$src/tests/check_lib.sh"

cleanup() {
  netns_down
  rm -rf "$tmp"
}
trap cleanup EXIT

netns_up 4 || { echo "cannot create network namespaces"; exit 1; }
M=$(netns_addr 0)
ENVCMD='echo "R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK G=$GROUP_RANK GW=$GROUP_WORLD_SIZE M=$MASTER_ADDR I=$GLOO_SOCKET_IFNAME N=$NCCL_SOCKET_IFNAME"'

# 1. static master, three nodes, node 0 last; ranks and environment.
netns_agent 1 "$tmp/s1" --nnodes 3 --node-rank 1 --master "$M:29400" --job s --nproc-per-node 2 -- sh -c "$ENVCMD"
a1=$!
netns_agent 2 "$tmp/s2" --nnodes 3 --node-rank 2 --master "$M:29400" --job s --nproc-per-node 2 -- sh -c "$ENVCMD"
a2=$!
sleep 1
netns_agent 0 "$tmp/s0" --nnodes 3 --node-rank 0 --master "$M:29400" --job s --nproc-per-node 2 -- sh -c "$ENVCMD"
a0=$!
wait_all 60 $a0 $a1 $a2
check "static: all agents exit 0 ($codes)" [ "$codes" = "0 0 0" ]
for r in 0 1 2 3 4 5; do
  node=$((r / 2))
  check "static: rank $r environment" contains "$tmp/s$node" "[r$r] R=$r W=6 L=$((r % 2)) G=$node GW=3 M=$M I=eth0 N=eth0"
done

# 2. node ranks by join order, node 0 first, one node 5 s late.
netns_agent 0 "$tmp/j0" --nnodes 3 --node-rank 0 --master "$M:29401" --job j -- sh -c "$ENVCMD"
a0=$!
netns_agent 2 "$tmp/j2" --nnodes 3 --master "$M:29401" --job j -- sh -c "$ENVCMD"
a2=$!
sleep 5
netns_agent 1 "$tmp/j1" --nnodes 3 --master "$M:29401" --job j -- sh -c "$ENVCMD"
a1=$!
wait_all 60 $a0 $a1 $a2
check "join order: all exit 0 ($codes)" [ "$codes" = "0 0 0" ]
check "join order: the early node is node 1" contains "$tmp/j2" "[r1] R=1 W=3 L=0 G=1"
check "join order: the late node is node 2" contains "$tmp/j1" "[r2] R=2 W=3 L=0 G=2"

# 3. DNS: the master's name resolves only 2 s after the others start.
for i in 1 2; do printf '127.0.0.1 localhost\n' >"/etc/netns/$(netns_node $i)/hosts"; done
netns_agent 1 "$tmp/d1" --nnodes 3 --master "master.cohort.test:29402" --job d -- sh -c "$ENVCMD"
a1=$!
netns_agent 2 "$tmp/d2" --nnodes 3 --master "master.cohort.test:29402" --job d -- sh -c "$ENVCMD"
a2=$!
netns_agent 0 "$tmp/d0" --nnodes 3 --node-rank 0 --master "master.cohort.test:29402" --job d -- sh -c "$ENVCMD"
a0=$!
sleep 2
for i in 1 2; do printf '%s master.cohort.test\n' "$M" >>"/etc/netns/$(netns_node $i)/hosts"; done
wait_all 60 $a0 $a1 $a2
check "dns: late name, all exit 0 ($codes)" [ "$codes" = "0 0 0" ]
check "dns: MASTER_ADDR is node 0's address" contains "$tmp/d1" "M=$M I=eth0"

# 4. a wrong token is refused with a clear error; the right ones run.
netns_agent 0 "$tmp/t0" --nnodes 2 --node-rank 0 --master "$M:29403" --job t --token right --join-timeout 8 -- true
a0=$!
netns_agent 1 "$tmp/t1" --nnodes 2 --node-rank 1 --master "$M:29403" --job t --token wrong --join-timeout 8 -- true
a1=$!
wait_all 30 $a1
check "token: wrong token exits non-zero ($codes)" eval '[ "$codes" != "0" ] && [ "$codes" != "timeout" ]'
check "token: the error names the token" contains "$tmp/t1" "token"
netns_agent 2 "$tmp/t2" --nnodes 2 --node-rank 1 --master "$M:29403" --job t --token right -- true
a2=$!
wait_all 30 $a0 $a2
check "token: right token joins ($codes)" [ "$codes" = "0 0" ]

# 5. kill -9 of a worker on node 2: every node stops, same root cause everywhere.
netns_agent 0 "$tmp/k0" --nnodes 3 --node-rank 0 --master "$M:29404" --job k --nproc-per-node 2 -- sh -c 'echo ready; exec sleep 60'
a0=$!
netns_agent 1 "$tmp/k1" --nnodes 3 --node-rank 1 --master "$M:29404" --job k --nproc-per-node 2 -- sh -c 'echo ready; exec sleep 60'
a1=$!
netns_agent 2 "$tmp/k2" --nnodes 3 --node-rank 2 --master "$M:29404" --job k --nproc-per-node 2 -- sh -c 'echo ready; echo $$ > '"$tmp"'/victim-$RANK; exec sleep 60'
a2=$!
for _ in $(seq 100); do [ -s "$tmp/victim-5" ] && break; sleep 0.1; done
sleep 0.5
t0=$(date +%s%N)
kill -9 "$(cat "$tmp/victim-5")"
wait_all 30 $a0 $a1 $a2
t1=$(date +%s%N)
check "worker kill: all agents exit 1 ($codes)" [ "$codes" = "1 1 1" ]
echo "worker kill -9 to all agents gone: $(((t1 - t0) / 1000000)) ms"
for i in 0 1 2; do
  check "worker kill: node $i names the root cause" contains "$tmp/k$i" "job failed: node 2 (node2): rank 5 (local rank 1,"
  check "worker kill: node $i names the signal" contains "$tmp/k$i" "was killed by SIGKILL"
done
check "worker kill: node 0 marks its ranks as stopped by cohort" contains "$tmp/k0" "node 0: rank 0: stopped by cohort (SIGTERM)"

# 6. kill -9 of node 1's agent: the others stop with "node 1 (node1) lost".
netns_agent 0 "$tmp/l0" --nnodes 3 --node-rank 0 --master "$M:29405" --job l --heartbeat-timeout 2 -- sh -c 'echo ready; exec sleep 60'
a0=$!
netns_agent 1 "$tmp/l1" --nnodes 3 --node-rank 1 --master "$M:29405" --job l --heartbeat-timeout 2 -- sh -c 'echo $$ > '"$tmp"'/lw; echo ready; exec sleep 60'
a1=$!
netns_agent 2 "$tmp/l2" --nnodes 3 --node-rank 2 --master "$M:29405" --job l --heartbeat-timeout 2 -- sh -c 'echo ready; exec sleep 60'
a2=$!
for _ in $(seq 100); do grep -q ready "$tmp/l2" 2>/dev/null && [ -s "$tmp/lw" ] && break; sleep 0.1; done
sleep 0.5
agent1=$(netns_pid 1 cohort)
kill -9 "$agent1"
wait_all 30 $a0 $a2
check "agent kill: the others exit 1 ($codes)" [ "$codes" = "1 1" ]
check "agent kill: node 0 says node 1 lost its agent" contains "$tmp/l0" "job failed: node 1 (node1): its agent died"
check "agent kill: node 2 says node 1 lost its agent" contains "$tmp/l2" "job failed: node 1 (node1): its agent died"
# The guard ends it: bounded (10 s), as a loaded machine may take more than a moment.
for _ in $(seq 100); do [ -d "/proc/$(cat "$tmp/lw")" ] || break; sleep 0.1; done
check "agent kill: node 1's worker died with its agent" [ ! -d "/proc/$(cat "$tmp/lw")" ]

# 7. kill -9 of node 0's agent (the store): the other stops well within the heartbeat timeout
# (its watcher's connection to the store breaks at once; about 55 ms measured). A timeout of 30 s
# and a bound of 10 s: a busy machine has room, and waiting out the timeout still fails.
netns_agent 0 "$tmp/m0" --nnodes 2 --node-rank 0 --master "$M:29406" --job m --heartbeat-timeout 30 -- sh -c 'echo ready; exec sleep 60'
a0=$!
netns_agent 1 "$tmp/m1" --nnodes 2 --node-rank 1 --master "$M:29406" --job m --heartbeat-timeout 30 -- sh -c 'echo ready; exec sleep 60'
a1=$!
for _ in $(seq 100); do grep -q ready "$tmp/m1" 2>/dev/null && grep -q ready "$tmp/m0" && break; sleep 0.1; done
agent0=$(netns_pid 0 cohort)
t0=$(date +%s%N)
kill -9 "$agent0"
wait_all 50 $a1
took=$((($(date +%s%N) - t0) / 1000000))
check "master kill: node 1 exits 1 ($codes)" [ "$codes" = "1" ]
check "master kill: node 1 out before its heartbeat timeout ($took ms, bound 10000)" [ "$took" -lt 10000 ]
check "master kill: node 1 says node 0 lost" contains "$tmp/m1" "node 0 (node0) lost"

# 8. link down: node 2 is cut off; node 0 and 1 stop with "node 2 lost", node 2 stops too.
netns_agent 0 "$tmp/n0" --nnodes 3 --node-rank 0 --master "$M:29407" --job n --heartbeat-timeout 2 -- sh -c 'echo ready; exec sleep 60'
a0=$!
netns_agent 1 "$tmp/n1" --nnodes 3 --node-rank 1 --master "$M:29407" --job n --heartbeat-timeout 2 -- sh -c 'echo ready; exec sleep 60'
a1=$!
netns_agent 2 "$tmp/n2" --nnodes 3 --node-rank 2 --master "$M:29407" --job n --heartbeat-timeout 2 -- sh -c 'echo ready; exec sleep 60'
a2=$!
for _ in $(seq 100); do grep -q ready "$tmp/n2" 2>/dev/null && break; sleep 0.1; done
sleep 0.5
netns_link 2 down
wait_all 40 $a0 $a1 $a2
netns_link 2 up
check "link down: every agent stops non-zero ($codes)" eval '[ "${codes#*timeout}" = "$codes" ] && [ "$codes" != "0 0 0" ]'
check "link down: node 0 says node 2 lost" contains "$tmp/n0" "node 2 (node2) lost"

# 9. restarts across nodes: rank 1 fails in round 0, everyone runs round 1.
netns_agent 0 "$tmp/r0" --nnodes 2 --node-rank 0 --master "$M:29408" --job r --max-restarts 1 -- sh -c 'echo round=$TORCHELASTIC_RESTART_COUNT; [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ $RANK = 1 ] && exit 3; sleep 0.3'
a0=$!
netns_agent 1 "$tmp/r1" --nnodes 2 --node-rank 1 --master "$M:29408" --job r --max-restarts 1 -- sh -c 'echo round=$TORCHELASTIC_RESTART_COUNT; [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ $RANK = 1 ] && exit 3; sleep 0.3'
a1=$!
wait_all 60 $a0 $a1
check "restart: both exit 0 after one restart ($codes)" [ "$codes" = "0 0" ]
check "restart: node 0 ran round 1" contains "$tmp/r0" "[r0] round=1"
check "restart: node 1 ran round 1" contains "$tmp/r1" "[r1] round=1"
check "restart: node 0 reports the round-0 failure" contains "$tmp/r0" "job failed: node 1 (node1): rank 1"

# 9b. a replacement: node 1 dies whole (agent and worker) in round 0, and a new agent is
# started at once in its place with the same command line. The job is full (2 of 2) when it
# arrives, so it waits for the survivors' next round instead of being turned away.
RW='echo round=$COHORT_ROUND; [ "$COHORT_ROUND" = 0 ] && exec sleep 60; sleep 0.3'
netns_agent 0 "$tmp/x0" --nnodes 2 --node-rank 0 --master "$M:29417" --job x --max-restarts 1 --heartbeat-timeout 2 -- sh -c "$RW"
a0=$!
netns_agent 1 "$tmp/x1" --nnodes 2 --node-rank 1 --master "$M:29417" --job x --max-restarts 1 --heartbeat-timeout 2 -- sh -c "$RW"
for _ in $(seq 100); do grep -q "round=0" "$tmp/x1" 2>/dev/null && grep -q "round=0" "$tmp/x0" && break; sleep 0.1; done
for p in $(ip netns pids "$(netns_node 1)"); do kill -9 "$p"; done
netns_agent 1 "$tmp/x1b" --nnodes 2 --node-rank 1 --master "$M:29417" --job x --max-restarts 1 --heartbeat-timeout 2 -- sh -c "$RW"
a1=$!
wait_all 60 $a0 $a1
check "replacement: both exit 0 ($codes)" [ "$codes" = "0 0" ]
check "replacement: it waited for the next round" contains "$tmp/x1b" "waiting up to"
check "replacement: it ran round 1" contains "$tmp/x1b" "[r1] round=1"
check "replacement: node 0 ran round 1" contains "$tmp/x0" "[r0] round=1"

# 10. the Slurm environment: hostlist and SLURM_* set by the test.
slurm_env() { # node index
  echo SLURM_JOB_ID=4242 SLURM_NNODES=2 SLURM_NODEID=$1 SLURM_PROCID=$1 SLURM_JOB_NODELIST="node[0-1]"
}
for i in 0 1; do printf '%s node0\n%s node1\n' "$M" "$(netns_addr 1)" >>"/etc/netns/$(netns_node $i)/hosts"; done
netns_bg 0 "$tmp/sl0" env $(slurm_env 0) "$cohort" run -- sh -c "$ENVCMD"
a0=$!
netns_bg 1 "$tmp/sl1" env $(slurm_env 1) "$cohort" run -- sh -c "$ENVCMD"
a1=$!
wait_all 60 $a0 $a1
check "slurm: both exit 0 ($codes)" [ "$codes" = "0 0" ]
check "slurm: detected and reported" contains "$tmp/sl0" "slurm"
check "slurm: node 1 is rank 1 of 2" contains "$tmp/sl1" "[r1] R=1 W=2 L=0 G=1 GW=2 M=$M"

# 11. shared file: node 0 publishes the store's address in a file.
rm -f "$tmp/rdzv"
netns_agent 1 "$tmp/f1" --nnodes 2 --node-rank 1 --rdzv-file "$tmp/rdzv" --job f -- sh -c "$ENVCMD"
a1=$!
netns_agent 0 "$tmp/f0" --nnodes 2 --rdzv-file "$tmp/rdzv" --job f --node-rank 0 -- sh -c "$ENVCMD"
a0=$!
wait_all 60 $a0 $a1
check "file: both complete ($codes)" [ "$codes" = "0 0" ]
check "file: node 1 reached node 0" contains "$tmp/f1" "[r1] R=1 W=2 L=0 G=1 GW=2 M=$M I=eth0"

# 12. --net auto: each node derives RDMA settings (here from fixture trees
# standing in for the machines) and a node whose RDMA setup differs from
# node 0's is warned about, naming both; --net off adds nothing.
fx=$src/tests/fixtures/doctor
NETCMD='echo "HCA=${NCCL_IB_HCA:-none} DIS=${NCCL_IB_DISABLE:-none}"'
netns_bg 0 "$tmp/e0" env COHORT_DOCTOR_ROOT="$fx/roce_bond" "$cohort" run --nnodes 2 --node-rank 0 --master "$M:29410" --job net -- sh -c "$NETCMD"
a0=$!
netns_bg 1 "$tmp/e1" env COHORT_DOCTOR_ROOT="$fx/ib_hdr4" "$cohort" run --nnodes 2 --node-rank 1 --master "$M:29410" --job net -- sh -c "$NETCMD"
a1=$!
wait_all 60 $a0 $a1
check "net: both exit 0 ($codes)" [ "$codes" = "0 0" ]
check "net: node 0 gets its bond device" contains "$tmp/e0" "[r0] HCA=mlx5_bond_0:1 DIS=none"
check "net: node 1 gets its four HCAs" grep -q '^\[r1\] HCA=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1 DIS=none' "$tmp/e1"
check "net: node 1 is warned, naming both nodes" grep -q 'warning: .*node 0 (node0).*node 1 (node1)' "$tmp/e1"
netns_agent 0 "$tmp/o0" --nnodes 2 --node-rank 0 --master "$M:29411" --job net2 --net off -- sh -c "$NETCMD"
a0=$!
netns_agent 1 "$tmp/o1" --nnodes 2 --node-rank 1 --master "$M:29411" --job net2 --net off -- sh -c "$NETCMD"
a1=$!
wait_all 60 $a0 $a1
check "net off: nothing added" contains "$tmp/o1" "[r1] HCA=none DIS=none"

# 13. UDP multicast: nobody knows node 0's address; node 0 starts last; a
# second job on the same segment, whose nodes claim no rank and elect a host,
# is not confused with the first.
netns_agent 1 "$tmp/u1" --nnodes 2 --discover mcast --job mc-a --node-rank 1 -- sh -c "$ENVCMD"
a1=$!
netns_agent 2 "$tmp/u2" --nnodes 2 --discover mcast --job mc-b -- sh -c "$ENVCMD"
b0=$!
netns_agent 3 "$tmp/u3" --nnodes 2 --discover mcast --job mc-b -- sh -c "$ENVCMD"
b1=$!
sleep 1
netns_agent 0 "$tmp/u0" --nnodes 2 --discover mcast --job mc-a --node-rank 0 -- sh -c "$ENVCMD"
a0=$!
wait_all 60 $a0 $a1 $b0 $b1
check "mcast: both jobs complete ($codes)" [ "$codes" = "0 0 0 0" ]
check "mcast: job a's node 1 found node 0" contains "$tmp/u1" "[r1] R=1 W=2 L=0 G=1 GW=2 M=$M I=eth0"
# Job b claimed no ranks: the two nodes elected one host between them.
check "mcast: job b elected one host" [ "$(cat "$tmp/u2" "$tmp/u3" | grep -c 'R=. W=2')" = 2 ]
check "mcast: job b's ranks differ" [ "$(cat "$tmp/u2" "$tmp/u3" | grep -o 'R=. W=2' | sort -u | wc -l)" = 2 ]

# 14. an unmodified PyTorch DDP script (gloo) across two nodes, no hand-set
# interface variables: parameters end identical on every rank.
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  netns_agent 0 "$tmp/p0" --nnodes 2 --node-rank 0 --master "$M:29412" --job torch -- /usr/bin/python3 "$src/tests/torch/ddp_train.py"
  a0=$!
  netns_agent 1 "$tmp/p1" --nnodes 2 --node-rank 1 --master "$M:29412" --job torch -- /usr/bin/python3 "$src/tests/torch/ddp_train.py"
  a1=$!
  wait_all 180 $a0 $a1
  check "torch: both nodes exit 0 ($codes)" [ "$codes" = "0 0" ]
  d0=$(sed -n 's/^\[r0\] PARAMS //p' "$tmp/p0")
  d1=$(sed -n 's/^\[r1\] PARAMS //p' "$tmp/p1")
  check "torch: parameters identical across nodes" eval '[ -n "$d0" ] && [ "$d0" = "$d1" ]'
  check "torch: world size 2" contains "$tmp/p0" "world 2"
else
  check "torch: /usr/bin/python3 imports torch (scripts/deps.sh installs python3-torch)" false
fi

# 15. elastic --nnodes MIN:MAX: with 3 of 2:3 nodes everyone joins; with 2,
# the job starts after the last-call window with the two it has.
netns_agent 0 "$tmp/el0" --nnodes 2:3 --node-rank 0 --master "$M:29413" --job el --last-call 3 -- sh -c "$ENVCMD"
a0=$!
netns_agent 1 "$tmp/el1" --nnodes 2:3 --master "$M:29413" --job el --last-call 3 -- sh -c "$ENVCMD"
a1=$!
netns_agent 2 "$tmp/el2" --nnodes 2:3 --master "$M:29413" --job el --last-call 3 -- sh -c "$ENVCMD"
a2=$!
wait_all 60 $a0 $a1 $a2
check "elastic 3 of 2:3: all exit 0 ($codes)" [ "$codes" = "0 0 0" ]
check "elastic 3 of 2:3: world of 3" contains "$tmp/el0" "[r0] R=0 W=3 L=0 G=0 GW=3"
netns_agent 0 "$tmp/em0" --nnodes 2:3 --node-rank 0 --master "$M:29414" --job em --last-call 1 -- sh -c "$ENVCMD"
a0=$!
netns_agent 1 "$tmp/em1" --nnodes 2:3 --master "$M:29414" --job em --last-call 1 -- sh -c "$ENVCMD"
a1=$!
wait_all 60 $a0 $a1
check "elastic 2 of 2:3: both exit 0 ($codes)" [ "$codes" = "0 0" ]
check "elastic 2 of 2:3: world of 2" contains "$tmp/em1" "[r1] R=1 W=2 L=0 G=1 GW=2"

# 16. IPv6: the master given as [address]:port.
for i in 0 1; do ip -n "$(netns_node $i)" addr add "fd00:201::$((i + 1))/64" dev eth0 nodad; done
netns_agent 1 "$tmp/v1" --nnodes 2 --node-rank 1 --master "[fd00:201::1]:29415" --job v6 -- sh -c "$ENVCMD"
a1=$!
netns_agent 0 "$tmp/v0" --nnodes 2 --node-rank 0 --master "[fd00:201::1]:29415" --job v6 -- sh -c "$ENVCMD"
a0=$!
wait_all 60 $a0 $a1
check "ipv6: both exit 0 ($codes)" [ "$codes" = "0 0" ]
check "ipv6: MASTER_ADDR is node 0's IPv6 address" contains "$tmp/v1" "[r1] R=1 W=2 L=0 G=1 GW=2 M=fd00:201::1 I=eth0"

if [ $failed -ne 0 ]; then
  for f in "$tmp"/*; do echo "== $f"; tail -n 15 "$f"; done
fi
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

#!/usr/bin/env bash
# torchrun's multi-node command lines, verbatim with `cohort run` in place of
# `torchrun`, across 3 network namespaces (tests/netns_lib.sh), each node
# training an unmodified PyTorch DDP script that parses its own arguments
# (tests/torch/ddp_args.py, gloo), to identical parameters on all 6 ranks:
#  1. seed 002's Run:ai pods: the static form, each pod given WORLD_SIZE,
#     RANK, MASTER_ADDR and MASTER_PORT by the platform;
#  2. PyTorch's documented elastic c10d form, the same line on every node:
#     --nnodes=1:4 --nproc-per-node=2 --max-restarts=3 --rdzv-id=J
#     --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT.
# Then torchrun's elastic membership with that line: 3. a node arriving while
# a --nnodes=2:3 job runs makes it re-form with 3 nodes (no restart used);
# 4. a node lost re-forms the job without it (a restart), and a new node in
# its place makes it grow back to 3.
# `python3` on the nodes' PATH is Debian's (which has torch), as in a pod.
# usage: test_torchrun_multinode.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(cd "$2" && pwd)
. "$src/tests/check_lib.sh"
. "$src/tests/netns_lib.sh"
tmp=$(mktemp -d /tmp/cohort-trmn-XXXXXX)
cleanup() {
  netns_down
  [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
/usr/bin/python3 -c 'import torch' 2>/dev/null || {
  echo "FAIL: /usr/bin/python3 imports torch (scripts/deps.sh installs python3-torch)"
  exit 1
}
netns_up 3 || {
  echo "cannot create network namespaces"
  exit 1
}
mkdir -p "$tmp/bin" "$tmp/work"
ln -s /usr/bin/python3 "$tmp/bin/python3"
cp "$src/tests/torch/ddp_train.py" "$src/tests/torch/ddp_args.py" "$tmp/work/"
cd "$tmp/work" || exit 1
M=$(netns_addr 0)
pids=()

# same_params NAME FILES...: every rank's PARAMS line present and equal, in a world of 6.
same_params() {
  local name=$1
  shift
  local all
  all=$(cat "$@" | sed -n 's/^\[r[0-9]*\] PARAMS //p')
  check "$name: 6 ranks report parameters" [ "$(echo "$all" | grep -c .)" = 6 ]
  check "$name: identical parameters on every rank" [ "$(echo "$all" | sort -u | wc -l)" = 1 ]
  check "$name: a world of 6" [ "$(cat "$@" | grep -c 'LOSS .* world 6$')" = 6 ]
}

# 1. Run:ai (seed 002): per pod WORLD_SIZE (nodes), RANK (node rank), MASTER_*.
for i in 0 1 2; do
  netns_bg "$i" "$tmp/runai$i" env PATH="$tmp/bin:$PATH" WORLD_SIZE=3 RANK=$i MASTER_ADDR="$M" \
    MASTER_PORT=23456 sh -c 'exec "$0" run --nproc-per-node 2 --nnodes ${WORLD_SIZE} \
      --node_rank ${RANK} --master_addr ${MASTER_ADDR} --master_port ${MASTER_PORT} \
      ddp_args.py --backend gloo --steps 5' "$cohort"
  eval "r$i=\$!"
done
wait_all 240 "$r0" "$r1" "$r2"
check "run:ai: every pod exits 0 ($codes)" [ "$codes" = "0 0 0" ]
same_params "run:ai" "$tmp/runai0" "$tmp/runai1" "$tmp/runai2"
check "run:ai: node 2 holds ranks 4 and 5" contains "$tmp/runai2" "[r5] PARAMS"

# 2. PyTorch's multi-node c10d line, the same on every node; node0 (the
# endpoint's owner) hosts the store.
for i in 0 1 2; do
  netns_bg "$i" "$tmp/c10d$i" env PATH="$tmp/bin:$PATH" "$cohort" run --nnodes=1:4 \
    --nproc-per-node=2 --max-restarts=3 --rdzv-id=J --rdzv-backend=c10d \
    --rdzv-endpoint=node0:29400 ddp_args.py --backend gloo --steps 5
  eval "c$i=\$!"
done
wait_all 240 "$c0" "$c1" "$c2"
check "c10d: every node exits 0 ($codes)" [ "$codes" = "0 0 0" ]
same_params "c10d" "$tmp/c10d0" "$tmp/c10d1" "$tmp/c10d2"
check "c10d: node0 hosts the store" contains "$tmp/c10d0" "hosting"

# wait_lines N PATTERN FILES...: until N lines match across FILES (at most 60 s).
wait_lines() {
  local n=$1 pat=$2 k
  shift 2
  for ((k = 0; k < 600; k++)); do
    [ "$(cat "$@" 2>/dev/null | grep -c -- "$pat")" -ge "$n" ] && return 0
    sleep 0.1
  done
  return 1
}
go=$tmp/go
# Each worker says who it is, then waits (bounded) for the test's go.
w='echo "up W=$WORLD_SIZE RC=$TORCHELASTIC_RESTART_COUNT"; for i in $(seq 600); do [ -e "$GO" ] && exit 0; sleep 0.1; done; exit 1'
elastic() { # elastic NODE OUT EXTRA...: the c10d line of a 2:3 job on node NODE
  local i=$1 out=$2
  shift 2
  netns_bg "$i" "$out" env GO="$go" "$cohort" run --nnodes=2:3 --nproc-per-node=1 \
    --rdzv-backend=c10d --rdzv-endpoint=node0:29402 --rdzv-conf=last_call_timeout=1 "$@" \
    --no-python sh -c "$w"
}

# 3. Scale-up: two nodes run, a third arrives.
elastic 0 "$tmp/up0"
u0=$!
elastic 1 "$tmp/up1"
u1=$!
check "scale-up: the job starts with 2 nodes" wait_lines 2 "] up W=2" "$tmp/up0" "$tmp/up1"
elastic 2 "$tmp/up2"
u2=$!
check "scale-up: it re-forms with 3" wait_lines 3 "] up W=3" "$tmp/up0" "$tmp/up1" "$tmp/up2"
touch "$go"
wait_all 60 "$u0" "$u1" "$u2"
check "scale-up: every node exits 0 ($codes)" [ "$codes" = "0 0 0" ]
check "scale-up: no restart counted" [ "$(cat "$tmp"/up? | grep -c '] up W=3 RC=0')" = 3 ]
check "scale-up: the nodes say why they re-form" contains "$tmp/up0" "joins the job: re-forming"
rm -f "$go"

# 4. A lost node, then a new one in its place.
elastic 0 "$tmp/lo0" --max-restarts=1
l0=$!
elastic 1 "$tmp/lo1" --max-restarts=1
l1=$!
elastic 2 "$tmp/lo2" --max-restarts=1
l2=$!
check "lost: the job starts with 3 nodes" wait_lines 3 "] up W=3" "$tmp/lo0" "$tmp/lo1" "$tmp/lo2"
victim=$(netns_pid 2 cohort)
check "lost: node 2's agent found" [ -n "$victim" ]
kill -KILL "$victim"
check "lost: the others re-form with 2 (a restart)" wait_lines 2 "] up W=2 RC=1" "$tmp/lo0" "$tmp/lo1"
elastic 2 "$tmp/lo2b" --max-restarts=1
l3=$!
# The restart count is each agent's own (the newcomer's is 0), as under torchrun.
check "lost: a new node makes it grow back to 3" \
  wait_lines 2 "] up W=3 RC=1" "$tmp/lo0" "$tmp/lo1"
check "lost: ... the new node among them" wait_lines 1 "] up W=3 RC=0" "$tmp/lo2b"
touch "$go"
wait_all 60 "$l0" "$l1" "$l3"
check "lost: the job ends with status 0 on every node ($codes)" [ "$codes" = "0 0 0" ]
wait "$l2" 2>/dev/null

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

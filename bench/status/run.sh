#!/usr/bin/env bash
# bench/status: latency of `cohort status` (and --json) against a running job
# of NODES emulated nodes (network namespaces on a bridge, created and removed
# here), NPROC sleeping ranks each, queried from one more namespace. Each
# figure is the median of REPS runs of the whole command (process start,
# finding the job, connecting with the token, node 0's snapshot, every
# node's in one pipelined read, printing). Run as root. No figure unless
# every rank was seen running first (exit 1).
# usage: bench/status/run.sh [COHORT_BINARY] [REPS] [NODES] [NPROC]
set -u
cohort=$(readlink -f "${1:-build/cohort}")
reps=${2:-15}
nodes=${3:-8}
nproc=${4:-4}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../tests/netns_lib.sh"
tmp=$(mktemp -d /tmp/cohort-bench-status-XXXXXX)
pids=()
cleanup() { netns_down; rm -rf "$tmp"; }
trap cleanup EXIT
netns_up $((nodes + 1)) || { echo "cannot create namespaces (root needed)"; exit 1; }
M=$(netns_addr 0)
export COHORT_TOKEN=bench-status-token
for i in $(seq 0 $((nodes - 1))); do
  netns_agent "$i" "$tmp/a$i" --nnodes "$nodes" --node-rank "$i" --master "$M:29500" \
    --nproc-per-node "$nproc" --net off -- sleep 120
done
q=$nodes
want=$((nodes * nproc))
seen=0
for _ in $(seq 1 120); do
  seen=$(netns_exec "$q" "$cohort" status --master "$M:29500" 2>/dev/null | grep -c ' running ')
  [ "$seen" = "$want" ] && break
  sleep 0.25
done
if [ "$seen" != "$want" ]; then
  echo "only $seen of $want ranks running: no figure"
  exit 1
fi
median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
# The timing loop runs inside the query namespace, so that entering it is not counted.
measure() {
  netns_exec "$q" sh -c 'for i in $(seq 1 "$1"); do
      s=$(date +%s%N); "$2" status --master "$3" $4 >/dev/null || exit 1
      e=$(date +%s%N); echo $(((e - s) / 1000))
    done' sh "$reps" "$cohort" "$M:29500" "$1" | median
}
table=$(measure "") && tjson=$(measure --json) || { echo "a status run failed: no figure"; exit 1; }
printf '%-36s %12s\n' "cohort status, $nodes nodes x $nproc ranks" "median (ms)"
printf '%-36s %12.1f\n' "table" "$(echo "$table / 1000" | bc -l)"
printf '%-36s %12.1f\n' "--json" "$(echo "$tjson / 1000" | bc -l)"

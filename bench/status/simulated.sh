#!/usr/bin/env bash
# bench/status/simulated.sh: latency of `cohort status` (table and --json)
# on a job of N simulated nodes: a built-in store on loopback (`cohort store
# serve`, with a token) holding N node snapshots of NPROC running ranks each,
# written as agents write them (J/status/<node>, the schema of
# docs/status.schema.json, every field filled). Each figure is the median of
# REPS runs of the whole command (process start, connecting with the token,
# node 0's snapshot, every node's in one pipelined read, printing). No figure
# unless status listed every rank (exit 1).
# usage: bench/status/simulated.sh [COHORT_BINARY] [REPS] [NODES] [NPROC]
set -u
cohort=$(readlink -f "${1:-build/cohort}")
reps=${2:-9}
nodes=${3:-1024}
nproc=${4:-4}
tmp=$(mktemp -d /tmp/cohort-bench-status-sim-XXXXXX)
store=
cleanup() { [ -n "$store" ] && kill "$store" 2>/dev/null && wait "$store" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
export COHORT_TOKEN=bench-status-sim
"$cohort" store serve --host 127.0.0.1 --port 0 --max-conns 4096 >"$tmp/store" 2>&1 &
store=$!
for _ in $(seq 1 50); do grep -q '127.0.0.1:' "$tmp/store" && break; sleep 0.1; done
addr=$(grep -o '127.0.0.1:[0-9]*' "$tmp/store" | head -1)
[ -n "$addr" ] || { echo "the store did not start: no figure"; exit 1; }
job=sim
# Every node's snapshot, one `cohort store set` reading it from stdin.
/usr/bin/python3 - "$nodes" "$nproc" "$tmp" <<'PY'
import json, os, sys, time
n, p, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
now = int(time.time() * 1000)
for k in range(n):
    ranks = [{"rank": k * p + i, "local_rank": i, "pid": 100000 + k * p + i, "state": "running",
              "uptime_ms": 60000, "silent_ms": 500, "step": 100 + i, "beat_age_ms": 300,
              "step_ms": 410.0, "cpu_percent": 99.5, "rss_bytes": 1 << 30} for i in range(p)]
    snap = {"version": 1, "node": k, "host": "node%d" % k, "agent_pid": 5000 + k, "round": 0,
            "restarts": 0, "max_restarts": 3, "nnodes": n, "nnodes_min": n, "nnodes_max": n,
            "world_size": n * p, "time_ms": now, "failure": None, "ranks": ranks}
    with open(os.path.join(d, "s%d" % k), "w") as f:
        json.dump(snap, f, separators=(",", ":"))
PY
for k in $(seq 0 $((nodes - 1))); do
  "$cohort" store set --addr "$addr" "$job/status/$k" - <"$tmp/s$k" >/dev/null || { echo "cannot write snapshot $k: no figure"; exit 1; }
done
want=$((nodes * nproc))
seen=$("$cohort" status --master "$addr" --job "$job" 2>/dev/null | grep -c ' running ')
if [ "$seen" != "$want" ]; then
  echo "status listed $seen of $want ranks: no figure"
  exit 1
fi
median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
measure() {
  for _ in $(seq 1 "$reps"); do
    s=$(date +%s%N)
    "$cohort" status --master "$addr" --job "$job" "$@" >/dev/null || exit 1
    e=$(date +%s%N)
    echo $(((e - s) / 1000))
  done | median
}
table=$(measure) && tjson=$(measure --json) || { echo "a status run failed: no figure"; exit 1; }
printf '%-40s %12s\n' "cohort status, $nodes simulated nodes x $nproc" "median (ms)"
printf '%-40s %12.1f\n' "table" "$(echo "$table / 1000" | bc -l)"
printf '%-40s %12.1f\n' "--json" "$(echo "$tjson / 1000" | bc -l)"

#!/usr/bin/env bash
# bench/multinode: rendezvous and failure propagation across emulated nodes
# (network namespaces on a bridge, created and removed here), cohort run vs
# torchrun with its c10d rendezvous (Debian's torch 1.13), side by side.
#  - rendezvous: from the last agent's start until every worker is running;
#  - failure: from a worker's kill -9 until the last process of the job is
#    gone on every node (torchrun: capped at CAP seconds).
# Median of REPS repetitions. Run as root. A run whose workers did not all
# start gives no figure: it is counted as "fail", and the script exits 1.
# usage: bench/multinode/run.sh [COHORT_BINARY] [REPS] [NODE_COUNTS...]
#   BENCH_TOOLS="cohort" measures cohort alone (default "cohort torch").
set -u
cohort=$(readlink -f "${1:-build/cohort}")
reps=${2:-3}
shift 2 2>/dev/null || shift $#
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(2 4 8)
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../tests/netns_lib.sh"
CAP=20
tmp=$(mktemp -d /tmp/cohort-bench-mn-XXXXXX)
agents=()
cleanup() { for p in "${agents[@]}"; do kill -9 "$p" 2>/dev/null; done; netns_down; [ -n "${KEEP:-}" ] || rm -rf "$tmp"; }
trap cleanup EXIT
maxn=0
for n in "${counts[@]}"; do [ "$n" -gt "$maxn" ] && maxn=$n; done
netns_up "$maxn" || { echo "cannot create namespaces (root needed)"; exit 1; }
M=$(netns_addr 0)
now_ns() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR==0) exit; if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# Every worker stamps its start time, then either ends or waits to be killed.
WORKER='date +%s%N > "$STAMP_DIR/start-$RANK"; echo $$ > "$STAMP_DIR/pid-$RANK"; [ "$MODE" = wait ] && exec sleep 60; exit 0'

launch() { # launch TOOL N PORT MODE JOB: starts N agents, node 0 last; sets $last_start
  local tool=$1 n=$2 port=$3 mode=$4 job=$5 i
  agents=()
  for ((i = n - 1; i >= 0; i--)); do
    [ "$i" = 0 ] && last_start=$(now_ns)
    if [ "$tool" = cohort ]; then
      netns_exec "$i" env STAMP_DIR="$tmp" MODE="$mode" "$cohort" run --nnodes "$n" --node-rank "$i" \
        --master "$M:$port" --job "$job" --net off -- sh -c "$WORKER" >"$tmp/log-$i" 2>&1 &
    else
      netns_exec "$i" env STAMP_DIR="$tmp" MODE="$mode" /usr/bin/python3 -m torch.distributed.run \
        --nnodes "$n" --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint "$M:$port" \
        --rdzv_id "$job" --redirects 2 --tee 1 --no_python sh -c "$WORKER" >"$tmp/log-$i" 2>&1 &
    fi
    agents+=($!)
  done
}

wait_agents() { # wait_agents LIMIT_S: 0 if all ended in time
  local end=$((SECONDS + $1)) p
  for p in "${agents[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.02; done
  done
  for p in "${agents[@]}"; do kill -0 "$p" 2>/dev/null && return 1; done
  return 0
}

rdzv_once() { # prints seconds, or "fail"
  local tool=$1 n=$2 port=$3 r
  rm -f "$tmp"/start-* "$tmp"/pid-*
  launch "$tool" "$n" "$port" done "rz$port"
  wait_agents 120 || { for p in "${agents[@]}"; do kill -9 "$p" 2>/dev/null; done; echo fail; return; }
  local last=0 f t
  for ((r = 0; r < n; r++)); do
    f="$tmp/start-$r"
    [ -s "$f" ] || { echo fail; return; }
    t=$(cat "$f")
    [ "$t" -gt "$last" ] && last=$t
  done
  echo "scale=4; ($last-$last_start)/1000000000" | bc
}

fail_once() { # prints seconds until every agent and worker is gone, or ">CAP"
  local tool=$1 n=$2 port=$3 r
  rm -f "$tmp"/start-* "$tmp"/pid-*
  launch "$tool" "$n" "$port" wait "fl$port"
  local started=0
  for _ in $(seq 600); do
    started=$(ls "$tmp"/pid-* 2>/dev/null | wc -l)
    [ "$started" -ge "$n" ] && break
    wait_agents 0 && break # every agent has exited: nothing more will start
    sleep 0.05
  done
  if [ "$started" -lt "$n" ]; then # nothing to propagate: no figure
    for p in "${agents[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    echo fail
    return
  fi
  sleep 0.5
  local victim
  victim=$(cat "$tmp/pid-$((n - 1))")
  local t0
  t0=$(now_ns)
  kill -9 "$victim"
  local ok=1
  wait_agents "$CAP" || ok=0
  # Workers too: none may survive.
  for ((r = 0; r < n; r++)); do
    local p
    p=$(cat "$tmp/pid-$r" 2>/dev/null)
    while [ -n "$p" ] && [ -d "/proc/$p" ] && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ] &&
      [ $(( ($(now_ns) - t0) / 1000000000 )) -lt "$CAP" ]; do sleep 0.02; done
    [ -n "$p" ] && [ -d "/proc/$p" ] && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ] && ok=0
  done
  local t1
  t1=$(now_ns)
  for p in "${agents[@]}"; do kill -9 "$p" 2>/dev/null; done
  for ((r = 0; r < n; r++)); do p=$(cat "$tmp/pid-$r" 2>/dev/null); [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done 2>/dev/null
  wait 2>/dev/null
  if [ $ok = 1 ]; then echo "scale=4; ($t1-$t0)/1000000000" | bc; else echo ">$CAP"; fi
}

port=30000
tools=(${BENCH_TOOLS:-cohort torch})
# measure KIND TOOL N FILE: one repetition of rdzv_once or fail_once into FILE
# ("fail" when the workers did not start), or "-" for a tool not measured.
measure() {
  port=$((port + 1))
  if [[ " ${tools[*]} " == *" $2 "* ]]; then "$1_once" "$2" "$3" $port >>"$4"; else echo - >>"$4"; fi
}
# figure FILE: the median of the runs that gave a time; "fail" when none did,
# ">CAP" when every run hit the cap, "-" when the tool was not measured.
figure() {
  local m
  m=$(grep -E '^[0-9.]+$' "$1" | median)
  if [ -n "$m" ]; then printf "%.4f\n" "$m"
  elif grep -q '^>' "$1"; then echo ">$CAP"
  elif grep -q '^-$' "$1"; then echo -
  else echo fail; fi
}
ratio() { # ratio COHORT TORCH: torch/cohort when both are times
  if [[ $1 =~ ^[0-9.]+$ && $2 =~ ^[0-9.]+$ ]]; then printf '%.1fx' "$(echo "$2/$1" | bc -l)"
  elif [[ $1 =~ ^[0-9.]+$ && $2 == ">"* ]]; then echo ">$(echo "$CAP/$1" | bc)x"
  else echo n/a; fi
}
printf '%-6s %-22s %12s %12s %10s\n' nodes "median of $reps (s)" cohort torchrun ratio
for n in "${counts[@]}"; do
  : >"$tmp/rc"; : >"$tmp/rt"; : >"$tmp/fc"; : >"$tmp/ft"
  for ((k = 0; k < reps; k++)); do
    measure rdzv cohort "$n" "$tmp/rc"
    measure rdzv torch "$n" "$tmp/rt"
    measure fail cohort "$n" "$tmp/fc"
    measure fail torch "$n" "$tmp/ft"
  done
  rc=$(figure "$tmp/rc"); rt=$(figure "$tmp/rt"); fc=$(figure "$tmp/fc"); ftv=$(figure "$tmp/ft")
  printf '%-6s %-22s %12s %12s %10s\n' "$n" "rendezvous" "$rc" "$rt" "$(ratio "$rc" "$rt")"
  printf '%-6s %-22s %12s %12s %10s\n' "$n" "failure propagation" "$fc" "$ftv" "$(ratio "$fc" "$ftv")"
  echo "  raw: rdzv cohort [$(tr '\n' ' ' <"$tmp/rc")] torchrun [$(tr '\n' ' ' <"$tmp/rt")] fail cohort [$(tr '\n' ' ' <"$tmp/fc")] torchrun [$(tr '\n' ' ' <"$tmp/ft")]"
  cat "$tmp/rc" "$tmp/rt" "$tmp/fc" "$tmp/ft" >>"$tmp/all"
done
bad=$(grep -c '^fail$' "$tmp/all")
if [ "$bad" -gt 0 ]; then
  echo "bench/multinode: $bad runs did not start all their workers (see the raw lines): no figure from them" >&2
  exit 1
fi

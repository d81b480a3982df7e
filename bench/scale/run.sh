#!/usr/bin/env bash
# bench/scale: the built-in store under a swarm of simulated nodes, the same
# agents' pattern through etcd (`--rdzv-backend etcd`, Debian's etcd-server
# started by swarm_etcd), and PyTorch's TCPStore (Debian's torch 1.13) under
# the same pattern. For each size, REPS runs of each; prints the median of
# every figure and the ratios etcd / cohort and TCPStore / cohort (above 1:
# the built-in store is faster or lighter; none for the request rate, which
# is the load offered, not a score). A size
# where any run of a store did not complete prints "incomplete" for that
# store instead of figures.
# usage: bench/scale/run.sh [BUILD_DIR] [REPS] [SIZES...]
#   e.g. bench/scale/run.sh build 5 256 1024 4096
# Environment: HOLD (seconds of heartbeats, default 3), TIMEOUT (per run, 120),
# TORCH_MAX (largest size tried with TCPStore, default 4096), ETCD_MAX
# (largest tried through etcd, default 1024: a thread per simulated node).
set -euo pipefail
build=${1:-build}
reps=${2:-3}
shift $(($# > 2 ? 2 : $#))
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(256 1024 4096)
hold=${HOLD:-3}
limit=${TIMEOUT:-120}
torch_max=${TORCH_MAX:-4096}
etcd_max=${ETCD_MAX:-1024}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
figures=(rendezvous_ms join_cpu_us hb_cpu_pct hb_req_per_s fail_max_ms fail_med_ms rss_b_per_node)

median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
field() { tr ' ' '\n' | sed -n "s/^$1=//p"; }

# run NAME N CMD... : REPS runs into $tmp/NAME.N (one line each), "incomplete" on any failure.
run() {
  local name=$1 n=$2 out
  shift 2
  : >"$tmp/$name.$n"
  for _ in $(seq "$reps"); do
    if ! out=$(timeout $((limit + 30)) "$@" 2>/dev/null) || [[ $out == incomplete* ]]; then
      echo incomplete >"$tmp/$name.$n"
      echo "  $name n=$n: ${out:-did not finish}" >&2
      return
    fi
    echo "$out" >>"$tmp/$name.$n"
  done
}

stat() { # stat NAME N FIGURE -> median or "-"
  local f=$tmp/$1.$2
  if [ ! -s "$f" ] || grep -q incomplete "$f"; then echo -; return; fi
  local v
  v=$(while read -r line; do echo "$line" | field "$3"; done <"$f" | median)
  echo "${v:--}" # a figure this peer does not measure
}

echo "bench/scale: $(nproc) cores, $(uptime | sed 's/.*load/load/'), reps=$reps hold=${hold}s"
# Two connections a node on each side: where the file limit cannot be raised that far (a
# container without CAP_SYS_RESOURCE), a node closes its join connection before it watches.
fd_max=$(ulimit -Hn)
for n in "${sizes[@]}"; do
  conn=keep
  if [ "$fd_max" != unlimited ] && [ $((2 * n + 1024)) -gt "$fd_max" ]; then
    conn=close
    echo "  n=$n: file limit $fd_max: one connection a node after the join (--join-conn close)" >&2
  fi
  run cohort "$n" "$build/swarm" --nodes "$n" --sweep host --hold "$hold" --timeout "$limit" \
    --join-conn "$conn"
  if [ "$n" -le 512 ]; then
    run cohort_all "$n" "$build/swarm" --nodes "$n" --sweep all --hold "$hold" --timeout "$limit"
  fi
  if [ "$n" -le "$etcd_max" ]; then
    run etcd "$n" "$build/swarm_etcd" --nodes "$n" --hold "$hold" --timeout "$limit"
  fi
  if [ "$n" -le "$torch_max" ]; then
    run torch "$n" /usr/bin/python3 "$here/torch_swarm.py" --nodes "$n" --hold "$hold" --timeout "$limit"
  fi
done

ratio() { # ratio OTHER COHORT FIGURE
  if [ "$3" != hb_req_per_s ] && [ "$1" != - ] && [ "$2" != - ]; then
    awk -v c="$2" -v t="$1" 'BEGIN {if (c > 0) printf "%.2f", t / c; else print "-"}'
  else echo -; fi
}
printf '\n%-6s %-16s %12s %12s %12s %11s %14s\n' nodes figure cohort etcd TCPStore etcd/cohort TCPStore/cohort
for n in "${sizes[@]}"; do
  for f in "${figures[@]}"; do
    c=$(stat cohort "$n" "$f")
    e=$(stat etcd "$n" "$f")
    t=$(stat torch "$n" "$f")
    printf '%-6s %-16s %12s %12s %12s %11s %14s\n' "$n" "$f" "$c" "$e" "$t" "$(ratio "$e" "$c" "$f")" \
      "$(ratio "$t" "$c" "$f")"
  done
done
echo
echo "cohort with the agents' watch before 1e0e53d (every node sweeps every counter, O(N^2); --sweep all):"
for n in "${sizes[@]}"; do
  [ "$n" -le 512 ] || continue
  printf '%-6s hb_cpu_pct %s hb_req_per_s %s fail_max_ms %s\n' "$n" "$(stat cohort_all "$n" hb_cpu_pct)" \
    "$(stat cohort_all "$n" hb_req_per_s)" "$(stat cohort_all "$n" fail_max_ms)"
done

#!/usr/bin/env bash
# bench/scale/agents.sh: N real `cohort run` agents on loopback, one per
# simulated node, running a `true` job (one worker each): the time from the
# first agent's start until the last agent has exited, through the built-in
# store (node 0 hosts it at --master) and through etcd (Debian's
# etcd-server, one member on loopback, started and removed here).
# REPS runs of each, interleaved; prints the median and the ratio
# etcd / store, and the CPU each agent cost (user + system of the agents
# and their workers, from the shell's `times`, divided by N; the medians),
# how many agents exited 0 in each run (store_ok, etcd_ok: one count a run)
# and the load average (1 min) when the size's runs ended. A run in which
# any agent exits non-zero or that does not end within TIMEOUT seconds
# prints "fail" for that backend and size (its count says how many agents
# finished), and the script exits 1.
# usage: bench/scale/agents.sh [COHORT_BINARY] [REPS] [SIZES...]
#   e.g. bench/scale/agents.sh build/cohort 3 32 128 256
# Environment: TIMEOUT (per run, default 60), BACKENDS (default "store etcd").
set -u
cohort=$(readlink -f "${1:-build/cohort}")
reps=${2:-3}
shift 2 2>/dev/null || shift $#
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(32 128 256)
limit=${TIMEOUT:-60}
backends=(${BACKENDS:-store etcd})
tmp=$(mktemp -d /tmp/cohort-bench-agents-XXXXXX)
pids=()
etcd_pid=
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  [ -n "$etcd_pid" ] && kill -9 "$etcd_pid" 2>/dev/null && wait "$etcd_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
ulimit -n 65536 2>/dev/null || true
median() { sort -n | awk '{a[NR]=$1} END {if (NR==0) exit; if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_etcd() {
  local cp pp
  cp=$(free_port) pp=$(free_port)
  etcd --name b --data-dir "$tmp/etcd" --listen-client-urls "http://127.0.0.1:$cp" \
    --advertise-client-urls "http://127.0.0.1:$cp" --listen-peer-urls "http://127.0.0.1:$pp" \
    --initial-advertise-peer-urls "http://127.0.0.1:$pp" --initial-cluster "b=http://127.0.0.1:$pp" \
    >"$tmp/etcd.log" 2>&1 &
  etcd_pid=$!
  ETCD_EP=127.0.0.1:$cp
  for _ in $(seq 1 100); do
    curl -s -m 1 -X POST "http://$ETCD_EP/v3/maintenance/status" -d '{}' | grep -q '"version"' && return 0
    sleep 0.1
  done
  echo "etcd did not start" >&2
  return 1
}

# cpu_ms: the CPU (user + system, milliseconds) of this shell's waited-for children so far.
# (`times` in this shell, not in a pipeline's or a substitution's subshell, which starts at 0.)
cpu_ms() {
  times >"$tmp/times"
  sed -n 2p "$tmp/times" | tr 'ms' '  ' |
    awk '{printf "%d\n", ($1 * 60 + $2 + $3 * 60 + $4) * 1000}'
}

# one BACKEND N RUN: prints "WALL_MS:CPU_MS:OK" from first start to last exit (OK: how many
# agents exited 0), or "fail:OK".
one() {
  local backend=$1 n=$2 run=$3 i args t0 t1 bad=0 ok=0
  local tok="bench-$$-$run"
  if [ "$backend" = store ]; then
    args=(--master "127.0.0.1:$(free_port)")
  else
    args=(--rdzv-backend etcd --rdzv-endpoint "$ETCD_EP" --rdzv-id "b$$-$run")
  fi
  pids=()
  cpu_ms >"$tmp/c0"
  t0=$(date +%s%N)
  for ((i = 0; i < n; i++)); do
    # node 0 hosts the built-in store (every agent owns 127.0.0.1: ranks say which)
    local rank=()
    [ "$backend" = store ] && rank=(--node-rank "$i")
    "$cohort" run --nnodes "$n" "${rank[@]}" "${args[@]}" --token "$tok" \
      --join-timeout "$limit" --no-python true >"$tmp/a$i.log" 2>&1 &
    pids+=($!)
  done
  local end=$((SECONDS + limit))
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.02; done
    if kill -0 "$p" 2>/dev/null; then bad=1; kill -9 "$p"; fi
    if wait "$p"; then ok=$((ok + 1)); else bad=1; fi
  done
  t1=$(date +%s%N)
  pids=()
  if [ "$bad" = 1 ]; then
    echo "fail:$ok"
  else
    cpu_ms >"$tmp/c1"
    echo "$(((t1 - t0) / 1000000)):$(($(cat "$tmp/c1") - $(cat "$tmp/c0"))):$ok"
  fi
}

[[ " ${backends[*]} " == *" etcd "* ]] && { start_etcd || exit 1; }
echo "bench/scale/agents: $(nproc) cores, $(uptime | sed 's/.*load/load/'), reps=$reps"
status=0
printf '%-6s %12s %12s %12s %18s %18s %14s %14s %6s\n' nodes store_ms etcd_ms etcd/store \
  store_cpu_ms/agent etcd_cpu_ms/agent store_ok etcd_ok load
for n in "${sizes[@]}"; do
  declare -A got=()
  for b in "${backends[@]}"; do got[$b]=""; done
  for r in $(seq "$reps"); do
    for b in "${backends[@]}"; do got[$b]+="$(one "$b" "$n" "$r") "; done
  done
  declare -A med=() cpu=() oks=()
  for b in store etcd; do
    cpu[$b]=- oks[$b]=-
    if [ -z "${got[$b]+x}" ]; then med[$b]=-; continue; fi
    oks[$b]=$(echo "${got[$b]}" | tr ' ' '\n' | grep . | awk -F: '{print $NF}' | paste -sd, -)
    if [[ ${got[$b]} == *fail* ]]; then
      med[$b]=fail status=1
      echo "  $b n=$n: a run failed (${got[$b]}); its agents' last lines:" >&2
      tail -q -n 2 "$tmp"/a*.log 2>/dev/null | sort | uniq -c | sort -rn | head -5 >&2
    else
      med[$b]=$(echo "${got[$b]}" | tr ' ' '\n' | grep . | cut -d: -f1 | median)
      cpu[$b]=$(echo "${got[$b]}" | tr ' ' '\n' | grep . | cut -d: -f2 | median |
        awk -v n="$n" '{printf "%.1f", $1 / n}')
    fi
  done
  ratio=-
  if [[ ${med[store]} =~ ^[0-9.]+$ && ${med[etcd]} =~ ^[0-9.]+$ ]]; then
    ratio=$(awk -v s="${med[store]}" -v e="${med[etcd]}" 'BEGIN {printf "%.2f", e / s}')
  fi
  printf '%-6s %12s %12s %12s %18s %18s %14s %14s %6s\n' "$n" "${med[store]}" "${med[etcd]}" \
    "$ratio" "${cpu[store]}" "${cpu[etcd]}" "${oks[store]}" "${oks[etcd]}" \
    "$(cut -d' ' -f1 /proc/loadavg)"
  unset got med cpu oks
done
exit $status

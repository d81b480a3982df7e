#!/usr/bin/env bash
# bench/launch_ssh: time from the launch command to every worker running,
# N hosts x 2 workers, over the same ssh (a real sshd in each of N network
# namespaces, as tests/test_launch.sh sets them up; needs root), for each N
# given (default 2 4 8 16), the launchers side by side in every round (their
# order turns by one each round):
#   cohort launch --hosts node0,...,nodeN-1 --nproc-per-node 2
#   mpirun --host node0:2,... -np 2N (Open MPI, plm_rsh_agent = the same ssh)
#   pdsh -R ssh -w node0,... (a plain parallel ssh fan-out, 2 workers per host)
# Every launcher runs in node 0's namespace, as a user would on the first
# node: cohort launch and mpirun start node 0's workers without ssh, pdsh
# reaches node 0 over ssh too. Each worker writes the time it started; a
# run's figure is the last of them minus the time the command was started,
# and a run that did not start all 2N workers counts as failed, not as a
# figure. Beside each time, the CPU it cost, from two cgroups of the
# bench's own (cgroup v2's cpu.stat, which counts every process in them,
# reaped or not): the launcher's ("here": every process it started on this
# machine: ssh clients, node 0's agent or ranks) and the servers' (every
# sshd with its sessions: the remote shells, agents or daemons, workers).
# Prints, per N, the medians of REPS runs and the ratios to cohort launch,
# then the medians against N with the slope (least squares, per added host)
# of the time and of the CPU, and the load averages before and after.
# usage: bench/launch_ssh/run.sh [COHORT_BINARY] [REPS] [N...]
#   COHORT_BASE=PATH adds a row "cohort-base": another cohort binary (an
#   older build) run the same way in the same rounds.
#   BENCH_TOOLS="cohort mpirun" picks the rows (default: every one).
#   BENCH_SSH_CONFIG="KexAlgorithms curve25519-sha256" adds lines (one per
#   line of the value) to the ssh_config every launcher's ssh is given.
set -u
cohort=$(readlink -f "${1:-build/cohort}")
reps=${2:-5}
shift 2 2>/dev/null || shift $#
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(2 4 8 16)
max=0
for n in "${sizes[@]}"; do
  case $n in '' | *[!0-9]*) echo "bad host count '$n'"; exit 2 ;; esac
  [ "$n" -ge 1 ] && [ "$n" -le 64 ] || { echo "host counts go from 1 to 64, not $n"; exit 2; }
  [ "$n" -gt $max ] && max=$n
done
tools=(${BENCH_TOOLS:-cohort ${COHORT_BASE:+cohort-base} mpirun pdsh})
for tool in "${tools[@]}"; do
  case $tool in
    cohort) ;;
    cohort-base) [ -x "${COHORT_BASE:-}" ] || { echo "COHORT_BASE='${COHORT_BASE:-}' is not an executable"; exit 2; } ;;
    mpirun | pdsh) command -v $tool >/dev/null ||
      { echo "$tool is not installed (apt-get install openmpi-bin pdsh)"; exit 1; } ;;
    *) echo "unknown launcher '$tool' (cohort, cohort-base, mpirun, pdsh)"; exit 2 ;;
  esac
done
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$src/tests/netns_lib.sh"
. "$src/tests/sshd_lib.sh"
tmp=$(mktemp -d /tmp/cohort-bench-launch-XXXXXX)
chmod 755 "$tmp"
# The two cgroups (v2: the unified hierarchy, at /sys/fs/cgroup or, on a
# hybrid system, /sys/fs/cgroup/unified).
cgroot=/sys/fs/cgroup
[ -f $cgroot/cgroup.controllers ] || cgroot=/sys/fs/cgroup/unified
cg_here=$cgroot/cohort-bench-$$-here
cg_sshd=$cgroot/cohort-bench-$$-sshd
cleanup() {
  sshd_down
  netns_down
  rmdir "$cg_here" "$cg_sshd" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir "$cg_here" "$cg_sshd" || { echo "cannot make cgroups in $cgroot (cgroup v2 needed)"; exit 1; }
netns_up $max || { echo "cannot create network namespaces"; exit 1; }
sshd_up "$tmp" $max || exit 1
for p in "${SSHD_PIDS[@]}"; do echo "$p" >"$cg_sshd/cgroup.procs" || exit 1; done
if [ -n "${BENCH_SSH_CONFIG:-}" ]; then
  printf '%s\n' "$BENCH_SSH_CONFIG" | sed 's/^/  /' >>"$tmp/ssh_config"
  ip netns exec "$(netns_node 0)" ssh -F "$tmp/ssh_config" node$((max - 1)) true ||
    { echo "ssh refuses BENCH_SSH_CONFIG='$BENCH_SSH_CONFIG'"; exit 2; }
fi
ssh_cmd="ssh -F $tmp/ssh_config"
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "cpu: $(nproc) x $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); load average before: $(load)"
echo "ssh: $(ssh -V 2>&1)${BENCH_SSH_CONFIG:+; ssh_config adds: $BENCH_SSH_CONFIG}"

median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else if (NR) print (a[NR/2]+a[NR/2+1])/2}'; }

# cpu CGROUP: the CPU (ms) its processes used so far.
cpu() { awk '$1 == "usage_usec" {printf "%d", $2 / 1000}' "$1/cpu.stat"; }
# Waits (at most 5 s) until the last run has nothing left: no process in the
# launcher's cgroup, no session on any server (only the listeners).
settle() {
  local k
  for ((k = 0; k < 100; k++)); do
    [ -z "$(cat "$cg_here/cgroup.procs")" ] &&
      [ "$(wc -l <"$cg_sshd/cgroup.procs")" = ${#SSHD_PIDS[@]} ] && return 0
    sleep 0.05
  done
  return 1
}

# once N NAME CMD...: runs the launcher once; prints "MS LAUNCHER_CPU_MS
# SSHD_CPU_MS" (ms from start to the last worker's start; the CPU of the
# launcher's process tree and of the servers), or "fail".
once() {
  local n=$1 name=$2 t0 last h0 s0
  shift 2
  rm -rf "$tmp/t" && mkdir -m 777 "$tmp/t"
  settle
  h0=$(cpu "$cg_here") s0=$(cpu "$cg_sshd")
  t0=$(date +%s%N)
  # Into the cgroup before ip netns exec, which mounts a /sys without it.
  sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg_here" \
    ip netns exec "$(netns_node 0)" timeout 120 "$@" >"$tmp/$name.log" 2>&1
  if [ "$(ls "$tmp/t" | wc -l)" != $((2 * n)) ] || ! settle; then
    echo fail
    return
  fi
  last=$(cat "$tmp"/t/* | sort -n | tail -1)
  echo "$(((last - t0) / 1000000)) $(($(cpu "$cg_here") - h0)) $(($(cpu "$cg_sshd") - s0))"
}

# stamp NAME: the worker's line: its start time into a file of its own.
stamp() { echo "date +%s%N > $tmp/t/$1"; }
hosts() { # hosts N [:SLOTS]: node0[:S],node1[:S],...
  local i out=
  for ((i = 0; i < $1; i++)); do out+="${out:+,}node$i${2:-}"; done
  echo "$out"
}
launch_with() { # launch_with N NAME BINARY
  once "$1" "$2" "$3" launch --hosts "$(hosts "$1")" --nproc-per-node 2 \
    --ssh-opts "-F $tmp/ssh_config" -- sh -c "$(stamp 'r$RANK')"
}
run_cohort() { launch_with "$1" cohort "$cohort"; }
run_cohort-base() { launch_with "$1" cohort-base "$COHORT_BASE"; }
run_mpirun() {
  once "$1" mpirun mpirun --allow-run-as-root --host "$(hosts "$1" :2)" -np $((2 * $1)) \
    --mca plm_rsh_agent "$ssh_cmd" --mca oob_tcp_if_include eth0 \
    sh -c "$(stamp 'r$OMPI_COMM_WORLD_RANK')"
}
run_pdsh() {
  # Two workers per host from one ssh session each, as a hand-written
  # fan-out would start them.
  PDSH_SSH_ARGS="-F $tmp/ssh_config -x -l%u %h" once "$1" pdsh pdsh -R ssh -w "$(hosts "$1")" \
    "$(stamp '$(hostname)-0') & $(stamp '$(hostname)-1') & wait"
}

# slope "N Y" lines: least squares, Y per added N (one decimal), or "-".
slope() {
  awk 'NF == 2 && $2 != "" {n++; sx += $1; sy += $2; sxx += $1 * $1; sxy += $1 * $2}
       END {d = n * sxx - sx * sx; if (n < 2 || d == 0) print "-"; else printf "%.1f", (n * sxy - sx * sy) / d}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b }'; }

declare -A res med lcpu scpu
nt=${#tools[@]}
for n in "${sizes[@]}"; do
  for tool in "${tools[@]}"; do res[$tool]="" lcpu[$tool]="" scpu[$tool]=""; done
  for ((r = 0; r < reps; r++)); do
    for ((k = 0; k < nt; k++)); do
      tool=${tools[$(((k + r) % nt))]}
      out=$(run_$tool "$n")
      set -- $out
      res[$tool]+="$1 "
      [ $# = 3 ] && lcpu[$tool]+="$2 " scpu[$tool]+="$3 "
    done
  done
  echo
  echo "$n hosts x 2 workers, $reps runs each (load average $(load))"
  printf '%-12s %9s %6s %9s %9s %9s %8s   %s\n' launcher "median ms" ratio "cpu here" "cpu sshd" \
    "cpu all" "per host" "runs (ms)"
  for tool in "${tools[@]}"; do
    med[$tool,$n]=$(echo ${res[$tool]} | tr ' ' '\n' | grep -v fail | median)
    med[$tool,$n,l]=$(echo ${lcpu[$tool]} | tr ' ' '\n' | median)
    med[$tool,$n,s]=$(echo ${scpu[$tool]} | tr ' ' '\n' | median)
    med[$tool,$n,a]=$(paste -d+ <(echo ${lcpu[$tool]} | tr ' ' '\n') <(echo ${scpu[$tool]} | tr ' ' '\n') |
      grep -v '^+$' | bc | median)
  done
  c=${med[cohort,$n]:-}
  for tool in "${tools[@]}"; do
    a=${med[$tool,$n,a]}
    per=$(awk -v a="$a" -v n="$n" 'BEGIN { if (a == "") print "-"; else printf "%d", a / n }')
    printf '%-12s %9s %6s %9s %9s %9s %8s   %s\n' "$tool" "${med[$tool,$n]:--}" \
      "$(ratio "${med[$tool,$n]}" "$c")" "${med[$tool,$n,l]:--}" "${med[$tool,$n,s]:--}" "${a:--}" \
      "$per" "${res[$tool]}"
  done
  for tool in "${tools[@]}"; do
    case " ${res[$tool]} " in *" fail "*) echo "--- $tool failed at least once; last log:"; tail -5 "$tmp/$tool.log" ;; esac
  done
done
echo
echo "flatness: median ms against hosts; slopes per added host (least squares)"
printf '%-12s' launcher
for n in "${sizes[@]}"; do printf ' %7s' "$n"; done
printf ' %9s %11s %11s\n' "ms/host" "cpu ms/host" "here/host"
failed=0
for tool in "${tools[@]}"; do
  printf '%-12s' "$tool"
  for n in "${sizes[@]}"; do
    printf ' %7s' "${med[$tool,$n]:--}"
    [ -n "${med[$tool,$n]}" ] || failed=1
  done
  printf ' %9s %11s %11s\n' \
    "$(for n in "${sizes[@]}"; do echo "$n ${med[$tool,$n]}"; done | slope)" \
    "$(for n in "${sizes[@]}"; do echo "$n ${med[$tool,$n,a]}"; done | slope)" \
    "$(for n in "${sizes[@]}"; do echo "$n ${med[$tool,$n,l]}"; done | slope)"
done
echo "load average after: $(load)"
[ $failed = 0 ]

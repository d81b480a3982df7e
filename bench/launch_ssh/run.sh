#!/usr/bin/env bash
# bench/launch_ssh: time from the launch command to every worker running,
# N hosts x 2 workers, over the same ssh (a real sshd in each of N network
# namespaces, as tests/test_launch.sh sets them up; needs root), for each N
# given (default 2 4 8 16), the three launchers side by side in every round:
#   cohort launch --hosts node0,...,nodeN-1 --nproc-per-node 2
#   mpirun --host node0:2,... -np 2N (Open MPI, plm_rsh_agent = the same ssh)
#   pdsh -R ssh -w node0,... (a plain parallel ssh fan-out, 2 workers per host)
# Every launcher runs in node 0's namespace, as a user would on the first
# node: cohort launch and mpirun start node 0's workers without ssh, pdsh
# reaches node 0 over ssh too. Each worker writes the time it started; a
# run's figure is the last of them minus the time the command was started,
# and a run that did not start all 2N workers counts as failed, not as a
# figure. Prints, per N, the medians of REPS runs and the ratios to cohort
# launch, then the medians against N (flatness), and the load averages
# before and after (the figures are wall times: read the ratios).
# usage: bench/launch_ssh/run.sh [COHORT_BINARY] [REPS] [N...]
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
for tool in mpirun pdsh; do
  command -v $tool >/dev/null || { echo "$tool is not installed (apt-get install openmpi-bin pdsh)"; exit 1; }
done
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$src/tests/netns_lib.sh"
. "$src/tests/sshd_lib.sh"
tmp=$(mktemp -d /tmp/cohort-bench-launch-XXXXXX)
chmod 755 "$tmp"
cleanup() {
  sshd_down
  netns_down
  rm -rf "$tmp"
}
trap cleanup EXIT
netns_up $max || { echo "cannot create network namespaces"; exit 1; }
sshd_up "$tmp" $max || exit 1
ssh_cmd="ssh -F $tmp/ssh_config"
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "cpu: $(nproc) x $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1); load average before: $(load)"

median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else if (NR) print (a[NR/2]+a[NR/2+1])/2}'; }
# on0 CMD...: runs in node 0's namespace (the launching machine).
on0() { ip netns exec "$(netns_node 0)" "$@"; }

# once N NAME CMD...: runs the launcher once; prints ms from start to the
# last worker's start, or "fail".
once() {
  local n=$1 name=$2 t0 last
  shift 2
  rm -rf "$tmp/t" && mkdir -m 777 "$tmp/t"
  t0=$(date +%s%N)
  on0 timeout 120 "$@" >"$tmp/$name.log" 2>&1
  if [ "$(ls "$tmp/t" | wc -l)" != $((2 * n)) ]; then
    echo fail
    return
  fi
  last=$(cat "$tmp"/t/* | sort -n | tail -1)
  echo $(((last - t0) / 1000000))
}

# stamp NAME: the worker's line: its start time into a file of its own.
stamp() { echo "date +%s%N > $tmp/t/$1"; }
hosts() { # hosts N [:SLOTS]: node0[:S],node1[:S],...
  local i out=
  for ((i = 0; i < $1; i++)); do out+="${out:+,}node$i${2:-}"; done
  echo "$out"
}
run_cohort() {
  once "$1" cohort "$cohort" launch --hosts "$(hosts "$1")" --nproc-per-node 2 \
    --ssh-opts "-F $tmp/ssh_config" -- sh -c "$(stamp 'r$RANK')"
}
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

tools=(cohort mpirun pdsh)
declare -A res med
for n in "${sizes[@]}"; do
  for tool in "${tools[@]}"; do res[$tool]=""; done
  for ((r = 0; r < reps; r++)); do
    for tool in "${tools[@]}"; do res[$tool]+="$(run_$tool "$n") "; done
  done
  echo
  echo "$n hosts x 2 workers, $reps runs each"
  printf '%-14s %10s %8s   %s\n' launcher "median ms" "ratio" "runs (ms)"
  for tool in "${tools[@]}"; do
    med[$tool,$n]=$(echo ${res[$tool]} | tr ' ' '\n' | grep -v fail | median)
  done
  c=${med[cohort,$n]}
  for tool in "${tools[@]}"; do
    m=${med[$tool,$n]}
    ratio=$(awk -v a="$m" -v b="$c" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b }')
    printf '%-14s %10s %8s   %s\n' "$tool" "${m:--}" "$ratio" "${res[$tool]}"
  done
  for tool in "${tools[@]}"; do
    case " ${res[$tool]} " in *" fail "*) echo "--- $tool failed at least once; last log:"; tail -5 "$tmp/$tool.log" ;; esac
  done
done
echo
echo "flatness: median ms against hosts"
printf '%-14s' launcher
for n in "${sizes[@]}"; do printf ' %7s' "$n"; done
echo
for tool in "${tools[@]}"; do
  printf '%-14s' "$tool"
  for n in "${sizes[@]}"; do printf ' %7s' "${med[$tool,$n]:--}"; done
  echo
done
echo "load average after: $(load)"

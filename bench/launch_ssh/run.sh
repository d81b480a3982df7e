#!/usr/bin/env bash
# bench/launch_ssh: time from the launch command to every worker running, 3
# hosts x 2 workers, over the same ssh (real sshd in 3 network namespaces,
# as tests/test_launch.sh sets them up; needs root):
#   cohort launch --hosts node0,node1,node2 --nproc-per-node 2
#   mpirun --host node0:2,node1:2,node2:2 -np 6 (Open MPI, plm_rsh_agent = the same ssh)
#   pdsh -R ssh -w node0,node1,node2 (a plain parallel ssh fan-out, 2 workers per host)
# Each worker writes the time it started; a run's figure is the last of them
# minus the time the command was started. Prints the medians of REPS runs
# and the ratios to cohort launch.
# usage: bench/launch_ssh/run.sh [COHORT_BINARY] [REPS]
set -u
cohort=$(readlink -f "${1:-build/cohort}")
reps=${2:-5}
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
netns_up 3 || { echo "cannot create network namespaces"; exit 1; }
sshd_up "$tmp" 3 || exit 1
ssh_cmd="ssh -F $tmp/ssh_config"

median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
# on0 CMD...: runs in node 0's namespace (the launching machine).
on0() { ip netns exec "$(netns_node 0)" "$@"; }

# once NAME CMD...: runs the launcher once; prints ms from start to the last
# worker's start, or "fail".
once() {
  local name=$1 t0 last n
  shift
  rm -rf "$tmp/t" && mkdir -m 777 "$tmp/t"
  t0=$(date +%s%N)
  on0 "$@" >"$tmp/$name.log" 2>&1
  n=$(ls "$tmp/t" | wc -l)
  if [ "$n" != 6 ]; then
    echo fail
    return
  fi
  last=$(cat "$tmp"/t/* | sort -n | tail -1)
  echo $(((last - t0) / 1000000))
}

# stamp NAME: the worker's line: its start time into a file of its own.
stamp() { echo "date +%s%N > $tmp/t/$1"; }
run_cohort() {
  once cohort "$cohort" launch --hosts node0,node1,node2 --nproc-per-node 2 \
    --ssh-opts "-F $tmp/ssh_config" -- sh -c "$(stamp 'r$RANK')"
}
run_mpirun() {
  once mpirun mpirun --allow-run-as-root --host node0:2,node1:2,node2:2 -np 6 \
    --mca plm_rsh_agent "$ssh_cmd" --mca oob_tcp_if_include eth0 \
    sh -c "$(stamp 'r$OMPI_COMM_WORLD_RANK')"
}
run_pdsh() {
  # Two workers per host from one ssh session each, as a hand-written
  # fan-out would start them.
  PDSH_SSH_ARGS="-F $tmp/ssh_config -x -l%u %h" once pdsh pdsh -R ssh -w node0,node1,node2 \
    "$(stamp '$(hostname)-0') & $(stamp '$(hostname)-1') & wait"
}

declare -A res
for tool in cohort mpirun pdsh; do res[$tool]=""; done
for ((r = 0; r < reps; r++)); do
  for tool in cohort mpirun pdsh; do res[$tool]+="$(run_$tool) "; done
done
c=$(echo ${res[cohort]} | tr ' ' '\n' | grep -v fail | median)
printf '%-14s %10s %8s   %s\n' launcher "median ms" "ratio" "runs (ms)"
for tool in cohort mpirun pdsh; do
  m=$(echo ${res[$tool]} | tr ' ' '\n' | grep -v fail | median)
  ratio=$(awk -v a="$m" -v b="$c" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b }')
  printf '%-14s %10s %8s   %s\n' "$tool" "${m:--}" "$ratio" "${res[$tool]}"
done
for tool in cohort mpirun pdsh; do
  case " ${res[$tool]} " in *" fail "*) echo "--- $tool failed at least once; last log:"; tail -5 "$tmp/$tool.log" ;; esac
done

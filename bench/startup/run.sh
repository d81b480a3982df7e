#!/usr/bin/env bash
# bench/startup: what one `cohort` exec costs, for one or more binaries side
# by side (e.g. the build of main before a change and after it): the shared
# libraries it loads, and the CPU (perf stat's task-clock: the process and
# its children) and elapsed time of
#   version  `cohort --version`
#   run8     `cohort run --nproc-per-node 8 -- true` (one node, 8 workers)
# REPS runs of each, the binaries interleaved run by run; prints the median
# of each and the ratio to the first binary. A run8 that exits non-zero
# gives no figure: the script says so and exits 1.
# usage: bench/startup/run.sh [REPS] COHORT_BINARY...
#   e.g. bench/startup/run.sh 50 /tmp/main/build/cohort build/cohort
set -u
reps=${1:-50}
shift
[ $# -gt 0 ] || set -- build/cohort
bins=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
command -v perf >/dev/null || { echo "bench/startup: needs perf (linux-perf)" >&2; exit 1; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR==0) exit; if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# once I CASE CMD...: appends "task_ms elapsed_ms" to $tmp/I.CASE, or "fail".
once() {
  local i=$1 case=$2 t0 t1 tc
  shift 2
  t0=$(date +%s%N)
  if ! perf stat -x, -e task-clock -o "$tmp/perf" "$@" >/dev/null 2>&1; then
    echo fail >>"$tmp/$i.$case"
    return
  fi
  t1=$(date +%s%N)
  tc=$(awk -F, '$3 == "task-clock" {print $1}' "$tmp/perf")
  echo "$tc $(echo "scale=3; ($t1 - $t0) / 1000000" | bc)" >>"$tmp/$i.$case"
}

for ((r = 0; r < reps; r++)); do
  for i in "${!bins[@]}"; do
    once "$i" version "${bins[$i]}" --version
    once "$i" run8 "${bins[$i]}" run --nproc-per-node 8 -- true
  done
done

echo "bench/startup: $(nproc) cores, $(uptime | sed 's/.*load/load/'), reps=$reps"
printf '%-4s %-40s %5s %12s %12s %12s %12s\n' "" binary libs version_cpu version_wall run8_cpu run8_wall
status=0
declare -a base
for i in "${!bins[@]}"; do
  libs=$(LD_TRACE_LOADED_OBJECTS=1 "${bins[$i]}" | grep -vc vdso)
  row=()
  for case in version run8; do
    if grep -q fail "$tmp/$i.$case"; then
      row+=(fail fail)
      status=1
      continue
    fi
    row+=("$(awk '{print $1}' "$tmp/$i.$case" | median)" "$(awk '{print $2}' "$tmp/$i.$case" | median)")
  done
  printf '%-4s %-40s %5s %12s %12s %12s %12s\n' "#$i" "${bins[$i]}" "$libs" "${row[@]}"
  if [ "$i" = 0 ]; then base=("${row[@]}"); continue; fi
  ratios=()
  for k in 0 1 2 3; do
    if [[ ${row[$k]} =~ ^[0-9.]+$ && ${base[$k]} =~ ^[0-9.]+$ ]]; then
      ratios+=("$(awk -v a="${base[$k]}" -v b="${row[$k]}" 'BEGIN {printf "%.2fx", a / b}')")
    else ratios+=(-); fi
  done
  printf '%-4s %-40s %5s %12s %12s %12s %12s\n' "" "  #0 / #$i" "" "${ratios[@]}"
done
echo "(milliseconds, medians; cpu = perf task-clock of the process and its children)"
exit $status

#!/usr/bin/env bash
# bench/launch: cohort run vs torchrun (Debian's torch 1.13), side by side.
#  1. start-to-exit time of an 8-worker job whose workers do nothing (`true`);
#  2. time from one worker's crash until every worker is gone (agent exited).
# Prints the median of REPS repetitions and the ratios.
# usage: bench/launch/run.sh [COHORT_BINARY] [REPS]
set -euo pipefail
cohort=${1:-build/cohort}
reps=${2:-5}
torchrun=(/usr/bin/python3 -m torch.distributed.run)
# torchrun 1.13 crashes on Python 3.11 unless given --redirects and --tee.
torchrun_flags=(--standalone --nproc_per_node 8 --redirects 2 --tee 1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

now_ns() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

launch_once() { # prints seconds
  local t0 t1
  t0=$(now_ns)
  "$@" >/dev/null 2>&1 || true
  t1=$(now_ns)
  echo "scale=4; ($t1-$t0)/1000000000" | bc
}

# The crashing worker records when it dies; the others would sleep 60 s.
crash_script='if [ "$RANK" = 3 ]; then sleep 1; date +%s%N > "$CRASH_FILE"; exit 1; fi; exec sleep 60'
crash_once() { # prints seconds from the crash to the launcher's exit
  local t1
  rm -f "$tmp/crash"
  CRASH_FILE=$tmp/crash "$@" sh -c "$crash_script" >/dev/null 2>&1 || true
  t1=$(now_ns)
  echo "scale=4; ($t1-$(cat "$tmp/crash"))/1000000000" | bc
}

for i in $(seq "$reps"); do
  launch_once "$cohort" run --nproc-per-node 8 -- true >>"$tmp/l_cohort"
  launch_once "${torchrun[@]}" "${torchrun_flags[@]}" --no_python true >>"$tmp/l_torch"
  crash_once "$cohort" run --nproc-per-node 8 -- >>"$tmp/c_cohort"
  crash_once "${torchrun[@]}" "${torchrun_flags[@]}" --no_python >>"$tmp/c_torch"
done

lc=$(median <"$tmp/l_cohort"); lt=$(median <"$tmp/l_torch")
cc=$(median <"$tmp/c_cohort"); ct=$(median <"$tmp/c_torch")
printf '%-44s %12s %12s %10s\n' "median of $reps runs (seconds)" "cohort" "torchrun" "ratio"
printf '%-44s %12.4f %12.4f %9.1fx\n' "launch: 8 workers of 'true', start to exit" "$lc" "$lt" "$(echo "$lt/$lc" | bc -l)"
printf '%-44s %12.4f %12.4f %9.1fx\n' "failure: one worker crashes, until all gone" "$cc" "$ct" "$(echo "$ct/$cc" | bc -l)"

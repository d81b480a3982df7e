#!/usr/bin/env bash
# bench/launch: cohort run vs torchrun (Debian's torch 1.13), side by side.
#  1. start-to-exit time of an 8-worker job whose workers only leave a mark
#     (`sh -c ': > FILE'`);
#  2. time from one worker's crash until every worker is gone (agent exited).
# cohort runs each twice: with its own line (`cohort run --nproc-per-node 8 --
# CMD`) and with torchrun's (`cohort run --standalone --nproc-per-node 8
# --no-python CMD`). Prints the median of REPS repetitions and the ratios. A run whose workers
# did not all start (no mark, no crash) gives no figure: the script says so
# and exits 1.
# usage: bench/launch/run.sh [COHORT_BINARY] [REPS]
#   BENCH_TOOLS="cohort" measures cohort alone (default "cohort tline torch";
#   tline is cohort given torchrun's line).
set -euo pipefail
cohort=${1:-build/cohort}
reps=${2:-5}
torchrun=(/usr/bin/python3 -m torch.distributed.run)
# torchrun 1.13 crashes on Python 3.11 unless given --redirects and --tee.
torchrun_flags=(--standalone --nproc_per_node 8 --redirects 2 --tee 1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

now_ns() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR==0) exit; if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# Every worker leaves a mark; a run counts only when all 8 did.
mark_script=': > "$MARK_DIR/$RANK"'
launch_once() { # prints seconds, or "fail"
  local t0 t1
  rm -rf "$tmp/marks" && mkdir "$tmp/marks"
  t0=$(now_ns)
  MARK_DIR=$tmp/marks "$@" sh -c "$mark_script" >/dev/null 2>&1 || true
  t1=$(now_ns)
  [ "$(ls "$tmp/marks" | wc -l)" = 8 ] || { echo fail; return; }
  echo "scale=4; ($t1-$t0)/1000000000" | bc
}

# The crashing worker records when it dies; the others mark their start and
# would sleep 60 s.
crash_script=': > "$MARK_DIR/$RANK"; if [ "$RANK" = 3 ]; then sleep 1; date +%s%N > "$CRASH_FILE"; exit 1; fi; exec sleep 60'
crash_once() { # prints seconds from the crash to the launcher's exit, or "fail"
  local t1
  rm -rf "$tmp/crash" "$tmp/marks" && mkdir "$tmp/marks"
  MARK_DIR=$tmp/marks CRASH_FILE=$tmp/crash "$@" sh -c "$crash_script" >/dev/null 2>&1 || true
  t1=$(now_ns)
  { [ -s "$tmp/crash" ] && [ "$(ls "$tmp/marks" | wc -l)" = 8 ]; } || { echo fail; return; }
  echo "scale=4; ($t1-$(cat "$tmp/crash"))/1000000000" | bc
}

tools=" ${BENCH_TOOLS:-cohort tline torch} "
cohort_cmd=("$cohort" run --nproc-per-node 8 --)
tline_cmd=("$cohort" run --standalone --nproc-per-node 8 --no-python)
torch_cmd=("${torchrun[@]}" "${torchrun_flags[@]}" --no_python)
: >"$tmp/l_cohort"; : >"$tmp/l_tline"; : >"$tmp/l_torch"
: >"$tmp/c_cohort"; : >"$tmp/c_tline"; : >"$tmp/c_torch"
for i in $(seq "$reps"); do
  for t in cohort tline torch; do
    [[ $tools == *" $t "* ]] || continue
    declare -n cmd=${t}_cmd
    launch_once "${cmd[@]}" >>"$tmp/l_$t"
    crash_once "${cmd[@]}" >>"$tmp/c_$t"
  done
done

# figure FILE: the median of the runs that gave a time, "fail" when none
# did, "-" for a tool not measured.
figure() {
  local m
  m=$(grep -E '^[0-9.]+$' "$1" | median)
  if [ -n "$m" ]; then printf "%.4f\n" "$m"; elif [ -s "$1" ]; then echo fail; else echo -; fi
}
ratio() { if [[ $1 =~ ^[0-9.]+$ && $2 =~ ^[0-9.]+$ ]]; then printf '%.1fx' "$(echo "$2/$1" | bc -l)"; else echo n/a; fi; }
lc=$(figure "$tmp/l_cohort"); lt=$(figure "$tmp/l_torch"); ll=$(figure "$tmp/l_tline")
cc=$(figure "$tmp/c_cohort"); ct=$(figure "$tmp/c_torch"); cl=$(figure "$tmp/c_tline")
printf '%-44s %12s %12s %10s\n' "median of $reps runs (seconds)" "cohort" "torchrun" "ratio"
printf '%-44s %12s %12s %10s\n' "launch: 8 workers, start to exit" "$lc" "$lt" "$(ratio "$lc" "$lt")"
printf '%-44s %12s %12s %10s\n' "  the same, given torchrun's line" "$ll" "$lt" "$(ratio "$ll" "$lt")"
printf '%-44s %12s %12s %10s\n' "failure: one worker crashes, until all gone" "$cc" "$ct" "$(ratio "$cc" "$ct")"
printf '%-44s %12s %12s %10s\n' "  the same, given torchrun's line" "$cl" "$ct" "$(ratio "$cl" "$ct")"
bad=$(cat "$tmp"/l_* "$tmp"/c_* | grep -c '^fail$' || true)
if [ "$bad" -gt 0 ]; then
  echo "bench/launch: $bad runs did not start all their workers: no figure from them" >&2
  exit 1
fi

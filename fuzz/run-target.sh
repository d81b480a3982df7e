#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time over its committed seed corpus.
#   run-target.sh BINARY SEED_CORPUS_DIR SECONDS RESULTS_DIR [libFuzzer flags...]
# New inputs go to a temporary directory (the committed corpus is only read).
# Exit status: libFuzzer's, so a crash, leak, timeout or OOM fails the run.
# The last stats line (execs, cov, ft) is kept in RESULTS_DIR/<name>.txt for
# bench/reliability/figures.sh.
set -uo pipefail
bin=$1 seeds=$2 secs=$3 results=$4
shift 4
name=$(basename "$bin")
if [ ! -d "$seeds" ]; then
  echo "run-target: no seed corpus at $seeds" >&2
  exit 2
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/cohort-fuzz-$name.XXXXXX")
# The harnesses' scratch files (fuzz_util.h), in memory when /dev/shm is
# there, removed with the work directory even when the target is killed.
scratch=$(mktemp -d /dev/shm/cfz.XXXXXX 2>/dev/null || mktemp -d "$work/s.XXXXXX")
export COHORT_FUZZ_SCRATCH=$scratch
trap 'rm -rf "$work" "$scratch"' EXIT
trap 'exit 143' TERM INT
mkdir -p "$results" "$work/corpus" "$work/artifacts"
log=$work/log
t0=$SECONDS
# -timeout: one input taking longer is a hang; -rss_limit_mb: runaway memory;
# -error_exitcode/-timeout_exitcode make every kind of failure non-zero.
"$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -error_exitcode=77 -timeout_exitcode=78 -artifact_prefix="$work/artifacts/" \
  "$@" "$work/corpus" "$seeds" >"$log" 2>&1
rc=$?
elapsed=$((SECONDS - t0))
# The final stats, and the last progress line's coverage.
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1)
cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
{
  echo "target=$name seconds=$elapsed execs=${execs:-0} cov=${cov:-0} ft=${ft:-0} rc=$rc"
} | tee "$results/$name.txt"
if [ $rc -ne 0 ]; then
  echo "run-target: $name FAILED (exit $rc); the end of its log:" >&2
  tail -60 "$log" >&2
  for a in "$work"/artifacts/*; do
    [ -e "$a" ] || continue
    mkdir -p "$results/artifacts"
    cp "$a" "$results/artifacts/" && echo "run-target: input kept in $results/artifacts/$(basename "$a")" >&2
  done
fi
exit $rc

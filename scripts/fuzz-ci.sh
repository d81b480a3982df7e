#!/usr/bin/env bash
# Builds every libFuzzer target with clang (ASan+UBSan) in its own build
# directory and runs each for a bounded time over its seed corpus; fails on
# any crash, leak, timeout or out-of-memory. Run by `make test`.
#   scripts/fuzz-ci.sh [BUILD_DIR]       (default build-fuzz)
# Environment: COHORT_FUZZ_SECONDS per target (default 30), JOBS (default
# nproc) for the build, FUZZ_JOBS (default JOBS) targets fuzzing at once,
# one core each: 15 targets take 15 x 30 s / FUZZ_JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-fuzz}
secs=${COHORT_FUZZ_SECONDS:-30}
jobs=${JOBS:-$(nproc)}
fuzz_jobs=${FUZZ_JOBS:-$jobs}

cc=$(command -v clang || command -v clang-14 || true)
if [ -z "$cc" ]; then
  echo "fuzz-ci: clang is not installed; run scripts/deps.sh (it installs clang and libclang-rt-14-dev)" >&2
  exit 1
fi
# libFuzzer's runtime comes with libclang-rt-14-dev; check before building.
probe=$(mktemp -d "${TMPDIR:-/tmp}/cohort-fuzzprobe.XXXXXX")
trap 'rm -rf "$probe"' EXIT
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n);\nint LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' >"$probe/t.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$probe/t.c" -o "$probe/t" 2>"$probe/err"; then
  echo "fuzz-ci: $cc cannot build a libFuzzer target (libclang-rt-14-dev missing?); run scripts/deps.sh:" >&2
  head -3 "$probe/err" >&2
  exit 1
fi

cmake -S . -B "$build" -DCMAKE_C_COMPILER="$cc" -DCOHORT_FUZZ=ON -DCOHORT_WERROR=ON \
  -DCOHORT_FUZZ_SECONDS="$secs" >/dev/null
cmake --build "$build" -j "$jobs" --target fuzz_all
rm -rf "$build/fuzz-results"
start=$(date +%s)
status=0
(cd "$build" && ctest --output-on-failure -L fuzz -j "$fuzz_jobs") || status=$?
echo "fuzz-ci: $(($(date +%s) - start)) s of fuzzing; per target:"
cat "$build"/fuzz-results/*.txt 2>/dev/null || true
exit $status

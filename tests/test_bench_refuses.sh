#!/usr/bin/env bash
# The benchmarks print no figure for a run whose workers did not start or did
# not do their work. Each is given a "cohort" that is not cohort (/bin/true:
# exits 0 at once, starts nothing) and must exit non-zero with every figure
# replaced by "fail" (bench/recovery's torchrun row also with --grad-compress,
# which it passes on); bench_store given a Python that fails prints no peer
# figure; the reliability figures refuse a build without its programs and
# leave docs/reliability.md alone; bench/train/compress_curve.sh runs small
# and refuses a failed run or a PowerSGD run without compression. (Root:
# bench/multinode and bench/launch_ssh use namespaces; launch_ssh an sshd
# in one, and cgroups.)
# usage: test_bench_refuses.sh BENCH_STORE_BINARY SOURCE_DIR
set -u
bench_store=$(readlink -f "$1")
src=$(readlink -f "$2")
. "$src/tests/check_lib.sh"
tmp=$(mktemp -d /tmp/cohort-bench-refuses-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
number='[0-9]\.[0-9]'

BENCH_TOOLS=cohort "$src/bench/launch/run.sh" /bin/true 1 >"$tmp/launch" 2>&1
rc=$?
check "bench/launch: a job that never started exits non-zero ($rc)" [ $rc != 0 ]
check "bench/launch: both rows say fail" [ "$(grep -cE '^(launch|failure):.* fail ' "$tmp/launch")" = 2 ]
check "bench/launch: no figure" not grep -q "$number" "$tmp/launch"

BENCH_TOOLS=cohort "$src/bench/multinode/run.sh" /bin/true 1 2 >"$tmp/mn" 2>&1
rc=$?
check "bench/multinode: a job that never started exits non-zero ($rc)" [ $rc != 0 ]
check "bench/multinode: both rows say fail" [ "$(grep -cE '^2 +(rendezvous|failure propagation) +fail ' "$tmp/mn")" = 2 ]
check "bench/multinode: no figure (no 'failure propagation' time)" not grep -q "$number" "$tmp/mn"

BENCH_TOOLS=cohort "$src/bench/launch_ssh/run.sh" /bin/true 1 1 >"$tmp/lssh" 2>&1
rc=$?
check "bench/launch_ssh: a launch that started no worker exits non-zero ($rc)" [ $rc != 0 ]
check "bench/launch_ssh: its run says fail" grep -qE '^cohort( +-){6} +fail $' "$tmp/lssh"
check "bench/launch_ssh: no figure on cohort's rows (time, CPU, flatness)" \
  [ "$(grep -cE '^cohort ' "$tmp/lssh")" = 2 -a "$(grep -cE '^cohort .*[0-9]' "$tmp/lssh")" = 0 ]

/usr/bin/python3 "$src/bench/recovery/run.py" --cohort /bin/true --gpt2 /bin/true --reps 1 \
  --rows "cohort restart" --timeout 30 >"$tmp/recovery" 2>&1
rc=$?
check "bench/recovery: a job that never started exits non-zero ($rc)" [ $rc != 0 ]
check "bench/recovery: the row says fail" grep -qE '^\| cohort restart \| fail' "$tmp/recovery"
check "bench/recovery: no figure" not grep -qE '^\|.*[0-9]\.[0-9]' "$tmp/recovery"
# A job that runs but never reaches the kill step: its run's limit (--row-limit) ends it, and
# the bench says which limit; a caller's SIGINT ends the bench with the row failed, no figure.
printf '#!/bin/sh\nexec sleep 60\n' >"$tmp/sleeper" && chmod +x "$tmp/sleeper"
/usr/bin/python3 "$src/bench/recovery/run.py" --cohort "$tmp/sleeper" --gpt2 /bin/true --reps 2 \
  --rows "cohort restart" --row-limit 2 >"$tmp/recovery_limit" 2>&1
rc=$?
check "bench/recovery: a run ended by its limit exits non-zero ($rc)" [ $rc != 0 ]
check "bench/recovery: ... the row says which limit ended it" \
  grep -qE "^\| cohort restart \| fail: run 1 of 2: the run's 2 s limit \(--row-limit\)" \
  "$tmp/recovery_limit"
check "bench/recovery: ... no figure" not grep -qE '^\|.*[0-9]\.[0-9]' "$tmp/recovery_limit"
/usr/bin/python3 "$src/bench/recovery/run.py" --cohort "$tmp/sleeper" --gpt2 /bin/true --reps 1 \
  --rows "cohort restart" --row-limit 60 >"$tmp/recovery_int" 2>&1 &
pid=$!
for _ in $(seq 100); do ip netns list | grep -q "^cm${pid}n2" && break; sleep 0.1; done
kill -INT $pid
wait $pid
rc=$?
check "bench/recovery: stopped by SIGINT exits non-zero ($rc)" [ $rc != 0 ]
check "bench/recovery: ... the row says SIGINT ended it" \
  grep -qE '^\| cohort restart \| fail: SIGINT ended run 1 of 1' "$tmp/recovery_int"
check "bench/recovery: ... no figure" not grep -qE '^\|.*[0-9]\.[0-9]' "$tmp/recovery_int"
check "bench/recovery: ... its namespaces removed" not sh -c "ip netns list | grep -q '^cm${pid}'"

# --grad-compress reaches the torchrun restart row (torch_ckpt.py gets the cohort-gpt2 rows'
# flags, for DDP's powerSGD_hook; a torchrun that exits at once: the row fails, no figure); the
# torch reform row says why it does not run; with torch 1.13, bf16's row says why not either.
printf '#!/bin/sh\necho "cuda=[${CUDA_VISIBLE_DEVICES-unset}] $*" >>"%s/torchrun_argv"\n' "$tmp" \
  >"$tmp/fake_torchrun"
chmod +x "$tmp/fake_torchrun"
/usr/bin/python3 "$src/bench/recovery/run.py" --cohort "$(dirname "$bench_store")/cohort" \
  --gpt2 /bin/true --reps 1 --rows "torchrun restart,torch reform" --grad-compress powersgd:2 \
  --torchrun "$tmp/fake_torchrun" --row-limit 30 >"$tmp/recovery_psgd" 2>&1
rc=$?
check "bench/recovery --grad-compress powersgd:2: torchrun given torch_ckpt.py's PowerSGD flags" \
  grep -qE 'torch_ckpt\.py .*--grad-compress powersgd:2 --powersgd-start 2' "$tmp/torchrun_argv"
check "bench/recovery: ... its workers see no GPU (CUDA_VISIBLE_DEVICES empty: the hook's synchronize)" \
  grep -qE '^cuda=\[\] ' "$tmp/torchrun_argv"
check "bench/recovery: ... its row ran (fail: the fake torchrun trained nothing; exit $rc)" \
  [ $rc != 0 -a "$(grep -cE '^\| torchrun restart \| fail: run 1 of 1' "$tmp/recovery_psgd")" = 1 ]
check "bench/recovery: ... the torch reform row: not run, and why" \
  grep -qE '^\| torch reform \| not run: torch_reform.py has no --grad-compress' "$tmp/recovery_psgd"
check "bench/recovery: ... no figure" not grep -qE '^\|.*[0-9]\.[0-9]' "$tmp/recovery_psgd"
if /usr/bin/python3 -c 'import torch, sys; sys.exit(not torch.__version__.startswith("1.13"))' 2>/dev/null; then
  /usr/bin/python3 "$src/bench/recovery/run.py" --cohort /bin/true --gpt2 /bin/true --reps 1 \
    --rows "torchrun restart" --grad-compress bf16 --row-limit 30 >"$tmp/recovery_bf16" 2>&1
  check "bench/recovery --grad-compress bf16, torch 1.13: the torchrun row says why not (CUDA, NCCL)" \
    grep -qE "^\| torchrun restart \| not run: DDP's bf16 hook does not run here: .*NCCL" \
    "$tmp/recovery_bf16"
fi

COHORT_BENCH_PYTHON=/bin/false "$bench_store" 1 20 >"$tmp/store" 2>&1
rc=$?
check "bench_store: its own figures with a failed peer ($rc)" [ $rc = 0 ]
check "bench_store: the peer is said to have failed" contains "$tmp/store" "not available"
check "bench_store: no peer figure on any row" \
  not grep -E '^(ping|set|get|add|rdzv).*[0-9]+\.[0-9]+ +[0-9]+\.[0-9]+' "$tmp/store"

sum=$(sha256sum "$src/docs/reliability.md")
"$src/bench/reliability/figures.sh" "$tmp/nobuild" "$tmp/noresults" --no-tsan >"$tmp/fig" 2>&1
rc=$?
check "reliability figures: refused without the programs ($rc)" [ $rc = 2 ]
check "reliability figures: docs/reliability.md untouched" [ "$(sha256sum "$src/docs/reliability.md")" = "$sum" ]

# bench/train/compress_curve.sh at a small size (the tiny model, 8 steps): a table and both
# curves in one picture; no figure when a run fails or the PowerSGD run does not compress.
build=$(dirname "$bench_store")
curve() { OMP_NUM_THREADS=1 STEPS=8 PSGD_START=2 "$src/bench/train/compress_curve.sh" "$build" "$tmp/$1" >"$tmp/$1.out" 2>&1; }
MODEL="--model tiny" PSGD=powersgd:2 curve cv_ok
rc=$?
check "compress_curve: a small run exits 0 ($rc)" [ $rc = 0 ]
check "compress_curve: the ratio of the final losses" grep -q "final loss powersgd / none: $number" "$tmp/cv_ok.out"
check "compress_curve: both runs in one picture" \
  [ "$(grep -c '<polyline class="loss" data-series' "$tmp/cv_ok/curves.svg" 2>/dev/null)" = 2 ]
MODEL="--model tiny" PSGD=none curve cv_none
rc=$?
check "compress_curve: a 'PowerSGD' run without compression exits non-zero ($rc)" [ $rc != 0 ]
check "compress_curve: ... and says so" grep -q "shows no compression" "$tmp/cv_none.out"
MODEL="--model bogus" PSGD=powersgd:2 curve cv_fail
rc=$?
check "compress_curve: a failed run exits non-zero ($rc)" [ $rc != 0 ]
check "compress_curve: ... with no figure" not grep -q "final loss" "$tmp/cv_fail.out" "$tmp/cv_none.out"

if [ $failed -ne 0 ]; then
  for f in "$tmp"/*; do echo "== $f"; cat "$f"; done
fi
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

#!/usr/bin/env bash
# A real, unmodified PyTorch DDP script (gloo, env://) trains with 2 workers
# under `cohort run`, and both ranks end with identical parameters.
# usage: test_torch_ddp.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$1
src=$2
py=/usr/bin/python3
if ! $py -c 'import torch' 2>/dev/null; then
  echo "FAIL: $py cannot import torch (scripts/deps.sh installs python3-torch)"
  exit 1
fi
out=$(timeout 300 "$cohort" run --nproc-per-node 2 -- $py "$src/tests/torch/ddp_train.py" 2>&1)
rc=$?
echo "$out"
fail=0
[ $rc -eq 0 ] || { echo "FAIL: cohort run exited $rc"; fail=1; }
d0=$(echo "$out" | sed -n 's/^\[r0\] PARAMS //p')
d1=$(echo "$out" | sed -n 's/^\[r1\] PARAMS //p')
[ -n "$d0" ] && [ -n "$d1" ] || { echo "FAIL: missing PARAMS lines"; fail=1; }
[ "$d0" = "$d1" ] || { echo "FAIL: parameters differ: $d0 vs $d1"; fail=1; }
echo "$out" | grep -q '^\[r0\] LOSS .* world 2$' || { echo "FAIL: world size is not 2"; fail=1; }
# A worker that raises under @record: the report quotes its exception.
out=$(timeout 300 "$cohort" run --nproc-per-node 2 -- $py "$src/tests/torch/record_fail.py" 2>&1)
rc=$?
[ $rc -eq 1 ] || { echo "FAIL: a raising worker gave exit $rc, not 1"; fail=1; }
echo "$out" | grep -q '^cohort: exception: ValueError: learning rate must be positive, got -0.1$' ||
  { echo "FAIL: the report does not quote the exception"; echo "$out"; fail=1; }
if [ $fail -eq 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
exit $fail

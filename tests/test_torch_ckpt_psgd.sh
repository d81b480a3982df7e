#!/usr/bin/env bash
# bench/recovery's torchrun restart row with DDP's PowerSGD hook (torch_ckpt.py
# --grad-compress powersgd): 3 ranks under Debian's torchrun on loopback train
# the bench's small GPT-2 with powerSGD_hook from step 2 (with DDP's several
# buckets torch 1.13 over gloo aborts at the first compressed step: one bucket
# here), save each rank's PowerSGDState with the snapshot, and a restart loads
# it and compresses again; a restart that misses one rank's state starts
# PowerSGD afresh on every rank alike (docs/reform.md, "PowerSGD in the
# torchrun restart row").
# usage: test_torch_ckpt_psgd.sh SOURCE_DIR
set -u
src=$(readlink -f "$1")
. "$src/tests/check_lib.sh"
py=/usr/bin/python3
"$py" -c 'import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook' 2>/dev/null || {
  echo "SKIP: no PyTorch with powerSGD_hook at $py"
  exit 77
}
tmp=$(mktemp -d /tmp/cohort-torch-psgd-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
train() {  # NAME STEPS: 3 ranks, checkpoint every 4 steps, PowerSGD rank 4 from step 2
  OMP_NUM_THREADS=1 timeout 300 "$py" -m torch.distributed.run --standalone --nproc_per_node 3 \
    --redirects 2 --tee 1 "$src/bench/recovery/torch_ckpt.py" --layers 4 --heads 4 \
    --channels 128 --vocab 4096 --steps "$2" --ckpt "$tmp/snap.pt" --ckpt-every 4 \
    --grad-compress powersgd --powersgd-start 2 >"$tmp/$1.out" 2>&1
  echo $? >"$tmp/$1.rc"
}
compressed() {  # NAME: rank 0's compression line says more than 1x
  grep -E '^\[default0\]:PowerSGD: compression [0-9.]+x' "$tmp/$1.out" |
    awk '{ sub(/x$/, "", $3); n++; ok = $3 > 1 } END { exit !(n == 1 && ok) }'
}

train first 4
check "3 ranks, several-bucket model, PowerSGD from step 2: exit 0" rc first 0
check "... every step done" grep -q '^\[default0\]:step 4/4' "$tmp/first.out"
check "... compressed (rank 0's compression above 1x)" compressed first
check "... each rank's PowerSGD state saved beside the snapshot" \
  [ -s "$tmp/snap.pt.psgd0" -a -s "$tmp/snap.pt.psgd1" -a -s "$tmp/snap.pt.psgd2" ]

train resumed 7
check "restart: exit 0" rc resumed 0
check "... resumed at the snapshot" grep -q '^\[default0\]:resumed at step 4' "$tmp/resumed.out"
check "... PowerSGD state loaded" grep -q '^\[default0\]:PowerSGD state loaded' "$tmp/resumed.out"
check "... every step done" grep -q '^\[default0\]:step 7/7' "$tmp/resumed.out"
check "... compressed again" compressed resumed

rm "$tmp/snap.pt.psgd2"
train afresh 8
check "one rank's state missing: exit 0 (every rank starts PowerSGD afresh)" rc afresh 0
check "... and says so" grep -q '^\[default0\]:PowerSGD state not saved at that step' "$tmp/afresh.out"
check "... every step done" grep -q '^\[default0\]:step 8/8' "$tmp/afresh.out"
check "... compressed after its warm-up" compressed afresh

if [ $failed -ne 0 ]; then
  for f in "$tmp"/*.out; do echo "== $f"; tail -30 "$f"; done
fi
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

#!/usr/bin/env bash
# The main job of `make demo`: a small GPT-2 learns to write licence text.
# Two ranks on this machine under `cohort run` train data-parallel on the
# texts of /usr/share/common-licenses (GPL, Apache, MPL, ...: 270 KB that
# Debian's base-files ships on every machine), one byte per token, read in
# file order, not repeated: the 120 steps take in 123 K tokens, under half of
# it. The loss falls from ln(256) = 5.5 towards 2.6 in about a minute. The
# metrics are drawn with `cohort plot`; the SVG's path is printed at the end.
#
# usage: scripts/demo.sh [--qa] [BUILD_DIR] [-- EXTRA cohort-gpt2 ARGS]
#   --qa   the seed's stress test instead: GPT-2 124M with the
#          question-answering head on fake data (random tokens, nothing to
#          learn), SGD lr 0.01 momentum 0.5, 10 steps.
# Output goes to BUILD_DIR/demo/ (metrics.jsonl, loss.svg).
set -euo pipefail
mode=text
if [ "${1:-}" = --qa ]; then
  mode=qa
  shift
fi
build=build
if [ $# -gt 0 ] && [ "$1" != -- ]; then
  build=$1
  shift
fi
[ "${1:-}" = -- ] && shift
for bin in cohort cohort-gpt2; do
  if [ ! -x "$build/$bin" ]; then
    echo "demo: $build/$bin not found; build first (make build)" >&2
    exit 2
  fi
done

if [ $mode = qa ]; then
  exec "$build/cohort" run --nproc-per-node 2 -- "$build/cohort-gpt2" --model 124M \
    --head qa --optimizer sgd --batch 4 --seq-len 64 --steps 10 "$@"
fi

text=/usr/share/common-licenses
if [ ! -d "$text" ]; then
  echo "demo: $text not found (Debian's base-files ships it)" >&2
  exit 1
fi
out=$build/demo
mkdir -p "$out"
rm -f "$out/metrics.jsonl" "$out/loss.svg"
start=$SECONDS
"$build/cohort" run --nproc-per-node 2 -- "$build/cohort-gpt2" --data "$text" --vocab 256 \
  --layers 4 --heads 4 --channels 128 --positions 64 --seq-len 64 --batch 8 \
  --steps 120 --lr 2e-3 --metrics "$out/metrics.jsonl" "$@"
seconds=$((SECONDS - start))
"$build/cohort" plot "$out/metrics.jsonl" -o "$out/loss.svg"
loss() { sed -n "$1"'s/^{"step":[0-9]*,"loss":\([0-9.]*\).*/\1/p' "$out/metrics.jsonl"; }
printf 'demo: loss %.2f at step 1, %.2f at the last step; %d s in all\n' "$(loss 1)" "$(loss '$')" \
  "$seconds"
echo "demo: loss and throughput curves: $(readlink -f "$out/loss.svg")"

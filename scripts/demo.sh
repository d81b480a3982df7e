#!/usr/bin/env bash
# The main job of `make demo`: GPT-2 (124M) trained data-parallel on fake
# data by two ranks on this machine under `cohort run`, printing loss and
# throughput per step and a summary. Run from the build directory given as $1.
# Extra arguments go to cohort-gpt2 (e.g. --steps 50 --head qa).
set -euo pipefail
build=${1:-build}
shift || true
exec "$build/cohort" run --nproc-per-node 2 -- \
  "$build/cohort-gpt2" --model 124M --batch 4 --seq-len 64 --steps 10 "$@"

#!/usr/bin/env bash
# bench/train/compress_curve.sh - does PowerSGD train as well as uncompressed
# gradients? Two data-parallel runs of cohort-gpt2 under `cohort run` on real
# text (the licence texts Debian ships in /usr/share/common-licenses, byte
# tokens), the same model, data, seed and steps, one with
# `--grad-compress none` and one with `--grad-compress powersgd[:RANK]`; then
# the final loss of each (the mean of the last 10 steps, since one step's
# loss is one batch's), their ratio, the bytes on the wire and the loss
# curves of both in one picture (`cohort plot A B -o curves.svg`).
#
# No figure for a run that did not do its work: each must exit 0 and write
# every step on the expected world size; the PowerSGD run must show
# compression after its start step.
#
# usage: bench/train/compress_curve.sh [BUILD_DIR] [OUT_DIR]
#   env: STEPS=150 RANKS=2 PSGD=powersgd:4 PSGD_START=10
#        MODEL="--model 124M --vocab 256" (GPT-2 124M's layers over bytes)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=$(cd "${1:-$HERE/../../build}" && pwd) || exit 1
OUT=${2:-$BUILD/compress-curve}
STEPS=${STEPS:-150}
RANKS=${RANKS:-2}
PSGD=${PSGD:-powersgd:4}
PSGD_START=${PSGD_START:-10}
MODEL=${MODEL:---model 124M --vocab 256}
TEXT=/usr/share/common-licenses
for bin in cohort cohort-gpt2; do
  [ -x "$BUILD/$bin" ] || { echo "compress_curve: $BUILD/$bin not built" >&2; exit 1; }
done
[ -d "$TEXT" ] || { echo "compress_curve: $TEXT not found (Debian's base-files)" >&2; exit 1; }
mkdir -p "$OUT" || exit 1

# run NAME COMPRESS: one training run; its metrics in $OUT/NAME.jsonl.
run() {
  local m=$OUT/$1.jsonl
  rm -f "$m"
  # shellcheck disable=SC2086  # MODEL is a list of options
  OMP_NUM_THREADS=1 "$BUILD/cohort" run --nproc-per-node "$RANKS" -- "$BUILD/cohort-gpt2" \
    $MODEL --data "$TEXT" --batch 4 --seq-len 64 --steps "$STEPS" --seed 1337 \
    --grad-compress "$2" --powersgd-start "$PSGD_START" --quiet --metrics "$m" \
    >"$OUT/$1.out" 2>&1 || { echo "compress_curve: the $1 run failed:" >&2; tail -3 "$OUT/$1.out" >&2; exit 1; }
}

# field FILE NAME: the values of one numeric field, one per line.
field() { sed -n 's/.*"'"$2"'":\([-0-9.eE+]*\).*/\1/p' "$1"; }

# check NAME: every step on RANKS ranks, or no figure.
check() {
  local m=$OUT/$1.jsonl
  local n w
  n=$(field "$m" step | wc -l)
  w=$(field "$m" world | sort -u)
  if [ "$n" != "$STEPS" ] || [ "$w" != "$RANKS" ]; then
    echo "compress_curve: $1: $n steps on world '$w', expected $STEPS on $RANKS: no figure" >&2
    exit 1
  fi
}

final() { field "$OUT/$1.jsonl" loss | tail -10 | awk '{s += $1} END {printf "%.4f", s / NR}'; }
first() { field "$OUT/$1.jsonl" loss | head -1; }
# mean over the steps after PowerSGD's start of a field
late() { field "$OUT/$1.jsonl" "$2" | tail -n +$((PSGD_START + 1)) | awk '{s += $1} END {printf "%.2f", s / NR}'; }

echo "compress_curve: $RANKS ranks, $STEPS steps, $MODEL, text of $TEXT, $PSGD from step $((PSGD_START + 1))"
run none none
run powersgd "$PSGD"
check none
check powersgd
ratio=$(late powersgd compress_ratio)
if ! awk -v r="$ratio" 'BEGIN {exit !(r > 1.5)}'; then
  echo "compress_curve: the $PSGD run shows no compression (ratio $ratio): no figure" >&2
  exit 1
fi
printf '\n%-14s %10s %12s %14s %12s %12s\n' run "first loss" "final loss" "wire MB/step" "compression" "tokens/s"
for r in none powersgd; do
  printf '%-14s %10.4f %12s %14s %12s %12s\n' "$r" "$(first $r)" "$(final $r)" \
    "$(late $r wire_mb)" "$(late $r compress_ratio)" "$(late $r tokens_per_s)"
done
awk -v p="$(final powersgd)" -v n="$(final none)" \
  'BEGIN {printf "final loss powersgd / none: %.4f (target: within 5%%, 0.95-1.05)\n", p / n}'
echo "(final loss: mean of the last 10 steps; wire, compression and tokens/s: mean of steps $((PSGD_START + 1))-$STEPS)"
# From inside OUT, so that the legend reads none.jsonl and powersgd.jsonl.
(cd "$OUT" && "$BUILD/cohort" plot none.jsonl powersgd.jsonl -o curves.svg) || exit 1

#!/usr/bin/env bash
# test_gpt2_shm.sh - cohort-gpt2's gradient buffer in memory the host's ranks
# share (cohort_mem_alloc), and its fallback.
#
# 1. Two ranks on one host: while they train, each maps both ranks' gradient
#    buffers from /dev/shm (its own and its peer's, unlinked once mapped, so
#    "(deleted)"), each of the gradients' size; nothing is left in /dev/shm
#    after the run.
# 2. The same job in a mount namespace whose /dev/shm is a 4 MiB tmpfs, too
#    small for the 8.8 MB of gradients: cohort_mem_alloc fails with -ENOSPC on
#    both ranks, rank 0 says the gradients stay private, and the run trains
#    to the same losses, bit for bit (two ranks' sums are the same whichever
#    algorithm adds them).
# Usage: test_gpt2_shm.sh COHORT COHORT-GPT2
set -u
if [ "${1:-}" = --small-shm ]; then
  SMALL=1
  shift
fi
COHORT=$1
GPT2=$2
if [ "$(id -u)" -ne 0 ] || ! command -v unshare >/dev/null; then
  echo "gpt2_shm: needs root and unshare for a mount namespace with a small /dev/shm" >&2
  exit 77
fi
. "$(dirname "$0")/check_lib.sh"

# 2,201,344 parameters: 8,805,376 bytes of gradients, 2150 pages.
MODEL=(--model tiny --vocab 32768 --seq-len 16 --batch 2 --quiet)
GRAD_BYTES=$((2150 * 4096))

# start_ranks TAG STEPS: two ranks in the background, PIDS set.
start_ranks() {
  local tag=$1 steps=$2
  PIDS=()
  for r in 0 1; do
    env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 COHORT_STORE="$STORE" \
      COHORT_JOB_ID="gpt2shm-$tag-$$" COHORT_TIMEOUT_MS=20000 OMP_NUM_THREADS=1 \
      "$GPT2" "${MODEL[@]}" --steps "$steps" --metrics "$WORK/$tag.r$r.jsonl" \
      >"$WORK/$tag.r$r.out" 2>"$WORK/$tag.r$r.err" &
    PIDS+=($!)
  done
}

wait_ranks() {
  local ok=0
  for p in "${PIDS[@]}"; do wait "$p" || ok=1; done
  PIDS=()
  return $ok
}

# Sizes (bytes) of the rank's mappings of gradient buffers from /dev/shm.
shared_maps() {
  local range lo hi
  grep -E '/dev/shm/cohort-gpt2shm-.*-b[0-9]+-[0-9]+ \(deleted\)$' "/proc/$1/maps" |
    while read -r range _; do
      lo=${range%-*} hi=${range#*-}
      echo $((16#$hi - 16#$lo))
    done
}

if [ -n "${SMALL:-}" ]; then
  # Inside the mount namespace: the outer run's store and directory.
  STORE=$3 WORK=$4
  mount -t tmpfs -o size=4m tmpfs /dev/shm || exit 1
  start_ranks small 4
  wait_ranks
  exit
fi

WORK=$(mktemp -d /tmp/gpt2_shm.XXXXXX)
STORE_PID=
PIDS=()
cleanup() {
  for p in "${PIDS[@]}" $STORE_PID; do kill "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

"$COHORT" store serve --host 127.0.0.1 --port 0 >"$WORK/store.log" 2>&1 &
STORE_PID=$!
for _ in $(seq 100); do grep -q '127.0.0.1:' "$WORK/store.log" && break; sleep 0.05; done
STORE=$(grep -o '127.0.0.1:[0-9]*' "$WORK/store.log" | head -1)
[ -n "$STORE" ] || { echo "gpt2_shm: no store" >&2; exit 1; }

# 1. Shared: look at the ranks' mappings once the first step is done (as
# soon as rank 0's metrics file has a line; the 49 steps after it keep the
# ranks alive while their maps are read).
start_ranks shared 50
for _ in $(seq 1200); do [ -s "$WORK/shared.r0.jsonl" ] && break; sleep 0.05; done
for r in 0 1; do
  shared_maps "${PIDS[$r]}" >"$WORK/maps.r$r" 2>/dev/null
  check "rank $r maps both gradient buffers, $GRAD_BYTES bytes each" \
    test "$(grep -cx "$GRAD_BYTES" "$WORK/maps.r$r")" -eq 2
done
check "shared: both ranks finish" wait_ranks
check "shared: no private-memory note" not_contains "$WORK/shared.r0.err" "private memory"
check "shared: nothing left in /dev/shm" \
  test -z "$(ls /dev/shm | grep "cohort-gpt2shm-shared-$$")"

# The reference for the fallback: the same job, 4 steps, shared gradients.
start_ranks ref 4
check "reference: both ranks finish" wait_ranks

# 2. A /dev/shm too small for the gradients (the shared-memory transport's rings still fit), the
# same for both ranks: this script again, in a mount namespace of its own, runs them.
check "small /dev/shm: both ranks finish" unshare -m --propagation private "$0" --small-shm \
  "$COHORT" "$GPT2" "$STORE" "$WORK"
check "small /dev/shm: rank 0 says the gradients are private" \
  contains "$WORK/small.r0.err" "gradients in private memory (cohort_mem_alloc: No space left on device)"
check "small /dev/shm: the same losses bit for bit" \
  test "$(grep -o '"loss":[^,]*' "$WORK/small.r0.jsonl")" = \
  "$(grep -o '"loss":[^,]*' "$WORK/ref.r0.jsonl")"
check "small /dev/shm: 4 steps" test "$(wc -l <"$WORK/small.r0.jsonl")" -eq 4

echo "$passed passed, $failed failed"
if [ "$failed" -ne 0 ]; then
  for f in "$WORK"/*.err; do echo "== $f"; tail -3 "$f"; done
  exit 1
fi

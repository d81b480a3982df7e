#!/usr/bin/env bash
# bench/collectives/run.sh - float32 allreduce of 2 ranks, side by side in one
# run: cohort (libcohort through `cohort bench`), Open MPI 4.1 (MPI_Allreduce,
# mpi_allreduce.c) and PyTorch Gloo (torch.distributed, gloo_allreduce.py).
#
#   host:                cohort on one host, 2, 4 and 8 ranks (LOCAL_RANKS),
#                        on ordinary buffers (`cohort bench --mem private`,
#                        what a program passes its own memory gets, which
#                        the library moves onto huge pages), the same left
#                        on 4 KiB pages (COHORT_SHM_COLLAPSE=0), on the
#                        same advised for transparent huge pages (`--mem
#                        huge`) and on buffers from cohort_mem_alloc (`--mem
#                        shared`), each
#                        beside the memory bound measured in the same run
#                        (mem_bound.c: one thread per rank reducing its 1/n
#                        of n buffers in place, every input read and every
#                        output written once); and the 2-rank private path
#                        piece by piece (cma_pattern.c: one process pulling
#                        half the message from another in 256 KiB chunks,
#                        reducing and writing it back, beside the bound's
#                        per-core work), on 4 KiB and on huge pages.
#   peers:               one host, 2 processes: cohort (ordinary buffers,
#                        shared memory), Open MPI (vader shared memory), Gloo
#                        (TCP over loopback).
#   two namespaces:      one rank in each of two network namespaces joined by
#                        veth links (tests/netns_lib.sh, 10.201.0.0/24); all
#                        three use TCP (Open MPI: --mca btl tcp,self), plus
#                        the raw single-connection TCP throughput (tcp_raw.c),
#                        one way and both ways at once (an allreduce of 2
#                        ranks moves its whole message in each direction, so
#                        the both-ways rate is its ceiling).
#   2 x 2:               two ranks in each of the two namespaces: cohort with
#                        its hierarchical allreduce (shared memory inside a
#                        namespace, TCP between them) and with COHORT_HIER=0
#                        (one flat ring), Open MPI (--mca btl tcp,vader,self)
#                        and Gloo.
#
# Bus bandwidth (nccl-tests: algbw * 2(n-1)/n, = algbw for 2 ranks) at 64 KiB,
# 4 MiB and 64 MiB, and the 8-byte latency; every number is the median of
# REPS runs (each run: warmup, then the mean of its iterations, slowest rank).
# Usage: bench/collectives/run.sh [BUILD_DIR]
#   env: REPS=5; PARTS="host peers ns hier" (the parts to run); LOCAL_RANKS="2 4 8";
#        PRIO: a prefix for the host part's runs, e.g. "chrt -f 1" (real-time priority) on a
#        machine others load, where a spinning bound or rank loses its core for whole slices
# Needs root (namespaces), mpicc/mpirun, /usr/bin/python3 with torch (PARTS=host needs none).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${1:-$ROOT/build}
COHORT=$BUILD/cohort
REPS=${REPS:-5}
PARTS=${PARTS:-host peers ns hier}
PRIO=${PRIO:-}
LOCAL_RANKS=${LOCAL_RANKS:-2 4 8}
want() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
PY=/usr/bin/python3
SIZES=(65536 4194304 67108864)
declare -A ITERS=([8]=2000 [65536]=300 [4194304]=30 [67108864]=6)
declare -A WARM=([8]=200 [65536]=30 [4194304]=5 [67108864]=2)
# One host's cohort and the bound take a few milliseconds at most: ten times the iterations, so
# that a single slow round does not move their means.
declare -A BITERS=([65536]=3000 [4194304]=300 [67108864]=60)
declare -A BWARM=([65536]=300 [4194304]=30 [67108864]=6)
declare -A PATTERN_ROUNDS=([4194304]=200 [67108864]=20)
# One host, 8 bytes, cohort and Open MPI (both under a microsecond): 50000 warm-up iterations
# (about 10 ms; with 200, the first configuration timed in a process ran 15-20 % slower than
# the next) and 50000 timed ones.
LAT_ITERS=50000
lat_it() { if [ "$1" = 8 ]; then echo $LAT_ITERS; else echo "${ITERS[$1]}"; fi; }
lat_wu() { if [ "$1" = 8 ]; then echo $LAT_ITERS; else echo "${WARM[$1]}"; fi; }

NEEDS=("$COHORT")
want peers || want ns || want hier && NEEDS+=(mpicc mpirun "$PY")
for t in "${NEEDS[@]}"; do
  command -v "$t" >/dev/null || { echo "run.sh: $t not found (build first; scripts/deps.sh)" >&2; exit 2; }
done
if want ns || want hier; then
  [ "$(id -u)" -eq 0 ] || { echo "run.sh: needs root for the network namespaces" >&2; exit 2; }
fi

WORK=$(mktemp -d /tmp/cohort-bench-coll.XXXXXX)
STORE_PID=
. "$ROOT/tests/netns_lib.sh"
cleanup() {
  [ -n "$STORE_PID" ] && kill "$STORE_PID" 2>/dev/null
  netns_down
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ ${#NEEDS[@]} -gt 1 ]; then
  mpicc -O2 -o "$WORK/mpi_allreduce" "$HERE/mpi_allreduce.c" || exit 1
  cc -O2 -o "$WORK/tcp_raw" "$HERE/tcp_raw.c" || exit 1
fi
cc -O3 -pthread -o "$WORK/mem_bound" "$HERE/mem_bound.c" || exit 1
cc -O3 -o "$WORK/cma_pattern" "$HERE/cma_pattern.c" || exit 1

median() { sort -g | awk '{a[NR] = $1} END {if (NR) print a[int((NR + 1) / 2)]; else print "nan"}'; }
# busbw in GB/s from bytes, microseconds and ranks (default 2: busbw = algbw).
busbw() { awk -v b="$1" -v t="$2" -v n="${3:-2}" 'BEGIN {if (t > 0) printf "%.3f", b / t / 1e3 * 2 * (n - 1) / n; else print "nan"}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0 && a == a + 0) printf "%.2f", a / b; else print "nan"}'; }
free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Each runner appends "SIZE TIME_US" lines to $WORK/<setting>.<tool>.
size_list() { echo 8 "${SIZES[@]}"; }

# cohort_host NP MEM: `cohort bench` of NP local ranks on private or shared buffers: "SIZE
# OUT_OF_PLACE_US IN_PLACE_US"; with 2 ranks on private ones also the 8-byte latency (the peers'
# table).
# MEM "4k": private buffers that the library leaves on 4 KiB pages (COHORT_SHM_COLLAPSE=0).
cohort_host() {
  local np=$1 mem=$2 s sizes=("${SIZES[@]}") collapse=1
  [ "$np" = 2 ] && [ "$mem" = private ] && want peers && sizes=(8 "${SIZES[@]}")
  [ "$mem" = 4k ] && mem=private collapse=0
  for s in "${sizes[@]}"; do
    COHORT_SHM_COLLAPSE=$collapse timeout 600 $PRIO "$COHORT" bench --nproc "$np" --mem "$mem" -b "$s" -e "$s" -n "$(host_it "$s")" -w "$(host_wu "$s")" |
      awk -v s="$s" '!/^#/ && NF >= 13 {if ($9 != 0 || $13 != 0) print "WRONG: no figure" > "/dev/stderr"; else print s, $6, $10}'
  done
}
host_it() { if [ "$1" = 8 ]; then echo $LAT_ITERS; else echo "${BITERS[$1]}"; fi; }
host_wu() { if [ "$1" = 8 ]; then echo $LAT_ITERS; else echo "${BWARM[$1]}"; fi; }

# The bound of NP ranks: no figure when its sums are wrong (it prints nothing then).
bound_host() {
  local s
  for s in "${SIZES[@]}"; do
    timeout 600 $PRIO "$WORK/mem_bound" "${BITERS[$s]}" "${BWARM[$s]}" "$s" "$1"
  done
}

mpi_local() {
  local s
  for s in $(size_list); do
    timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$WORK/mpi_allreduce" "$(lat_it "$s")" "$(lat_wu "$s")" "$s" 2>/dev/null
  done
}

gloo_local() {
  local s port
  for s in $(size_list); do
    port=$(free_port)
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 RANK=1 GLOO_SOCKET_IFNAME=lo \
      timeout 300 $PY "$HERE/gloo_allreduce.py" "${ITERS[$s]}" "${WARM[$s]}" "$s" >/dev/null 2>&1 &
    local peer=$!
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 RANK=0 GLOO_SOCKET_IFNAME=lo \
      timeout 300 $PY "$HERE/gloo_allreduce.py" "${ITERS[$s]}" "${WARM[$s]}" "$s" 2>/dev/null
    wait "$peer"
  done
}

if want ns || want hier; then
  netns_up 2 || { echo "run.sh: cannot create network namespaces" >&2; exit 1; }
  A=$(netns_addr 0)
  B=$(netns_addr 1)
  netns_exec 0 "$COHORT" store serve --host "$A" --port 29400 >"$WORK/store.log" 2>&1 &
  STORE_PID=$!
  # Open MPI across namespaces: node 1's orted is started through this "rsh".
  cat >"$WORK/nsrsh" <<EOF
#!/bin/sh
host=\$1; shift
case \$host in $A) i=0 ;; $B) i=1 ;; *) echo "nsrsh: unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec ${NETNS_PREFIX}n\$i unshare --uts sh -c "hostname node\$i; \$*"
EOF
  chmod +x "$WORK/nsrsh"
fi

JOBN=0
# cohort_nodes NP HIER: NP ranks over the two namespaces (rank r in node r*2/NP).
cohort_nodes() {
  local np=$1 hier=$2 s r pids
  for s in $(size_list); do
    JOBN=$((JOBN + 1))
    pids=()
    for ((r = np - 1; r >= 0; r--)); do
      if [ $r -gt 0 ]; then
        netns_exec $((r * 2 / np)) env RANK=$r WORLD_SIZE="$np" COHORT_STORE="$A:29400" \
          COHORT_JOB_ID="b$$-$JOBN" COHORT_HIER="$hier" \
          timeout 300 "$COHORT" bench -b "$s" -e "$s" -n "${ITERS[$s]}" -w "${WARM[$s]}" >/dev/null &
        pids+=($!)
      else
        netns_exec 0 env RANK=0 WORLD_SIZE="$np" COHORT_STORE="$A:29400" COHORT_JOB_ID="b$$-$JOBN" \
          COHORT_HIER="$hier" timeout 300 "$COHORT" bench -b "$s" -e "$s" -n "${ITERS[$s]}" -w "${WARM[$s]}" |
          awk -v s="$s" '!/^#/ && NF >= 13 {if ($9 != 0 || $13 != 0) print "WRONG: no figure" > "/dev/stderr"; else print s, $6}'
      fi
    done
    wait "${pids[@]}"
  done
}

# mpi_nodes NP HOSTS BTL
mpi_nodes() {
  local s
  for s in $(size_list); do
    netns_exec 0 timeout 300 mpirun --allow-run-as-root --oversubscribe --host "$2" -np "$1" \
      --mca plm_rsh_agent "$WORK/nsrsh" --mca btl "$3" \
      --mca btl_tcp_if_include 10.201.0.0/24 --mca oob_tcp_if_include 10.201.0.0/24 \
      "$WORK/mpi_allreduce" "${ITERS[$s]}" "${WARM[$s]}" "$s" 2>/dev/null
  done
}

# gloo_nodes NP
gloo_nodes() {
  local np=$1 s r pids
  for s in $(size_list); do
    pids=()
    for ((r = np - 1; r >= 1; r--)); do
      netns_exec $((r * 2 / np)) env MASTER_ADDR="$A" MASTER_PORT=29500 WORLD_SIZE="$np" RANK=$r \
        GLOO_SOCKET_IFNAME=eth0 timeout 300 $PY "$HERE/gloo_allreduce.py" "${ITERS[$s]}" "${WARM[$s]}" "$s" \
        >/dev/null 2>&1 &
      pids+=($!)
    done
    netns_exec 0 env MASTER_ADDR="$A" MASTER_PORT=29500 WORLD_SIZE="$np" RANK=0 GLOO_SOCKET_IFNAME=eth0 \
      timeout 300 $PY "$HERE/gloo_allreduce.py" "${ITERS[$s]}" "${WARM[$s]}" "$s" 2>/dev/null
    wait "${pids[@]}"
  done
}

raw_ns() {
  netns_exec 0 "$WORK/tcp_raw" recv "$A" 29600 2147483648 >>"$WORK/ns.raw" &
  local peer=$!
  netns_exec 1 "$WORK/tcp_raw" send "$A" 29600 2147483648
  wait "$peer"
  # Both directions at once, one connection each way: the mean of the two rates.
  netns_exec 0 "$WORK/tcp_raw" recv "$A" 29601 1073741824 >"$WORK/raw.ab" &
  local p1=$!
  netns_exec 1 "$WORK/tcp_raw" recv "$B" 29602 1073741824 >"$WORK/raw.ba" &
  local p2=$!
  netns_exec 1 "$WORK/tcp_raw" send "$A" 29601 1073741824 &
  local p3=$!
  netns_exec 0 "$WORK/tcp_raw" send "$B" 29602 1073741824
  wait "$p1" "$p2" "$p3"
  cat "$WORK/raw.ab" "$WORK/raw.ba" | awk '{s += $1} END {if (NR == 2) printf "%.3f\n", s / 2}' >>"$WORK/ns.raw2"
}

for ((rep = 1; rep <= REPS; rep++)); do
  echo "run.sh: repetition $rep/$REPS ($(uptime | sed 's/.*load/load/'))" >&2
  if want host; then
    for np in $LOCAL_RANKS; do
      cohort_host "$np" private >>"$WORK/host$np.private"
      bound_host "$np" >>"$WORK/host$np.bound"
      cohort_host "$np" 4k >>"$WORK/host$np.4k"
      cohort_host "$np" huge >>"$WORK/host$np.huge"
      cohort_host "$np" shared >>"$WORK/host$np.shared"
    done
    for s in 4194304 67108864; do
      for h in 0 1; do
        timeout 600 $PRIO "$WORK/cma_pattern" $((s / 2)) 262144 "$h" "${PATTERN_ROUNDS[$s]}" |
          awk -v s="$s" '{print s, $2, $4, $6, $8, $10}' >>"$WORK/pattern.$h"
      done
    done
  fi
  if want peers; then
    if ! want host || [[ " $LOCAL_RANKS " != *" 2 "* ]]; then cohort_host 2 private >>"$WORK/host2.private"; fi
    mpi_local >>"$WORK/local.mpi"
    gloo_local >>"$WORK/local.gloo"
  fi
  if want ns; then
    cohort_nodes 2 1 >>"$WORK/ns.cohort"
    mpi_nodes 2 "$A,$B" tcp,self >>"$WORK/ns.mpi"
    gloo_nodes 2 >>"$WORK/ns.gloo"
    raw_ns
  fi
  if want hier; then
    # 2 x 2: ranks 0 and 1 in node 0, ranks 2 and 3 in node 1.
    cohort_nodes 4 1 >>"$WORK/hier.cohort"
    cohort_nodes 4 0 >>"$WORK/hier.flat"
    mpi_nodes 4 "$A:2,$B:2" tcp,vader,self >>"$WORK/hier.mpi"
    gloo_nodes 4 >>"$WORK/hier.gloo"
  fi
done
echo "run.sh: done ($(uptime | sed 's/.*load/load/')); CPU: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores" >&2

# t SETTING TOOL SIZE: median time (us); ti: of the in-place form (cohort_host's third column)
t() { awk -v s="$3" '$1 == s {print $2}' "$WORK/$1.$2" 2>/dev/null | median; }
ti() { awk -v s="$3" '$1 == s {print $3}' "$WORK/$1.$2" 2>/dev/null | median; }
# The peers' table reads cohort's 2-rank figures on private buffers as the local setting's.
[ -f "$WORK/host2.private" ] && cp "$WORK/host2.private" "$WORK/local.cohort"

report() {
  local set=$1 title=$2 s tc tm tg bc bm bg raw=""
  echo
  echo "== $title: float32 allreduce, 2 ranks, median of $REPS =="
  if [ "$set" = ns ]; then
    raw=$(median <"$WORK/ns.raw")
    raw2=$(median <"$WORK/ns.raw2")
    echo "raw TCP between the namespaces: $raw GB/s one way (one connection); $raw2 GB/s each way when both directions run at once"
  fi
  printf "%-10s %12s %12s %12s %11s %11s" size "cohort GB/s" "MPI GB/s" "Gloo GB/s" cohort/MPI cohort/Gloo
  [ "$set" = ns ] && printf " %11s %11s" cohort/raw cohort/raw2
  printf "\n"
  for s in "${SIZES[@]}"; do
    tc=$(t "$set" cohort "$s"); tm=$(t "$set" mpi "$s"); tg=$(t "$set" gloo "$s")
    bc=$(busbw "$s" "$tc"); bm=$(busbw "$s" "$tm"); bg=$(busbw "$s" "$tg")
    printf "%-10s %12s %12s %12s %11s %11s" "$((s / 1024)) KiB" "$bc" "$bm" "$bg" "$(ratio "$bc" "$bm")" "$(ratio "$bc" "$bg")"
    [ "$set" = ns ] && printf " %11s %11s" "$(ratio "$bc" "$raw")" "$(ratio "$bc" "$raw2")"
    printf "\n"
  done
  tc=$(t "$set" cohort 8); tm=$(t "$set" mpi 8); tg=$(t "$set" gloo 8)
  printf "%-10s %10s us %9s us %9s us %11s %11s\n" "8 B" "$tc" "$tm" "$tg" "$(ratio "$tm" "$tc")" "$(ratio "$tg" "$tc")"
  echo "(8 B row: latency; its ratios are MPI/cohort and Gloo/cohort, > 1 means cohort is faster)"
}

if want host; then
  echo
  echo "== one host: float32 allreduce, busbw GB/s in place (out of place), median of $REPS; private: ordinary buffers (the library moves them onto huge pages, MADV_COLLAPSE), 4k: the same left on 4 KiB pages (COHORT_SHM_COLLAPSE=0), huge: advised MADV_HUGEPAGE before first touch, shared: from cohort_mem_alloc =="
  printf "%-6s %-10s %17s %17s %17s %17s %9s %8s %8s %8s %8s\n" ranks size "private" "4k" "huge" "shared" "bound" priv/bnd 4k/bnd huge/bnd shrd/bnd
  for np in $LOCAL_RANKS; do
    for s in "${SIZES[@]}"; do
      bb=$(busbw "$s" "$(t "host$np" bound "$s")" "$np")
      printf "%-6s %-10s" "$np" "$((s / 1024)) KiB"
      for m in private 4k huge shared; do
        printf " %7s (%7s)" "$(busbw "$s" "$(ti "host$np" $m "$s")" "$np")" "$(busbw "$s" "$(t "host$np" $m "$s")" "$np")"
      done
      printf " %9s" "$bb"
      for m in private 4k huge shared; do printf " %8s" "$(ratio "$(busbw "$s" "$(ti "host$np" $m "$s")" "$np")" "$bb")"; done
      printf "\n"
    done
  done
  echo "targets, 2 ranks at 4 and 64 MiB, in place: private >= 0.5x the bound, shared >= 0.8x (below the 128 KiB threshold the latency algorithms run)"
  echo "(bound: n buffers reduced in place by a thread per rank, at most one per core: the least memory traffic an allreduce can have; busbw = algbw * 2(n-1)/n)"
  echo
  echo "== the 2-rank private path piece by piece, one core (cma_pattern.c), us per round, median of $REPS =="
  printf "%-10s %-6s %8s %8s %8s %8s %8s %12s\n" size pages get reduce put total bound bound/total
  for s in 4194304 67108864; do
    for h in 0 1; do
      printf "%-10s %-6s" "$((s / 1024)) KiB" "$([ $h = 1 ] && echo huge || echo 4K)"
      for c in 2 3 4 5 6; do printf " %8s" "$(awk -v s="$s" -v c="$c" '$1 == s {print $c}' "$WORK/pattern.$h" | median)"; done
      tt=$(awk -v s="$s" '$1 == s {print $5}' "$WORK/pattern.$h" | median); tb=$(awk -v s="$s" '$1 == s {print $6}' "$WORK/pattern.$h" | median)
      printf " %12s\n" "$(ratio "$tb" "$tt")"
    done
  done
fi
if want peers; then
  report local "one host, cohort on ordinary buffers"
  echo "targets: cohort >= 1.5x MPI and >= 2x Gloo at 4 and 64 MiB"
fi
if want ns; then
  report ns "two network namespaces (TCP over veth)"
  echo "targets: cohort >= 1.3x MPI, >= 2x Gloo, >= 0.70x raw TCP at 4 and 64 MiB"
  echo "(raw2: the both-ways rate, the most a 2-rank allreduce can reach: each rank sends and receives the whole message)"
fi
want hier || exit 0
echo
echo "== 2 x 2: two namespaces, two ranks in each: float32 allreduce, 4 ranks, median of $REPS =="
printf "%-10s %12s %12s %12s %12s %11s %11s %11s\n" size "hier GB/s" "flat GB/s" "MPI GB/s" "Gloo GB/s" hier/flat hier/MPI hier/Gloo
for s in "${SIZES[@]}"; do
  th=$(t hier cohort "$s"); tf=$(t hier flat "$s"); tm=$(t hier mpi "$s"); tg=$(t hier gloo "$s")
  bh=$(busbw "$s" "$th" 4); bf=$(busbw "$s" "$tf" 4); bm=$(busbw "$s" "$tm" 4); bg=$(busbw "$s" "$tg" 4)
  printf "%-10s %12s %12s %12s %12s %11s %11s %11s\n" "$((s / 1024)) KiB" "$bh" "$bf" "$bm" "$bg" \
    "$(ratio "$bh" "$bf")" "$(ratio "$bh" "$bm")" "$(ratio "$bh" "$bg")"
done
th=$(t hier cohort 8); tf=$(t hier flat 8); tm=$(t hier mpi 8); tg=$(t hier gloo 8)
printf "%-10s %10s us %9s us %9s us %9s us\n" "8 B" "$th" "$tf" "$tm" "$tg"
echo "(hier: COHORT_HIER=1, the default; flat: COHORT_HIER=0; busbw = algbw * 2(n-1)/n; below the 128 KiB threshold both use recursive doubling)"

#!/usr/bin/env bash
# `cohort run` counting its workers on the node's devices and binding them to
# CPUs, on this machine and on GPU fixture trees laid over its CPUs:
# --cpu-bind cores|numa (each worker's sched_getaffinity, OMP_NUM_THREADS, the
# agent's one line per rank), --nproc-per-node gpu|auto|cpu with and without
# GPUs and CUDA_VISIBLE_DEVICES, --numa-binding node on two fixture GPUs
# whose NUMA nodes are this machine's CPUs 0 and 1, a Python worker started
# torchrun's way, PET_ forms and the errors.
# usage: test_place_run.sh COHORT_BINARY
set -u
cohort=$(readlink -f "$1")
here=$(cd "$(dirname "$0")" && pwd)
. "$here/check_lib.sh"
tmp=$(mktemp -d /tmp/cohort-placerun-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
ncpu=$(getconf _NPROCESSORS_ONLN)
allowed=$(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status)
show='echo "cpus=$(awk "/^Cpus_allowed_list/ {print \$2}" /proc/self/status) omp=$OMP_NUM_THREADS n=$LOCAL_WORLD_SIZE"'
if [ "$ncpu" -lt 2 ] || [ "$allowed" != "0-$((ncpu - 1))" ]; then
  echo "this test needs two or more CPUs, all allowed (have $ncpu, allowed $allowed)"
  exit 1
fi

# --cpu-bind cores: one CPU slice each, disjoint, OMP_NUM_THREADS its size.
run cores "$cohort" run --cpu-bind cores --nproc-per-node 2 -- sh -c "$show"
check "--cpu-bind cores runs" rc cores 0
half=$((ncpu / 2))
r0=$([ "$half" = 1 ] && echo 0 || echo "0-$((half - 1))")
check "rank 0 bound to the first half" contains "$tmp/cores.out" "[r0] cpus=$r0 omp=$half n=2"
check "rank 1 not on rank 0's CPUs" not_contains "$tmp/cores.out" "[r1] cpus=$r0 "
check "one line per rank from the agent" contains "$tmp/cores.err" "local rank 1 bound to CPUs"
check "... exactly two" lines cores.err 2
run omp env OMP_NUM_THREADS=7 "$cohort" run --cpu-bind=cores --nproc-per-node 2 -- sh -c "$show"
check "the user's OMP_NUM_THREADS stays" contains "$tmp/omp.out" "[r0] cpus=$r0 omp=7"
run numa "$cohort" run --cpu-bind numa --nproc-per-node 1 -- sh -c "$show"
check "--cpu-bind numa, one rank: the whole node" contains "$tmp/numa.out" "[r0] cpus=$allowed omp=$ncpu n=1"
run none "$cohort" run --cpu-bind none --nproc-per-node 2 -- sh -c "$show"
check "--cpu-bind none: not bound, torchrun's OMP_NUM_THREADS" contains "$tmp/none.out" "[r1] cpus=$allowed omp=1 n=2"
check "... and nothing printed" lines none.err 0
run many "$cohort" run --cpu-bind cores --nproc-per-node $((ncpu + 1)) -- true
check "more ranks than CPUs: exit 2" rc many 2
check "... one line" lines many.err 1
check "... saying why" contains "$tmp/many.err" "local ranks but only $ncpu CPUs"

# A fixture tree: this machine's CPUs, NUMA node 0 = CPU 0, node 1 = CPU 1,
# and two NVIDIA GPUs, the first on node 1 and the second on node 0.
fx=$tmp/fx
mkdir -p "$fx/sys/devices/system/cpu" "$fx/sys/devices/system/node/node0" \
  "$fx/sys/devices/system/node/node1" "$fx/proc" "$fx/dev" "$tmp/nogpu/proc" "$tmp/nogpu/dev"
echo "0-1" >"$fx/sys/devices/system/cpu/online"
echo 0 >"$fx/sys/devices/system/node/node0/cpulist"
echo 1 >"$fx/sys/devices/system/node/node1/cpulist"
for g in 0:1 1:0; do
  addr=0000:0${g%%:*}:00.0
  mkdir -p "$fx/proc/driver/nvidia/gpus/$addr" "$fx/sys/bus/pci/devices/$addr"
  echo "GPU UUID: GPU-fixture-${g%%:*}" >"$fx/proc/driver/nvidia/gpus/$addr/information"
  echo "${g##*:}" >"$fx/sys/bus/pci/devices/$addr/numa_node"
done
roots="--sysfs-root $fx/sys --proc-root $fx/proc --dev-root $fx/dev"
noroots="--sysfs-root $fx/sys --proc-root $tmp/nogpu/proc --dev-root $tmp/nogpu/dev"

run gpu "$cohort" run $roots --nproc-per-node gpu -- sh -c "$show"
check "--nproc-per-node gpu: one worker per GPU" contains "$tmp/gpu.out" "[r1] cpus=$allowed omp=1 n=2"
check "... and no third" not_contains "$tmp/gpu.out" "[r2]"
run vis env CUDA_VISIBLE_DEVICES=1 "$cohort" run $roots --nproc_per_node=gpu -- sh -c "$show"
check "CUDA_VISIBLE_DEVICES=1: one worker" contains "$tmp/vis.out" "[r0] cpus=$allowed omp= n=1"
run pet env PET_NPROC_PER_NODE=auto "$cohort" run $roots -- sh -c "$show"
check "PET_NPROC_PER_NODE=auto with GPUs: one per GPU" contains "$tmp/pet.out" "n=2"
run auto "$cohort" run $noroots --nproc-per-node auto -- sh -c "$show"
check "auto without GPUs: one per CPU" contains "$tmp/auto.out" "[r1] cpus=$allowed omp=1 n=2"
run cpu "$cohort" run --nproc-per-node cpu -- sh -c "$show"
check "--nproc-per-node cpu: one per CPU" contains "$tmp/cpu.out" "n=$ncpu"
run nogpu "$cohort" run $noroots --nproc-per-node gpu -- true
check "gpu without a GPU: exit 2" rc nogpu 2
check "... one line" lines nogpu.err 1
check "... saying so" contains "$tmp/nogpu.err" "this node shows no GPU"
run hidden env CUDA_VISIBLE_DEVICES= "$cohort" run $roots --nproc-per-node gpu -- true
check "CUDA_VISIBLE_DEVICES empty: exit 2" rc hidden 2
check "... naming the variable" contains "$tmp/hidden.err" "CUDA_VISIBLE_DEVICES leaves none of this node's 2 NVIDIA GPUs"

# --numa-binding node: local rank 0 on GPU 0 (NUMA node 1: CPU 1), rank 1 on CPU 0.
run node "$cohort" run $roots --numa-binding node --nproc-per-node gpu -- sh -c "$show"
check "--numa-binding node runs" rc node 0
check "rank 0 near GPU 0: CPU 1" contains "$tmp/node.out" "[r0] cpus=1 omp=1 n=2"
check "rank 1 near GPU 1: CPU 0" contains "$tmp/node.out" "[r1] cpus=0 omp=1 n=2"
check "the agent names GPU and node" contains "$tmp/node.err" "local rank 0 bound to CPUs 1 (--numa-binding node, GPU 0 on NUMA node 1)"
run petnuma env PET_NUMA_BINDING=exclusive CUDA_VISIBLE_DEVICES=1 "$cohort" run $roots --nproc-per-node gpu -- sh -c "$show"
check "PET_NUMA_BINDING, CUDA_VISIBLE_DEVICES=1: rank 0 on GPU 1's CPU 0" contains "$tmp/petnuma.out" "[r0] cpus=0 "
run toomany "$cohort" run $roots --numa-binding socket --nproc-per-node 3 -- true
check "more ranks than GPUs: exit 2" rc toomany 2
check "... one line" lines toomany.err 1
# torchrun's form: a Python script through $PYTHON_EXEC, seeing its binding.
cat >"$tmp/aff.py" <<'PY'
import os
print("aff", os.environ["LOCAL_RANK"], sorted(os.sched_getaffinity(0)))
PY
run py env PYTHON_EXEC=python3 "$cohort" run $roots --nproc-per-node=gpu --numa-binding=node "$tmp/aff.py"
check "a Python worker sees its binding" contains "$tmp/py.out" "[r0] aff 0 [1]"
check "... and the other rank its own" contains "$tmp/py.out" "[r1] aff 1 [0]"
run both "$cohort" run --numa-binding node --cpu-bind cores -- true
check "--numa-binding with --cpu-bind: exit 2" rc both 2
run badroot "$cohort" run --sysfs-root "$tmp/nowhere" --cpu-bind cores -- true
check "a root without CPUs: exit 2" rc badroot 2
check "... one line naming the file" contains "$tmp/badroot.err" "nowhere/devices/system/cpu/online"

for f in "$tmp"/*.rc; do
  n=$(basename "$f" .rc)
  if [ "$failed" -gt 0 ]; then echo "--- $n: rc $(cat "$f")"; head -5 "$tmp/$n.out" "$tmp/$n.err"; fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

#!/usr/bin/env bash
# Fault injection in the middle of a multi-node cohort-gpt2 run (two emulated
# nodes in network namespaces this test creates and removes), with
# checkpoints and --max-restarts. Each case must end either in a restart that
# resumes from the last complete checkpoint with losses identical to an
# uninterrupted run, or in a clean failure naming the right cause; never a
# hang, never a corrupt checkpoint.
# usage: test_faults.sh COHORT_BINARY COHORT_GPT2_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
gpt2=$(readlink -f "$2")
src=$(readlink -f "$3")
. "$src/tests/netns_lib.sh"
tmp=$(mktemp -d /tmp/cohort-faults-XXXXXX)
pids=()
mnt=""
. "$src/tests/check_lib.sh"
cleanup() {
  netns_down
  [ -n "$mnt" ] && umount "$mnt" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
netns_up 2 || { echo "cannot create network namespaces"; exit 1; }
M=$(netns_addr 0)
# The faults come once step 60 is logged (after the step-50 checkpoint); the
# process they hit is found before that, so the fault follows the step within
# one 10 ms poll, and the 240 steps left (about 2 s on an idle machine, 7 ms a
# step) are ample room.
STEPS=300
TRAIN=("$gpt2" --model tiny --batch 2 --steps $STEPS --threads 1 --seed 7 --quiet)


# job NAME PORT EXTRA_AGENT_ARGS... : starts both agents of a 2-node job whose
# checkpoints and metrics live under $tmp/NAME; sets $a0 $a1.
job() {
  local name=$1 port=$2
  shift 2
  mkdir -p "$tmp/$name/ckpt"
  for i in 0 1; do
    netns_bg "$i" "$tmp/$name/agent$i" env COHORT_TIMEOUT_MS=4000 "$cohort" run --nnodes 2 \
      --node-rank "$i" --master "$M:$port" --job "$name" --net off --join-timeout 30 \
      --heartbeat-timeout 2 "$@" -- \
      "${TRAIN[@]}" --ckpt-dir "$tmp/$name/ckpt" --ckpt-every 50 --metrics "$tmp/$name/metrics"
    eval "a$i=\$!"
  done
}

# The losses of a metrics file, the last record of each step: "step loss".
losses() { sed -n 's/^{"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/p' "$1" | sort -n -k1,1 -s | awk '{l[$1]=$2} END {for (s in l) print s, l[s]}' | sort -n; }
same_losses() { # reference metrics, faulty run's metrics: every step the faulty run logged matches
  local ref=$1 got=$2
  [ -s "$got" ] || return 1
  local n
  n=$(losses "$got" | wc -l)
  [ "$(losses "$got" | tail -1 | cut -d' ' -f1)" = "$STEPS" ] || return 1
  [ "$n" -gt 0 ] && join <(losses "$ref") <(losses "$got") | awk '$2 != $3 {bad=1} END {exit bad}' &&
    [ "$(join <(losses "$ref") <(losses "$got") | wc -l)" = "$n" ]
}
# Waits until the metrics show step >= $2 (the last record: the first round
# only appends).
wait_step() {
  local f=$1 want=$2 last
  for _ in $(seq 3000); do
    last=$(tail -n 1 "$f" 2>/dev/null | sed -n 's/^{"step":\([0-9]*\),.*/\1/p')
    [ -n "$last" ] && [ "$last" -ge "$want" ] && return 0
    sleep 0.01
  done
  return 1
}
# fault NODE COMM STEP SIGNAL: finds node NODE's process COMM (cohort-gpt2:
# the worker, cohort: the agent), waits until the job's metrics ($metrics)
# show STEP, then sends it SIGNAL. Fails when the process was not found or
# had ended before the signal.
fault() {
  local node=$1 comm=$2 step=$3 sig=$4 pid=""
  for _ in $(seq 3000); do
    pid=$(netns_pid "$node" "$comm") && break
    sleep 0.01
  done
  [ -n "$pid" ] && wait_step "$metrics" "$step" && kill -"$sig" "$pid"
}

# 0. The uninterrupted reference run.
job ref 29500
wait_all 300 $a0 $a1
check "reference run succeeds ($codes)" [ "$codes" = "0 0" ]
check "reference run logged every step" [ "$(losses "$tmp/ref/metrics" | wc -l)" = "$STEPS" ]

# 1. kill -9 a worker: the job restarts from the last checkpoint, same losses.
job kw 29501 --max-restarts 2
metrics=$tmp/kw/metrics
check "worker kill: node 1's cohort-gpt2 killed at step 60" fault 1 cohort-gpt2 60 KILL
wait_all 300 $a0 $a1
check "worker kill: restarted and finished ($codes)" [ "$codes" = "0 0" ]
check "worker kill: node 0 reports node 1's rank" contains "$tmp/kw/agent0" "job failed: node 1 (node1): rank 1"
# The killed rank is the root cause, not node 0's rank that lost its peer.
check "worker kill: the root cause is the SIGKILL" grep -q "job failed: node 1 (node1): rank 1 .*was killed by SIGKILL" "$tmp/kw/agent0"
check "worker kill: restarted" contains "$tmp/kw/agent0" "restarting all workers (restart 1 of 2)"
check "worker kill: losses identical to the uninterrupted run" same_losses "$tmp/ref/metrics" "$tmp/kw/metrics"

# 2. SIGSTOP a worker (a hang): the collective deadline ends it, the report
#    names the stopped rank, the restart resumes with identical losses.
job hang 29502 --max-restarts 1
metrics=$tmp/hang/metrics
check "hang: node 1's cohort-gpt2 stopped at step 60" fault 1 cohort-gpt2 60 STOP
wait_all 300 $a0 $a1
check "hang: restarted and finished ($codes)" [ "$codes" = "0 0" ]
check "hang: node 1 names its stopped rank" contains "$tmp/hang/agent1" "rank 1: was stopped (SIGSTOP or traced)"
check "hang: losses identical to the uninterrupted run" same_losses "$tmp/ref/metrics" "$tmp/hang/metrics"

# 3. kill -9 an agent: a clean failure naming the lost node.
job ka 29503 --max-restarts 1
metrics=$tmp/ka/metrics
check "agent kill: node 1's agent killed at step 60" fault 1 cohort 60 KILL
wait_all 120 $a0
check "agent kill: node 0 fails cleanly ($codes)" eval '[ "$codes" != "0" ] && [ "$codes" != "timeout" ]'
check "agent kill: node 0 names node 1's dead agent" contains "$tmp/ka/agent0" "job failed: node 1 (node1): its agent died"
wait_all 10 $a1
sleep 0.5
check "agent kill: node 1's worker is gone" eval '! netns_pid 1 cohort-gpt2 >/dev/null'

# 4. link down, then up: both sides stop, rendezvous again, resume.
job link 29504 --max-restarts 2
check "link down/up: the job reached step 60" wait_step "$tmp/link/metrics" 60
netns_link 1 down
sleep 4
netns_link 1 up
wait_all 300 $a0 $a1
check "link down/up: restarted and finished ($codes)" [ "$codes" = "0 0" ]
check "link down/up: a node was reported lost" grep -q "lost" "$tmp/link/agent0"
check "link down/up: losses identical to the uninterrupted run" same_losses "$tmp/ref/metrics" "$tmp/link/metrics"

# 5. the checkpoint filesystem fills up during a save: a clean failure, and
#    the last complete checkpoint still loads. The filesystem is left with
#    room for one checkpoint and a half, so the save at step 50 fits and the
#    one at step 100 cannot.
mkdir -p "$tmp/size"
"${TRAIN[@]}" --steps 1 --ckpt-dir "$tmp/size" --ckpt-every 1 >/dev/null 2>&1
ckpt_bytes=$(stat -c %s "$tmp"/size/ckpt_*.bin 2>/dev/null | head -1)
check "full disk: a checkpoint's size is known" [ -n "$ckpt_bytes" ]
mnt=$tmp/full/ckpt
mkdir -p "$mnt"
mount -t tmpfs -o size=16m tmpfs "$mnt"
free_kb=$(df -k --output=avail "$mnt" | tail -n 1)
fill_kb=$((free_kb - ckpt_bytes * 3 / 2 / 1024))
dd if=/dev/zero of="$mnt/.filler" bs=1k count="$fill_kb" 2>/dev/null
job full 29505
wait_all 300 $a0 $a1
check "full disk: the job fails ($codes)" eval '[ "$codes" != "0 0" ] && [ "${codes#*timeout}" = "$codes" ]'
check "full disk: the report says the disk is full" grep -qi "no space left" "$tmp/full/agent0" "$tmp/full/agent1"
rm -f "$mnt/.filler"
check "full disk: only complete checkpoints are left" [ -z "$(ls -A "$mnt" | grep -v '^ckpt_[0-9]*\.bin$')" ]
check "full disk: the step-50 checkpoint survived" [ -s "$mnt/ckpt_000000000050.bin" ]
job full 29506
wait_all 300 $a0 $a1
check "full disk: the run resumes from the last complete checkpoint ($codes)" [ "$codes" = "0 0" ]
check "full disk: resumed at step 50" grep -q "resumed from .* at step 50" "$tmp/full/agent0"
check "full disk: losses identical to the uninterrupted run" same_losses "$tmp/ref/metrics" "$tmp/full/metrics"
umount "$mnt" && mnt=""

if [ $failed -ne 0 ]; then for f in "$tmp"/*/agent*; do echo "== $f"; tail -n 12 "$f"; done; fi
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

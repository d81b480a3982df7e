#!/usr/bin/env bash
# Real Slurm, end to end: a private Slurm cluster (Debian's slurm-wlm, munge)
# whose nodes are network namespaces that this test creates, runs the script
# `cohort manifest slurm` prints, submitted with sbatch.
#   1. a multi-node job completes with every rank in lock step;
#   2. PyTorch DDP trains across the nodes to identical parameters;
#   3. cohort-gpt2 trains data-parallel across the nodes, loss for loss as
#      one process with the same global batch;
#   4, 5. a job in which one rank crashes (a lock-step worker, cohort-gpt2)
#      ends FAILED, and no process of it is left on any node;
#   6. the same when a node's `cohort run` agent is killed;
#   7. scancel ends a running job CANCELLED with nothing left; before, with
#      the job submitted without a token (the script makes one), a client on
#      the login node without it can neither read the job's store, nor set
#      its failure key, nor join it as a node, and the job steps on.
# Every daemon is started by hand (no systemd) and stopped by PID on exit;
# the namespaces and the private directory are removed.
# usage: test_slurm.sh BIN_DIR SOURCE_DIR   (BIN_DIR holds cohort, cohort-gpt2)
set -u
bin=$(readlink -f "$1")
src=$(readlink -f "$2")
cohort=$bin/cohort
NODES=3 # compute nodes; one more namespace holds the controller
NPROC=2 # workers per node
STEPS=5
world=$((NODES * NPROC))

. "$src/tests/check_lib.sh"
finish() {
  if [ "$failed" -ne 0 ] && [ -d "${dir:-}/log" ]; then tail -n 30 "$dir"/log/*; fi
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}
log() { echo "[$(date +%T)] $*"; }

for tool in slurmctld slurmd sbatch scontrol munged mungekey; do
  if ! command -v "$tool" >/dev/null; then
    echo "FAIL: $tool not found (scripts/deps.sh installs slurm-wlm and munge)"
    failed=1
    finish
  fi
done
[ -x "$cohort" ] && [ -x "$bin/cohort-gpt2" ] || {
  echo "FAIL: no cohort or cohort-gpt2 binary in $bin"
  failed=1
  finish
}

. "$src/tests/netns_lib.sh"
# munged insists that every directory above its socket is searchable by all.
dir=$(mktemp -d /tmp/cohort-slurm-XXXXXX)
chmod 755 "$dir"
daemons=() # PIDs of every daemon this test started

# Stops every daemon this test started, by PID: SIGTERM, then SIGKILL what
# is still there 15 s later. Fails if one needed SIGKILL.
stop_daemons() {
  local p end rc=0
  for p in "${daemons[@]}"; do kill -TERM "$p" 2>/dev/null; done
  end=$((SECONDS + 15))
  for p in "${daemons[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.1; done
    if kill -KILL "$p" 2>/dev/null; then
      echo "daemon $p ($(cat "/proc/$p/comm" 2>/dev/null)) ignored SIGTERM"
      rc=1
    fi
    wait "$p" 2>/dev/null
  done
  daemons=()
  return $rc
}
cleanup() {
  stop_daemons
  netns_down
  rm -rf "$dir"
}

# A fresh cluster name and a node naming as on a real cluster: node0..node2.
cluster="cohort$$"
ctl=$NODES # namespace index of the controller
ctl_host=ctl
mkdir -p "$dir/munge" "$dir/state" "$dir/run" "$dir/log" "$dir/spool" "$dir/jobs"
chmod 700 "$dir/state"

log "network namespaces: $NODES nodes and a controller"
netns_up $((NODES + 1))
up=$?
trap cleanup EXIT # after netns_up, which sets its own
[ "$up" -eq 0 ] || {
  echo "FAIL: cannot create network namespaces (needs root)"
  failed=1
  finish
}

nodes_conf=""
for ((i = 0; i < NODES; i++)); do
  nodes_conf+="NodeName=node$i NodeAddr=$(netns_addr "$i")"$'\n'
done
sed -e "s|@CLUSTER@|$cluster|g" -e "s|@CTL_HOST@|$ctl_host|g" \
  -e "s|@CTL_ADDR@|$(netns_addr "$ctl")|g" -e "s|@DIR@|$dir|g" \
  -e "s|@NODELIST@|node[0-$((NODES - 1))]|g" \
  "$src/tests/slurm/slurm.conf.in" | awk -v nodes="$nodes_conf" '$0 == "@NODES@" { printf "%s", nodes; next } { print }' \
  >"$dir/slurm.conf"
cp "$src/tests/slurm/cgroup.conf" "$dir/cgroup.conf"
export SLURM_CONF=$dir/slurm.conf

# munge: a generated key and a daemon on a private socket.
mungekey --create --keyfile="$dir/munge/munge.key" || {
  echo "FAIL: mungekey"
  failed=1
  finish
}
munged --foreground --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/munged.seed" \
  >"$dir/log/munged.log" 2>&1 &
daemons+=($!)

# NS_CMD becomes the prefix that runs a command in node $1's namespace with
# hostname $2 and that node's hosts file (node0.. resolve), in a private
# mount namespace. nsenter, unshare and sh all exec: a daemon started in the
# background as "${NS_CMD[@]}" CMD & has $! as its own PID.
ns_prefix() {
  local ns
  ns=$(netns_node "$1")
  NS_CMD=(nsenter --net="/run/netns/$ns" unshare --mount --uts
    sh -c 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"'
    "/etc/netns/$ns/hosts" "$2")
}
in_ns() { # in_ns NODE HOSTNAME CMD... (foreground)
  ns_prefix "$1" "$2"
  shift 2
  "${NS_CMD[@]}" "$@"
}
# Slurm's commands run on the controller's namespace, the cluster's login node.
on_ctl() { in_ns "$ctl" "$ctl_host" "$@"; }

# Every wait ends by the test's deadline, so that a broken cluster fails the
# test well within ctest's TIMEOUT (and the daemons are still stopped).
DEADLINE=$((SECONDS + 420))
wait_for() { # wait_for SECONDS command... : polls every 0.5 s
  local end=$((SECONDS + $1))
  [ "$end" -le "$DEADLINE" ] || end=$DEADLINE
  shift
  until "$@"; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.5
  done
}
munge_up() { [ -S "$dir/munge/munge.socket" ]; }
check "munged is up" wait_for 10 munge_up

log "slurmctld in $(netns_node "$ctl") ($(netns_addr "$ctl"))"
ns_prefix "$ctl" "$ctl_host"
"${NS_CMD[@]}" slurmctld -D -c -f "$SLURM_CONF" >"$dir/log/slurmctld.out" 2>&1 &
daemons+=($!)
ctl_up() { on_ctl scontrol ping 2>/dev/null | grep -q 'is UP'; }
check "slurmctld answers" wait_for 30 ctl_up

for ((i = 0; i < NODES; i++)); do
  mkdir -p "$dir/spool/node$i"
  ns_prefix "$i" "node$i"
  "${NS_CMD[@]}" slurmd -D -f "$SLURM_CONF" -N "node$i" >"$dir/log/slurmd-node$i.out" 2>&1 &
  daemons+=($!)
done
nodes_idle() {
  local n
  n=$(on_ctl sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
  [ "$n" -eq "$NODES" ]
}
log "waiting for $NODES slurmd to register"
if ! check "all $NODES nodes idle" wait_for 60 nodes_idle; then
  on_ctl sinfo -N -l
  finish
fi
log "cluster up"

# job_state ID: JobState as the controller reports it.
job_state() { on_ctl scontrol show job "$1" -o 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
job_field() { on_ctl scontrol show job "$1" -o 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
job_ended() {
  case "$(job_state "$1")" in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) return 0 ;;
    *) return 1 ;;
  esac
}
# submit NAME ARGS... : the script `cohort manifest slurm` prints, through sbatch; sets $jobid
submit() {
  local name=$1
  shift
  "$cohort" manifest slurm --nodes "$NODES" --nproc-per-node "$NPROC" --time 5 --job-name "$name" \
    -- "$@" >"$dir/jobs/$name.sbatch" || return 1
  jobid=""
  jobid=$(on_ctl env PATH="$bin:$PATH" sbatch --parsable --chdir="$dir/jobs" \
    --output="$dir/jobs/$name-%j.out" "$dir/jobs/$name.sbatch") || return 1
  jobid=${jobid%%;*}
  [ -n "$jobid" ] || return 1
  log "submitted $name as job $jobid"
}
# No process of job $1 on this machine: none has SLURM_JOB_ID=$1 and this
# cluster's SLURM_CLUSTER_NAME in its environment, and the nodes' namespaces
# hold nothing but their slurmd.
of_job() { # of_job PID ID: process PID belongs to job ID of this cluster
  { tr '\0' '\n' <"/proc/$1/environ"; } 2>/dev/null |
    grep -cxE "SLURM_JOB_ID=$2|SLURM_CLUSTER_NAME=$cluster" | grep -qx 2
}
job_gone() {
  local p i
  for p in /proc/[0-9]*; do
    if of_job "${p#/proc/}" "$1"; then return 1; fi
  done
  for ((i = 0; i < NODES; i++)); do
    for p in $(ip netns pids "$(netns_node "$i")"); do
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = slurmd ] || return 1
    done
  done
}
# ended NAME ID LIMIT STATE: waits for job ID to end and checks its state.
ended() {
  local t0=$SECONDS
  check "job $2 ($1) ends within $3 s" wait_for "$3" job_ended "$2"
  log "job $2 ($1): $(job_state "$2") after $((SECONDS - t0)) s"
  check "job $2 ($1) $4" [ "$(job_state "$2")" = "$4" ] || on_ctl scontrol show job "$2"
}

# 1. every rank in lock step, through a barrier per step.
case_lockstep() {
  local id out r
  submit lockstep sh "$src/tests/slurm/lockstep.sh" "$cohort" "$STEPS" || {
    check "sbatch takes the lockstep script" false
    return
  }
  id=$jobid
  out="$dir/jobs/lockstep-$id.out"
  ended lockstep "$id" 180 COMPLETED
  check "job $id exit code 0:0" [ "$(job_field "$id" ExitCode)" = 0:0 ]
  # The script's #SBATCH lines were honoured.
  check "job $id is named lockstep" [ "$(job_field "$id" JobName)" = lockstep ]
  check "job $id ran on node[0-$((NODES - 1))]" [ "$(job_field "$id" NodeList)" = "node[0-$((NODES - 1))]" ]
  check "job $id had a 5 min limit" [ "$(job_field "$id" TimeLimit)" = 00:05:00 ]
  # The agents took the rendezvous from srun's environment: node 0 of the
  # step's node list, port 29400 + job id % 1000.
  for ((r = 0; r < NODES; r++)); do
    check "node $r's agent found the store from SLURM_*" grep -qx \
      "cohort: rendezvous via slurm job $id: node $r of $NODES, store node0:$((29400 + id % 1000))" "$out"
  done
  for ((r = 0; r < world; r++)); do
    check "rank $r finished all $STEPS steps on node $((r / NPROC))" \
      grep -qx "\[r$r\] finished $STEPS steps: rank $r of $world on node $((r / NPROC)) of $NODES" "$out"
    check "rank $r printed steps 1..$STEPS in order" \
      [ "$(sed -n "s/^\[r$r\] step \([0-9]*\) of $STEPS\$/\1/p" "$out" | tr '\n' ' ')" = "$(seq -s ' ' 1 "$STEPS") " ]
  done
  check "job $id leaves no process" wait_for 15 job_gone "$id"
  cat "$out"
}

# 2. a real training run: PyTorch DDP (gloo) across the nodes. Every rank
# seeds its model differently; identical parameters after training show that
# the ranks averaged their gradients in every step.
case_ddp() {
  local id out
  submit ddp env STEPS=10 /usr/bin/python3 "$src/tests/torch/ddp_train.py" || {
    check "sbatch takes the ddp script" false
    return
  }
  id=$jobid
  out="$dir/jobs/ddp-$id.out"
  ended ddp "$id" 240 COMPLETED
  check "$world ranks report their parameters" [ "$(grep -c '^\[r[0-9]*\] PARAMS ' "$out")" -eq "$world" ]
  check "every rank ends with the same parameters" \
    [ "$(sed -n 's/^\[r[0-9]*\] PARAMS //p' "$out" | sort -u | wc -l)" -eq 1 ]
  check "rank 0 trained in a world of $world" grep -q "^\[r0\] LOSS .* world $world\$" "$out"
  check "job $id leaves no process" wait_for 15 job_gone "$id"
  cat "$out"
}

# 3. cohort-gpt2 (tiny model) data-parallel over the 6 ranks. The loss of
# each step is the mean over all ranks' batches; it must equal, step for
# step, that of one process with 6-fold gradient accumulation over the same
# global batch (up to float summation order): every rank contributed to
# every step. The trainer itself ends with a cross-rank parameter check.
GPT2_ARGS=(--model tiny --steps 8 --seed 7)
gpt2_losses() { sed -n 's/.*"loss":\([^,]*\),.*/\1/p' "$1"; }
same_losses() { # same_losses A B: same number of steps, relative difference <= 1e-5
  paste <(gpt2_losses "$1") <(gpt2_losses "$2") | awk -v n="$3" '
    function abs(x) { return x < 0 ? -x : x }
    { k++; if (NF != 2 || !(abs($1 - $2) <= 1e-5 * abs($2))) bad++ }
    END { exit !(k == n && bad == 0) }'
}
case_gpt2() {
  local id out steps=8
  submit gpt2 "$bin/cohort-gpt2" "${GPT2_ARGS[@]}" --metrics "$dir/jobs/gpt2.jsonl" || {
    check "sbatch takes the gpt2 script" false
    return
  }
  id=$jobid
  out="$dir/jobs/gpt2-$id.out"
  ended gpt2 "$id" 240 COMPLETED
  check "cohort-gpt2 trains in a world of $world with identical parameters" \
    grep -q "^\[r0\] cohort-gpt2: .* world=$world, .*parameters identical on all ranks\$" "$out"
  check "cohort-gpt2 ran $steps steps" grep -q "^\[r0\] summary: $steps steps, " "$out"
  check "no rank reported an error" not grep -q "^\[r[0-9]*\] cohort-gpt2: rank" "$out"
  env -u RANK -u WORLD_SIZE OMP_NUM_THREADS=1 "$bin/cohort-gpt2" "${GPT2_ARGS[@]}" --threads 1 \
    --grad-accum "$world" --quiet --metrics "$dir/jobs/gpt2-ref.jsonl" >"$dir/jobs/gpt2-ref.out" 2>&1
  check "one process with $world-fold accumulation trains" [ $? -eq 0 ]
  check "$steps losses equal to the one-process run's" same_losses "$dir/jobs/gpt2.jsonl" "$dir/jobs/gpt2-ref.jsonl" "$steps"
  paste <(gpt2_losses "$dir/jobs/gpt2.jsonl") <(gpt2_losses "$dir/jobs/gpt2-ref.jsonl")
  check "job $id leaves no process" wait_for 15 job_gone "$id"
  cat "$out"
}

# 4. one rank crashes (SIGKILL at step 3): the job fails and nothing of it
# is left; the other ranks never pass the barrier of step 3.
case_crash() {
  local id out crash_rank=$((NPROC + 1)) # on node1, not the batch host
  submit crash sh "$src/tests/slurm/lockstep.sh" "$cohort" 1000 "$crash_rank" 3 || {
    check "sbatch takes the crash script" false
    return
  }
  id=$jobid
  out="$dir/jobs/crash-$id.out"
  ended crash "$id" 120 FAILED
  check "job $id leaves no process" wait_for 15 job_gone "$id"
  check "rank $crash_rank crashed at step 3" grep -qx "\[r$crash_rank\] crashing at step 3" "$out"
  check "cohort's report names rank $crash_rank" grep -q "^cohort: job failed: node 1 (node1): rank $crash_rank " "$out"
  check "no rank got past step 2" \
    [ "$(sed -n 's/^\[r[0-9]*\] step \([0-9]*\) of .*/\1/p' "$out" | sort -n | tail -1)" = 2 ]
  cat "$out"
}

# 5. the same with cohort-gpt2: rank 3 is killed (SIGKILL) while training.
case_gpt2_crash() {
  local id out
  submit gpt2crash sh "$src/tests/slurm/crash_rank.sh" 3 3 \
    "$bin/cohort-gpt2" --model tiny --steps 100000 --seed 7 || {
    check "sbatch takes the gpt2crash script" false
    return
  }
  id=$jobid
  out="$dir/jobs/gpt2crash-$id.out"
  ended gpt2crash "$id" 120 FAILED
  check "job $id leaves no process" wait_for 15 job_gone "$id"
  check "rank 3 was killed" grep -qx "\[r3\] killing rank 3 with SIGKILL" "$out"
  # Three paths race: node1's agent sees rank 3 die, the peers' libcohort
  # errors reach the other agents, and srun (--kill-on-bad-exit) stops the
  # step when the first agent exits. Node1's agent names rank 3 either as the
  # failure ("rank 3 (local rank 1, ...) was killed by SIGKILL"), as "also
  # was killed by SIGKILL", or in "stopped by cohort ... after rank 3 failed".
  check "cohort's report names rank 3" \
    grep -Eq "^cohort: .*(rank 3 \(local rank 1, pid [0-9]+\) was killed by SIGKILL|rank 3: also was killed by SIGKILL|after rank 3 failed)" "$out"
  check "training did not finish" not grep -q "summary:" "$out"
  log "job $id: rank 0 printed $(grep -c '^\[r0\] step ' "$out") steps before the crash"
  tail -n 30 "$out"
}

# 6. a node's agent is killed (SIGKILL, as by the OOM killer): Slurm ends the
# job FAILED and nothing of it is left either.
agent_pid() { # the `cohort run` process of job $1 in node $2's namespace
  local p
  for p in $(ip netns pids "$(netns_node "$2")"); do
    if [ "$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -d' ' -f2)" = run ] && of_job "$p" "$1"; then
      echo "$p"
      return
    fi
  done
}

# start_lockstep NAME: submits a long lockstep job (1000 steps) named NAME
# and waits until it steps; sets $id and $out (the caller's locals).
start_lockstep() {
  submit "$1" sh "$src/tests/slurm/lockstep.sh" "$cohort" 1000 || {
    check "sbatch takes the $1 script" false
    return 1
  }
  id=$jobid
  out="$dir/jobs/$1-$id.out"
  stepping() { grep -q '^\[r4\] step 2 ' "$out" 2>/dev/null; }
  check "job $id steps" wait_for 120 stepping
  return 0 # the case goes on either way, as its checks say what happened
}

case_killed() {
  local id out victim
  # As the generated script says: COHORT_TOKEN exported before sbatch
  # authenticates every store connection of the job.
  local token port
  token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  COHORT_TOKEN=$token start_lockstep killed || return
  check "job $id is seen running on the nodes" not job_gone "$id"
  port=$((29400 + id % 1000))
  check "the job's store takes the token given to sbatch" \
    in_ns 1 node1 "$cohort" store ping --timeout 5 --addr "node0:$port" --token "$token"
  check "the job's store refuses another token" \
    not in_ns 1 node1 "$cohort" store ping --timeout 5 --addr "node0:$port" --token "x$token"
  victim=$(agent_pid "$id" 2)
  check "node2's agent found" [ -n "$victim" ] && kill -KILL "$victim"
  ended killed "$id" 120 FAILED
  check "job $id leaves no process" wait_for 15 job_gone "$id"
  check "no rank finished" not grep -q finished "$out"
  cat "$out"
}

# 7. scancel (a user's, or a preemption's): the job ends CANCELLED and its
# processes on every node are gone.
case_cancel() {
  local id out
  start_lockstep cancel || return
  # No token was exported to sbatch: the script made one. The login node (the
  # controller's namespace) reaches node0's store, but without the token:
  local port=$((29400 + id % 1000)) said
  refused() { # refused CMD...: the command fails because the store requires a token
    said=$(on_ctl env -u COHORT_TOKEN timeout 60 "$@" 2>&1)
    [ $? -ne 0 ] && grep -q "requires a token" <<<"$said"
  }
  check "without the token the job's store cannot be read" \
    refused "$cohort" store get --timeout 5 --addr "node0:$port" plan
  check "without the token the failure key cannot be set" \
    refused "$cohort" store set --timeout 5 --addr "node0:$port" "j/0/fail" "intruder says stop"
  check "without the token an agent cannot join" \
    refused "$cohort" run --nnodes "$NODES" --node-rank 1 --master "node0:$port" -- /bin/true
  local steps_before
  steps_before=$(grep -c '^\[r4\] step ' "$out")
  more_steps() { [ "$(grep -c '^\[r4\] step ' "$out")" -gt "$steps_before" ]; }
  check "job $id steps on after the intruder" wait_for 60 more_steps
  check "job $id is still running" [ "$(job_state "$id")" = RUNNING ]
  check "scancel $id" on_ctl scancel "$id"
  ended cancel "$id" 60 CANCELLED
  check "job $id leaves no process" wait_for 15 job_gone "$id"
  check "no rank finished" not grep -q finished "$out"
  tail -n 20 "$out"
}

case_lockstep
case_ddp
case_gpt2
case_crash
case_gpt2_crash
case_killed
case_cancel

check "slurmd, slurmctld and munged stop on SIGTERM" stop_daemons
nothing_left() { # nothing runs in the nodes' namespaces any more
  local i
  for ((i = 0; i <= NODES; i++)); do [ -z "$(ip netns pids "$(netns_node "$i")")" ] || return 1; done
}
check "nothing is left in the namespaces" wait_for 10 nothing_left

finish

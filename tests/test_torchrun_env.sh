#!/usr/bin/env bash
# The environment a worker sees under `cohort run` and under `torchrun`
# (Debian's torch 1.13; on the GPU node torch 2.11; same layout: one node, 2
# workers) is the same, except for the differences documented in
# docs/torchrun-env.md.
# usage: test_torchrun_env.sh COHORT_BINARY
# (env COHORT_TEST_PYTHON: the Python with torch, default /usr/bin/python3;
# scripts/device-check.sh points it at a GPU node's torchrun 2.11)
set -u
cohort=$1
py=${COHORT_TEST_PYTHON:-/usr/bin/python3}
. "$(dirname "$0")/check_lib.sh"
tmp=$(mktemp -d /tmp/cohort-envcmp-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# Values that differ by design (docs/torchrun-env.md); they must exist in both.
# TORCHELASTIC_USE_AGENT_STORE: torchrun's True where its workers share its
# TCPStore (1.13: static only; 2.11: every backend), cohort's always False
# (checked below).
differ="MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID TORCHELASTIC_ERROR_FILE TORCHELASTIC_USE_AGENT_STORE"
# Set only by torchrun's Python interpreter (PEP 538 locale coercion), and
# (torchrun 2.11) the signals its agent handles, inherited by the workers.
torch_only="LC_CTYPE TORCHELASTIC_SIGNALS_TO_HANDLE"
# Added by cohort.
cohort_only="COHORT_STORE COHORT_JOB_ID COHORT_ROUND COHORT_TOKEN COHORT_NODE_RANK COHORT_NNODES COHORT_PROGRESS COHORT_HEARTBEAT \
COHORT_STACKS_FILE COHORT_STACKS_SIGNAL PYTHONPATH GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME NCCL_IB_DISABLE NCCL_SOCKET_NTHREADS NCCL_NSOCKS_PERTHREAD \
UCX_NET_DEVICES"
# Set by cohort under both names; torchrun 1.13 sets the old one, 2.x the new
# one: the same value where torchrun sets it.
cohort_both="NCCL_ASYNC_ERROR_HANDLING TORCH_NCCL_ASYNC_ERROR_HANDLING"

base=(env -i PATH=/usr/bin:/bin HOME=/root TMPDIR="$tmp")
dump='env | sort > "$OUT-$RANK"'

# compare NAME NPROC ARGS...: the same torchrun arguments (ARGS, then
# --no_python and the dump) under torchrun and `cohort run`; every variable of
# every rank equal but the documented differences. torchrun gets the words of
# the array torch_args instead where it is set.
torch_args=()
compare() {
  local name=$1 nproc=$2 r n t c ht hc
  shift 2
  [ ${#torch_args[@]} -gt 0 ] || torch_args=("$@")
  "${base[@]}" OUT="$tmp/$name-torch" timeout 120 "$py" -m torch.distributed.run "${torch_args[@]}" \
    --no_python sh -c "$dump" >/dev/null 2>&1
  torch_args=()
  "${base[@]}" OUT="$tmp/$name-cohort" timeout 120 "$cohort" run "$@" --no_python sh -c "$dump" \
    >/dev/null 2>&1
  for ((r = 0; r < nproc; r++)); do
    check "$name rank $r: torchrun dump exists" eval "[ -s $tmp/$name-torch-$r ]"
    check "$name rank $r: cohort dump exists" eval "[ -s $tmp/$name-cohort-$r ]"
    for n in $(cut -d= -f1 "$tmp/$name-torch-$r" "$tmp/$name-cohort-$r" | sort -u); do
      [ "$n" = OUT ] && continue
      t=$(grep -m1 "^$n=" "$tmp/$name-torch-$r" | cut -d= -f2-)
      c=$(grep -m1 "^$n=" "$tmp/$name-cohort-$r" | cut -d= -f2-)
      ht=$(grep -c "^$n=" "$tmp/$name-torch-$r")
      hc=$(grep -c "^$n=" "$tmp/$name-cohort-$r")
      case " $torch_only " in *" $n "*) check "$name rank $r: $n only under torchrun" eval "[ $ht = 1 ] && [ $hc = 0 ]"; continue ;; esac
      case " $cohort_only " in *" $n "*) check "$name rank $r: $n only under cohort" eval "[ $ht = 0 ] && [ $hc = 1 ]"; continue ;; esac
      case " $cohort_both " in *" $n "*) check "$name rank $r: $n set by cohort, as torchrun where it does (torchrun '$t', cohort '$c')" eval "[ $hc = 1 ] && { [ $ht = 0 ] || [ \"\$t\" = \"\$c\" ]; }"; continue ;; esac
      case " $differ " in *" $n "*) check "$name rank $r: $n set by both" eval "[ $ht = 1 ] && [ $hc = 1 ]"; continue ;; esac
      check "$name rank $r: $n same (torchrun '$t', cohort '$c')" eval "[ $ht = $hc ] && [ \"\$t\" = \"\$c\" ]"
    done
  done
  for n in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK \
    ROLE_WORLD_SIZE ROLE_NAME TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS \
    TORCHELASTIC_USE_AGENT_STORE; do
    check "$name: $n compared" eval "grep -q '^$n=' $tmp/$name-torch-0 && grep -q '^$n=' $tmp/$name-cohort-0"
  done
  check "$name: torchrun sets one of the async error handling variables" \
    eval "grep -q -E '^(TORCH_)?NCCL_ASYNC_ERROR_HANDLING=1' $tmp/$name-torch-0"
  # cohort's store is not a TCPStore: rank 0's env:// init hosts PyTorch's.
  check "$name: cohort's TORCHELASTIC_USE_AGENT_STORE is False" \
    eval "grep -q '^TORCHELASTIC_USE_AGENT_STORE=False' $tmp/$name-cohort-0"
}

# Python 3.11 needs --redirects 2 --tee 1 under torchrun 1.13; cohort takes them too.
out=(--redirects 2 --tee 1)
# torchrun's --standalone is c10d at localhost:29400 with a random id (1.13;
# 2.x: port 0): a fixed port that another job on the machine (this test in
# another checkout, say) may hold, and then torchrun joins that job's store
# or waits on a foreign server until the timeout. torchrun gets the same
# rendezvous on a free port; cohort run --standalone picks a free one itself.
torch_args=(--rdzv_backend c10d --rdzv_endpoint "localhost:$(free_port)" \
  --rdzv_id "$(cat /proc/sys/kernel/random/uuid)" --nproc_per_node 2 "${out[@]}")
compare standalone 2 --standalone --nproc_per_node 2 "${out[@]}"
check "standalone: OMP_NUM_THREADS compared" eval "grep -q '^OMP_NUM_THREADS=1' $tmp/standalone-cohort-1"
port=$(free_port)
compare c10d 2 --nnodes=1 --nproc_per_node=2 --rdzv_backend=c10d \
  --rdzv_endpoint=127.0.0.1:$port --rdzv_id=envjob --role trainer --max_restarts 2 "${out[@]}"
check "c10d: the rdzv id is the run id under both" \
  eval "grep -q '^TORCHELASTIC_RUN_ID=envjob' $tmp/c10d-torch-0 && grep -q '^TORCHELASTIC_RUN_ID=envjob' $tmp/c10d-cohort-0"
# Static: torchrun's workers share its store (TORCHELASTIC_USE_AGENT_STORE=True).
compare static 1 --nnodes 1 --node_rank 0 --master_addr 127.0.0.1 \
  --master_port "$(free_port)" --nproc_per_node 1 "${out[@]}"
check "static: one worker, no OMP_NUM_THREADS" eval "! grep -q '^OMP_NUM_THREADS=' $tmp/static-cohort-0"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

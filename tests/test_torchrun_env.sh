#!/usr/bin/env bash
# The environment a worker sees under `cohort run` and under `torchrun`
# (Debian's torch 1.13, same layout: one node, 2 workers) is the same, except
# for the differences documented in docs/torchrun-env.md.
# usage: test_torchrun_env.sh COHORT_BINARY
set -u
cohort=$1
tmp=$(mktemp -d /tmp/cohort-envcmp-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
check() { if eval "$2"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $1"; fi; }

# Values that differ by design (docs/torchrun-env.md); they must exist in both.
differ="MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID TORCHELASTIC_ERROR_FILE"
# Set only by torchrun's Python interpreter (PEP 538 locale coercion).
torch_only="LC_CTYPE"
# Added by cohort.
cohort_only="COHORT_STORE COHORT_JOB_ID COHORT_TOKEN COHORT_NODE_RANK COHORT_NNODES \
GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME NCCL_IB_DISABLE NCCL_SOCKET_NTHREADS NCCL_NSOCKS_PERTHREAD \
UCX_NET_DEVICES"

base=(env -i PATH=/usr/bin:/bin HOME=/root)
dump='env | sort > "$OUT-$RANK"'
"${base[@]}" OUT="$tmp/torch" timeout 120 /usr/bin/python3 -m torch.distributed.run --standalone \
  --nproc_per_node 2 --redirects 2 --tee 1 --no_python sh -c "$dump" >/dev/null 2>&1
"${base[@]}" OUT="$tmp/cohort" timeout 120 "$cohort" run --nproc-per-node 2 -- sh -c "$dump" >/dev/null 2>&1

for r in 0 1; do
  check "rank $r: torchrun dump exists" "[ -s $tmp/torch-$r ]"
  check "rank $r: cohort dump exists" "[ -s $tmp/cohort-$r ]"
  names=$(cut -d= -f1 "$tmp/torch-$r" "$tmp/cohort-$r" | sort -u)
  for n in $names; do
    [ "$n" = OUT ] && continue
    t=$(grep -m1 "^$n=" "$tmp/torch-$r" | cut -d= -f2-)
    c=$(grep -m1 "^$n=" "$tmp/cohort-$r" | cut -d= -f2-)
    ht=$(grep -c "^$n=" "$tmp/torch-$r")
    hc=$(grep -c "^$n=" "$tmp/cohort-$r")
    case " $torch_only " in *" $n "*) check "rank $r: $n only under torchrun" "[ $ht = 1 ] && [ $hc = 0 ]"; continue ;; esac
    case " $cohort_only " in *" $n "*) check "rank $r: $n only under cohort" "[ $ht = 0 ] && [ $hc = 1 ]"; continue ;; esac
    case " $differ " in *" $n "*) check "rank $r: $n set by both" "[ $ht = 1 ] && [ $hc = 1 ]"; continue ;; esac
    check "rank $r: $n same (torchrun '$t', cohort '$c')" "[ $ht = $hc ] && [ \"\$t\" = \"\$c\" ]"
  done
done
for n in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK \
  ROLE_WORLD_SIZE ROLE_NAME TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS OMP_NUM_THREADS \
  TORCHELASTIC_USE_AGENT_STORE NCCL_ASYNC_ERROR_HANDLING; do
  check "$n compared" "grep -q '^$n=' $tmp/torch-1 && grep -q '^$n=' $tmp/cohort-1"
done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

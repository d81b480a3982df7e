#!/usr/bin/env bash
# Soak: many consecutive multi-node jobs (default 200) across three network
# namespaces on a bridge (tests/netns_lib.sh; created and removed here). Each
# job: three agents (`cohort run --nnodes 3 --node-rank R --master ADDR:PORT
# --job ID --nproc-per-node 2`), six workers that run a short collective
# workload: `cohort bench --op allreduce -b 8 -e 1K -n 2 -w 1` (libcohort over
# TCP between nodes and shared memory inside each, results checked). Every
# fifth job fails on purpose: one rank (a different one each time) exits 3
# instead, so the others are stopped while they wait in their collective.
#
# Checked: every good job exits 0 on all nodes; every failing job exits 1 on
# all nodes and every node names the right rank and node; afterwards no
# process is left in the namespaces or of the agents, no socket listens or is
# held open in the namespaces, and no shared-memory segment or temporary
# file is left: each node's /dev/shm and /tmp are private directories of this
# test (bind-mounted inside the node's mount namespace), checked empty.
#
# usage: test_soak.sh COHORT_BINARY SOURCE_DIR [JOBS]
#   COHORT_RELIABILITY_OUT=FILE: also write a one-line summary for the figures.
set -u
src=$(readlink -f "$2")
# Each node gets a private /tmp; a binary that lives under /tmp (a CI clone
# there) would vanish behind it, so the agents run a copy kept under /run.
bindir=$(mktemp -d /run/cohort-soak-bin-XXXXXX)
cp "$(readlink -f "$1")" "$bindir/cohort"
cohort=$bindir/cohort
jobs=${3:-${COHORT_SOAK_JOBS:-200}}
. "$src/tests/netns_lib.sh"
tmp=$(mktemp -d /tmp/cohort-soak-XXXXXX)
pids=()

. "$src/tests/check_lib.sh"

cleanup() {
  netns_down
  rm -rf "$tmp" "$bindir"
}
trap cleanup EXIT

NODES=3
netns_up $NODES || { echo "cannot create network namespaces"; exit 1; }
# netns_up installs its own EXIT trap (netns_down); ours also removes the
# copied binary and the scratch directory, and calls netns_down itself.
trap cleanup EXIT
M=$(netns_addr 0)
# Each node's /dev/shm and /tmp are $tmp/node<i>/shm and tmp (netns_lib.sh).
NETNS_PRIVATE=$tmp
for ((i = 0; i < NODES; i++)); do mkdir -p "$tmp/node$i/shm" "$tmp/node$i/tmp"; done

# The worker: a short checked allreduce sweep; rank $1 (or none: -1) fails.
WORKER='[ "$RANK" = "$1" ] && exit 3
exec "$0" bench --op allreduce -b 8 -e 1K -n 2 -w 1 >/dev/null'

good=0 bad_ok=0 good_ok=0 bad=0
start=$SECONDS
for ((j = 0; j < jobs; j++)); do
  port=$((29600 + j % 4))
  fail=-1
  if [ $((j % 5)) -eq 4 ]; then fail=$((j % 6)); fi
  ags=()
  for ((i = 0; i < NODES; i++)); do
    netns_agent $i "$tmp/out$i" --nnodes $NODES --node-rank $i --master "$M:$port" \
      --job "soak$$-$j" --nproc-per-node 2 --heartbeat-timeout 5 --join-timeout 60 \
      -- sh -c "$WORKER" "$cohort" "$fail"
    ags+=($!)
  done
  wait_all 90 "${ags[@]}"
  pids=()
  if [ $fail -lt 0 ]; then
    good=$((good + 1))
    if [ "$codes" = "0 0 0" ]; then
      good_ok=$((good_ok + 1))
    else
      echo "FAIL: job $j (good) exited: $codes"
      tail -n 5 "$tmp"/out*
    fi
  else
    bad=$((bad + 1))
    node=$((fail / 2))
    ok=1
    [ "$codes" = "1 1 1" ] || ok=0
    for ((i = 0; i < NODES; i++)); do
      grep -qF "job failed: node $node (node$node): rank $fail " "$tmp/out$i" || ok=0
    done
    if [ $ok = 1 ]; then
      bad_ok=$((bad_ok + 1))
    else
      echo "FAIL: job $j (rank $fail fails) exited: $codes"
      tail -n 5 "$tmp"/out*
    fi
  fi
done
elapsed=$((SECONDS - start))
echo "soak: $jobs jobs in $elapsed s: $good_ok/$good good jobs exited 0 everywhere," \
  "$bad_ok/$bad failing jobs exited 1 naming the right rank"
check "every good job succeeded" [ $good_ok -eq $good ]
check "every failing job failed with the right rank named" [ $bad_ok -eq $bad ]

# Leftovers. Processes: none in the namespaces; none of the agents.
sleep 0.5
left_procs=0
for ((i = 0; i < NODES; i++)); do
  n=$(ip netns pids "$(netns_node $i)" | wc -l)
  left_procs=$((left_procs + n))
done
n=$(grep -lsa "soak$$[-]" /proc/[0-9]*/cmdline 2>/dev/null | wc -l) # [-]: not grep itself
left_procs=$((left_procs + n))
# Sockets: nothing listening or connected in the namespaces (TIME_WAIT has no owner).
left_socks=0
for ((i = 0; i < NODES; i++)); do
  n=$(ip netns exec "$(netns_node $i)" ss -H -tuan state listening state established 2>/dev/null | wc -l)
  left_socks=$((left_socks + n))
done
left_shm=$(find "$tmp"/node*/shm -mindepth 1 | wc -l)
left_tmp=$(find "$tmp"/node*/tmp -mindepth 1 | wc -l)
echo "soak leftovers: processes $left_procs, sockets $left_socks, /dev/shm entries $left_shm, /tmp entries $left_tmp"
find "$tmp"/node*/shm "$tmp"/node*/tmp -mindepth 1 | head -5
check "no process left" [ "$left_procs" -eq 0 ]
check "no socket left" [ "$left_socks" -eq 0 ]
check "no shared-memory segment left" [ "$left_shm" -eq 0 ]
check "no temporary file left" [ "$left_tmp" -eq 0 ]

if [ -n "${COHORT_RELIABILITY_OUT:-}" ]; then
  echo "jobs=$jobs seconds=$elapsed good=$good good_ok=$good_ok bad=$bad bad_ok=$bad_ok" \
    "left_procs=$left_procs left_socks=$left_socks left_shm=$left_shm left_tmp=$left_tmp" \
    >"$COHORT_RELIABILITY_OUT"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# test_rdzv_file.sh - two `cohort run` agents on loopback meeting through a
# shared rendezvous file signed with their token: a forged record of the job
# (no MAC) already in the file is not joined, the job runs, the file's last
# line is the MAC; an agent holding another token never joins and says why.
# Node 0 publishes an address, never its host name (a joiner's resolver may map
# the name elsewhere): its --local-addr, which is then MASTER_ADDR, and without
# one a numeric address of its own.
# Usage: test_rdzv_file.sh COHORT
set -u
cohort=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/check_lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
say='echo rank=$RANK world=$WORLD_SIZE master=$MASTER_ADDR'
agent() { # OUT TOKEN NODE_RANK TIMEOUT [OPTION...]
  local out=$1 token=$2 rank=$3 limit=$4
  shift 4
  "$cohort" run --net off --nnodes 2 --node-rank "$rank" --rdzv-file "$tmp/rdzv" --job sf \
    --token "$token" --join-timeout "$limit" "$@" -- sh -c "$say" >"$out" 2>&1
  echo "rc=$?" >>"$out"
}

# An intruder's record: this job's id, an address of its choosing, no MAC.
printf 'cohort-rdzv 1\njob=sf\nnode=0000000000000001\nstate=ready\nhost=127.0.0.1\nport=1\n' \
  >"$tmp/rdzv"
agent "$tmp/n1" T0ken 1 20 &
p1=$!
sleep 1
agent "$tmp/n0" T0ken 0 20 --local-addr 127.0.0.2
wait "$p1"
check "node 0 ran its rank of a 2-node job" contains "$tmp/n0" "[r0] rank=0 world=2"
check "node 1 joined the real store, not the forged record" contains "$tmp/n1" "[r1] rank=1 world=2"
check "the file holds node 0's --local-addr" grep -qx "host=127.0.0.2" "$tmp/rdzv"
check "--local-addr is node 0's MASTER_ADDR" contains "$tmp/n1" "[r1] rank=1 world=2 master=127.0.0.2"
check "both exited 0" contains "$tmp/n0" "rc=0"
check "node 1 exited 0" contains "$tmp/n1" "rc=0"
check "the record's last line is its MAC" [ "$(tail -n 1 "$tmp/rdzv" | cut -c1-4)" = "mac=" ]

# The job's signed record read with another token: not joined, one clear reason.
agent "$tmp/n2" 0therToken 1 2
check "another token does not join (exit non-zero)" not contains "$tmp/n2" "rc=0"
check "it says the record is not signed with its token" \
  contains "$tmp/n2" "a record not signed with this job's token"
not_contains "$tmp/n2" "[r1]" || check "no worker started" false

# Without --local-addr: node 0 alone writes its file (nobody joins: no traffic) and times out.
agent "$tmp/n3" T0ken 0 2
host=$(sed -n 's/^host=//p' "$tmp/rdzv")
is_ip() { python3 -c 'import ipaddress, sys; ipaddress.ip_address(sys.argv[1])' "$1" 2>/dev/null; }
check "without --local-addr the file holds a numeric address ('$host'), not the host name" \
  is_ip "$host"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

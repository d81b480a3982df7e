#!/usr/bin/env bash
# `cohort status`, `stacks` and `stop` on a job whose agents met through etcd
# (--rdzv-backend etcd): a 3-node job (2 ranks each) in network namespaces
# this test creates and removes, one etcd member (Debian's etcd-server) with
# users and passwords in a fourth, the commands run from a fifth that knows
# only etcd's endpoint, the credentials and the job's token. status lists the
# six ranks (the job id derived as the agents derive it), --json names etcd,
# stacks answers (cohort's spelling --discover etcd --master, --rdzv-id),
# a wrong password and no credentials are refused in one line, an unknown
# job is one line within its timeout, stop ends every node (stopped status
# 4, the reason printed; the time from the command's start to the last
# agent's exit is printed and held under 5 s), and no key is left in etcd.
# usage: test_status_etcd.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(readlink -f "$2")
. "$src/tests/netns_lib.sh"
. "$src/tests/check_lib.sh"
. "$src/tests/etcd_lib.sh"
if [ "$(id -u)" != 0 ]; then echo "needs root (network namespaces)"; exit 1; fi
etcd_find || exit 1
tmp=$(mktemp -d /tmp/cohort-status-etcd-XXXXXX)
pids=()
cleanup() {
  netns_down
  rm -rf "$tmp"
}
trap cleanup EXIT
netns_up 5 || { echo "cannot create network namespaces"; exit 1; }
A3=$(netns_addr 3)
etcd_member 3 e "http://$A3:2379" "http://127.0.0.1:2380" "e=http://127.0.0.1:2380"
etcd_ready 4 "http://$A3:2379"
ctl() { netns_exec 4 env ETCDCTL_API=3 "$etcdctl" --endpoints "$A3:2379" "$@"; }
ctl user add root:rootpw >/dev/null 2>&1 && ctl user add trainer:s3cret >/dev/null 2>&1 &&
  ctl role add cohort >/dev/null 2>&1 &&
  ctl role grant-permission cohort --prefix=true readwrite /cohort/ >/dev/null 2>&1 &&
  ctl user grant-role trainer cohort >/dev/null 2>&1 && ctl auth enable >/dev/null 2>&1
check "etcd is up, authentication enabled" [ $? = 0 ] || exit 1
printf 's3cret\n' >"$tmp/pw" && chmod 600 "$tmp/pw"
printf 'wrong\n' >"$tmp/badpw" && chmod 600 "$tmp/badpw"
left_keys() { ctl --user root:rootpw get --prefix /cohort --keys-only 2>&1 | grep -c .; }

export COHORT_TOKEN=status-etcd-token
CONF="user=trainer,password_file=$tmp/pw"
# The agents name etcd without its port; the commands with it (the same job id).
for i in 0 1 2; do
  netns_agent "$i" "$tmp/a$i" --rdzv-backend etcd --rdzv-endpoint "$A3" --rdzv-conf "$CONF" \
    --nnodes 3 --nproc-per-node 2 --net off -- sh -c 'echo "up $RANK"; exec sleep 60'
  eval "a$i=\$!"
done
E=(--rdzv-backend etcd --rdzv-endpoint "$A3:2379")
q() { netns_exec 4 "$cohort" "$@"; }

# Bounded in tries and time: each try has a 2 s timeout, all of them 60 s.
end=$((SECONDS + 60))
for _ in $(seq 1 80); do
  q status "${E[@]}" --rdzv-conf "$CONF" --timeout 2 >"$tmp/st" 2>&1
  [ "$(grep -c ' running ' "$tmp/st")" = 6 ] || [ $SECONDS -ge $end ] && break
  sleep 0.25
done
check "status through etcd lists 6 running ranks" [ "$(grep -c ' running ' "$tmp/st")" = 6 ]
check "... and the job line" grep -q "^job j[0-9a-f]*: 3 of 3 nodes joined, round 0, running$" "$tmp/st"
id=$(sed -n 's/^job \([^:]*\): .*/\1/p' "$tmp/st")
q status "${E[@]}" --rdzv-conf "$CONF" --json >"$tmp/json" 2>&1
check "--json names etcd as the store" contains "$tmp/json" "\"store\": \"etcd $A3:2379\""
check "... with three nodes" python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(len([n for n in d["nodes"] if n]) != 3)' "$tmp/json"

q stacks --discover etcd --master "$A3" --rdzv-id "$id" --rdzv-conf "$CONF" >"$tmp/stacks" 2>&1
check "stacks through etcd (--discover etcd --master, --rdzv-id): every rank" \
  [ "$(grep -c '^== rank [0-5], node [0-2]' "$tmp/stacks")" = 6 ]

q status "${E[@]}" --rdzv-conf "user=trainer,password_file=$tmp/badpw" --timeout 3 >"$tmp/bad" 2>&1
rc=$?
check "a wrong password: exit 1 in one line ($rc)" eval '[ $rc = 1 ] && [ "$(wc -l <"$tmp/bad")" = 1 ]'
check "... saying etcd refused it" contains "$tmp/bad" "etcd refused this client"
q status "${E[@]}" --timeout 3 >"$tmp/nocred" 2>&1
rc=$?
check "no credentials: exit 1 in one line ($rc)" eval '[ $rc = 1 ] && [ "$(wc -l <"$tmp/nocred")" = 1 ]'
start=$SECONDS
q status "${E[@]}" --rdzv-conf "$CONF" --rdzv-id other --timeout 1 >"$tmp/unk" 2>&1
rc=$?
check "an unknown job: exit 1 in one line ($rc)" eval '[ $rc = 1 ] && [ "$(wc -l <"$tmp/unk")" = 1 ]'
check "... naming it and etcd" contains "$tmp/unk" "no job other at etcd $A3:2379"
check "... within its timeout (1 s; bound 10 s)" [ $((SECONDS - start)) -le 10 ]
q status --rdzv-backend etcd >"$tmp/noep" 2>&1
check "--rdzv-backend etcd without an endpoint: exit 2" [ $? = 2 ]
q status --master "$A3:29400" --rdzv-conf "$CONF" >"$tmp/noetcd" 2>&1
check "--rdzv-conf without etcd: exit 2" [ $? = 2 ]

stop_checked "$tmp/stop" "cohort: stopped by $(id -un)@node4: through etcd" "$a0 $a1 $a2" \
  q stop "${E[@]}" --rdzv-conf "$CONF" --reason "through etcd"
check "no key left in etcd (the stop and the stacks request went with node 0's lease)" \
  [ "$(left_keys)" = 0 ]

if [ "$failed" -gt 0 ] || [ -n "${SHOW:-}" ]; then
  for f in "$tmp"/a? "$tmp"/st "$tmp"/stop "$tmp"/bad "$tmp"/nocred "$tmp"/unk "$tmp"/stacks; do
    echo "--- $f"
    tail -n 5 "$f"
  done
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

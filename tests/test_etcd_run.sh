#!/usr/bin/env bash
# `cohort run --rdzv-backend etcd` across network namespaces this script
# creates and removes (tests/netns_lib.sh), with real etcd members (Debian's
# etcd-server) started inside them:
#   a 3-node job through a 3-member etcd cluster, its libcohort workers
#   bootstrapping through node 0's agent (cohort bench's checked allreduce);
#   node 0's whole namespace SIGKILLed under --nnodes 2:3 --max-restarts 1:
#   the other two re-form with WORLD_SIZE=2 and finish with status 0;
#   one etcd member killed mid-job (the endpoint every client starts with):
#   nothing changes; the leader (as `etcdctl endpoint status` names it)
#   killed mid-job, quorum intact: the election is ridden out, every agent
#   exits 0 (--heartbeat-timeout 2; the election alone takes longer); TLS with client certificates; user and password, and a
#   wrong password refused with one line; etcd down at start: one line
#   naming the endpoints within the join timeout; every member lost mid-job:
#   the job fails naming etcd. No key is left in etcd.
# usage: test_etcd_run.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(cd "$2" && pwd)
. "$src/tests/check_lib.sh"
. "$src/tests/netns_lib.sh"
. "$src/tests/etcd_lib.sh"
if [ "$(id -u)" != 0 ]; then echo "needs root (network namespaces)"; exit 1; fi
etcd_find || exit 1
tmp=$(mktemp -d /tmp/cohort-etcdrun-XXXXXX)
pids=()
cleanup() {
  netns_down
  rm -rf "$tmp"
}
trap cleanup EXIT
netns_up 3 || { echo "cannot create network namespaces"; exit 1; }
A0=$(netns_addr 0) A1=$(netns_addr 1) A2=$(netns_addr 2)
CLUSTER="e0=http://$A0:2380,e1=http://$A1:2380,e2=http://$A2:2380"
EPS="$A0:2379,$A1:2379,$A2:2379"

# member I [state]: etcd member e<I> in node I's namespace
member() {
  local a
  a=$(netns_addr "$1")
  ETCD_STATE=${2:-new} etcd_member "$1" "e$1" "http://$a:2379" "http://$a:2380" "$CLUSTER"
}
# kill_member I: SIGKILL to member e<I>'s etcd server in node I's namespace
# (the PID netns_bg gives is the shell around it; node 2 also runs the TLS
# member from step 4 on); a failed check if none was there.
kill_member() {
  local p
  p=$(netns_pid "$1" etcd "e$1")
  check "etcd member $1 is running before it is killed" [ -n "$p" ]
  [ -n "$p" ] && kill -9 "$p"
}
# failed_codes: every code in $codes is a failure, none a timeout.
failed_codes() {
  local c
  for c in $codes; do [ "$c" = 0 ] || [ "$c" = timeout ] && return 1; done
  return 0
}
for i in 0 1 2; do member "$i"; done
for i in 0 1 2; do etcd_ready "$i" "http://$(netns_addr "$i"):2379" || exit 1; done

E=(--rdzv-backend etcd --rdzv-endpoint "$EPS" --token "t-$$" --heartbeat-timeout 2)
left_keys() { netns_exec 1 env ETCDCTL_API=3 "$etcdctl" --endpoints "$A1:2379" get --prefix /cohort --keys-only 2>&1 | grep -c .; }

# 1. Three nodes of two ranks; the workers are cohort bench (libcohort through COHORT_STORE).
job='echo "ws=$WORLD_SIZE rank=$RANK store=$COHORT_STORE"; exec "$0" bench -b 1K -e 64K -n 3'
ap=()
for i in 0 1 2; do
  netns_agent "$i" "$tmp/j$i" "${E[@]}" --nnodes 3 --nproc-per-node 2 --no-python sh -c "$job" "$cohort"
  ap+=($!)
done
wait_all 90 "${ap[@]}"
check "3 nodes through etcd: every agent exits 0 (got $codes)" [ "$codes" = "0 0 0" ]
check "... six ranks" grep -q "ws=6 rank=5" "$tmp/j0" "$tmp/j1" "$tmp/j2"
check "... the checked allreduce passed" grep -q "Out of bounds values : 0 OK" "$tmp/j0" "$tmp/j1" "$tmp/j2"
check "... the workers' store is node 0's" grep -q "node 0 of 3" "$tmp/j0" "$tmp/j1" "$tmp/j2"
check "... no key left in etcd" [ "$(left_keys)" = 0 ]

# 2. Node 0's namespace killed whole (its agent, workers and etcd member) mid-job.
slow='echo "ws=$WORLD_SIZE restart=$TORCHELASTIC_RESTART_COUNT"; sleep 6; echo finished'
ap=()
for i in 0 1 2; do
  netns_agent "$i" "$tmp/k$i" "${E[@]}" --nnodes 2:3 --max-restarts 1 --last-call 2 \
    --nproc-per-node 1 --no-python sh -c "$slow"
  ap+=($!)
  sleep 0.3 # node 0 (the first to join, and so the planner) is the one in namespace 0
done
for _ in $(seq 1 100); do grep -q "ws=3" "$tmp/k0" && break; sleep 0.1; done
check "the 3-node elastic job runs, node 0 in namespace 0" grep -q "node 0 of 3" "$tmp/k0"
for p in $(ip netns pids "$(netns_node 0)"); do kill -9 "$p" 2>/dev/null; done
wait_all 90 "${ap[1]}" "${ap[2]}"
check "node 0 killed: the other two exit 0 (got $codes)" [ "$codes" = "0 0" ]
check "... they saw node 0 lost" grep -q "node 0 (node0) lost" "$tmp/k1"
check "... and re-formed with WORLD_SIZE=2, restart 1" grep -q "ws=2 restart=1" "$tmp/k1" "$tmp/k2"
check "... and finished" grep -q "finished" "$tmp/k2"
member 0 existing
etcd_ready 0 "http://$A0:2379"

# 3. An etcd member (the endpoint every client tries first) killed mid-job.
ap=()
for i in 0 1 2; do
  netns_agent "$i" "$tmp/m$i" "${E[@]}" --nnodes 3 --nproc-per-node 1 --no-python sh -c "$slow"
  ap+=($!)
done
for _ in $(seq 1 100); do grep -q "ws=3" "$tmp/m0" "$tmp/m1" "$tmp/m2" 2>/dev/null && break; sleep 0.1; done
kill_member 0
wait_all 90 "${ap[@]}"
check "an etcd member killed mid-job: every agent exits 0 (got $codes)" [ "$codes" = "0 0 0" ]
check "... after the workers finished" grep -q "finished" "$tmp/m0"
member 0 existing
etcd_ready 0 "http://$A0:2379"

# 3b. The leader killed mid-job, quorum intact: no answer from any member
# until the others notice (1 s, etcd's election timeout), then 503s (no
# leader) until they elect one. The agents ride it out.
leader=
for _ in $(seq 1 50); do
  leader=$(netns_exec 1 env ETCDCTL_API=3 "$etcdctl" --endpoints "$EPS" endpoint status 2>/dev/null |
    awk -F', ' '$5 == "true" {print $1}')
  [ -n "$leader" ] && break
  sleep 0.1
done
lead=
for i in 0 1 2; do [ "$leader" = "$(netns_addr "$i"):2379" ] && lead=$i; done
check "etcdctl endpoint status names the leader ($leader)" [ -n "$lead" ]
ap=()
for i in 0 1 2; do
  netns_agent "$i" "$tmp/x$i" "${E[@]}" --nnodes 3 --nproc-per-node 1 --no-python sh -c "$slow"
  ap+=($!)
done
for _ in $(seq 1 100); do grep -q "ws=3" "$tmp/x0" "$tmp/x1" "$tmp/x2" 2>/dev/null && break; sleep 0.1; done
sleep 1 # the watchers beating
kill_member "${lead:-0}"
wait_all 90 "${ap[@]}"
check "the etcd leader (member $lead) killed mid-job: every agent exits 0 (got $codes)" \
  [ "$codes" = "0 0 0" ]
check "... after the workers finished" grep -q "finished" "$tmp/x0" "$tmp/x1" "$tmp/x2"
member "${lead:-0}" existing
etcd_ready "${lead:-0}" "http://$(netns_addr "${lead:-0}"):2379"

# 4. TLS with client certificates (a member of its own in node 2's namespace).
pki=$tmp/pki
etcd_pki "$pki" "$A2"
etcd_member 2 tls "https://$A2:2479" "http://127.0.0.1:2480" "tls=http://127.0.0.1:2480" \
  --cert-file "$pki/server.crt" --key-file "$pki/server.key" --client-cert-auth \
  --trusted-ca-file "$pki/ca.crt"
etcd_ready 2 "https://$A2:2479" --cacert "$pki/ca.crt" --cert "$pki/client.crt" --key "$pki/client.key"
T=(--rdzv-backend etcd --rdzv-endpoint "$A2:2479" --token "t-$$"
  --rdzv-conf "protocol=https,cacert=$pki/ca.crt,cert=$pki/client.crt,key=$pki/client.key")
ap=()
for i in 0 1; do
  netns_agent "$i" "$tmp/t$i" "${T[@]}" --nnodes 2 --no-python sh -c 'echo ws=$WORLD_SIZE'
  ap+=($!)
done
wait_all 60 "${ap[@]}"
check "TLS with a client certificate: both exit 0 (got $codes)" [ "$codes" = "0 0" ]
check "... two ranks" grep -q "ws=2" "$tmp/t1"
netns_agent 0 "$tmp/t_nocert" --rdzv-backend etcd --rdzv-endpoint "$A2:2479" --token "t-$$" \
  --rdzv-conf "cacert=$pki/ca.crt" --nnodes 2 --join-timeout 3 --no-python true
wait_all 30 $!
check "TLS without a client certificate: refused (got $codes)" failed_codes
check "... one line naming etcd" grep -q "cannot reach etcd: etcd $A2:2479" "$tmp/t_nocert"

# 5. User and password on the 3-member cluster (authentication enabled there).
ctl() { netns_exec 1 env ETCDCTL_API=3 "$etcdctl" --endpoints "$A1:2379,$A2:2379" "$@"; }
ctl user add root:rootpw >/dev/null 2>&1 && ctl user add trainer:s3cret >/dev/null 2>&1 &&
  ctl role add cohort >/dev/null 2>&1 &&
  ctl role grant-permission cohort --prefix=true readwrite /cohort/ >/dev/null 2>&1 &&
  ctl user grant-role trainer cohort >/dev/null 2>&1 && ctl auth enable >/dev/null 2>&1
check "etcdctl enables authentication" [ $? = 0 ]
printf 's3cret\n' >"$tmp/pw" && chmod 600 "$tmp/pw"
printf 'wrong\n' >"$tmp/badpw" && chmod 600 "$tmp/badpw"
P=(--rdzv-backend etcd --rdzv-endpoint "$A1:2379,$A2:2379" --token "t-$$")
ap=()
for i in 1 2; do
  netns_agent "$i" "$tmp/p$i" "${P[@]}" --rdzv-conf "user=trainer,password_file=$tmp/pw" \
    --nnodes 2 --no-python sh -c 'echo ws=$WORLD_SIZE'
  ap+=($!)
done
wait_all 60 "${ap[@]}"
check "user and password: both exit 0 (got $codes)" [ "$codes" = "0 0" ]
start=$SECONDS
netns_agent 1 "$tmp/p_bad" "${P[@]}" --rdzv-conf "user=trainer,password_file=$tmp/badpw" \
  --nnodes 2 --no-python true
wait_all 30 $!
check "a wrong password: refused (got $codes)" failed_codes
check "... at once ($((SECONDS - start)) s)" [ $((SECONDS - start)) -lt 10 ]
check "... one line saying so" grep -q "cannot reach etcd: .*authentication failed" "$tmp/p_bad"
check "... and nothing else but the endpoints it tried" [ "$(grep -vc "rendezvous via etcd" "$tmp/p_bad")" = 1 ]

# 6. etcd down at start: the join timeout, one line naming the endpoints.
start=$SECONDS
netns_agent 0 "$tmp/down" --rdzv-backend etcd --rdzv-endpoint "$A0:2999,$A1:2998" --nnodes 2 \
  --join-timeout 3 --token "t-$$" --no-python true
wait_all 60 $!
took=$((SECONDS - start))
check "etcd down: exits non-zero (got $codes)" failed_codes
check "... at its join timeout (3 s), not the test's limit ($took s, bound 30)" [ "$took" -le 30 ]
check "... naming the endpoints" grep -q "cannot reach etcd: etcd $A0:2999,$A1:2998: " "$tmp/down"

# 7. Every etcd member lost mid-job (the two left, with authentication on):
# the job fails with that cause, never hangs.
ap=()
for i in 1 2; do
  netns_agent "$i" "$tmp/l$i" "${P[@]}" --rdzv-conf "user=trainer,password_file=$tmp/pw" \
    --heartbeat-timeout 2 --nnodes 2 --no-python sh -c 'echo ws=$WORLD_SIZE; sleep 60'
  ap+=($!)
done
both_run() { grep -q "ws=2" "$tmp/l1" 2>/dev/null && grep -q "ws=2" "$tmp/l2" 2>/dev/null; }
for _ in $(seq 1 200); do both_run && break; sleep 0.1; done
check "a job runs on both nodes before etcd goes" both_run
start=$SECONDS
kill_member 1
kill_member 2
wait_all 40 "${ap[@]}"
took=$((SECONDS - start))
check "etcd lost mid-job: both agents fail (got $codes)" failed_codes
# (etcd is lost when no member answered for the heartbeat timeout, 2 s here.
# Writing its exit key, publishing the failure or revoking its lease would
# only wait out their deadlines: an agent that lost the store skips them.
# The bound is ten times the timeout, below wait_all's limit of 40 s.)
check "... within ten times the heartbeat timeout, 20 s, not wait_all's limit ($took s)" \
  [ "$took" -le 20 ]
check "... naming etcd as the cause" grep -q "lost etcd $A1:2379,$A2:2379" "$tmp/l1" "$tmp/l2"

if [ "$failed" -gt 0 ]; then for f in "$tmp"/[jkmxtpdl]*; do [ -f "$f" ] && { echo "--- $f"; tail -n 8 "$f"; }; done; fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

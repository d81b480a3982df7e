#!/usr/bin/env bash
# The etcd client (src/rdzv/etcd.c) against real etcd servers (Debian's
# etcd-server) this script starts on loopback and removes: one member for
# every operation, counters from several processes, leases (and a guest
# backend writing under an agent's lease), waiting and prefixes; the member
# stopped (SIGSTOP) while a backend that has lost it closes (the close does not
# wait out the lease's renewal); a 3-member cluster whose first member is
# killed (requests go to the others); user/password authentication (right and
# wrong); TLS with a client certificate (and refused without); nothing
# listening (one line, within the deadline).
# usage: test_etcd.sh TEST_ETCD_BINARY
set -u
bin=$(readlink -f "$1")
here=$(cd "$(dirname "$0")" && pwd)
. "$here/check_lib.sh"
. "$here/etcd_lib.sh"
etcd_find || exit 1
tmp=$(mktemp -d /tmp/cohort-etcd-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
# Ports below the kernel's ephemeral range (32768 and up), which any outgoing
# connection on the machine may hold: a member that cannot bind fails the test.
base=$((20000 + ($$ % 1200) * 10))

# start NAME CLIENT_PORT PEER_PORT CLUSTER [extra etcd flags...]; its pid in pid_NAME
start() {
  local name=$1 cport=$2 pport=$3 cluster=$4 scheme=http
  shift 4
  case " $* " in *" --cert-file "*) scheme=https ;; esac
  etcd_member - "$name" "$scheme://127.0.0.1:$cport" "http://127.0.0.1:$pport" "$cluster" "$@"
  eval "pid_$name=$!"
}
# ready PORT [curl flags]: the member answers within 30 s (a loaded machine
# slows etcd's start); else a failed check and the end of its log.
ready() {
  local port=$1 url=http
  shift
  [ $# -gt 0 ] && url=https
  etcd_ready - "$url://127.0.0.1:$port" "$@" && return 0
  check "etcd on port $port comes up" false
  tail -n 5 "$tmp"/*.log | cut -c1-200
  return 1
}
step() { # step NAME ARGS...: runs test_etcd, prints its output, counts it
  local name=$1
  shift
  timeout 120 "$bin" "$@" >"$tmp/$name.out" 2>&1
  local rc=$?
  sed "s/^/  [$name] /" "$tmp/$name.out"
  check "test_etcd $name" [ "$rc" = 0 ]
}

# One member.
p1=$base
start one $p1 $((p1 + 1)) "one=http://127.0.0.1:$((p1 + 1))"
ready $p1 || exit 1
step basic basic "127.0.0.1:$p1"
step hung hung "127.0.0.1:$p1" "$pid_one"
kill -CONT "$pid_one" 2>/dev/null # whatever became of the step
ready $p1 || exit 1

# Three members; the first one killed: the client goes to the others.
c1=$((base + 2)) c2=$((base + 4)) c3=$((base + 6))
cluster="m1=http://127.0.0.1:$((c1 + 1)),m2=http://127.0.0.1:$((c2 + 1)),m3=http://127.0.0.1:$((c3 + 1))"
start m1 $c1 $((c1 + 1)) "$cluster"
start m2 $c2 $((c2 + 1)) "$cluster"
start m3 $c3 $((c3 + 1)) "$cluster"
if ready $c1 && ready $c2 && ready $c3; then
  step cluster basic "127.0.0.1:$c1,127.0.0.1:$c2,127.0.0.1:$c3"
  kill -9 "$pid_m1"
  wait "$pid_m1" 2>/dev/null
  step failover failover "127.0.0.1:$c1,127.0.0.1:$c2,127.0.0.1:$c3"
fi

# Authentication on the single member: root with a password, auth enabled.
E="$etcdctl --endpoints=127.0.0.1:$p1"
if ETCDCTL_API=3 $E user add root:s3cret >/dev/null 2>&1 &&
  ETCDCTL_API=3 $E auth enable >/dev/null 2>&1; then
  step auth auth "127.0.0.1:$p1" root s3cret
  check "wrong password: one line naming etcd" grep -q "wrong password: etcd 127.0.0.1:$p1: HTTP 400 from 127.0.0.1:$p1: .*authentication failed" "$tmp/auth.out"
else
  check "etcdctl enables authentication" false
fi

# TLS: a CA, a server certificate for 127.0.0.1, a client certificate.
pki=$tmp/pki
etcd_pki "$pki" 127.0.0.1
pt=$((base + 8))
start tls $pt $((pt + 1)) "tls=http://127.0.0.1:$((pt + 1))" --cert-file "$pki/server.crt" \
  --key-file "$pki/server.key" --client-cert-auth --trusted-ca-file "$pki/ca.crt"
if ready $pt --cacert "$pki/ca.crt" --cert "$pki/client.crt" --key "$pki/client.key"; then
  step tls tls "127.0.0.1:$pt" "$pki/ca.crt" "$pki/client.crt" "$pki/client.key"
fi

# Nothing listening (the killed member's port).
step down down "127.0.0.1:$c1"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$passed" -ge 8 ]

#!/bin/bash
# test_rdzv_mcast.sh DRIVER - multicast discovery between three network namespaces.
#
# Creates three node namespaces joined by a bridge that lives in a fourth
# (tests/netns_lib.sh; node 1 has a default route, nodes 2 and 3 a
# 224.0.0.0/4 route), runs the driver (tests/test_rdzv_mcast.c) in them in
# several start orders, and removes every namespace on exit, also on failure.
# No traffic leaves these namespaces. Exits 77 (skipped) without root or ip.
set -u
DRV=${1:?usage: test_rdzv_mcast.sh DRIVER}
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "skipped: needs root and iproute2 to create network namespaces"
  exit 77
fi

. "$(dirname "$0")/netns_lib.sh"
OUT=$(mktemp -d /tmp/cohort_rdzv_mcast.XXXXXX)
pids=()

cleanup() {
  netns_down
  rm -rf "$OUT"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

netns_up 3 || exit 1
# Both ways an interface for multicast is found: the default route, and a 224/4 route.
ip -n "$(netns_node 0)" route replace default via "$NETNS_SUBNET.254" dev eth0 || exit 1
for i in 1 2; do
  ip -n "$(netns_node $i)" route del default &&
    ip -n "$(netns_node $i)" route add 224.0.0.0/4 dev eth0 || exit 1
done

FAILED=0
# run NAME NODE(1..3) DRIVER-ARGS...: starts the driver in the background.
run() {
  local name=$1 node=$2
  shift 2
  ip netns exec "$(netns_node $((node - 1)))" "$DRV" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err" &
  pids+=($!)
  echo "$!" >"$OUT/$name.pid"
}
# finish NAME...: waits for the drivers, returns non-zero if any failed.
finish() {
  local bad=0
  for name in "$@"; do
    if ! wait "$(cat "$OUT/$name.pid")"; then bad=1; fi
  done
  return $bad
}
field() { sed -n "s/.*$2=\([^ ]*\).*/\1/p" "$OUT/$1.out"; }
status() { cut -d' ' -f1 "$OUT/$1.out"; }
# the_host NODE...: prints the one node that hosted; fails unless exactly one did.
the_host() {
  local n found=()
  for n in "$@"; do [ "$(status "$n")" = HOSTED ] && found+=("$n"); done
  [ ${#found[@]} = 1 ] && echo "${found[0]}"
}
dump() {
  for name in "$@"; do
    echo "  [$name] $(cat "$OUT/$name.out") / $(tr '\n' ' ' <"$OUT/$name.err")"
  done
}
# check SCENARIO HOST JOINERS...: HOST hosted, every joiner joined HOST's address.
check() {
  local scen=$1 host=$2 ok=1
  shift 2
  [ "$(status "$host")" = HOSTED ] || ok=0
  local addr
  addr=$(field "$host" addr)
  for j in "$@"; do
    [ "$(status "$j")" = JOINED ] && [ "$(field "$j" addr)" = "$addr" ] || ok=0
  done
  if [ $ok = 1 ]; then
    local times=""
    for j in "$@"; do times="$times $(field "$j" ms)"; done
    echo "ok: $scen (store $addr; joiners' discovery ms:$times)"
  else
    echo "FAIL: $scen"
    dump "$host" "$@"
    FAILED=1
  fi
}

T="--timeout 8000"

# 1. The host starts first, joiners later.
run a0 1 --job jobA --rank 0 --expect 2 $T
sleep 0.3
run a1 2 --job jobA --rank 1 $T
run a2 3 --job jobA --rank 2 --iface eth0 $T
finish a0 a1 a2
check "host first" a0 a1 a2

# 2. Joiners first, the host a second later; meanwhile a second job on the same group and
#    port, whose host is on another node: nobody may join the other job's store.
G="--group 239.255.77.77:29777"
run b1 2 --job jobB --rank 1 $G $T
run b2 3 --job jobB --rank 2 $G $T
run c1 1 --job jobC --rank 1 $G $T
run c2 3 --job jobC --rank 2 $G $T
sleep 1
run b0 1 --job jobB --rank 0 --expect 2 $G $T
run c0 2 --job jobC --rank 0 --expect 2 $G $T
finish b0 b1 b2 c0 c1 c2
check "host last, job B" b0 b1 b2
check "host last, job C on the same group" c0 c1 c2
if [ "$(field b0 addr | cut -d: -f1)" = "$(field c0 addr | cut -d: -f1)" ]; then
  echo "FAIL: jobs B and C were hosted on the same node"
  FAILED=1
fi

# 3. No node rank: the lowest node id hosts after the settle window; staggered starts.
run d1 1 --job jobD --settle 800 --expect 2 $T
sleep 0.15
run d2 2 --job jobD --settle 800 --expect 2 $T
sleep 0.15
run d3 3 --job jobD --settle 800 --expect 2 $T
finish d1 d2 d3
if h=$(the_host d1 d2 d3); then
  check "election, exactly one host ($h)" "$h" $(echo d1 d2 d3 | tr ' ' '\n' | grep -v "^$h$")
else
  echo "FAIL: election did not give exactly one host"
  dump d1 d2 d3
  FAILED=1
fi

# 4. No node rank, one node starting long after the others' window: it hears the host.
run e1 1 --job jobE --settle 600 --expect 2 $T
run e2 2 --job jobE --settle 600 --expect 2 $T
sleep 2
run e3 3 --job jobE --settle 600 --expect 2 $T
finish e1 e2 e3
if h=$(the_host e1 e2 e3) && [ "$h" != e3 ]; then
  check "late starter joins the elected host ($h)" "$h" $(echo e1 e2 e3 | tr ' ' '\n' | grep -v "^$h$")
  # Two nodes stood for election (each sent several candidates): the host counts nodes.
  if grep -q "hosting (lowest node id of 2 candidates)" "$OUT/$h.err"; then
    echo "ok: the host counts 2 candidates, not their datagrams"
  else
    echo "FAIL: the host's count of candidates: $(cat "$OUT/$h.err")"
    FAILED=1
  fi
else
  echo "FAIL: late starter: not exactly one host, or the late node (${h:-none})"
  dump e1 e2 e3
  FAILED=1
fi

# 5. A token: rogue announcements of the same job with a wrong token and without one are
#    ignored; the joiners find the real host, which starts last.
run r1 2 --job jobF --token wrong-token --rogue 2500 $T
run r2 3 --job jobF --rogue 2500 $T
run f1 2 --job jobF --token tok-F --rank 1 $T
run f2 3 --job jobF --token tok-F --rank 2 $T
sleep 1
run f0 1 --job jobF --token tok-F --rank 0 --expect 2 $T
finish f0 f1 f2 r1 r2
check "token: rogue announcements ignored" f0 f1 f2

exit $FAILED

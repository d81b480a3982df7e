# netns_lib.sh - emulated nodes for multi-node tests: network namespaces on a
# bridge that lives in a namespace of its own. Source it, call netns_up N,
# and netns_down is run on exit. Addresses: 10.201.0.<i+1>/24 for node i.
# Traffic never leaves these namespaces.

NETNS_PREFIX="ch$$"
NETNS_BR="${NETNS_PREFIX}br"
NETNS_NODES=()
NETNS_SUBNET=10.201.0

netns_node() { echo "${NETNS_PREFIX}n$1"; }
netns_addr() { echo "${NETNS_SUBNET}.$(($1 + 1))"; }

netns_down() {
  # The caller's background processes (netns_bg), then what runs in the namespaces.
  local p
  for p in ${pids[@]+"${pids[@]}"}; do kill -9 "$p" 2>/dev/null; done
  for ns in "${NETNS_NODES[@]}"; do
    # End what still runs in the namespace, by PID.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
    rm -rf "/etc/netns/$ns"
  done
  ip netns del "$NETNS_BR" 2>/dev/null
  NETNS_NODES=()
}

netns_up() {
  local n=$1 i ns
  # Callers with a cleanup of their own (which calls netns_down) keep it.
  [ -n "$(trap -p EXIT)" ] || trap netns_down EXIT
  ip netns add "$NETNS_BR" || return 1
  # No IGMP snooping: multicast reaches every node, as on a plain switch.
  ip -n "$NETNS_BR" link add br0 type bridge mcast_snooping 0 || return 1
  ip -n "$NETNS_BR" link set br0 up
  ip -n "$NETNS_BR" link set lo up
  for ((i = 0; i < n; i++)); do
    ns=$(netns_node "$i")
    ip netns add "$ns" || return 1
    NETNS_NODES+=("$ns")
    ip link add "eth$i-$$" type veth peer name "br$i-$$" || return 1
    ip link set "eth$i-$$" netns "$ns"
    ip link set "br$i-$$" netns "$NETNS_BR"
    ip -n "$ns" link set "eth$i-$$" name eth0
    ip -n "$ns" addr add "$(netns_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" route add default dev eth0
    ip -n "$NETNS_BR" link set "br$i-$$" master br0
    ip -n "$NETNS_BR" link set "br$i-$$" up
  done
  # A cluster's hosts file: every node knows every node's name.
  for ((i = 0; i < n; i++)); do
    ns=$(netns_node "$i")
    mkdir -p "/etc/netns/$ns"
    {
      printf '127.0.0.1 localhost\n'
      for ((k = 0; k < n; k++)); do printf '%s node%d\n' "$(netns_addr "$k")" "$k"; done
    } >"/etc/netns/$ns/hosts"
  done
}

# Runs a command inside node i's namespace with its own hosts file.
# It gets its own hostname (node<i>) so that reports name it. With
# NETNS_PRIVATE=DIR set, node i also gets DIR/node<i>/shm and DIR/node<i>/tmp
# as its /dev/shm and /tmp (created here; ip netns exec gives each command a
# mount namespace of its own), so that a test can see what a node leaves.
netns_exec() {
  local i=$1
  shift
  if [ -n "${NETNS_PRIVATE:-}" ]; then
    mkdir -p "$NETNS_PRIVATE/node$i/shm" "$NETNS_PRIVATE/node$i/tmp"
    ip netns exec "$(netns_node "$i")" unshare --uts sh -c \
      'hostname "$0" && mount --bind "$1/shm" /dev/shm && mount --bind "$1/tmp" /tmp && shift 2 && exec "$@"' \
      "node$i" "$NETNS_PRIVATE/node$i" -- "$@"
  else
    ip netns exec "$(netns_node "$i")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "node$i" "$@"
  fi
}

# netns_bg NODE OUTFILE CMD... : CMD on node i in the background, stdout and
# stderr to OUTFILE. Its PID is $! and joins the caller's pids array, whose
# processes netns_down kills.
netns_bg() {
  local i=$1 out=$2
  shift 2
  netns_exec "$i" "$@" >"$out" 2>&1 &
  pids+=($!)
}

# netns_agent NODE OUTFILE ARGS... : `$cohort run ARGS` on node i, as netns_bg.
netns_agent() {
  local i=$1 out=$2
  shift 2
  netns_bg "$i" "$out" "$cohort" run "$@"
}

# netns_pid NODE COMM [ARG]: the PID of a process named COMM in node i's
# namespace (with ARG one of its arguments, when given: of two etcd
# members in one namespace, the one named so).
netns_pid() {
  local p
  for p in $(ip netns pids "$(netns_node "$1")"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ] || continue
    [ $# -lt 3 ] || tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -qxF -- "$3" || continue
    echo "$p"
    return 0
  done
  return 1
}

# netns_crash I: node i dies whole, as a machine does: every process in its namespace is stopped,
# then killed, children before their parents, so that none of them (the agent's guard) names the
# others' deaths first. Stopping alone is not enough: a stopped process whose parent dies first
# is, alone in its process group as the guard is, woken by the kernel (SIGHUP and SIGCONT to a
# newly orphaned group with a stopped member).
netns_crash() {
  local pids p first=() last=()
  pids=$(ip netns pids "$(netns_node "$1")")
  [ -n "$pids" ] || return 0
  # shellcheck disable=SC2086 # one word per PID
  kill -STOP $pids 2>/dev/null
  for p in $pids; do
    if grep -qxF "$(awk '/^PPid:/ {print $2}' "/proc/$p/status" 2>/dev/null)" <<<"$pids"; then
      first+=("$p")
    else
      last+=("$p")
    fi
  done
  kill -9 ${first[@]+"${first[@]}"} 2>/dev/null
  kill -9 ${last[@]+"${last[@]}"} 2>/dev/null
  return 0
}

# Takes node i's link down or up (from the bridge side).
netns_link() { ip -n "$NETNS_BR" link set "br$1-$$" "$2"; }

# Waits for the given PIDs (children of the calling shell), at most LIMIT
# seconds in all; kills what is still running then. Sets $codes to their exit
# codes, or "timeout", in order.
wait_all() {
  local limit=$1
  shift
  local end=$((SECONDS + limit)) p list=()
  for p in "$@"; do
    while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.05; done
    if kill -0 "$p" 2>/dev/null; then
      kill -9 "$p"
      wait "$p" 2>/dev/null
      list+=(timeout)
    else
      wait "$p"
      list+=($?)
    fi
  done
  codes="${list[*]}"
}

# stop_checked OUT LINE PIDS CMD...: runs a `cohort stop` command line (output in OUT) against
# the job whose agents are PIDS (one word, space-separated) and checks that it exits 0, that
# every agent exits with the stopped status 4, the last within 5 s of the command (a few hundred
# ms measured; the bound only tells a prompt stop from wait_all's 15 s), and that each
# agent's output (the files "$tmp"/a0, a1, ...) holds LINE. Uses check (check_lib.sh).
stop_checked() {
  local out=$1 line=$2 pids=$3 t0 rc ms i=0 p want=""
  shift 3
  for p in $pids; do want="${want:+$want }4"; done
  t0=$(date +%s%N)
  "$@" >"$out" 2>&1
  rc=$?
  # shellcheck disable=SC2086
  wait_all 15 $pids
  ms=$((($(date +%s%N) - t0) / 1000000))
  echo "stop to the last agent's exit: $ms ms"
  check "stop exits 0 ($rc)" [ $rc = 0 ]
  check "every agent exits with the stopped status 4 ($codes)" [ "$codes" = "$want" ]
  check "every node stopped within 5 s of the command ($ms ms)" [ "$ms" -le 5000 ]
  for p in $pids; do
    check "node $i prints the reason" contains "$tmp/a$i" "$line"
    i=$((i + 1))
  done
}

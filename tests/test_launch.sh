#!/usr/bin/env bash
# `cohort launch` against real OpenSSH servers (Debian's openssh-server), one
# in each of 3 network namespaces this test creates and removes, with host
# and user keys it generates into its temp dir (tests/sshd_lib.sh). The
# launching side runs in node 0's namespace, as a user would on the first
# node of a cluster; all traffic stays inside the namespaces.
# usage: test_launch.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(readlink -f "$2")
. "$src/tests/netns_lib.sh"
. "$src/tests/sshd_lib.sh"
. "$src/tests/check_lib.sh"
tmp=$(mktemp -d /tmp/cohort-launch-XXXXXX)
chmod 755 "$tmp"

sshd_cluster "$tmp" 3 || exit 1
# node3 has a name and an address on the nodes' subnet, but no machine.
for i in 0 1 2; do printf '%s node3\n' "$(netns_addr 3)" >>"/etc/netns/$(netns_node $i)/hosts"; done
ssh_opts="-F $tmp/ssh_config"
version=$("$cohort" --version)

# The remote binary: the real one everywhere, except that on node2 it
# answers launch's handshake as another version would (hosts share this
# file system; the host name is what differs between them). Were it given
# the token anyway, it would leave a file saying so.
cat >"$tmp/cohort-mixed" <<SH
#!/bin/sh
if [ "\$(hostname)" = node2 ] && [ "\$2" = --launcher-stdin ]; then
  echo 'cohort 0.0.1'
  read -r token || exit 129
  touch "$tmp/started-mixed-node2"
  exit 1
fi
exec "$cohort" "\$@"
SH
chmod 755 "$tmp/cohort-mixed"

# ssh as launch finds it in PATH: the system's, each session logged with
# its host (the word after "--"), so that the test can count them.
mkdir "$tmp/bin"
cat >"$tmp/bin/ssh" <<SH
#!/bin/sh
for a in "\$@"; do [ -n "\$next" ] && { echo "\$a" >>"$tmp/ssh-sessions"; break; }; [ "\$a" = -- ] && next=1; done
exec /usr/bin/ssh "\$@"
SH
chmod 755 "$tmp/bin/ssh"
export PATH="$tmp/bin:$PATH"
sessions() { grep -cx "$1" "$tmp/ssh-sessions" 2>/dev/null; }

# netns_exec as a plain command (a shell function cannot be exec'ed).
netns_exec_argv() {
  local i=$1
  shift
  exec ip netns exec "$(netns_node "$i")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "node$i" "$@"
}

# 0. the agent's end, without ssh: `cohort run --launcher-stdin` with a pipe
#    as its standard input. It answers its version first; the token is the
#    first line. End of file before it: nothing starts. End of file after:
#    the worker is stopped and the agent says why; a "stop" line: stopped
#    as by SIGTERM.
(sleep 1) | "$cohort" run --launcher-stdin -- sh -c 'touch '"$tmp"'/started-no-token' >"$tmp/e0" 2>"$tmp/e0.err" &
wait_all 30 $!
check "no token: the agent exits 128+SIGHUP ($codes)" [ "$codes" = 129 ]
check "no token: its first line is its version" [ "$(head -1 "$tmp/e0")" = "$version" ]
check "no token: one line says nothing was started" \
  [ "$(cat "$tmp/e0.err")" = "cohort: the launcher's connection ended before the job started; nothing was started" ]
check "no token: the worker never ran" [ ! -e "$tmp/started-no-token" ]
ln -s "$cohort" "$tmp/bin/torchrun"
(sleep 1) | "$tmp/bin/torchrun" --launcher-stdin --standalone --no-python true >"$tmp/e0t" 2>/dev/null
check "no token: torchrun's spelling answers its version too" [ "$(head -1 "$tmp/e0t")" = "$version" ]
(echo token-e1; sleep 2) | "$cohort" run --launcher-stdin -- sh -c 'echo $$ > '"$tmp"'/eof-pid; echo "token=$COHORT_TOKEN"; exec sleep 60' >"$tmp/e1" 2>&1 &
wait_all 30 $!
check "stdin eof: the agent exits 128+SIGHUP ($codes)" [ "$codes" = 129 ]
check "stdin eof: the worker had the token of the first line" contains "$tmp/e1" "token=token-e1"
check "stdin eof: it names the lost launcher" contains "$tmp/e1" "cohort: lost the connection to the launcher"
check "stdin eof: the worker is gone" eval '[ -s "$tmp/eof-pid" ] && [ ! -d /proc/$(cat "$tmp/eof-pid") ]'
t0=$(date +%s)
(echo token-e2; sleep 2; echo stop; sleep 20) | {
  "$cohort" run --launcher-stdin -- sleep 60 >"$tmp/e2" 2>&1
  echo "$? $(date +%s)" >"$tmp/e2-end"
} &
wait_all 40 $!
read -r code t1 <"$tmp/e2-end"
check "stdin stop: the agent exits 128+SIGTERM ($code)" [ "$code" = 143 ]
check "stdin stop: as stopped by SIGTERM" contains "$tmp/e2" "cohort: cohort run was stopped by SIGTERM"
check "stdin stop: before its input closes" [ $((t1 - t0)) -lt 15 ]

# launch LOG ARGS...: `cohort launch` from node 0 in the background; $! is
# its PID (every wrapper execs), so that signals reach it.
launch() {
  local out=$1
  shift
  (netns_exec_argv 0 "$cohort" launch --ssh-opts "$ssh_opts" "$@" >"$out" 2>&1) &
}
# What runs in the nodes besides the ssh servers (should be nothing after a job).
leftovers() {
  local i p
  for i in 0 1 2; do
    for p in $(ip netns pids "$(netns_node $i)"); do
      case " ${SSHD_PIDS[*]} " in *" $p "*) continue ;; esac
      echo "node$i: $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
    done
  done
}
no_leftovers() { # waits up to 10 s for the nodes to be empty
  local k
  for k in $(seq 100); do [ -z "$(leftovers)" ] && return 0; sleep 0.1; done
  leftovers
  return 1
}
count() { grep -cF -- "$2" "$1"; }

# 2. a 6-rank job across the 3 hosts: every rank's line on the one terminal.
launch "$tmp/l1" --hosts node0,node1,node2 --nproc-per-node 2 -- \
  sh -c 'echo "hello from rank $RANK of $WORLD_SIZE on $(hostname) token=${COHORT_TOKEN:+set}"'
wait_all 60 $!
check "6 ranks: launch exits 0 ($codes)" [ "$codes" = 0 ]
for r in 0 1 2 3 4 5; do
  check "6 ranks: rank $r's line" contains "$tmp/l1" "[r$r] hello from rank $r of 6 on node$((r / 2)) token=set"
done
check "6 ranks: nothing left on any host" no_leftovers
# One ssh session per host, version check included; none to this machine.
check "one session: node1 ($(sessions node1))" [ "$(sessions node1)" = 1 ]
check "one session: node2 ($(sessions node2))" [ "$(sessions node2)" = 1 ]
check "one session: none to node0, this machine ($(sessions node0))" [ "$(sessions node0)" = 0 ]
rm -f "$tmp/ssh-sessions"
launch "$tmp/l3" --hosts node0,node1 --ssh-self -- sh -c 'echo "rank $RANK on $(hostname)"'
wait_all 60 $!
check "--ssh-self: launch exits 0 ($codes)" [ "$codes" = 0 ]
check "--ssh-self: rank 0 ran" contains "$tmp/l3" "[r0] rank 0 on node0"
check "--ssh-self: node0 over ssh, once ($(sessions node0))" [ "$(sessions node0)" = 1 ]
check "--ssh-self: node1 once ($(sessions node1))" [ "$(sessions node1)" = 1 ]
# Slots from a hostfile, a filter, and run's own options passed through.
printf '# test cluster\nnode0 slots=1\nnode1 slots=3  # bigger\n\nnode2 slots=2\n' >"$tmp/hostfile"
launch "$tmp/l2" --hostfile "$tmp/hostfile" --exclude node2 --role trainer -- \
  sh -c 'echo "rank $RANK/$WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE role $ROLE_NAME"'
wait_all 60 $!
check "hostfile: launch exits 0 ($codes)" [ "$codes" = 0 ]
check "hostfile: node0 has 1 slot" contains "$tmp/l2" "[r0] rank 0/4 local 0/1 role trainer"
check "hostfile: node1 has 3 slots" contains "$tmp/l2" "[r3] rank 3/4 local 2/3 role trainer"
check "hostfile: node2 is excluded" [ "$(grep -c '^\[r' "$tmp/l2")" = 4 ]

# 3. a failing rank fails the job: its report, once; the job's exit status.
launch "$tmp/f1" --hosts node0,node1,node2 --nproc-per-node 2 -- \
  sh -c 'if [ "$RANK" = 3 ]; then sleep 1; echo "rank 3 gives up" >&2; exit 7; fi; exec sleep 60'
wait_all 60 $!
check "failing rank: launch exits 1 ($codes)" [ "$codes" = 1 ]
check "failing rank: the root cause is printed" contains "$tmp/f1" "cohort: job failed: node 1 (node1): rank 3 (local rank 1,"
check "failing rank: the root cause is printed once" [ "$(count "$tmp/f1" "cohort: job failed:")" = 1 ]
check "failing rank: with its last line" contains "$tmp/f1" "rank 3 gives up"
check "failing rank: every node says what it did" contains "$tmp/f1" "node 2: rank 5: stopped by cohort"
check "failing rank: nothing left on any host" no_leftovers

# 4. SIGINT to launch mid-job: the job stops on every host, nothing is left.
rm -f "$tmp"/pid-*
launch "$tmp/i1" --hosts node0,node1,node2 --nproc-per-node 2 -- sh -c 'echo $$ > '"$tmp"'/pid-$RANK; exec sleep 60'
lp=$!
for _ in $(seq 200); do [ "$(ls "$tmp"/pid-* 2>/dev/null | wc -l)" = 6 ] && break; sleep 0.1; done
check "sigint: all 6 workers ran" [ "$(ls "$tmp"/pid-* 2>/dev/null | wc -l)" = 6 ]
# The job's token (a worker's COHORT_TOKEN) on no command line that ps shows:
# not the ssh clients', not any process on the hosts (sshd's shells, agents).
token=$(tr '\0' '\n' <"/proc/$(cat "$tmp"/pid-5)/environ" | sed -n 's/^COHORT_TOKEN=//p')
check "token: the workers have the job's token" [ "${#token}" = 64 ]
cmdlines() {
  local i p
  for p in $(ps -o pid= --ppid $lp); do tr '\0' ' ' <"/proc/$p/cmdline"; echo; done
  for i in 0 1 2; do
    for p in $(ip netns pids "$(netns_node $i)"); do tr '\0' ' ' <"/proc/$p/cmdline"; echo; done
  done 2>/dev/null
}
check "token: ps shows ssh and the agents" eval 'cmdlines | grep -q -- "run --launcher-stdin"'
check "token: on no command line" eval '! cmdlines | grep -qF -- "$token"'
kill -INT $lp
wait_all 30 $lp
check "sigint: launch exits 130 ($codes)" [ "$codes" = 130 ]
check "sigint: launch says it stops the job" contains "$tmp/i1" "cohort launch: SIGINT: stopping the job on every host"
check "sigint: no worker is left" eval 'for f in "$tmp"/pid-*; do [ ! -d /proc/$(cat $f) ] || exit 1; done'
check "sigint: nothing left on any host" no_leftovers

# 5. an unreachable host, a version mismatch, a missing binary: named
#    before anything starts, one line each, still one session per host.
rm -f "$tmp"/started-* "$tmp/ssh-sessions"
t0=$SECONDS
launch "$tmp/u1" --hosts node0,node3,node1 --connect-timeout 2 -- touch "$tmp/started-unreachable"
wait_all 30 $!
check "unreachable: launch exits 1 ($codes)" [ "$codes" = 1 ]
check "unreachable: node3 and ssh's reason are named" \
  contains "$tmp/u1" "cohort launch: node3: unreachable over ssh: ssh: connect to host node3 port 22"
check "unreachable: only node3" [ "$(count "$tmp/u1" "over ssh")" = 1 ]
check "unreachable: nothing was started" contains "$tmp/u1" "cohort launch: nothing was started"
check "unreachable: two lines in all" [ "$(wc -l <"$tmp/u1")" = 2 ]
check "unreachable: within ssh's connect timeout" [ $((SECONDS - t0)) -le 20 ]
check "unreachable: one session per host ($(sessions node1) $(sessions node3))" \
  [ "$(sessions node1) $(sessions node3)" = "1 1" ]
rm -f "$tmp/ssh-sessions"
launch "$tmp/v1" --hosts node0,node1,node2 --cohort "$tmp/cohort-mixed" -- touch "$tmp/started-mismatch"
wait_all 30 $!
check "mismatch: launch exits 1 ($codes)" [ "$codes" = 1 ]
check "mismatch: one line names node2 and both versions, then nothing was started" \
  [ "$(cat "$tmp/v1")" = "cohort launch: node2: runs 'cohort 0.0.1', not '$version' as this machine does
cohort launch: nothing was started" ]
check "mismatch: one session per host ($(sessions node1) $(sessions node2))" \
  [ "$(sessions node1) $(sessions node2)" = "1 1" ]
launch "$tmp/m1" --hosts node0,node1 --cohort "$tmp/nonexistent/cohort" -- touch "$tmp/started-missing"
wait_all 30 $!
check "missing binary: launch exits 1 ($codes)" [ "$codes" = 1 ]
check "missing binary: named for each host" \
  [ "$(cat "$tmp/m1")" = "cohort launch: node0: $tmp/nonexistent/cohort is not there (give the remote path with --cohort PATH)
cohort launch: node1: $tmp/nonexistent/cohort is not there (give the remote path with --cohort PATH)
cohort launch: nothing was started" ]
check "pre-start failures: no command ran anywhere" eval '! ls "$tmp"/started-* 2>/dev/null'
check "pre-start failures: nothing left on any host" no_leftovers

# 6. the ssh client of one host killed: that host's agent stops its workers,
#    the job fails together with the cause, nothing is left.
rm -f "$tmp"/pid-*
launch "$tmp/k1" --hosts node0,node1,node2 --nproc-per-node 2 -- sh -c 'echo $$ > '"$tmp"'/pid-$RANK; exec sleep 60'
lp=$!
for _ in $(seq 200); do [ "$(ls "$tmp"/pid-* 2>/dev/null | wc -l)" = 6 ] && break; sleep 0.1; done
victim=
for p in $(ps -o pid= --ppid $lp); do
  tr '\0' ' ' <"/proc/$p/cmdline" | grep -q -- '-- node2 ' && victim=$p
done
check "ssh lost: found node2's ssh client" [ -n "$victim" ]
kill -9 $victim
wait_all 60 $lp
check "ssh lost: launch exits 1 ($codes)" [ "$codes" = 1 ]
check "ssh lost: launch names the host" contains "$tmp/k1" "cohort launch: lost the connection to node2 (node 2)"
check "ssh lost: the job failed with that cause" contains "$tmp/k1" "cohort: job failed: node 2 (node2): lost the connection to the launcher"
check "ssh lost: node2's workers are gone" eval '[ ! -d /proc/$(cat "$tmp"/pid-4) ] && [ ! -d /proc/$(cat "$tmp"/pid-5) ]'
check "ssh lost: nothing left on any host" no_leftovers

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

#!/usr/bin/env bash
# `cohort launch` against real OpenSSH servers (Debian's openssh-server), one
# in each of 3 network namespaces this test creates and removes, with host
# and user keys it generates into its temp dir (tests/sshd_lib.sh). The
# launching side runs in node 0's namespace, as a user would on the first
# node of a cluster; all traffic stays inside the namespaces.
# usage: test_launch.sh COHORT_BINARY TEST_LAUNCH_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
test_launch=$(readlink -f "$2")
src=$(readlink -f "$3")
. "$src/tests/netns_lib.sh"
. "$src/tests/sshd_lib.sh"
. "$src/tests/check_lib.sh"
tmp=$(mktemp -d /tmp/cohort-launch-XXXXXX)
chmod 755 "$tmp"

cleanup() {
  sshd_down
  netns_down
  rm -rf "$tmp"
}
trap cleanup EXIT

netns_up 3 || { echo "cannot create network namespaces"; exit 1; }
# node3 has a name and an address on the nodes' subnet, but no machine.
for i in 0 1 2; do printf '%s node3\n' "$(netns_addr 3)" >>"/etc/netns/$(netns_node $i)/hosts"; done
sshd_up "$tmp" 3 || exit 1
ssh_opts="-F $tmp/ssh_config"
version=$("$cohort" --version)

# The remote binary: the real one everywhere, except that on node2 it says
# it is another version (hosts share this file system; the host name is
# what differs between them).
cat >"$tmp/cohort-mixed" <<SH
#!/bin/sh
if [ "\$(hostname)" = node2 ] && [ "\$1" = --version ]; then echo 'cohort 0.0.1'; exit 0; fi
exec "$cohort" "\$@"
SH
chmod 755 "$tmp/cohort-mixed"

# 1. pre-flight over real ssh: every host fine; an unreachable host; a
#    version mismatch; a missing binary.
preflight() { netns_exec 0 "$test_launch" preflight "$@"; }
preflight "$cohort" "$version" "$ssh_opts" node0,node1,node2 10000 >"$tmp/p1" 2>&1
rc=$?
check "preflight: three hosts answer with the same version ($rc)" [ $rc = 0 ]
check "preflight: and nothing is reported" [ ! -s "$tmp/p1" ]
t0=$SECONDS
preflight "$cohort" "$version" "$ssh_opts" node0,node3,node1 10000 >"$tmp/p2" 2>&1
rc=$?
check "preflight: an unreachable host fails it ($rc)" [ $rc = 1 ]
check "preflight: one line, naming the unreachable host" [ "$(wc -l <"$tmp/p2")" = 1 ]
check "preflight: ssh's reason is given" contains "$tmp/p2" "node3: unreachable over ssh: ssh: connect to host node3 port 22"
check "preflight: within ssh's connect timeout" [ $((SECONDS - t0)) -le 8 ]
preflight "$tmp/cohort-mixed" "$version" "$ssh_opts" node0,node1,node2 10000 >"$tmp/p3" 2>&1
rc=$?
check "preflight: a version mismatch fails it ($rc)" [ $rc = 1 ]
check "preflight: the mismatch names the host and both versions" \
  [ "$(cat "$tmp/p3")" = "node2: runs 'cohort 0.0.1', not '$version' as this machine does" ]
preflight "$tmp/nonexistent/cohort" "$version" "$ssh_opts" node1 10000 >"$tmp/p4" 2>&1
check "preflight: a missing binary is named" contains "$tmp/p4" "node1: $tmp/nonexistent/cohort is not there"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

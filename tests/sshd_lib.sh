# sshd_lib.sh - a real OpenSSH server (Debian's openssh-server) in each node
# of netns_lib.sh, for tests and benchmarks of `cohort launch`. Source it after
# netns_lib.sh, call sshd_up DIR N after netns_up, and sshd_down in the
# caller's cleanup (before netns_down).
#
# Everything lives in DIR, which the caller made and removes: host keys (one
# per node), the user key, authorized_keys, one sshd config per node, and the
# client's ssh_config (pass it with `ssh -F DIR/ssh_config`) with a
# known_hosts file naming each node's key. Nothing in /etc/ssh or ~/.ssh is
# read or written. The servers run as root, listen on port 22 of their node's
# address only, and accept only the test's user key.

SSHD_PIDS=()
SSHD_MADE_PRIVSEP=

sshd_up() {
  local dir=$1 n=$2 i
  ssh-keygen -q -t ed25519 -N '' -C cohort-test-user -f "$dir/user_key" || return 1
  cp "$dir/user_key.pub" "$dir/authorized_keys"
  chmod 600 "$dir/authorized_keys"
  : >"$dir/known_hosts"
  # sshd refuses to start without its privilege separation directory; Debian
  # makes it at boot only when the service runs.
  if [ ! -d /run/sshd ]; then
    mkdir -m 755 /run/sshd || return 1
    SSHD_MADE_PRIVSEP=1
  fi
  for ((i = 0; i < n; i++)); do
    ssh-keygen -q -t ed25519 -N '' -C "cohort-test-node$i" -f "$dir/host_key$i" || return 1
    printf 'node%d,%s %s\n' "$i" "$(netns_addr "$i")" "$(cut -d' ' -f1,2 "$dir/host_key$i.pub")" \
      >>"$dir/known_hosts"
    cat >"$dir/sshd_config$i" <<CFG
ListenAddress $(netns_addr "$i"):22
HostKey $dir/host_key$i
AuthorizedKeysFile $dir/authorized_keys
PidFile $dir/sshd$i.pid
StrictModes no
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
X11Forwarding no
AllowTcpForwarding no
PrintMotd no
PrintLastLog no
AcceptEnv none
MaxStartups 100:30:200
MaxSessions 100
LogLevel ERROR
CFG
    # Under netns_exec, so that sessions see the node's host name and hosts
    # file. -D: stays in the foreground, so $! is the server itself (every
    # wrapper execs); -e: logs to stderr, which goes to a file of the test.
    netns_exec "$i" /usr/sbin/sshd -D -e -f "$dir/sshd_config$i" 2>"$dir/sshd$i.log" &
  done
  cat >"$dir/ssh_config" <<CFG
Host *
  IdentityFile $dir/user_key
  IdentitiesOnly yes
  UserKnownHostsFile $dir/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  User root
  BatchMode yes
  ConnectTimeout 5
  LogLevel ERROR
CFG
  # Ready when every server accepts a login (bounded: 10 s).
  for ((i = 0; i < n; i++)); do
    local ok=0 k
    for ((k = 0; k < 100; k++)); do
      if netns_exec 0 ssh -F "$dir/ssh_config" "node$i" true 2>/dev/null; then
        ok=1
        break
      fi
      sleep 0.1
    done
    [ $ok = 1 ] || { echo "sshd on node$i did not accept a login:"; cat "$dir/sshd$i.log"; return 1; }
    SSHD_PIDS+=("$(cat "$dir/sshd$i.pid")")
  done
}

# Stops every server this file started, by PID (sshd's own pid file; the
# background job is a wrapper). netns_down also ends what is left by PID.
sshd_down() {
  local p k
  for p in "${SSHD_PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${SSHD_PIDS[@]}"; do
    for k in $(seq 50); do [ -d "/proc/$p" ] || break; sleep 0.1; done
  done
  SSHD_PIDS=()
  [ -z "$SSHD_MADE_PRIVSEP" ] || rmdir /run/sshd 2>/dev/null
  SSHD_MADE_PRIVSEP=
}

# sshd_cluster DIR N: the whole setup for a script: N nodes (netns_up), a
# server in each, and an EXIT trap that stops them and removes DIR.
sshd_cluster() {
  SSHD_CLUSTER_DIR=$1
  trap sshd_cluster_down EXIT
  netns_up "$2" || { echo "cannot create network namespaces"; return 1; }
  sshd_up "$1" "$2"
}

sshd_cluster_down() {
  sshd_down
  netns_down
  rm -rf "$SSHD_CLUSTER_DIR"
}

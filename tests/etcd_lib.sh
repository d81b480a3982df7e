# etcd_lib.sh - real etcd members (Debian's etcd-server) for the shell tests
# (sourced; after netns_lib.sh when the members run in the test's namespaces).
#   etcd_find            sets $etcd and $etcdctl; one line and false if missing
#   etcd_member NODE NAME CLIENT_URL PEER_URL CLUSTER [etcd flags...]
#                        starts member NAME in node NODE's namespace (netns_bg)
#                        or, NODE "-", in this one: data in $tmp/NAME, output
#                        in $tmp/NAME.log, PID in $! and in the caller's pids;
#                        ETCD_STATE=existing for a member joining again
#   etcd_ready NODE URL [curl flags...]
#                        waits (30 s at most) until the member at URL, asked
#                        from node NODE ("-": this namespace), has a leader;
#                        one line and false if it never does
#   etcd_pki DIR IP      a CA (DIR/ca.crt), a server certificate for IP
#                        (server.crt, server.key) and a client certificate
#                        (client.crt, client.key)

etcd_find() {
  etcd=$(command -v etcd || echo /usr/bin/etcd)
  etcdctl=$(command -v etcdctl || echo /usr/bin/etcdctl)
  [ -x "$etcd" ] && [ -x "$etcdctl" ] && return 0
  echo "etcd and etcdctl are needed (Debian's etcd-server and etcd-client; scripts/deps.sh installs them)"
  return 1
}

etcd_member() {
  local node=$1 name=$2 client=$3 peer=$4 cluster=$5
  shift 5
  local cmd=("$etcd" --name "$name" --data-dir "$tmp/$name"
    --listen-client-urls "$client" --advertise-client-urls "$client"
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer"
    --initial-cluster "$cluster" --initial-cluster-state "${ETCD_STATE:-new}" "$@")
  if [ "$node" = - ]; then
    "${cmd[@]}" >"$tmp/$name.log" 2>&1 &
    pids+=($!)
  else
    netns_bg "$node" "$tmp/$name.log" "${cmd[@]}"
  fi
}

etcd_ready() {
  local node=$1 url=$2 in=()
  shift 2
  [ "$node" = - ] || in=(netns_exec "$node")
  for _ in $(seq 1 300); do
    "${in[@]}" curl -s -m 1 "$@" -X POST "$url/v3/maintenance/status" -d '{}' 2>/dev/null |
      grep -q '"leader"' && return 0
    sleep 0.1
  done
  echo "etcd at $url did not answer within 30 s"
  return 1
}

etcd_pki() {
  local dir=$1 ip=$2
  mkdir -p "$dir"
  (
    cd "$dir" || exit 1
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj /CN=test-ca
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=$ip"
    printf 'subjectAltName=IP:%s\n' "$ip" >san.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt \
      -days 1 -extfile san.ext
    openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=client
    openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 1
  ) >"$dir.log" 2>&1
}

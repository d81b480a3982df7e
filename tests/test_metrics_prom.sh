#!/usr/bin/env bash
# `cohort run --metrics-port` scraped by a real Prometheus (Debian's
# package, started here): a 2-node job (2 ranks each) in network namespaces
# this test creates and removes, Prometheus in a third, and the values read
# back through Prometheus' HTTP API (/api/v1/query). The first attempt fails
# (rank 3 exits 1), so the job restarts once; the second runs until the test
# has seen what it wants, then ends. Each rank writes its progress file with a
# step number. What Prometheus must show: both targets up, 2 members and a
# world of 4 on each node, one restart, 4 ranks with a step and a fresh
# beat, the store hosted on node 0 alone and up everywhere; and promtool
# accepts the exposition.
# Then, without Prometheus: a hung job's --metrics-file ends with the hang
# verdict (cohort_hung, cohort_rank_hung of the silent rank), and its root
# cause is the container's termination message (--termination-log, written
# only where the file exists).
# usage: test_metrics_prom.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(readlink -f "$2")
. "$src/tests/netns_lib.sh"
. "$src/tests/check_lib.sh"
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  echo "FAIL: prometheus and promtool are missing (scripts/deps.sh installs prometheus)"
  exit 1
fi
tmp=$(mktemp -d /tmp/cohort-prom-XXXXXX)
pids=()
cleanup() {
  netns_down
  rm -rf "$tmp"
}
trap cleanup EXIT

netns_up 3 || { echo "cannot create network namespaces"; exit 1; }
M=$(netns_addr 0)
export COHORT_TOKEN=metrics-test-token
# Beats with a step number every 0.1 s until $tmp/go appears (at most 90 s);
# in the first attempt rank 3 fails after 2 s.
WORK='i=0; while [ $i -lt 900 ] && [ ! -e '"$tmp"'/go ]; do
  i=$((i + 1)); echo $i >"$COHORT_PROGRESS"
  if [ "$RANK" = 3 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ $i = 20 ]; then exit 1; fi
  sleep 0.1; done'
for i in 0 1; do
  netns_agent "$i" "$tmp/a$i" --nnodes 2 --node-rank "$i" --master "$M:29500" --nproc-per-node 2 \
    --max-restarts 1 --metrics-port 9400 -- sh -c "$WORK"
  eval "a$i=\$!"
done

cat >"$tmp/prom.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
- job_name: cohort
  static_configs:
  - targets: ['$(netns_addr 0):9400', '$(netns_addr 1):9400']
EOF
netns_bg 2 "$tmp/prom.log" prometheus --config.file="$tmp/prom.yml" \
  --storage.tsdb.path="$tmp/tsdb" --web.listen-address=127.0.0.1:9090
prom=$!

# query EXPR: the values of an instant query, "labels=value" per line, sorted.
query() {
  netns_exec 2 curl -s --max-time 5 http://127.0.0.1:9090/api/v1/query \
    --data-urlencode "query=$1" | python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
for r in d.get("data", {}).get("result", []):
    m = r["metric"]
    print(",".join("%s=%s" % (k, m[k]) for k in sorted(m) if k not in ("instance", "job")) +
          "=" + r["value"][1])' | sort
}
# wait_for EXPR WANT: polls (at most 60 s) until the query gives WANT.
wait_for() {
  local got=""
  for _ in $(seq 1 120); do
    got=$(query "$1")
    [ "$got" = "$2" ] && return 0
    sleep 0.5
  done
  echo "  $1 gave: $(echo "$got" | tr '\n' ' ')"
  return 1
}

check "Prometheus scrapes both nodes (up)" wait_for 'count(up{job="cohort"} == 1)' "=2"
check "both nodes say the job restarted once" wait_for 'sum by (node) (cohort_restarts_total)' \
  "$(printf 'node=0=1\nnode=1=1')"
check "both nodes count 2 members" wait_for 'sum by (node) (cohort_nodes)' "$(printf 'node=0=2\nnode=1=2')"
check "both nodes count a world of 4" wait_for 'sum by (node) (cohort_world_size)' \
  "$(printf 'node=0=4\nnode=1=4')"
check "4 running ranks, each with a step past 5" wait_for \
  'count by (node) (cohort_rank_step > 5 and on (node, rank) cohort_rank_running == 1)' \
  "$(printf 'node=0=2\nnode=1=2')"
check "every rank's last beat is fresh (under 5 s)" wait_for \
  'count(cohort_rank_beat_age_seconds < 5)' "=4"
check "ranks are labelled with their global rank on their node" wait_for \
  'count by (node, rank) (cohort_rank_step)' "$(printf 'node=0,rank=0=1\nnode=0,rank=1=1\nnode=1,rank=2=1\nnode=1,rank=3=1')"
check "node 0 alone hosts the store" wait_for 'sum by (node) (cohort_store_hosted)' \
  "$(printf 'node=0=1\nnode=1=0')"
check "the store is up for both" wait_for 'sum(cohort_store_up)' "=2"
check "no hang, no failure" wait_for 'sum(cohort_hung) + sum(cohort_failed)' "=0"
netns_exec 2 curl -s --max-time 5 "http://$M:9400/metrics" >"$tmp/scrape"
check "promtool accepts the exposition" promtool check metrics <"$tmp/scrape"
check "the exposition has a help and type for every family" \
  [ "$(grep -c '^# HELP cohort_' "$tmp/scrape")" = "$(grep -c '^# TYPE cohort_' "$tmp/scrape")" ]
touch "$tmp/go"
wait_all 60 "$a0" "$a1"
check "both agents succeed after the restart ($codes)" [ "$codes" = "0 0" ]
kill "$prom" 2>/dev/null

# Without Prometheus: the hang verdict in --metrics-file and the root cause
# in the termination message. Rank 0 beats once and hangs; rank 1 beats on.
: >"$tmp/termination-log"
HANG='echo 1 >"$COHORT_PROGRESS"; if [ "$RANK" = 0 ]; then exec sleep 60; fi
i=0; while [ $i -lt 600 ]; do i=$((i + 1)); echo $i >"$COHORT_PROGRESS"; sleep 0.1; done'
timeout 120 "$cohort" run --nproc-per-node 2 --hang-timeout 2 --metrics-file "$tmp/m.prom" \
  --termination-log "$tmp/termination-log" -- sh -c "$HANG" >"$tmp/hang.out" 2>&1
rc=$?
check "the hung job exits 5 ($rc)" [ $rc = 5 ]
check "the metrics file says hung" grep -Eq '^cohort_hung\{.*\} 1$' "$tmp/m.prom"
check "the metrics file blames rank 0" grep -Eq '^cohort_rank_hung\{.*rank="0".*\} 1$' "$tmp/m.prom"
check "... and not rank 1" grep -Eq '^cohort_rank_hung\{.*rank="1".*\} 0$' "$tmp/m.prom"
check "the metrics file says failed" grep -Eq '^cohort_failed\{.*\} 1$' "$tmp/m.prom"
check "promtool accepts the metrics file" promtool check metrics <"$tmp/m.prom"
check "no temporary file is left beside it" [ ! -e "$tmp/m.prom.tmp" ]
check "the termination message names the hung rank" grep -q 'rank 0 .*made no progress' \
  "$tmp/termination-log"
check "the termination message is the report's root cause line" \
  [ "$(head -1 "$tmp/termination-log")" = "$(grep -m1 'made no progress' "$tmp/hang.out")" ]
# A failing worker: its exit is the message. Where the file does not exist,
# the agent creates none (outside Kubernetes there is no such file).
: >"$tmp/termination-log"
timeout 60 "$cohort" run --termination-log "$tmp/termination-log" -- sh -c 'exit 3' >/dev/null 2>&1
check "a failed worker's exit is the termination message" \
  grep -q '^cohort: job failed: rank 0 .*exit.*3' "$tmp/termination-log"
timeout 60 "$cohort" run --termination-log "$tmp/absent" -- sh -c 'exit 3' >/dev/null 2>&1
check "no termination message file is created" [ ! -e "$tmp/absent" ]
timeout 60 "$cohort" run --termination-log "$tmp/ok-log" -- true
check "a successful job writes none" [ ! -e "$tmp/ok-log" ]
echo "$passed passed, $failed failed"
[ $failed = 0 ]

#!/usr/bin/env bash
# Valgrind memcheck over the agent and the store across whole jobs:
#   1. `cohort run --nproc-per-node 2` of a job whose workers meet in the
#      agent's store (a barrier), under valgrind (--trace-children=no: the
#      agent, its store thread and its supervision, not the workers);
#   2. the same with a worker that fails (the fail-together path);
#   3. `cohort store serve` with a token under valgrind, used by real
#      clients (set, add, wait, get, cas, delete), a wrong token and garbage
#      bytes, then stopped with SIGTERM.
# Each must end with "ERROR SUMMARY: 0 errors" and no definitely/indirectly
# lost bytes (--error-exitcode=9 makes either a failure).
# usage: bench/reliability/valgrind.sh COHORT_BINARY [OUT_SUMMARY_FILE]
set -u
cohort=$(readlink -f "$1")
out=${2:-}
tmp=$(mktemp -d /tmp/cohort-vg-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
vg=(valgrind --leak-check=full --errors-for-leak-kinds=definite,indirect --error-exitcode=9
  --trace-children=no)
fails=0
summary=()

verdict() { # name log exit_code expected_exit
  local name=$1 log=$2 code=$3 want=$4
  local errs lost
  errs=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' "$log" | tail -1)
  lost=$(sed -n 's/.*definitely lost: \([0-9,]*\) bytes.*/\1/p' "$log" | tail -1)
  [ -z "$lost" ] && lost=0 # "All heap blocks were freed"
  echo "valgrind $name: exit $code (want $want), errors ${errs:-?}, definitely lost ${lost} bytes"
  summary+=("$name:exit=$code,errors=${errs:-?},lost=${lost}")
  if [ "$code" != "$want" ] || [ "${errs:-1}" != 0 ]; then
    fails=$((fails + 1))
    grep -E "definitely|indirectly|Invalid|uninitialised|ERROR SUMMARY" "$log" | head -20
  fi
}

BARRIER='"$0" store set "b/$RANK" up >/dev/null || exit 9
[ "$RANK" = "$1" ] && exit 3
exec "$0" store wait --timeout 60 b/0 b/1 >/dev/null'

"${vg[@]}" --log-file="$tmp/run.vg" "$cohort" run --nproc-per-node 2 -- sh -c "$BARRIER" "$cohort" -1 \
  >"$tmp/run.out" 2>&1
verdict "cohort-run-ok" "$tmp/run.vg" $? 0

"${vg[@]}" --log-file="$tmp/fail.vg" "$cohort" run --nproc-per-node 2 -- sh -c "$BARRIER" "$cohort" 1 \
  >"$tmp/fail.out" 2>&1
verdict "cohort-run-failing-rank" "$tmp/fail.vg" $? 1

"${vg[@]}" --log-file="$tmp/serve.vg" "$cohort" store serve --host 127.0.0.1 --port 0 --token vgtok \
  >"$tmp/serve.out" 2>&1 &
spid=$!
addr=
for _ in $(seq 300); do
  addr=$(sed -n 's/.*serving on \([0-9.:]*\).*/\1/p' "$tmp/serve.out")
  [ -n "$addr" ] && break
  sleep 0.1
done
if [ -z "$addr" ]; then
  echo "valgrind store: the server did not start"
  kill "$spid" 2>/dev/null
  fails=$((fails + 1))
else
  export COHORT_STORE=$addr COHORT_TOKEN=vgtok
  ok=1
  "$cohort" store set k v >/dev/null || ok=0
  "$cohort" store add n 5 >/dev/null || ok=0
  "$cohort" store wait k n >/dev/null || ok=0
  [ "$("$cohort" store get k)" = v ] || ok=0
  "$cohort" store cas k v w >/dev/null || ok=0
  "$cohort" store delete k >/dev/null || ok=0
  "$cohort" store get --token wrong n >/dev/null 2>&1 && ok=0
  host=${addr%:*} port=${addr##*:}
  # Garbage, a huge length and an idle connection, through bash's /dev/tcp.
  for junk in 'GET / HTTP/1.0\r\n\r\n' '\xff\xff\xff\xff' '\x00\x00\x00\x05\x01\x01'; do
    (exec 3<>"/dev/tcp/$host/$port" && printf "$junk" >&3 && timeout 2 cat <&3 >/dev/null) 2>/dev/null
  done
  (exec 3<>"/dev/tcp/$host/$port" && sleep 1) 2>/dev/null &
  sleep 1.5
  [ $ok = 1 ] || { echo "valgrind store: a client operation failed"; fails=$((fails + 1)); }
  kill -TERM "$spid"
  wait "$spid"
  verdict "store-serve" "$tmp/serve.vg" $? 0
fi

if [ -n "$out" ]; then echo "${summary[*]} failures=$fails" >"$out"; fi
[ $fails -eq 0 ]

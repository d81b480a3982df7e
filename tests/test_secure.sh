#!/usr/bin/env bash
# Secure by default, by hand: real `cohort run` agents in network namespaces
# that this test creates (and removes). Node 2 plays an intruder on the
# job's network that lacks the token.
#   1. a 2-node job whose token comes from a file (COHORT_TOKEN_FILE, made by
#      `cohort token --file`) runs; meanwhile the intruder can neither read a
#      key of its store, nor set its failure key, nor join it as a node, and
#      the job then finishes normally;
#   2. a token file that others may read is refused (exit 2, one line);
#   3. a multi-node job without any token runs, and each agent prints the
#      warning block once;
#   4. --require-token (and COHORT_REQUIRE_TOKEN=1) turns it into a refusal
#      with exit status 2; a one-node run needs no token.
# usage: test_secure.sh COHORT_BINARY SOURCE_DIR
set -u
cohort=$(readlink -f "$1")
src=$(readlink -f "$2")
. "$src/tests/netns_lib.sh"
tmp=$(mktemp -d /tmp/cohort-secure-XXXXXX)
pids=()

. "$src/tests/check_lib.sh"

cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  netns_down
  rm -rf "$tmp"
}
trap cleanup EXIT

netns_up 3 || { echo "cannot create network namespaces"; exit 1; }
M=$(netns_addr 0)
wait_for() { # wait_for SECONDS command... : polls every 0.1 s
  local end=$((SECONDS + $1))
  shift
  until "$@"; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.1
  done
}
# Workers print, then wait (bounded) for $tmp/go-<job> so that the job runs
# while the intruder tries.
worker() { echo "sh -c 'echo worker \$RANK up; i=0; while [ ! -e $tmp/go-$1 ] && [ \$i -lt 600 ]; do sleep 0.1; i=\$((i + 1)); done; echo worker \$RANK done'"; }

# intruder CMD...: runs on node 2 without any token; succeeds when the
# command fails because the store requires a token.
intruder() {
  local said
  said=$(netns_exec 2 env -u COHORT_TOKEN -u COHORT_TOKEN_FILE timeout 60 "$@" 2>&1)
  [ $? -ne 0 ] && grep -q "requires a token" <<<"$said"
}

# 1. By hand with a token file.
check "cohort token --file makes a private file" "$cohort" token --file "$tmp/token"
check "the token file has mode 0600" [ "$(stat -c %a "$tmp/token")" = 600 ]
for i in 0 1; do
  netns_bg "$i" "$tmp/f$i" env COHORT_TOKEN_FILE="$tmp/token" "$cohort" run --nnodes 2 \
    --node-rank "$i" --master "$M:29400" --nproc-per-node 1 -- sh -c "$(worker f)"
  eval "f$i=\$!"
done
up() { contains "$tmp/f0" "worker 0 up" && contains "$tmp/f1" "worker 1 up"; }
check "the job with a token file starts" wait_for 60 up
check "the intruder cannot read the store" \
  intruder "$cohort" store get --timeout 5 --addr "$M:29400" plan
check "the intruder cannot set the failure key" \
  intruder "$cohort" store set --timeout 5 --addr "$M:29400" j/0/fail "intruder says stop"
check "the intruder cannot join as a node" \
  intruder "$cohort" run --nnodes 2 --node-rank 1 --master "$M:29400" -- /bin/true
check "the store names each refused peer" contains "$tmp/f0" "$(netns_addr 2)"
touch "$tmp/go-f"
wait_all 60 "$f0" "$f1"
check "the job finishes normally: $codes" [ "$codes" = "0 0" ]
check "no intruder text reached the job" not grep -q intruder "$tmp/f0" "$tmp/f1"
check "both workers finished" contains "$tmp/f1" "worker 1 done"
check "no warning with a token" not grep -q "without a token" "$tmp/f0" "$tmp/f1"

# 2. A token file that others may read is refused before anything starts.
cp "$tmp/token" "$tmp/open-token"
chmod 644 "$tmp/open-token"
COHORT_TOKEN_FILE=$tmp/open-token "$cohort" run --nnodes 2 --node-rank 0 --master "127.0.0.1:1" \
  -- /bin/true >"$tmp/open.out" 2>&1
code=$?
check "a token file readable by others: exit 2 (got $code)" [ "$code" = 2 ]
check "one line" [ "$(wc -l <"$tmp/open.out")" = 1 ]
check "... naming the file" contains "$tmp/open.out" "$tmp/open-token"
check "... and the fix" contains "$tmp/open.out" "chmod 600"
# ... and so is it by `cohort store`, given as --token-file or COHORT_TOKEN_FILE.
"$cohort" store get --addr 127.0.0.1:1 --token-file "$tmp/open-token" plan >"$tmp/open-s.out" 2>&1
code=$?
check "cohort store refuses it too: exit 2 (got $code)" [ "$code" = 2 ]
check "... saying chmod 600" contains "$tmp/open-s.out" "chmod 600"
COHORT_TOKEN_FILE=$tmp/open-token "$cohort" store get --addr 127.0.0.1:1 plan >"$tmp/open-s.out" 2>&1
code=$?
check "cohort store reads COHORT_TOKEN_FILE: exit 2 (got $code)" [ "$code" = 2 ]
check "... saying chmod 600" contains "$tmp/open-s.out" "chmod 600"

# 3. No token at all: the job runs, each agent warns once.
for i in 0 1; do
  netns_bg "$i" "$tmp/w$i" env -u COHORT_TOKEN "$cohort" run --nnodes 2 --node-rank "$i" \
    --master "$M:29401" --nproc-per-node 1 -- sh -c "$(worker w)"
  eval "w$i=\$!"
done
up() { contains "$tmp/w0" "worker 0 up" && contains "$tmp/w1" "worker 1 up"; }
check "the job without a token starts" wait_for 60 up
touch "$tmp/go-w"
wait_all 60 "$w0" "$w1"
check "the job without a token finishes: $codes" [ "$codes" = "0 0" ]
for i in 0 1; do
  check "agent $i warns once" [ "$(grep -c "runs without a token" "$tmp/w$i")" = 1 ]
  check "agent $i says what is exposed" contains "$tmp/w$i" "rank plan"
  check "agent $i gives the fix" contains "$tmp/w$i" 'COHORT_TOKEN=$(cohort token)'
done

# 4. Required: refused with exit status 2, before the store starts.
netns_exec 0 env -u COHORT_TOKEN "$cohort" run --nnodes 2 --node-rank 0 --master "$M:29402" \
  --require-token -- /bin/true >"$tmp/r0" 2>&1
code=$?
check "--require-token without a token: exit 2 (got $code)" [ "$code" = 2 ]
check "--require-token says why" contains "$tmp/r0" "token"
netns_exec 1 env -u COHORT_TOKEN COHORT_REQUIRE_TOKEN=1 "$cohort" run --nnodes 2 --node-rank 1 \
  --master "$M:29402" -- /bin/true >"$tmp/r1" 2>&1
code=$?
check "COHORT_REQUIRE_TOKEN=1 without a token: exit 2 (got $code)" [ "$code" = 2 ]
netns_exec 0 env -u COHORT_TOKEN COHORT_REQUIRE_TOKEN=1 "$cohort" run --nnodes 2 --node-rank 0 \
  --master "$M:29403" --token s3cret --join-timeout 2 -- /bin/true >"$tmp/r2" 2>&1
code=$?
check "--require-token with a token gets past the check (a join timeout: $code)" \
  [ "$code" != 0 ] && [ "$code" != 2 ] && not contains "$tmp/r2" "require"
env -u COHORT_TOKEN "$cohort" run --require-token --nproc-per-node 1 -- /bin/true >"$tmp/r3" 2>&1
check "a one-node run needs no token, even with --require-token" [ $? = 0 ]
check "a one-node run does not warn" not contains "$tmp/r3" "without a token"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# `cohort run` takes torchrun's command line: both spellings, --opt=value,
# PET_* variables, the program as torchrun runs it (script through Python,
# -m, --no-python, --run-path, and cohort's `--` form), notes for options
# without effect, one line and exit 2 for what is not supported, the torchrun
# link, and seed 004's single-node c10d line training a DDP script that parses
# its own arguments (identical parameters on both ranks).
# usage: test_torchrun_cli.sh COHORT_BINARY SOURCE_DIR
# (env COHORT_TEST_PYTHON: the Python with torch, default /usr/bin/python3)
set -u
py=${COHORT_TEST_PYTHON:-/usr/bin/python3}
cohort=$(readlink -f "$1")
src=$(cd "$2" && pwd)
. "$src/tests/check_lib.sh"
tmp=$(mktemp -d /tmp/cohort-trcli-XXXXXX)
trap "rm -rf $tmp" EXIT
show='echo "$RANK/$WORLD_SIZE/$LOCAL_WORLD_SIZE/$ROLE_NAME/$TORCHELASTIC_MAX_RESTARTS"'

# Spellings, = and PET_ (the command line wins over the variable).
run dash "$cohort" run --nproc-per-node 2 --max-restarts 1 --role tr --no-python sh -c "$show"
check "--nproc-per-node --no-python" contains "$tmp/dash.out" "[r1] 1/2/2/tr/1"
run under "$cohort" run --nproc_per_node=3 --max_restarts=2 --no_python sh -c "$show"
check "--nproc_per_node=3 --no_python" contains "$tmp/under.out" "[r2] 2/3/3/default/2"
run pet env PET_NPROC_PER_NODE=2 PET_ROLE=p PET_NO_PYTHON=1 "$cohort" run sh -c "$show"
check "PET_NPROC_PER_NODE, PET_ROLE, PET_NO_PYTHON" contains "$tmp/pet.out" "[r1] 1/2/2/p/0"
run petline env PET_NPROC_PER_NODE=4 "$cohort" run --nproc-per-node 1 -- sh -c "$show"
check "the command line wins over PET_" contains "$tmp/petline.out" "[r0] 0/1/1/default/0"
check "... one worker" not_contains "$tmp/petline.out" "[r1]"
run pet0 env PET_NO_PYTHON=0 PYTHON_EXEC=/bin/echo "$cohort" run sh -c true
check "PET_NO_PYTHON=0 runs through PYTHON_EXEC" contains "$tmp/pet0.out" "[r0] -u sh -c true"
run petbad env PET_NPROC_PER_NODE=many "$cohort" run --no-python true
check "bad PET_ value: exit 2" rc petbad 2
check "... one line naming the variable" contains "$tmp/petbad.err" "(from PET_NPROC_PER_NODE)"

# The program, as torchrun runs it; its arguments are its own, even those that look like ours.
printf 'import sys\nprint("args", sys.argv[1:])\n' >"$tmp/s.py"
run py env PYTHON_EXEC="$py" "$cohort" run --nproc-per-node 2 "$tmp/s.py" --nnodes 3 -m
check "script through PYTHON_EXEC, its own arguments" contains "$tmp/py.out" "[r1] args ['--nnodes', '3', '-m']"
mkdir "$tmp/bin" && printf '#!/bin/sh\necho "python3 $*"\n' >"$tmp/bin/python3" && chmod +x "$tmp/bin/python3"
run path env -u PYTHON_EXEC PATH="$tmp/bin:$PATH" "$cohort" run x.py a
check "else python3 on PATH, unbuffered" contains "$tmp/path.out" "[r0] python3 -u x.py a"
run mod env PYTHON_EXEC="$py" "$cohort" run -m json.tool --help
check "-m runs a module" contains "$tmp/mod.out" "usage: python -m json.tool"
run rp env PYTHON_EXEC="$py" "$cohort" run --run-path "$tmp/s.py" b c
check "--run-path" contains "$tmp/rp.out" "[r0] args ['b', 'c']"
run dd env PYTHON_EXEC=/bin/false "$cohort" run -- echo direct
check "'--' form runs the command itself" contains "$tmp/dd.out" "[r0] direct"
run both "$cohort" run -m --no-python x
check "-m with --no-python: exit 2" rc both 2
run none "$cohort" run --nproc-per-node 2
check "no program: exit 2" rc none 2

# Notes and refusals: one line each.
run note "$cohort" run --monitor-interval 1 --start-method=fork --no-python true
check "no-effect options run" rc note 0
check "... one note line each" lines note.err 2
check "... naming the option" contains "$tmp/note.err" "note: --monitor-interval has no effect"
for bad in "--rdzv-backend zookeeper" "--rdzv-backend etcd" "--rdzv-backend etcd --rdzv-endpoint ,," \
  "--rdzv-conf protocol=ftp" "--nproc-per-node gpus" "--tee 0:4" "--tee 0:3,x:1" \
  "--local-ranks-filter 0,a" "--numa-binding sideways" "--cpu-bind all" \
  "--numa-binding node --cpu-bind cores" "--rdzv-conf join_timeout"; do
  run bad "$cohort" run $bad --no-python true
  check "$bad: exit 2" rc bad 2
  check "$bad: one line" lines bad.err 1
done

# --redirects/--tee with --log-dir: files only, or files and the console.
run red "$cohort" run --nproc-per-node 2 --log-dir "$tmp/logs" -r 3 --no-python sh -c 'echo out-$RANK'
check "-r 3: nothing on the console" not_contains "$tmp/red.out" "out-1"
check "-r 3: the log file" contains "$tmp/logs/attempt0/rank1.log" "out-1"
run tee "$cohort" run --nproc-per-node 2 --log_dir="$tmp/logs2" --tee=3 --no-python sh -c 'echo out-$RANK'
check "--tee=3: the console" contains "$tmp/tee.out" "[r1] out-1"
check "--tee=3: the log file" contains "$tmp/logs2/attempt0/rank1.log" "out-1"
# Debian's torchrun 1.13 line: stderr to the files only, stdout to both; without
# --log-dir the files go to a new directory, named on stderr, as torchrun's do.
both='echo out-$RANK; echo err-$RANK >&2'
TMPDIR=$tmp run split "$cohort" run --nproc-per-node 2 --redirects 2 --tee 1 --no_python sh -c "$both"
check "-r 2 -t 1: runs" rc split 0
check "-r 2 -t 1: stdout on the console" contains "$tmp/split.out" "[r1] out-1"
check "-r 2 -t 1: stderr not on the console" not_contains "$tmp/split.err" "err-1"
logs=$(sed -n 's/.*worker output files in \([^ ]*\) .*/\1/p' "$tmp/split.err")
check "-r 2 -t 1: the directory is named" [ -n "$logs" ]
check "-r 2 -t 1: ... under TMPDIR" [ "${logs#$tmp/}" != "$logs" ]
check "-r 2 -t 1: stdout in the file" contains "$logs/attempt0/rank1.log" "out-1"
check "-r 2 -t 1: stderr in the file" contains "$logs/attempt0/rank1.log" "err-1"
# Per local rank: rank 0 to its file only, rank 1 to the console only.
run per "$cohort" run --nproc-per-node 2 --log-dir "$tmp/logs3" -r 0:3 --no_python sh -c "$both"
check "-r 0:3: rank 0 not on the console" not_contains "$tmp/per.out" "out-0"
check "-r 0:3: rank 0 in its file" contains "$tmp/logs3/attempt0/rank0.log" "err-0"
check "-r 0:3: rank 1 on the console" contains "$tmp/per.err" "[r1] err-1"
check "-r 0:3: rank 1 without a file" [ ! -e "$tmp/logs3/attempt0/rank1.log" ]
# torchtitan's line: --local_ranks_filter=0 --tee=3 shows rank 0 alone, files for all.
TMPDIR=$tmp run filt "$cohort" run --nproc-per-node 2 --local_ranks_filter=0 --tee=3 \
  --no_python sh -c "$both"
check "--local-ranks-filter 0: rank 0 on the console" contains "$tmp/filt.out" "[r0] out-0"
check "--local-ranks-filter 0: not rank 1's stdout" not_contains "$tmp/filt.out" "[r1]"
check "--local-ranks-filter 0: not rank 1's stderr" not_contains "$tmp/filt.err" "[r1]"
logs=$(sed -n 's/.*worker output files in \([^ ]*\) .*/\1/p' "$tmp/filt.err")
check "--local-ranks-filter 0: rank 1 still in its file" contains "$logs/attempt0/rank1.log" "out-1"

# --duplicate-stdout/stderr-filters: matching lines of every rank, prefixed, in one file.
lines3='echo "loss 1.5"; echo other; echo "a,b here"; echo "warn x" >&2; echo quiet >&2'
run dup "$cohort" run --nproc-per-node 2 --log-dir "$tmp/logs4" --tee 3 \
  --duplicate-stdout-filters 'loss,a,,b' --duplicate_stderr_filters=warn --no-python sh -c "$lines3"
check "--duplicate-*-filters: runs" rc dup 0
check "... a match of rank 1 in filtered_stdout.log" contains "$tmp/logs4/attempt0/filtered_stdout.log" "[r1] loss 1.5"
check "... ',,' is a comma" contains "$tmp/logs4/attempt0/filtered_stdout.log" "[r0] a,b here"
check "... no line without a match" not_contains "$tmp/logs4/attempt0/filtered_stdout.log" "other"
check "... four lines" [ "$(wc -l <"$tmp/logs4/attempt0/filtered_stdout.log")" = 4 ]
check "... stderr's in filtered_stderr.log" contains "$tmp/logs4/attempt0/filtered_stderr.log" "[r0] warn x"
check "... not stdout's" not_contains "$tmp/logs4/attempt0/filtered_stderr.log" "loss"
check "... the console as before" contains "$tmp/dup.out" "[r1] other"
TMPDIR=$tmp run dupenv env PET_DUPLICATE_STDOUT_FILTERS=loss "$cohort" run --no-python sh -c "$lines3"
logs=$(sed -n 's/.*worker output files in \([^ ]*\) .*/\1/p' "$tmp/dupenv.err")
check "PET_DUPLICATE_STDOUT_FILTERS without --log-dir: a new directory" contains "$logs/attempt0/filtered_stdout.log" "[r0] loss 1.5"
check "... the console still gets every line" contains "$tmp/dupenv.out" "[r0] other"
# --virtual-local-rank: LOCAL_RANK 0 and each worker's own GPU.
vshow='echo "$LOCAL_RANK/$CUDA_VISIBLE_DEVICES/$RANK"'
run virt env CUDA_VISIBLE_DEVICES=5,GPU-x,7 "$cohort" run --nproc-per-node 3 --virtual-local-rank --no-python sh -c "$vshow"
check "--virtual-local-rank: rank 1 sees only its GPU as 0" contains "$tmp/virt.out" "[r1] 0/GPU-x/1"
check "... rank 2 the third entry" contains "$tmp/virt.out" "[r2] 0/7/2"
run virt2 env PET_VIRTUAL_LOCAL_RANK=1 "$cohort" run --nproc-per-node 2 --no-python sh -c "$vshow"
check "PET_VIRTUAL_LOCAL_RANK without CUDA_VISIBLE_DEVICES: its number" contains "$tmp/virt2.out" "[r1] 0/1/1"
# --shutdown-timeout: a worker that ignores SIGTERM gets SIGKILL after it.
stubborn='if [ "$RANK" = 0 ]; then sleep 0.5; exit 3; fi; trap "" TERM; sleep 30'
start=$(date +%s%N)
run shut "$cohort" run --nproc-per-node 2 --shutdown-timeout 1 --no-python sh -c "$stubborn"
took=$((($(date +%s%N) - start) / 1000000))
check "--shutdown-timeout 1: the failure is reported" rc shut 1
check "... the stubborn rank killed by SIGKILL" grep -q "rank 1.*SIGKILL" "$tmp/shut.err"
check "... at about one second, not the test's limit (took $took ms, bound 15000)" [ "$took" -lt 15000 ]
# ... and the value is the one used, not the 5 s default: with 30 s a rank that ignores SIGTERM
# and ends by itself 8 s later is not killed.
patient='if [ "$RANK" = 0 ]; then sleep 0.5; exit 3; fi; trap "" TERM; sleep 8'
run patient "$cohort" run --nproc-per-node 2 --shutdown-timeout 30 --no-python sh -c "$patient"
check "--shutdown-timeout 30: the failure is reported" rc patient 1
check "... the rank that ignores SIGTERM ends by itself, not by SIGKILL" \
  not grep -q "rank 1.*SIGKILL" "$tmp/patient.err"
run shutbad "$cohort" run --shutdown_timeout=soon --no-python true
check "--shutdown-timeout soon: exit 2" rc shutbad 2

# Static: --master-addr/--master-port/--node-rank host the store there (one node).
port=$(free_port)
run st "$cohort" run --nnodes 1 --node_rank 0 --master_addr 127.0.0.1 --master_port $port --no-python sh -c "$show"
check "static one node" contains "$tmp/st.err" "static --master 127.0.0.1:$port, node rank 0"
check "... runs" contains "$tmp/st.out" "[r0] 0/1/1/default/0"

# The torchrun link: torchrun's help, cohort's behaviour.
ln -s "$(readlink -f "$cohort")" "$tmp/bin/torchrun"
run help "$tmp/bin/torchrun" --help
check "torchrun --help says it is cohort" contains "$tmp/help.out" "This torchrun is cohort"
run link "$tmp/bin/torchrun" --nproc_per_node 2 --no_python sh -c "$show"
check "torchrun link runs" contains "$tmp/link.out" "[r1] 1/2/2/default/0"
run linkbad "$tmp/bin/torchrun" --bogus x.py
check "torchrun: errors name torchrun" contains "$tmp/linkbad.err" "torchrun: unknown option '--bogus'"

# Seed 004 (GreenNode), verbatim with cohort run: single-node c10d, a DDP script with its own flags.
if "$py" -c 'import torch' 2>/dev/null; then
  port2=$(free_port)
  cd "$tmp" && cp "$src"/tests/torch/ddp_train.py "$src"/tests/torch/ddp_args.py . &&
    PYTHON_EXEC="$py" timeout 300 "$cohort" run --nnodes=1 --nproc_per_node=2 --rdzv_id=1 \
      --rdzv_endpoint=127.0.0.1:$port2 --rdzv_backend=c10d ddp_args.py --backend gloo --steps 10 \
      >"$tmp/ddp.out" 2>"$tmp/ddp.err"
  check "seed 004 line: exit 0" [ $? = 0 ] || cat "$tmp/ddp.err"
  check "... the store on the endpoint" contains "$tmp/ddp.err" "static --master 127.0.0.1:$port2 (a local address: hosting)"
  d0=$(sed -n 's/^\[r0\] PARAMS //p' "$tmp/ddp.out")
  d1=$(sed -n 's/^\[r1\] PARAMS //p' "$tmp/ddp.out")
  check "... identical parameters on both ranks" [ -n "$d0" -a "$d0" = "$d1" ]
else
  check "$py imports torch" false
fi
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

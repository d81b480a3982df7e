#!/usr/bin/env bash
# scripts/device-check.sh - one prepared check of cohort on a real GPU node
# (one run, under 8 minutes): builds cohort with CMake, then
#   1. cohort doctor on the node, beside what nvidia-smi, sysfs and PyTorch say
#      (GPU, PCI address, NUMA node, driver, NCCL); --check's verdicts, and
#      --json validated against docs/doctor.schema.json (also in OUT/doctor.json);
#   2. cohort run --nproc-per-node gpu|auto against the node's GPU count, and
#      --numa-binding node read back with sched_getaffinity in the worker,
#      against the GPU's NUMA node's CPUs (and torchrun's own binding);
#   3. a PyTorch job on the GPU (1 rank NCCL, 2 ranks gloo on CUDA tensors:
#      DDP steps and an allreduce) under cohort run and under the node's
#      torchrun: the same parameters' hash and sums; and cohort_reform's
#      NCCL path (scripts/devcheck_reform.py: reshape aborts the communicator,
#      one rank re-forms twice in the same process);
#   4. tests/test_torchrun_env.sh and tests/test_torchrun_cli.sh against the
#      node's torchrun, with the raw environments of both launchers;
#   5. bench: cohort bench allreduce (in place and out of place) with 2, 4
#      and 8 ranks beside the memory
#      bound (bench/collectives/mem_bound.c), the OpenBLAS kernels on this CPU
#      (gpt2-sgemm-rate and cohort-gpt2 under each OPENBLAS_CORETYPE), and
#      cohort-gpt2's thread scaling (1, 2, 4, 8, 16 threads) beside PyTorch's
#      (bench/train/gpt2_torch.py);
#   6. netns: network namespaces, a veth pair, a bridge, tc tbf, a UTS
#      namespace and a TCP connection across (created and removed here);
#      when they work, recovery: bench/recovery/run.py (GPT-2 124M, the rows
#      cohort reform, cohort restart, torchrun restart, torch reform; the
#      torch rows with PY and `PY -m torch.distributed.run`), and shaped:
#      bench/train/run.py --only shaped (1gbit, cohort-gpt2 only).
# Writes OUT/report.md (the findings; what is missing is reported as MISSING,
# what did not run for lack of time as NOT RUN) and OUT/raw.log (every
# command's output), then OUT/logs.tar.gz (the work files).
#
# Libraries: cohort needs Nettle, jansson, libcurl and OpenBLAS headers and
# pkg-config, which a GPU image often lacks and which nothing can install
# there. DEBS (default: debs/ beside scripts/) may hold Debian's .deb files
# for them: they are unpacked with dpkg -x into a prefix under the work
# directory (never into /), CMake and pkg-config are pointed at it, and only
# the shared libraries the system lacks are linked into a directory that the
# binaries name in their DT_RPATH (which, unlike LD_LIBRARY_PATH, neither
# reaches the workers nor is lost under `env -i`, and unlike DT_RUNPATH also
# serves the libraries' own dependencies). `scripts/device-check.sh
# fetch-debs` downloads them (Debian 12, apt-get download) into DEBS, about
# 24 MB: run it on a Debian machine with a registry, then carry DEBS along.
#
# usage: scripts/device-check.sh [fetch-debs]   (env: OUT, default /tmp/cohort-devcheck;
#        PY, the Python with torch, default python3 on PATH; DEBS;
#        BUDGET_S, the seconds after which sections are not started, 420;
#        ONLY, the sections to run, default "doctor place torch reform torchrun coll blas gpt2 netns";
#        also netns, recovery (needs netns before it), shaped and extra;
#        BUILD, the build directory (default under the work directory);
#        COLL_RANKS "2 4 8", COLL_BYTES "4194304 67108864" (8: the latency row),
#        GPT2_THREADS "1 2 4 8 16", TORCH_THREADS "1 4 16";
#        RECOVERY_MODEL 124M|small, RECOVERY_STEPS 10, RECOVERY_KILL 4,
#        RECOVERY_ROWS (bench/recovery --rows; default the four rows), RECOVERY_RATE
#        (--rate, e.g. 1gbit; default unshaped),
#        RECOVERY_NEED_S 200 (not started with less budget left), RECOVERY_RUN_S
#        (a run's limit; default: bench/recovery's, from the model, steps and link);
#        RECOVERY_VARIANTS (bench/recovery options per run, quoted as in a shell,
#        ';' between runs, e.g. "--replace-after 8;--rows 'cohort reform' --rate
#        1gbit"; a later option overrides the defaults; default one run),
#        SHAPED_NEED_S 120, SHAPED_ARGS (more bench/train/run.py options);
#        EXTRA, a shell command for the section extra (SRC, BUILD, COHORT, PY set))
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/cohort-devcheck}
DEBS=${DEBS:-$SRC/debs}
if [ "${1:-}" = fetch-debs ]; then
  mkdir -p "$DEBS" && cd "$DEBS" || exit 1
  # The -dev packages, their libraries and those libraries' own (libcurl's
  # long list), pkg-config; gcc's libgomp is the compiler's own. iproute2
  # and its libraries: ip and tc for the netns sections, used only where
  # the node has none.
  exec apt-get download nettle-dev libssl3 libjansson-dev libjansson4 libcurl4-openssl-dev \
    libcurl4 libbrotli1 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 \
    libkeyutils1 libldap-2.5-0 libsasl2-2 libsasl2-modules-db libdb5.3 libnghttp2-14 libpsl5 \
    librtmp1 libgnutls30 libhogweed6 libnettle8 libgmp10 libidn2-0 libunistring2 libtasn1-6 \
    libp11-kit0 libffi8 libssh2-1 libzstd1 zlib1g libopenblas-dev libopenblas-pthread-dev \
    libopenblas0-pthread libopenblas0 libgfortran5 libquadmath0 pkgconf pkgconf-bin libpkgconf3 \
    pkg-config iproute2 libbpf1 libmnl0 libxtables12 libelf1 libtirpc3 libtirpc-common libbsd0 \
    libmd0 libcap2 libselinux1 libpcre2-8-0
fi
PY=${PY:-python3}
# An absolute path: the torchrun tests run their workers under `env -i` with a
# short PATH, where a bare "python3" can be another interpreter without torch
# (on the GPU image torch lives in /opt/torch/.venv).
PY=$(command -v "$PY") || { echo "device-check: no Python named ${PY}" >&2; exit 2; }
BUDGET_S=${BUDGET_S:-420}
JOBS=$(nproc)
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/cohort-devcheck.XXXXXX)
BUILD=${BUILD:-$WORK/build}
PREFIX=$WORK/sysroot
RT=$PREFIX/rtlib
REPORT=$OUT/report.md
# Written as the run goes (what a run stopped at its limit leaves): the
# results table and the sections; report.md gets both at the end.
RESULTS=$OUT/results.md
SECTIONS=$OUT/sections.md
RAW=$OUT/raw.log
T0=$(date +%s)
: >"$RAW"
: >"$RESULTS"
: >"$SECTIONS"

finish() {
  tar -C "$WORK" --exclude=build --exclude=sysroot -czf "$OUT/logs.tar.gz" . 2>/dev/null
  rm -rf "$WORK"
}
trap finish EXIT

elapsed() { echo $(($(date +%s) - T0)); }
say() { printf '%s\n' "$*" >>"$REPORT"; }
# logged NAME TIMEOUT CMD...: runs CMD with its output in $WORK/NAME.log and in
# raw.log under a header; returns its status. A shell function runs in a
# subshell without the timeout (its commands carry their own).
logged() {
  local name=$1 limit=$2 rc
  shift 2
  if declare -F "$1" >/dev/null; then
    ("$@") >"$WORK/$name.log" 2>&1
  else
    timeout -k 5 "$limit" "$@" >"$WORK/$name.log" 2>&1
  fi
  rc=$?
  {
    printf '\n===== %s (rc %d, t=%ss): %s\n' "$name" "$rc" "$(elapsed)" "$*"
    cat "$WORK/$name.log"
  } >>"$RAW"
  return $rc
}
# Results table: one row per check.
result() { printf '| %s | %s | %s |\n' "$1" "$2" "$3" >>"$RESULTS"; }
# time_left NEEDED: true when NEEDED seconds fit before the budget.
time_left() { [ $(($(elapsed) + $1)) -le "$BUDGET_S" ]; }
not_run() { result "$1" "NOT RUN" "the run's budget of ${BUDGET_S}s was spent (t=$(elapsed)s)"; }

cat >"$REPORT" <<EOF
# cohort on a GPU node: scripts/device-check.sh

Run $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname), $(nproc) CPUs; source
$(cat "$SRC/REVISION" 2>/dev/null || (cd "$SRC" && git rev-parse --short HEAD 2>/dev/null)).

EOF

# ---- 0. The node -------------------------------------------------------------
probe() {
  echo "uname: $(uname -srm)"
  echo "os: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) online"
  echo "cpu family/model: $(awk -F': ' '/^cpu family/ {f = $2} /^model\t/ {m = $2} END {print f "/" m}' /proc/cpuinfo)"
  echo "cpu flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512bw|avx512vl|avx512_bf16|avx512_fp16|amx_tile|amx_bf16)$' | tr '\n' ' ')"
  echo "numa nodes: $(ls -d /sys/devices/system/node/node* 2>/dev/null | sed 's,.*/,,' | tr '\n' ' ')"
  for n in /sys/devices/system/node/node*; do [ -e "$n/cpulist" ] && echo "  $(basename "$n") cpus $(cat "$n/cpulist")"; done
  echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "/dev/shm: $(df -h /dev/shm 2>/dev/null | awk 'NR == 2 {print $2}')"
  echo "nvidia-smi: $(command -v nvidia-smi || echo MISSING)"
  nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,uuid --format=csv,noheader 2>&1
  echo "driver version file: $(head -1 /proc/driver/nvidia/version 2>/dev/null || echo MISSING)"
  echo "/proc/driver/nvidia/gpus: $(ls /proc/driver/nvidia/gpus 2>/dev/null | tr '\n' ' ' || true)"
  local g
  for g in /proc/driver/nvidia/gpus/*; do
    [ -d "$g" ] || continue
    echo "  $(basename "$g"): sysfs numa_node $(cat "/sys/bus/pci/devices/$(basename "$g")/numa_node" 2>/dev/null || echo MISSING)"
  done
  echo "/dev/nvidia*: $(ls /dev/nvidia* 2>/dev/null | tr '\n' ' ')"
  echo "python: $PY"
  "$PY" -c 'import torch, sys
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "devices", torch.cuda.device_count())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device0", p.name, "SMs", p.multi_processor_count, "pci_bus_id", getattr(p, "pci_bus_id", "?"))
    print("nccl", ".".join(map(str, torch.cuda.nccl.version())))
print("distributed nccl", torch.distributed.is_nccl_available(), "gloo", torch.distributed.is_gloo_available())' 2>&1
  "$PY" -m pip list 2>/dev/null | grep -i -E '^(nvidia-nccl|torch) ' || true
  echo "NCCL files (/usr /opt, depth 8):"
  find /usr /opt -maxdepth 8 \( -name 'libnccl.so*' -o -name nccl.h -o -name 'nvidia_nccl_cu*.dist-info' \) \
    2>/dev/null | head -20 | sed 's/^/  /'
  local t
  for t in cc gcc cmake make ninja pkg-config pkgconf dpkg mpicc mpirun numactl; do
    echo "tool $t: $(command -v $t || echo MISSING)"
  done
  echo "system libraries (ldconfig -p):"
  for t in libnettle.so.8 libjansson.so.4 libcurl.so.4 libopenblas.so.0 libgomp.so.1 libgfortran.so.5; do
    echo "  $t: $(ldconfig -p | awk -v t="$t" '$1 == t {print $NF; exit}')"
  done
  echo "system headers: nettle/hmac.h $([ -e /usr/include/nettle/hmac.h ] && echo yes || echo no)," \
    "jansson.h $([ -e /usr/include/jansson.h ] && echo yes || echo no)," \
    "curl/curl.h $([ -e /usr/include/curl/curl.h ] || [ -e /usr/include/x86_64-linux-gnu/curl/curl.h ] && echo yes || echo no)," \
    "cblas.h $(ls /usr/include/cblas.h /usr/include/*/cblas.h /usr/include/x86_64-linux-gnu/*/cblas.h 2>/dev/null | head -1 | grep -q . && echo yes || echo no)"
}
logged probe 60 probe
{
  echo "## The node"
  echo
  echo '```'
  cat "$WORK/probe.log"
  echo '```'
  echo
} >>"$REPORT"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
TORCH_NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo "?")

# ---- Build -------------------------------------------------------------------
# The prefix: every .deb unpacked; pkg-config from it when the node has none.
make_prefix() {
  local d
  mkdir -p "$PREFIX" "$RT" "$PREFIX/bin" "$PREFIX/tools"
  for d in "$DEBS"/*.deb; do
    [ -e "$d" ] || continue
    dpkg -x "$d" "$PREFIX" || echo "dpkg -x $d failed"
  done
  echo "unpacked $(ls "$DEBS"/*.deb 2>/dev/null | wc -l) packages from $DEBS"
  if ! command -v pkg-config >/dev/null && [ -x "$PREFIX/usr/bin/pkgconf" ]; then
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$PREFIX/usr/lib/x86_64-linux-gnu" \
      "$PREFIX/usr/bin/pkgconf" >"$PREFIX/bin/pkg-config"
    chmod +x "$PREFIX/bin/pkg-config"
    echo "pkg-config: the prefix's pkgconf"
  fi
  # ip and tc (iproute2) for the netns sections, where the node has none:
  # through the dynamic loader with the prefix's libraries, which (unlike
  # LD_LIBRARY_PATH) what `ip netns exec` starts does not inherit.
  local t f ld=/lib64/ld-linux-x86-64.so.2
  for t in ip tc; do
    f=$(ls "$PREFIX/bin/$t" "$PREFIX/sbin/$t" 2>/dev/null | head -1)
    command -v "$t" >/dev/null || [ -z "$f" ] || [ ! -x "$ld" ] || {
      printf '#!/bin/sh\nexec %s --library-path %s %s "$@"\n' "$ld" \
        "$PREFIX/usr/lib/x86_64-linux-gnu:$PREFIX/lib/x86_64-linux-gnu" "$f" >"$PREFIX/tools/$t"
      chmod +x "$PREFIX/tools/$t"
      echo "$t: the prefix's ($f)"
    }
  done
}
# runtime_libs BIN...: links the shared libraries the binaries (and those
# libraries) need and the system lacks from the prefix into $RT, until none
# is left; prints what is still not found.
runtime_libs() {
  local lib found missing
  for _ in 1 2 3 4 5 6; do
    missing=$(LD_LIBRARY_PATH=$RT ldd "$@" "$RT"/* 2>/dev/null | awk '/not found/ {print $1}' | sort -u)
    [ -z "$missing" ] && return 0
    found=0
    for lib in $missing; do
      local f
      f=$(find "$PREFIX" -name "$lib" \( -type f -o -type l \) 2>/dev/null | head -1)
      [ -n "$f" ] && [ ! -e "$RT/$lib" ] && ln -s "$f" "$RT/$lib" && found=1 && echo "runtime: $lib from the prefix"
    done
    [ $found = 0 ] && break
  done
  echo "runtime: still not found: $missing"
  return 1
}
build() {
  make_prefix
  local lib=$PREFIX/usr/lib/x86_64-linux-gnu
  export PATH=$PREFIX/bin:$PATH
  # Only with packages unpacked: a sysroot over an empty prefix would send
  # the system's own .pc files' paths into the prefix too.
  if compgen -G "$DEBS/*.deb" >/dev/null; then
    export PKG_CONFIG_PATH=$lib/pkgconfig:$PREFIX/usr/share/pkgconfig
    export PKG_CONFIG_SYSROOT_DIR=$PREFIX
  fi
  local blas=()
  [ -e "$lib/openblas-pthread/libopenblas.so" ] &&
    blas=(-DGPT2_OPENBLAS="$lib/openblas-pthread/libopenblas.so"
      -DGPT2_CBLAS_INCLUDE="$PREFIX/usr/include/x86_64-linux-gnu/openblas-pthread")
  local gen=() pc
  command -v ninja >/dev/null && [ ! -e "$BUILD/CMakeCache.txt" ] && gen=(-G Ninja)
  # Not the prefix's pkgconf itself: it needs the prefix's libpkgconf.
  pc=$(command -v pkg-config)
  cmake -S "$SRC" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOHORT_WERROR=OFF \
    -DCMAKE_PREFIX_PATH="$PREFIX/usr" -DPKG_CONFIG_EXECUTABLE="$pc" \
    -DCMAKE_BUILD_RPATH="$RT" -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags "${blas[@]}" || return 1
  grep -E '^(pkgcfg_lib_(NETTLE|JANSSON|CURL)_[a-z]+:|GPT2_OPENBLAS:)' "$BUILD/CMakeCache.txt"
  cmake --build "$BUILD" -j "$JOBS" --target cohort cohort-gpt2 cohort_shared gpt2-sgemm-rate || return 1
  runtime_libs "$BUILD/cohort" "$BUILD/cohort-gpt2"
}
say "## Results"
say
BUILT=0
if logged build 240 build; then
  BUILT=1
  result "build (cmake, $JOBS jobs)" PASS "$(elapsed)s; $(grep -c 'from the prefix' "$WORK/build.log") runtime libraries from the Debian prefix; $(grep -m1 '^unpacked' "$WORK/build.log")"
else
  result "build (cmake)" FAIL "see raw.log 'build': $(grep -m1 -iE 'error|not found|could not' "$WORK/build.log" | cut -c1-200)"
fi
COHORT=$BUILD/cohort
# The prefix's ip and tc, after the system's (make_prefix made them only
# where the system has none).
PATH=$PATH:$PREFIX/tools

# ---- 1. doctor ---------------------------------------------------------------
# doctor's GPUs (--json) beside nvidia-smi's: PCI addresses (nvidia-smi
# prints an 8-digit domain) and the driver; one line, "PASS ..." or "FAIL ...".
doctor_vs_smi() {
  nvidia-smi --query-gpu=pci.bus_id,driver_version --format=csv,noheader 2>/dev/null |
    "$PY" -c 'import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit("FAIL doctor --json gave no document: %s" % e)
smi = [l.split(",") for l in sys.stdin.read().splitlines() if "," in l]
want = sorted(p.strip().lower()[-12:] for p, _ in smi)
drv = sorted({d.strip() for _, d in smi})
g = doc["gpus"]
got = sorted((d["pci"] or "?").lower() for d in g["devices"])
numa = ", ".join("%s node %s" % (d["pci"], d["numa_node"]) for d in g["devices"])
ok = got == want and drv == [g["driver"]] * (len(drv) > 0) and g["found"] == len(want)
print("%s doctor %s (%s), driver %s, libcuda %s; nvidia-smi %s, driver %s" % (
    "PASS" if ok else "FAIL", got, numa or "no GPU", g["driver"],
    (g["cuda_library"] or {}).get("version"), want, ",".join(drv) or "none"))' "$1" 2>&1 | tail -1
}
doctor_section() {
  logged doctor 30 "$COHORT" doctor
  local rc=$?
  logged doctor-json 30 "$COHORT" doctor --json
  local jrc=$?
  cp "$WORK/doctor-json.log" "$OUT/doctor.json"
  logged doctor-check 30 "$COHORT" doctor --check
  local crc=$?
  logged doctor-schema 30 "$PY" "$SRC/tests/test_doctor_schema.py" --validate "$OUT/doctor.json" \
    "$SRC/docs/doctor.schema.json"
  local src=$?
  {
    echo "## cohort doctor"
    echo
    echo '```'
    cat "$WORK/doctor.log"
    echo '```'
    echo
    echo "### cohort doctor --check (exit $crc)"
    echo
    echo '```'
    cat "$WORK/doctor-check.log"
    echo '```'
    echo
    echo "### cohort doctor --json (exit $jrc; the whole document in doctor.json): gpus, nccl, limits"
    echo
    echo '```'
    "$PY" -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(json.dumps({k: d.get(k) for k in ("schema", "ok", "gpus", "nccl", "limits")}, indent=1))' \
      "$OUT/doctor.json" 2>&1 | head -80
    echo '```'
    echo
  } >>"$SECTIONS"
  [ $rc = 0 ] && result "doctor" PASS "exit 0" || result "doctor" FAIL "exit $rc"
  local nccl_doc nccl_torch
  nccl_doc=$(awk '/^NCCL/ {getline; print $1; exit}' "$WORK/doctor.log")
  nccl_torch=$(grep -m1 '^nccl ' "$WORK/probe.log" | awk '{print $2}')
  if [ -n "$nccl_doc" ] && [ "$nccl_doc" = "$nccl_torch" ]; then
    result "doctor: NCCL version" PASS "doctor $nccl_doc = torch.cuda.nccl.version() $nccl_torch"
  else
    result "doctor: NCCL version" FAIL "doctor '${nccl_doc:-none}', torch.cuda.nccl.version() '${nccl_torch:-?}'"
  fi
  local vs
  vs=$(doctor_vs_smi "$OUT/doctor.json")
  result "doctor --json: GPUs, PCI addresses, driver vs nvidia-smi" "${vs%% *}" "${vs#* }"
  [ $src = 0 ] && result "doctor --json: docs/doctor.schema.json" PASS "$(tail -1 "$WORK/doctor-schema.log")" ||
    result "doctor --json: docs/doctor.schema.json" FAIL "$(head -3 "$WORK/doctor-schema.log" | tr '\n' ' ' | cut -c1-240)"
  if [ $crc = 0 ]; then
    result "doctor --check" PASS "$(tail -1 "$WORK/doctor-check.log")"
  else
    result "doctor --check" FAIL "exit $crc: $(grep -E '^fail ' "$WORK/doctor-check.log" | tr -s ' ' | cut -c1-160 | tr '\n' ';')"
  fi
}

# ---- 2. GPU count and NUMA binding ---------------------------------------------
# The CPUs of the NUMA node of the first GPU (-1 or unknown: node 0, as PyTorch's binding).
expected_cpus() {
  "$PY" - <<'EOF'
import glob, os
gpus = sorted(os.path.basename(g) for g in glob.glob("/proc/driver/nvidia/gpus/*"))
node = -1
if gpus:
    try:
        node = int(open("/sys/bus/pci/devices/%s/numa_node" % gpus[0]).read())
    except OSError:
        pass
path = "/sys/devices/system/node/node%d/cpulist" % max(node, 0)
cpus = set()
try:
    for part in open(path).read().strip().split(","):
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
except OSError:
    cpus = os.sched_getaffinity(0)
print("node %d (%s) %s" % (node, gpus[0] if gpus else "no GPU", ",".join(map(str, sorted(cpus)))))
EOF
}
AFF='import os; print("AFFINITY", os.environ.get("LOCAL_RANK"), ",".join(map(str, sorted(os.sched_getaffinity(0)))), flush=True)'
place_section() {
  local mode n t
  for mode in gpu auto; do
    logged "nproc-$mode" 30 "$COHORT" run --nproc-per-node $mode --no-python sh -c 'echo "LWS $LOCAL_WORLD_SIZE"'
    n=$(grep -o 'LWS [0-9]*' "$WORK/nproc-$mode.log" | head -1 | cut -d' ' -f2)
    logged "nproc-$mode-torchrun" 60 "$PY" -m torch.distributed.run --nproc-per-node $mode --no-python \
      sh -c 'echo "LWS $LOCAL_WORLD_SIZE"'
    t=$(grep -o 'LWS [0-9]*' "$WORK/nproc-$mode-torchrun.log" | head -1 | cut -d' ' -f2)
    if [ -n "$n" ] && [ "$n" = "$NGPU" ]; then
      result "run --nproc-per-node $mode" PASS "$n worker(s); nvidia-smi $NGPU GPU(s), torch $TORCH_NGPU, torchrun ${t:-failed}"
    else
      result "run --nproc-per-node $mode" FAIL "${n:-no} worker(s); nvidia-smi $NGPU, torch $TORCH_NGPU, torchrun ${t:-failed}"
    fi
  done
  local want got tgot
  want=$(expected_cpus)
  echo "expected: $want" >>"$RAW"
  logged numa 60 "$COHORT" run --nproc-per-node gpu --numa-binding node -- "$PY" -c "$AFF"
  got=$(grep -o 'AFFINITY 0 .*' "$WORK/numa.log" | awk '{print $3}')
  logged numa-torchrun 90 "$PY" -m torch.distributed.run --nproc-per-node gpu --numa-binding node \
    --no-python "$PY" -c "$AFF"
  tgot=$(grep -o 'AFFINITY 0 .*' "$WORK/numa-torchrun.log" | awk '{print $3}')
  if [ -n "$got" ] && [ "$got" = "${want##* }" ]; then
    result "run --numa-binding node" PASS "rank 0 on CPUs $got = ${want% *}'s; torchrun: ${tgot:-failed ($(tail -1 "$WORK/numa-torchrun.log" | cut -c1-100))}"
  else
    result "run --numa-binding node" FAIL "rank 0 on '${got:-?}', expected ${want}; torchrun: ${tgot:-failed}"
  fi
  {
    echo "## Placement"
    echo
    echo "Expected for --numa-binding node: $want"
    echo
    echo '```'
    grep -h -E 'LWS|AFFINITY|bind|cpus|error|Error' "$WORK"/nproc-*.log "$WORK"/numa*.log | head -40
    echo '```'
    echo
  } >>"$SECTIONS"
}

# ---- 3. A PyTorch job on the GPU ----------------------------------------------
cat >"$WORK/gpu_job.py" <<'EOF'
"""DDP steps and an allreduce on CUDA tensors; prints one RESULT line per rank
(the parameters' sha256 and the sums) and one INFO line (versions, NCCL env)."""
import hashlib
import os
import sys

import torch
import torch.distributed as dist

backend = sys.argv[1]
rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
dev = torch.device("cuda", local % torch.cuda.device_count())
torch.cuda.set_device(dev)
if backend == "nccl":
    dist.init_process_group("nccl", device_id=dev)
else:
    dist.init_process_group(backend)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 8)).to(dev)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
g = torch.Generator().manual_seed(100 + rank)
for step in range(20):
    x = torch.randn(32, 64, generator=g).to(dev)
    y = torch.randn(32, 8, generator=g).to(dev)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
t = torch.arange(1 << 20, device=dev, dtype=torch.float32) * (rank + 1)
dist.all_reduce(t)
b = torch.full((4,), float(rank + 7), device=dev)
dist.broadcast(b, 0)
torch.cuda.synchronize()
flat = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
print("RESULT rank %d/%d %s params %s allreduce %.1f broadcast %.1f loss %.6f" % (
    rank, world, backend, hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16],
    t.sum().item(), b.sum().item(), loss.item()), flush=True)
nccl_env = " ".join("%s=%s" % (k, v) for k, v in sorted(os.environ.items())
                    if k.startswith(("NCCL_", "TORCH_NCCL", "GLOO_", "CUDA_VISIBLE")))
print("INFO rank %d %s nccl %s device %s affinity %d cpus env: %s" % (
    rank, torch.__version__, ".".join(map(str, torch.cuda.nccl.version())),
    torch.cuda.get_device_name(dev), len(os.sched_getaffinity(0)), nccl_env), flush=True)
dist.destroy_process_group()
EOF
torch_section() {
  local be np c t
  for be in "nccl 1" "gloo 2"; do
    np=${be#* }
    be=${be% *}
    logged "job-$be-cohort" 120 env PYTHON_EXEC="$PY" "$COHORT" run --standalone --nproc-per-node "$np" \
      "$WORK/gpu_job.py" "$be"
    c=$(grep -o 'RESULT .*' "$WORK/job-$be-cohort.log" | sort)
    logged "job-$be-torchrun" 120 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$np" \
      "$WORK/gpu_job.py" "$be"
    t=$(grep -o 'RESULT .*' "$WORK/job-$be-torchrun.log" | sort)
    if [ "$(printf '%s\n' "$c" | grep -c RESULT)" = "$np" ] && [ "$c" = "$t" ]; then
      result "PyTorch $be, $np rank(s) on the GPU" PASS "same as torchrun: $(printf '%s\n' "$c" | head -1 | cut -d' ' -f4-9)"
    else
      result "PyTorch $be, $np rank(s) on the GPU" FAIL "cohort: ${c:-no result}; torchrun: ${t:-no result}"
    fi
  done
  {
    echo "## PyTorch on the GPU"
    echo
    echo '```'
    grep -H -o -E '(RESULT|INFO) .*' "$WORK"/job-*.log | sed "s,$WORK/,,"
    echo '```'
    echo
  } >>"$SECTIONS"
}

# ---- 3b. cohort_reform's NCCL path ----------------------------------------------
# One rank on the GPU (NCCL refuses two on one device): scripts/devcheck_reform.py
# plays the agent's side of the control channel; reshape must abort the NCCL
# communicator and the worker re-form twice in the same process.
reform_section() {
  local r
  logged reform-nccl 150 "$PY" "$SRC/scripts/devcheck_reform.py" "$SRC" nccl
  r=$(grep -o 'RESULT .*' "$WORK/reform-nccl.log")
  if grep -q '^FAIL' "$WORK/reform-nccl.log" || [ -z "$r" ]; then
    result "cohort_reform with NCCL: reshape, abort, re-form x2" FAIL "$(grep -m1 '^FAIL' "$WORK/reform-nccl.log" || echo "${r:-no result}")"
  else
    result "cohort_reform with NCCL: reshape, abort, re-form x2" PASS "${r#RESULT }; $(grep -o 'reshape aborted.*' "$WORK/reform-nccl.log")"
  fi
  { echo "## cohort_reform with NCCL"; echo; echo '```'; cat "$WORK/reform-nccl.log"; echo '```'; echo; } >>"$SECTIONS"
}

# ---- 4. torchrun compatibility --------------------------------------------------
# The raw environments of both launchers, worker 0 (and 1 where there is
# one), on the command lines of tests/test_torchrun_env.sh.
env_dumps() {
  local d=$WORK/envdump base=(env -i PATH=/usr/bin:/bin HOME=/root) name r port=$((20000 + $$ % 20000))
  local -A lines=([standalone]="--standalone --nproc_per_node 2"
    [c10d]="--nnodes=1 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port --rdzv_id=envjob --role trainer --max_restarts 2"
    [static]="--nnodes 1 --node_rank 0 --master_addr 127.0.0.1 --master_port $((port + 1)) --nproc_per_node 1")
  mkdir -p "$d"
  for name in standalone c10d static; do
    # shellcheck disable=SC2086
    "${base[@]}" D="$d/$name-torch" timeout 120 "$PY" -m torch.distributed.run ${lines[$name]} \
      --no-python sh -c 'env | sort >"$D-$RANK"'
    # shellcheck disable=SC2086
    "${base[@]}" D="$d/$name-cohort" timeout 120 "$COHORT" run ${lines[$name]} \
      --no-python sh -c 'env | sort >"$D-$RANK"'
    for r in 0 1; do
      [ -e "$d/$name-torch-$r" ] || [ -e "$d/$name-cohort-$r" ] || continue
      touch "$d/$name-torch-$r" "$d/$name-cohort-$r"
      echo "--- $name, worker $r"
      echo "only under torchrun: $(comm -23 <(cut -d= -f1 "$d/$name-torch-$r" | sort) <(cut -d= -f1 "$d/$name-cohort-$r" | sort) | tr '\n' ' ')"
      echo "only under cohort:   $(comm -13 <(cut -d= -f1 "$d/$name-torch-$r" | sort) <(cut -d= -f1 "$d/$name-cohort-$r" | sort) | tr '\n' ' ')"
      comm -12 <(cut -d= -f1 "$d/$name-torch-$r" | sort) <(cut -d= -f1 "$d/$name-cohort-$r" | sort) | while read -r n; do
        a=$(grep -m1 "^$n=" "$d/$name-torch-$r" | cut -d= -f2-)
        b=$(grep -m1 "^$n=" "$d/$name-cohort-$r" | cut -d= -f2-)
        [ "$a" = "$b" ] || echo "differs: $n: torchrun '$a', cohort '$b'"
      done
    done
  done
}
torchrun_section() {
  local tv rc
  tv=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)
  logged envdump 260 env_dumps
  logged torchrun-env 200 env COHORT_TEST_PYTHON="$PY" bash "$SRC/tests/test_torchrun_env.sh" "$COHORT"
  rc=$?
  result "tests/test_torchrun_env.sh, torch $tv" "$([ $rc = 0 ] && echo PASS || echo FAIL)" \
    "$(tail -1 "$WORK/torchrun-env.log"); $(grep -c '^FAIL' "$WORK/torchrun-env.log") FAIL lines"
  if time_left 60; then
    logged torchrun-cli 240 env COHORT_TEST_PYTHON="$PY" bash "$SRC/tests/test_torchrun_cli.sh" "$COHORT" "$SRC"
    rc=$?
    result "tests/test_torchrun_cli.sh, torch $tv" "$([ $rc = 0 ] && echo PASS || echo FAIL)" \
      "$(tail -1 "$WORK/torchrun-cli.log"); $(grep -c '^FAIL' "$WORK/torchrun-cli.log") FAIL lines"
  else
    not_run "tests/test_torchrun_cli.sh"
  fi
  {
    echo "## torchrun $tv"
    echo
    echo '```'
    cat "$WORK/envdump.log"
    grep -h '^FAIL' "$WORK"/torchrun-*.log
    echo '```'
    echo
  } >>"$SECTIONS"
}

# ---- 5a. Collectives beside the memory bound --------------------------------------
# cohort bench prints nccl-tests' columns: 6 and 9 the out-of-place time and
# #wrong, 10 and 13 the in-place ones. The bound (mem_bound.c) reads and
# writes every buffer once, as an in-place allreduce does; out of place every
# output line is also read before it is written (write-allocate), so that
# column's ratio is 0.67 at best. COLL_BYTES: the sizes (8 for the latency row).
read -r -a COLL_SIZES <<<"${COLL_BYTES-4194304 67108864}"
declare -A ITERS=([8]=2000 [65536]=300 [4194304]=30 [67108864]=6)
declare -A WARM=([8]=200 [65536]=30 [4194304]=5 [67108864]=2)
declare -A BITERS=([65536]=3000 [4194304]=300 [67108864]=60)
REPS=3
median() { sort -g | awk '{a[NR] = $1} END {if (NR) print a[int((NR + 1) / 2)]; else print "nan"}'; }
busbw() { awk -v b="$1" -v t="$2" -v n="$3" 'BEGIN {if (t > 0) printf "%.2f", b / t / 1e3 * 2 * (n - 1) / n; else print "nan"}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0 && a == a + 0) printf "%.2f", a / b; else print "nan"}'; }
# coll_times N MEM SIZE: REPS runs of cohort bench; the in-place and
# out-of-place times in $WORK/ci.t and $WORK/co.t, the bound's in $WORK/b.t;
# fails when a run printed a wrong value, no line, or not REPS of each.
coll_times() {
  local n=$1 m=$2 s=$3 r bad=0
  : >"$WORK/ci.t"
  : >"$WORK/co.t"
  : >"$WORK/b.t"
  for ((r = 0; r < REPS; r++)); do
    timeout 60 "$COHORT" bench --nproc "$n" --mem "$m" -b "$s" -e "$s" -n "${ITERS[$s]}" \
      -w "${WARM[$s]}" >"$WORK/cb.out" 2>&1 || bad=1
    cat "$WORK/cb.out" >>"$RAW"
    # Both columns' #wrong must be 0 and both times numbers above 0.
    awk -v ci="$WORK/ci.t" -v co="$WORK/co.t" '!/^#/ && NF >= 13 {
        if ($9 != 0 || $13 != 0 || !($6 > 0) || !($10 > 0)) { bad = 1; next }
        print $10 >> ci; print $6 >> co }
      END { exit bad }' "$WORK/cb.out" || bad=1
    [ "$s" = 8 ] && continue
    timeout 60 "$WORK/mem_bound" "${BITERS[$s]}" "$((BITERS[$s] / 10))" "$s" "$n" | awk '{print $2}' \
      >>"$WORK/b.t"
  done
  [ $bad = 0 ] && [ "$(wc -l <"$WORK/ci.t")" = $REPS ] && [ "$(wc -l <"$WORK/co.t")" = $REPS ]
}
coll_section() {
  local n s m ms ti to tb fails=0 rows=$WORK/coll.md
  cc -O3 -pthread -o "$WORK/mem_bound" "$SRC/bench/collectives/mem_bound.c" >>"$RAW" 2>&1 || {
    result "bench: memory bound" FAIL "mem_bound.c did not build"
    return
  }
  {
    echo "## Allreduce on one host (float32, cohort bench --nproc N; medians of $REPS)"
    echo
    echo "Bound: bench/collectives/mem_bound.c N (every buffer read once and written once, as in place)."
    echo "Out of place reads each output line before writing it: 0.67 of the bound at best."
    echo
    echo "| ranks | --mem | size | in-place us | in-place busbw GB/s | out-of-place us | out-of-place busbw GB/s | bound us | bound busbw GB/s | in-place / bound | out-of-place / bound |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
  } >"$rows"
  for n in ${COLL_RANKS-2 4 8}; do
    for ms in "${COLL_SIZES[@]/#/private }" "${COLL_SIZES[@]/#/huge }" "${COLL_SIZES[@]/#/shared }"; do
      m=${ms% *}
      s=${ms#* }
      if ! time_left 20; then
        not_run "bench: allreduce $n ranks $s B --mem $m"
        continue
      fi
      if ! coll_times "$n" "$m" "$s"; then
        result "bench: allreduce $n ranks $s B --mem $m" FAIL "wrong values or a failed run: no figure"
        fails=$((fails + 1))
        continue
      fi
      ti=$(median <"$WORK/ci.t")
      to=$(median <"$WORK/co.t")
      if [ "$s" = 8 ]; then
        echo "| $n | $m | 8 B | $ti | | $to | | | | | |" >>"$rows"
        continue
      fi
      tb=$(median <"$WORK/b.t")
      echo "| $n | $m | $s | $ti | $(busbw "$s" "$ti" "$n") | $to | $(busbw "$s" "$to" "$n") | $tb | $(busbw "$s" "$tb" "$n") | $(ratio "$tb" "$ti") | $(ratio "$tb" "$to") |" >>"$rows"
    done
  done
  result "bench: allreduce ${COLL_RANKS-2 4 8} ranks, in place and out of place, beside the memory bound" \
    "$([ $fails = 0 ] && echo PASS || echo FAIL)" "$fails rows without a figure; table below"
  { cat "$rows"; echo; } >>"$SECTIONS"
}

# ---- 6. Network namespaces, and the benchmarks that need them ---------------------
# netns_probe: what bench/recovery and bench/train's shaped links do, step by
# step (two namespaces, a veth pair, a bridge, tc tbf, a UTS namespace, a
# TCP connection across), each printed "ok STEP" or "FAIL STEP: why"; removes
# what it made. Names carry the PID.
netns_probe() {
  local a=cdc$$a b=cdc$$b step
  # shellcheck disable=SC2317
  netns_try() {
    step=$1
    shift
    if out=$("$@" 2>&1); then echo "ok $step"; else echo "FAIL $step: $(echo "$out" | head -1)"; return 1; fi
  }
  local out rc=0
  echo "ip: $(command -v ip || echo MISSING), tc: $(command -v tc || echo MISSING), unshare: $(command -v unshare || echo MISSING)"
  {
    netns_try "ip netns add" ip netns add "$a" &&
      netns_try "second namespace" ip netns add "$b" &&
      netns_try "veth pair across them" ip link add "cdc$$x" netns "$a" type veth peer name "cdc$$y" netns "$b" &&
      netns_try "addresses, links up" sh -c "ip -n $a addr add 10.204.$(($$ % 250)).1/24 dev cdc$$x &&
        ip -n $b addr add 10.204.$(($$ % 250)).2/24 dev cdc$$y && ip -n $a link set cdc$$x up &&
        ip -n $b link set cdc$$y up && ip -n $a link set lo up && ip -n $b link set lo up" &&
      netns_try "tc qdisc add ... tbf rate 1gbit" tc -n "$a" qdisc add dev "cdc$$x" root tbf rate 1gbit \
        burst 256kb latency 50ms &&
      netns_try "bridge in a namespace" ip -n "$b" link add "cdc$$br" type bridge &&
      netns_try "unshare --uts; hostname" ip netns exec "$a" unshare --uts sh -c 'hostname node0 && hostname' &&
      netns_try "TCP across the veth (a cohort store)" netns_tcp "$a" "$b" "10.204.$(($$ % 250)).1"
  } || rc=1
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  echo "left behind: $(ip netns list 2>/dev/null | grep -c "^cdc$$" || true) namespaces"
  return $rc
}
# netns_tcp A B ADDR: a cohort store on ADDR in A, connected to from B.
netns_tcp() {
  local pid addr i rc=1
  ip netns exec "$1" timeout 30 "$COHORT" store serve --host "$3" --port 0 >"$WORK/netns-store.out" 2>&1 &
  pid=$!
  for ((i = 0; i < 50; i++)); do
    addr=$(grep -o "$3:[0-9]*" "$WORK/netns-store.out" | head -1)
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] && ip netns exec "$2" timeout 5 bash -c "exec 3<>/dev/tcp/${addr%:*}/${addr#*:}" && rc=0
  [ -n "$addr" ] || echo "no address from cohort store serve: $(head -1 "$WORK/netns-store.out")"
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return $rc
}
NETNS_OK=0
netns_section() {
  if logged netns 60 netns_probe; then
    NETNS_OK=1
    result "network namespaces, veth, bridge, tc tbf" PASS "$(grep -c '^ok' "$WORK/netns.log") steps ok; $(grep -m1 '^left' "$WORK/netns.log")"
  else
    result "network namespaces, veth, bridge, tc tbf" FAIL "$(grep -m1 '^FAIL' "$WORK/netns.log" | cut -c1-200)"
  fi
  { echo "## Network namespaces"; echo; echo '```'; cat "$WORK/netns.log"; echo '```'; echo; } >>"$SECTIONS"
}

# budget_left: the seconds left of BUDGET_S (a section's outer timeout).
budget_left() { echo $((BUDGET_S - $(elapsed))); }

# recovery_run LIMIT: bench/recovery under a SIGINT after LIMIT seconds (its
# runs' finally blocks then end what runs in the namespaces and remove them,
# and it prints the rows done, the others "stopped by SIGINT"). A run's own
# limit is the bench's (it scales with the model) unless RECOVERY_RUN_S.
recovery_run() {
  local limit=$1 logs=$2
  shift 2
  timeout -s INT -k 15 "$limit" "$PY" "$SRC/bench/recovery/run.py" --cohort "$COHORT" --gpt2 "$BUILD/cohort-gpt2" \
    --python "$PY" --model "${RECOVERY_MODEL:-124M}" --reps 1 --steps "${RECOVERY_STEPS:-10}" \
    --kill-step "${RECOVERY_KILL:-4}" --ckpt-every 3 --logs "$logs" \
    --rows "${RECOVERY_ROWS:-cohort reform,cohort restart,torchrun restart,torch reform}" \
    ${RECOVERY_RATE:+--rate "$RECOVERY_RATE"} ${RECOVERY_RUN_S:+--row-limit "$RECOVERY_RUN_S"} "$@"
}
# bench/recovery: 3 namespaces x 1 rank x 1 thread, node 2 killed at
# RECOVERY_KILL of RECOVERY_STEPS; the torch rows with PY and its torchrun.
recovery_section() {
  local rc n=0 v vs=() args need=${RECOVERY_NEED_S:-200}
  [ $NETNS_OK = 1 ] || { result "bench/recovery" "NOT RUN" "network namespaces did not work (or the netns section did not run)"; return; }
  IFS=';' read -r -a vs <<<"${RECOVERY_VARIANTS-}"
  [ ${#vs[@]} -gt 0 ] || vs=("")
  for v in "${vs[@]}"; do
    n=$((n + 1))
    time_left "$need" || { not_run "bench/recovery $v (needs ${need}s)"; continue; }
    mkdir -p "$WORK/recovery-logs-$n"
    eval "args=($v)" # a variant is bench/recovery's options, quoted as in a shell
    logged "recovery-$n" 0 recovery_run "$(budget_left)" "$WORK/recovery-logs-$n" "${args[@]}"
    rc=$?
    result "bench/recovery, GPT-2 ${RECOVERY_MODEL:-124M}${RECOVERY_RATE:+ at $RECOVERY_RATE}${v:+ ($v)}" \
      "$([ $rc = 0 ] && echo PASS || echo FAIL)" \
      "exit $rc; $(grep -c '| fail' "$WORK/recovery-$n.log") rows failed; table below"
    { echo "## bench/recovery (one lost node of 3)${v:+: $v}"; echo; grep -E '^(#|\||time lost|newcomer)' "$WORK/recovery-$n.log"; echo; } >>"$SECTIONS"
  done
}

# EXTRA: one more command (a diagnosis prepared for this run), with SRC, BUILD,
# COHORT and PY in its environment; its output is in the report.
extra_section() {
  [ -n "${EXTRA-}" ] || { result "extra" "NOT RUN" "EXTRA is empty"; return; }
  local rc
  logged extra "$(budget_left)" env SRC="$SRC" BUILD="$BUILD" COHORT="$COHORT" PY="$PY" bash -c "$EXTRA"
  rc=$?
  result "extra: $(echo "$EXTRA" | cut -c1-80)" "exit $rc" "output below"
  { echo "## extra"; echo; echo '```'; tail -c 6000 "$WORK/extra.log"; echo '```'; echo; } >>"$SECTIONS"
}

# bench/train's shaped links, cohort-gpt2 only (--skip-torch: no PyTorch).
shaped_section() {
  local rc need=${SHAPED_NEED_S:-120}
  [ $NETNS_OK = 1 ] || { result "bench/train shaped" "NOT RUN" "network namespaces did not work (or the netns section did not run)"; return; }
  time_left "$need" || { not_run "bench/train shaped (needs ${need}s)"; return; }
  # shellcheck disable=SC2086
  logged shaped "$(budget_left)" "$PY" "$SRC/bench/train/run.py" --build "$BUILD" --only shaped --reps 1 \
    --steps 8 --rates 1gbit --skip-torch ${SHAPED_ARGS-}
  rc=$?
  result "bench/train --only shaped (1gbit, cohort-gpt2)" "$([ $rc = 0 ] && echo PASS || echo FAIL)" \
    "exit $rc$([ $rc = 0 ] || echo ": $(tail -1 "$WORK/shaped.log" | cut -c1-200)"); table below"
  { echo "## bench/train: shaped links"; echo; grep -v '^cohort-gpt2 training' "$WORK/shaped.log"; echo; } >>"$SECTIONS"
}

# ---- 5c. OpenBLAS on this CPU -----------------------------------------------------
# The kernels OpenBLAS chooses for a program that does not correct them (a
# Python process), those cohort-gpt2 and gpt2-sgemm-rate run on, and their
# rates under each OPENBLAS_CORETYPE of BLAS_CORES, all threads.
blas_section() {
  local lib core t tc
  lib=$(ldd "$BUILD/cohort-gpt2" | awk '/libopenblas/ {print $3; exit}')
  core=$("$PY" -c 'import ctypes, sys
l = ctypes.CDLL(sys.argv[1])
for f in ("openblas_get_corename", "openblas_get_config"):
    getattr(l, f).restype = ctypes.c_char_p
print(l.openblas_get_corename().decode(), "|", l.openblas_get_config().decode())' "$lib" 2>&1)
  echo "openblas: $lib: $core" >>"$RAW"
  {
    echo "## OpenBLAS on this CPU"
    echo
    echo "cohort-gpt2 loads $lib; core and config: $core"
    echo
    echo "| OPENBLAS_CORETYPE | kernels in use (sgemm-rate / cohort-gpt2) | sgemm GFLOP/s, $JOBS threads (OpenBLAS / cohort kernels) | cohort-gpt2 tok/s, $JOBS threads |"
    echo "|---|---|---|---|"
  } >>"$SECTIONS"
  for t in default ${BLAS_CORES-Haswell SkylakeX Cooperlake SapphireRapids}; do
    time_left 40 || { not_run "OpenBLAS core $t"; continue; }
    local e=()
    [ "$t" = default ] || e=(OPENBLAS_CORETYPE="$t")
    logged "sgemm-$t" 60 env "${e[@]}" OMP_NUM_THREADS="$JOBS" "$BUILD/gpt2-sgemm-rate" 124M lm 4 64 "$JOBS" 2
    rm -f "$WORK/b$t.jsonl"
    logged "gpt2-blas-$t" 90 env "${e[@]}" OMP_NUM_THREADS="$JOBS" OMP_WAIT_POLICY=passive "$BUILD/cohort-gpt2" \
      --model 124M --batch 4 --seq-len 64 --steps 3 --head lm --optimizer adamw --quiet --metrics "$WORK/b$t.jsonl"
    tc=$("$PY" -c 'import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("%.1f" % (256e3 / statistics.median(r["step_ms"] for r in rows[1:])))' "$WORK/b$t.jsonl" 2>/dev/null)
    echo "| $t | $("$PY" -c 'import json, sys
print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]).get("openblas_core", "?"))' "$WORK/sgemm-$t.log" 2>/dev/null) / $(grep -o 'OpenBLAS [A-Za-z0-9]* kernels' "$WORK/gpt2-blas-$t.log" | cut -d' ' -f2) | $("$PY" -c 'import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("%.1f / %.1f" % (d["openblas_gflops"], d["sliced_gflops"]))' "$WORK/sgemm-$t.log" 2>/dev/null || echo failed) | ${tc:-failed} |" >>"$SECTIONS"
  done
  echo >>"$SECTIONS"
  result "OpenBLAS core on this CPU" INFO "$core (as loaded by Python; the tools re-execute with better kernels, see the table)"
}

# ---- 5b. cohort-gpt2 thread scaling ------------------------------------------
gpt2_section() {
  local t tc tt k rows=$WORK/gpt2.md one=''
  {
    echo "## cohort-gpt2 thread scaling (GPT-2 124M, B=4, T=64, LM head, AdamW, 4 steps; median step after the first)"
    echo
    echo "| threads | cohort-gpt2 tok/s | OpenBLAS kernels | scaling vs 1 thread | PyTorch tok/s | cohort/PyTorch |"
    echo "|---|---|---|---|---|---|"
  } >"$rows"
  for t in ${GPT2_THREADS-1 2 4 8 16}; do
    [ "$t" -le "$(nproc)" ] || continue
    if ! time_left 45; then
      not_run "cohort-gpt2 $t threads"
      continue
    fi
    rm -f "$WORK/g$t.jsonl"
    logged "gpt2-$t" 120 env OMP_NUM_THREADS=$t OMP_WAIT_POLICY=passive "$BUILD/cohort-gpt2" --model 124M \
      --batch 4 --seq-len 64 --steps 4 --head lm --optimizer adamw --quiet --metrics "$WORK/g$t.jsonl"
    tc=$("$PY" -c 'import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 4, "steps"
print("%.1f" % (256e3 / statistics.median(r["step_ms"] for r in rows[1:])))' "$WORK/g$t.jsonl" 2>/dev/null)
    [ -z "$one" ] && one=$tc
    tt=
    if [[ " ${TORCH_THREADS-1 4 16} " == *" $t "* ]] && time_left 60; then
      logged "gpt2-torch-$t" 150 "$PY" "$SRC/bench/train/gpt2_torch.py" --model 124M --batch 4 --seq-len 64 \
        --steps 4 --head lm --optimizer adamw --threads "$t"
      tt=$("$PY" -c 'import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        print("%.1f" % json.loads(l)["tokens_per_s"])' "$WORK/gpt2-torch-$t.log" 2>/dev/null | tail -1)
    fi
    k=$(grep -o 'OpenBLAS [A-Za-z0-9]* kernels' "$WORK/gpt2-$t.log" | cut -d' ' -f2)
    echo "| $t | ${tc:-failed} | ${k:-?} | $(awk -v a="$tc" -v b="$one" -v t="$t" 'BEGIN {if (a > 0 && b > 0) printf "%.2fx (%.0f%%)", a / b, 100 * a / b / t; else print "-"}') | ${tt:-not run} | $(awk -v a="$tc" -v b="$tt" 'BEGIN {if (a > 0 && b > 0) printf "%.2f", a / b; else print "-"}') |" >>"$rows"
  done
  if grep -q failed "$rows"; then result "cohort-gpt2 thread scaling" FAIL "a run failed (raw.log)"; else
    result "cohort-gpt2 thread scaling" PASS "table below"; fi
  { cat "$rows"; echo; } >>"$SECTIONS"
}

if [ $BUILT = 1 ]; then
  for sec in ${ONLY:-doctor place torch reform torchrun coll blas gpt2 netns}; do
    if time_left 30; then
      "${sec}_section"
    else
      not_run "$sec"
    fi
  done
else
  result "every check" "NOT RUN" "no build"
fi
{
  echo "| check | result | detail |"
  echo "|---|---|---|"
  cat "$RESULTS"
  echo
  cat "$SECTIONS"
  echo "Total $(elapsed)s."
} >>"$REPORT"
cat "$REPORT"

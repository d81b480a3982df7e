#!/usr/bin/env bash
# Installs the Debian packages cohort needs, by purpose:
#   scripts/deps.sh demo    building cohort and running `make demo`
#   scripts/deps.sh test    the above, and the tests' tools and servers
#   scripts/deps.sh         everything: demo, test, fuzz and bench (`make test`)
# Purposes: demo, test, fuzz, bench; several may be given. Skips what is
# already present; runs `apt-get update` only when something is missing.
# Safe to run repeatedly. A new need is one word in the list of its purpose.
set -euo pipefail

# Building cohort, libcohort and cohort-gpt2 (CMakeLists.txt's find_package
# and pkg_check_modules), which is all `make demo` runs.
demo=(
  build-essential cmake pkg-config
  libopenblas-dev libomp-dev
  nettle-dev libjansson-dev libcurl4-openssl-dev
)
# The ctest suites: namespaces and process tools, PyTorch for the torchrun
# and DDP tests, jsonschema for the Kubernetes templates' schemas, the real
# servers (Slurm with munge, etcd, sshd, Prometheus), gdb and eu-stack for
# workers' stacks, groff for the man pages.
test=(
  iproute2 util-linux procps psmisc
  python3 python3-torch python3-numpy python3-yaml python3-protobuf python3-jsonschema
  openmpi-bin groff-base
  slurm-wlm munge
  openssl curl
  etcd-server etcd-client openssh-server openssh-client gdb elfutils prometheus
)
# The libFuzzer targets and the sanitizer builds (scripts/fuzz-ci.sh).
fuzz=(clang libclang-rt-14-dev)
# The benchmarks' peers and tools (bench/).
bench=(openmpi-bin libopenmpi-dev valgrind bc pdsh)

purposes=("$@")
[ ${#purposes[@]} -gt 0 ] || purposes=(test fuzz bench)
pkgs=()
for purpose in "${purposes[@]}"; do
  case $purpose in
  demo) pkgs+=("${demo[@]}") ;;
  test) pkgs+=("${demo[@]}" "${test[@]}") ;;
  fuzz) pkgs+=("${demo[@]}" "${fuzz[@]}") ;;
  bench) pkgs+=("${demo[@]}" "${bench[@]}") ;;
  *)
    echo "deps: unknown purpose '$purpose' (demo, test, fuzz, bench)" >&2
    exit 2
    ;;
  esac
done
mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#pkgs[@]} packages for ${purposes[*]} present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "deps: missing packages: ${missing[*]}; run as root or install them with apt-get" >&2
  exit 1
fi

echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"

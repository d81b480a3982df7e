#!/usr/bin/env bash
# Installs the Debian packages cohort needs to build, test and benchmark.
# Skips what is already present; runs `apt-get update` only when something is
# missing. Safe to run repeatedly.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config
  libopenblas-dev libomp-dev
  iproute2 util-linux procps psmisc bc
  python3 python3-torch python3-numpy python3-yaml python3-protobuf
  openmpi-bin libopenmpi-dev
  clang libclang-rt-14-dev valgrind
  groff-base
  slurm-wlm munge
  libssl-dev libjansson-dev libcurl4-openssl-dev openssl curl
  etcd-server etcd-client openssh-server openssh-client gdb elfutils
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#pkgs[@]} packages present"
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

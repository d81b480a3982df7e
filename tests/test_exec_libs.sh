#!/usr/bin/env bash
# What every `cohort` exec loads: libc, libm, Nettle and jansson, and
# nothing else; libcurl's tree (TLS, Kerberos, LDAP, ...) only in a process
# that connects to etcd (src/rdzv/etcd.c opens it then; the etcd_* tests
# cover that side).
# usage: test_exec_libs.sh COHORT_BINARY
set -u
libs=$(LD_TRACE_LOADED_OBJECTS=1 "$1" | awk '{print $1}' | grep -v '^linux-vdso' | sed 's,.*/,,')
[ -n "$libs" ] || { echo "FAIL: no list of libraries from $1"; exit 1; }
# (a sanitizer build adds its runtime)
extra=$(echo "$libs" | grep -Ev '^(libc|libm|libnettle|libjansson)\.so\.[0-9]+$|^ld-linux' |
  grep -Ev '^lib(asan|ubsan|tsan|stdc\+\+|gcc_s)\.so')
if [ -n "$extra" ]; then
  echo "FAIL: cohort loads more than libc, libm, Nettle and jansson:" $extra
  exit 1
fi
echo "ok: cohort loads" $libs

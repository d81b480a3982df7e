#!/usr/bin/env bash
# test_install.sh SOURCE_DIR BUILD_DIR - installs cohort into a temporary
# prefix and uses the installed copy as a user would: the files and the
# soname, `cohort --version`, a program built against libcohort with
# pkg-config and with CMake's find_package(cohort) (shared and static), and
# examples/allreduce.c built both ways and run under `cohort run`.
set -euo pipefail
src=$1
build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "test_install: FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >/dev/null

# Files. The library directory is whatever GNUInstallDirs chose.
libdir=$(dirname "$(find "$prefix" -name cohort.pc)")/..
libdir=$(cd "$libdir" && pwd)
version=$(sed -n 's/^Version: //p' "$libdir/pkgconfig/cohort.pc")
[ -n "$version" ] || fail "cohort.pc has no Version"
for f in "$prefix/bin/cohort" "$prefix/include/cohort/cohort.h" "$libdir/libcohort.a" \
         "$libdir/libcohort.so" "$libdir/libcohort.so.${version%%.*}" \
         "$libdir/libcohort.so.$version" "$libdir/cmake/cohort/cohortConfig.cmake" \
         "$libdir/cmake/cohort/cohortConfigVersion.cmake" "$prefix/share/man/man1/cohort.1"; do
  [ -e "$f" ] || fail "missing $f"
done
soname=$(objdump -p "$libdir/libcohort.so.$version" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = "libcohort.so.${version%%.*}" ] || fail "soname '$soname'"
[ "$(readlink "$libdir/libcohort.so")" = "libcohort.so.${version%%.*}" ] || fail "dev symlink"
# Only the public API is exported.
syms=$(nm -D --defined-only "$libdir/libcohort.so" | awk '$2 == "T" {print $3}')
[ -n "$syms" ] || fail "libcohort.so exports nothing"
if grep -v '^cohort_' <<<"$syms"; then fail "libcohort.so exports symbols outside cohort_*"; fi
[ "$("$prefix/bin/cohort" --version)" = "cohort $version" ] || fail "cohort --version"
# cohort-gpt2 is installed, with its page, whenever it is built.
if [ -x "$build/cohort-gpt2" ]; then
  [ -x "$prefix/bin/cohort-gpt2" ] || fail "cohort-gpt2 built but not installed"
  [ -e "$prefix/share/man/man1/cohort-gpt2.1" ] || fail "cohort-gpt2.1 not installed"
  "$prefix/bin/cohort-gpt2" --help >/dev/null || fail "installed cohort-gpt2 --help"
fi
for page in "$prefix"/share/man/man1/*.1; do
  warnings=$(groff -man -Tutf8 -ww -z "$page" 2>&1)
  [ -z "$warnings" ] || fail "$page: $warnings"
done

# A program using the installed header and library.
mkdir "$tmp/probe"
cat > "$tmp/probe/probe.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <cohort/cohort.h>
int main(void) {
  printf("%s %d.%d.%d %s\n", cohort_version(), COHORT_VERSION_MAJOR, COHORT_VERSION_MINOR,
         COHORT_VERSION_PATCH, strlen(cohort_strerror(COHORT_EAUTH)) > 0 ? "strerror" : "empty");
  return 0;
}
C
want="$version $version strerror"

# pkg-config.
export PKG_CONFIG_PATH=$libdir/pkgconfig
pkg-config --exists cohort || fail "pkg-config does not find cohort"
[ "$(pkg-config --modversion cohort)" = "$version" ] || fail "pkg-config --modversion"
cc -o "$tmp/probe/probe_pc" "$tmp/probe/probe.c" $(pkg-config --cflags cohort) \
  $(pkg-config --libs cohort) -Wl,-rpath,"$libdir"
[ "$("$tmp/probe/probe_pc")" = "$want" ] || fail "pkg-config probe printed '$("$tmp/probe/probe_pc")'"
# (Output captured first: with pipefail, grep -q closing the pipe early would
# make ldd die of SIGPIPE and the check fail at random.)
deps=$(ldd "$tmp/probe/probe_pc")
grep -q "libcohort.so.${version%%.*} => $libdir/" <<<"$deps" || \
  fail "pkg-config probe does not use the installed libcohort.so: $deps"

# pkg-config for a static link: a prefix holding only the archive (the .pc
# derives its prefix from its own place), linked with --static, so that
# Requires.private and Libs.private alone must bring Nettle and the system
# libraries.
rel=${libdir#"$prefix"/}
sprefix=$tmp/static-prefix
mkdir -p "$sprefix/$rel/pkgconfig"
cp "$libdir/libcohort.a" "$sprefix/$rel/"
cp "$libdir/pkgconfig/cohort.pc" "$sprefix/$rel/pkgconfig/"
ln -s "$prefix/include" "$sprefix/include"
static_flags=$(PKG_CONFIG_PATH=$sprefix/$rel/pkgconfig pkg-config --static --cflags --libs cohort)
cc -o "$tmp/probe/probe_pc_static" "$tmp/probe/probe.c" $static_flags ||
  fail "static link with pkg-config --static: $static_flags"
[ "$("$tmp/probe/probe_pc_static")" = "$want" ] || fail "static pkg-config probe"
deps=$(ldd "$tmp/probe/probe_pc_static")
if grep -q libcohort <<<"$deps"; then fail "static pkg-config probe is dynamic: $deps"; fi

# CMake package.
cat > "$tmp/probe/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(probe LANGUAGES C)
find_package(cohort 0.1 REQUIRED)
add_executable(probe_shared probe.c)
target_link_libraries(probe_shared PRIVATE cohort::cohort)
add_executable(probe_static probe.c)
target_link_libraries(probe_static PRIVATE cohort::cohort_static)
CM
cmake -S "$tmp/probe" -B "$tmp/probe/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/probe/build" >/dev/null
[ "$("$tmp/probe/build/probe_shared")" = "$want" ] || fail "CMake shared probe"
[ "$("$tmp/probe/build/probe_static")" = "$want" ] || fail "CMake static probe"
deps=$(ldd "$tmp/probe/build/probe_shared")
grep -q "$libdir/libcohort.so" <<<"$deps" || fail "shared probe lib: $deps"
deps=$(ldd "$tmp/probe/build/probe_static")
if grep -q libcohort <<<"$deps"; then fail "static probe is dynamic: $deps"; fi
# A version the package does not satisfy is refused.
sed -i 's/find_package(cohort 0.1 REQUIRED)/find_package(cohort 99 REQUIRED)/' \
  "$tmp/probe/CMakeLists.txt"
if cmake -S "$tmp/probe" -B "$tmp/probe/build99" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null 2>&1; then
  fail "find_package(cohort 99) succeeded"
fi

# The example program, built against the installed copy with its Makefile
# (pkg-config) and its CMakeLists.txt (find_package), run by the installed
# `cohort run` with two workers: both ranks print the sums 1+2 .. 4+8.
cp -r "$src/examples" "$tmp/examples"
make -s -C "$tmp/examples" LDFLAGS="-Wl,-rpath,$libdir" >/dev/null || fail "examples/Makefile"
cmake -S "$tmp/examples" -B "$tmp/examples/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/examples/build" >/dev/null || fail "examples/CMakeLists.txt"
for exe in "$tmp/examples/allreduce" "$tmp/examples/build/allreduce"; do
  out=$(timeout 120 "$prefix/bin/cohort" run --nproc-per-node 2 -- "$exe" 2>&1) ||
    fail "cohort run --nproc-per-node 2 $exe: $out"
  for r in 0 1; do
    grep -q "rank $r of 2: 3 6 9 12\$" <<<"$out" || fail "rank $r of $exe: $out"
  done
done

echo "test_install: ok (version $version, $libdir)"

# check_lib.sh - pass/fail counting for the shell tests (sourced).
#   check "description" command...   runs the command; counts it passed or
#                                     failed (printing "FAIL: description");
#                                     returns the command's success
#   contains FILE TEXT / not_contains FILE TEXT   whether FILE holds TEXT (fixed string)
#   not command...                    succeeds when the command fails
#   run NAME command...               runs the command (60 s at most), its stdout
#                                     in $tmp/NAME.out, stderr in $tmp/NAME.err,
#                                     status in $tmp/NAME.rc ($tmp: the caller's)
#   rc NAME STATUS                    whether `run NAME` ended with STATUS
#   lines FILE N                      whether $tmp/FILE has N lines
#   free_port                         prints a loopback port the kernel deems free
#                                     (parallel tests must not pick fixed ones)
# The caller prints "$passed passed, $failed failed" and exits accordingly.
passed=0
failed=0
check() {
  local what=$1
  shift
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $what"
    return 1
  fi
}
contains() { grep -qF -- "$2" "$1"; }
not_contains() { ! grep -qF -- "$2" "$1"; }
not() { ! "$@"; }
run() {
  local name=$1
  shift
  timeout 60 "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  echo $? >"$tmp/$name.rc"
}
rc() { [ "$(cat "$tmp/$1.rc")" = "$2" ]; }
lines() { [ "$(wc -l <"$tmp/$1")" = "$2" ]; }
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

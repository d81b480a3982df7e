# check_lib.sh - pass/fail counting for the shell tests (sourced).
#   check "description" command...   runs the command; counts it passed or
#                                     failed (printing "FAIL: description");
#                                     returns the command's success
#   contains FILE TEXT / not_contains FILE TEXT   whether FILE holds TEXT (fixed string)
#   not command...                    succeeds when the command fails
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

#!/bin/sh
# A worker wrapper for tests/test_slurm.sh: runs CMD; in rank CRASH_RANK the
# command is killed with SIGKILL SECONDS after its start (a crash that the
# program cannot catch or report itself).
# usage: crash_rank.sh CRASH_RANK SECONDS CMD [ARG...]
crash_rank=$1
seconds=$2
shift 2
if [ "$RANK" = "$crash_rank" ]; then
  # $$ stays the PID of CMD after exec.
  (sleep "$seconds" && echo "killing rank $RANK with SIGKILL" && kill -KILL $$) &
fi
exec "$@"

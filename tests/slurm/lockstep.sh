#!/bin/sh
# A worker for tests/test_slurm.sh: STEPS steps in lock step with every other
# rank of the job, through a barrier on the job's cohort store (COHORT_STORE,
# COHORT_TOKEN, set by `cohort run`). A rank cannot print "step K" before
# every rank has reached step K.
# usage: lockstep.sh COHORT STEPS [CRASH_RANK CRASH_STEP]
#   CRASH_RANK kills itself with SIGKILL when it reaches CRASH_STEP.
cohort=$1
steps=$2
crash_rank=${3:--1}
crash_step=${4:-0}
s=1
while [ "$s" -le "$steps" ]; do
  if [ "$RANK" = "$crash_rank" ] && [ "$s" -eq "$crash_step" ]; then
    echo "crashing at step $s"
    kill -9 $$
  fi
  # The rank that arrives last opens the barrier for everybody.
  n=$("$cohort" store add --timeout 30 "lockstep/$s") || exit 1
  if [ "$n" -eq "$WORLD_SIZE" ]; then "$cohort" store set --timeout 30 "lockstep/$s/open" 1 || exit 1; fi
  "$cohort" store wait --timeout 60 "lockstep/$s/open" || exit 1
  echo "step $s of $steps"
  s=$((s + 1))
done
echo "finished $steps steps: rank $RANK of $WORLD_SIZE on node $GROUP_RANK of $GROUP_WORLD_SIZE"

#!/usr/bin/env bash
# The main job of `make demo`, run from the build directory given as $1.
set -euo pipefail
build=${1:-build}
exec "$build/cohort" run --nproc-per-node 4 -- sh -c 'echo "rank $RANK of $WORLD_SIZE (local $LOCAL_RANK) master $MASTER_ADDR:$MASTER_PORT"'

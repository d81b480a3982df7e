# Real Slurm end to end: a private cluster (slurmctld, one slurmd per network
# namespace, munged) started by hand, the `cohort manifest slurm` script
# submitted with sbatch (root; slurm-wlm and munge from scripts/deps.sh).
# About a minute (every wait ends by 420 s); its own label, run by plain
# `ctest` and so by `make test`.
add_test(NAME slurm
  COMMAND ${CMAKE_SOURCE_DIR}/tests/test_slurm.sh $<TARGET_FILE_DIR:cohort> ${CMAKE_SOURCE_DIR})
set_tests_properties(slurm PROPERTIES TIMEOUT 600 COST 150 LABELS "slurm")

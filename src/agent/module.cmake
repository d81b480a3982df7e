# src/agent: part of the node library (cohort_node).
cohort_module(cohort_node)

# The Python start-up hook (python/sitecustomize.py) compiled in as the
# string py_hook[]: with --hang-timeout the agent writes it into the job's
# directory and puts that first on the workers' PYTHONPATH (agent/hang.c).
file(READ ${CMAKE_CURRENT_LIST_DIR}/python/sitecustomize.py COHORT_PY_HOOK)
string(REPLACE "\\" "\\\\" COHORT_PY_HOOK "${COHORT_PY_HOOK}")
string(REPLACE "\"" "\\\"" COHORT_PY_HOOK "${COHORT_PY_HOOK}")
string(REPLACE "\n" "\\n\"\n    \"" COHORT_PY_HOOK "${COHORT_PY_HOOK}")
file(WRITE ${CMAKE_BINARY_DIR}/generated/agent/python_hook.h
  "/* Generated from src/agent/python/sitecustomize.py by src/agent/module.cmake. */\n"
  "static const char py_hook[] =\n    \"${COHORT_PY_HOOK}\";\n")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_LIST_DIR}/python/sitecustomize.py)
target_include_directories(cohort_node PRIVATE ${CMAKE_BINARY_DIR}/generated)

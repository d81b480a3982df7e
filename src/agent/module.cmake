# src/agent: part of the node library (cohort_node).
cohort_module(cohort_node)

# The Python modules of python/ compiled in as strings: sitecustomize.py (the
# start-up hook) as py_hook[], cohort_reform.py (re-forms for PyTorch
# workers) as py_reform[]. The agent writes them into the job's directory and
# puts that first on the workers' PYTHONPATH (agent/hang.c).
set(COHORT_PY_HEADER "/* Generated from src/agent/python/ by src/agent/module.cmake. */\n")
foreach(pair "sitecustomize.py=py_hook" "cohort_reform.py=py_reform")
  string(REPLACE "=" ";" pair "${pair}")
  list(GET pair 0 file)
  list(GET pair 1 name)
  file(READ ${CMAKE_CURRENT_LIST_DIR}/python/${file} text)
  string(REPLACE "\\" "\\\\" text "${text}")
  string(REPLACE "\"" "\\\"" text "${text}")
  string(REPLACE "\n" "\\n\"\n    \"" text "${text}")
  string(APPEND COHORT_PY_HEADER "static const char ${name}[] =\n    \"${text}\";\n")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
    ${CMAKE_CURRENT_LIST_DIR}/python/${file})
endforeach()
file(WRITE ${CMAKE_BINARY_DIR}/generated/agent/python_hook.h "${COHORT_PY_HEADER}")
target_include_directories(cohort_node PRIVATE ${CMAKE_BINARY_DIR}/generated)

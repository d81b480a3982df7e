# The layout of docs/architecture.md: includes point down its layer table.
add_test(NAME layers COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/test_layers.py ${CMAKE_SOURCE_DIR})
set_tests_properties(layers PROPERTIES TIMEOUT 60 LABELS "unit")

# The README's first steps: cohort on PATH before the first example.
add_test(NAME readme COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/test_readme.py ${CMAKE_SOURCE_DIR})
set_tests_properties(readme PROPERTIES TIMEOUT 60 LABELS "unit")

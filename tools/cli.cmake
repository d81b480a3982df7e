# The command-line layer (tools/cli.c): option tables and one-line usage
# errors, shared by `cohort` and `cohort-gpt2`.
target_sources(cohort PRIVATE ${CMAKE_SOURCE_DIR}/tools/cli.c)
if(TARGET cohort-gpt2)
  target_sources(cohort-gpt2 PRIVATE ${CMAKE_SOURCE_DIR}/tools/cli.c)
endif()

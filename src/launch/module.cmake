# src/launch: `cohort launch` below the command line (host lists, ssh
# fan-out, pre-flight). Part of the node-side library the tools link.
file(GLOB COHORT_LAUNCH_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/launch/*.c)
target_sources(cohort_node PRIVATE ${COHORT_LAUNCH_SOURCES})

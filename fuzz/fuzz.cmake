# libFuzzer targets for every parser of cohort (clang only), built in a
# separate build directory:
#   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCOHORT_FUZZ=ON
#   cmake --build build-fuzz -j2 --target fuzz_all
#   cd build-fuzz && ctest -L fuzz        (or scripts/fuzz-ci.sh, which does all of it)
# Every target is built with ASan+UBSan (UBSan aborts, so undefined behaviour
# counts as a crash) and links an instrumented copy of the node-side sources,
# so coverage guides the fuzzer inside the code under test. Each target has a
# committed seed corpus in fuzz/corpus/<name>/ (regenerate with
# fuzz/make_corpus.py); a ctest (label "fuzz") runs it for
# COHORT_FUZZ_SECONDS (default 30) through fuzz/run-target.sh, which keeps new
# inputs out of the committed corpus and fails on any crash, leak or timeout.
#
# The root does not glob fuzz/: tests/fuzz.cmake, tests/store.cmake and
# tests/eco.cmake include this file (include_guard makes that harmless).
include_guard(GLOBAL)
option(COHORT_FUZZ "Build libFuzzer targets (needs clang)" OFF)
if(COHORT_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "COHORT_FUZZ=ON needs clang: -DCMAKE_C_COMPILER=clang")
  endif()
  set(COHORT_FUZZ_SECONDS 30 CACHE STRING "Seconds each fuzz ctest runs its target")
  set(COHORT_FUZZ_SAN -fsanitize=address,undefined -fno-sanitize-recover=all
    -fno-omit-frame-pointer)

  # The sources under test, instrumented for coverage (fuzzer-no-link) and
  # sanitized. A static library, so each target pulls in only what it uses.
  file(GLOB COHORT_FUZZ_LIB_SOURCES CONFIGURE_DEPENDS
    ${CMAKE_SOURCE_DIR}/src/base/*.c ${CMAKE_SOURCE_DIR}/src/store/*.c
    ${CMAKE_SOURCE_DIR}/src/rdzv/*.c ${CMAKE_SOURCE_DIR}/src/doctor/*.c
    ${CMAKE_SOURCE_DIR}/src/manifest/*.c ${CMAKE_SOURCE_DIR}/src/plot/*.c
    ${CMAKE_SOURCE_DIR}/src/agent/*.c)
  add_library(cohort_fuzzlib STATIC ${COHORT_FUZZ_LIB_SOURCES}
    ${CMAKE_SOURCE_DIR}/src/gpt2/ckpt.c ${CMAKE_SOURCE_DIR}/src/gpt2/data.c)
  target_compile_options(cohort_fuzzlib PRIVATE -fsanitize=fuzzer-no-link ${COHORT_FUZZ_SAN})
  # The agent's compiled-in Python hook (src/agent/module.cmake writes it).
  target_include_directories(cohort_fuzzlib PRIVATE ${CMAKE_BINARY_DIR}/generated)
  target_link_libraries(cohort_fuzzlib PUBLIC Threads::Threads rt m PkgConfig::NETTLE PkgConfig::JANSSON ${CMAKE_DL_LIBS})

  add_custom_target(fuzz_all)
  # cohort_fuzz(<name> <harness.c> [SOURCES extra.c...] [ARGS libFuzzer flags...])
  function(cohort_fuzz name harness)
    cmake_parse_arguments(F "" "" "SOURCES;ARGS" ${ARGN})
    add_executable(${name} ${harness} ${F_SOURCES})
    target_compile_options(${name} PRIVATE -fsanitize=fuzzer ${COHORT_FUZZ_SAN})
    target_link_options(${name} PRIVATE -fsanitize=fuzzer ${COHORT_FUZZ_SAN})
    target_link_libraries(${name} PRIVATE cohort_fuzzlib)
    add_dependencies(fuzz_all ${name})
    add_test(NAME ${name}
      COMMAND ${CMAKE_SOURCE_DIR}/fuzz/run-target.sh $<TARGET_FILE:${name}>
              ${CMAKE_SOURCE_DIR}/fuzz/corpus/${name} ${COHORT_FUZZ_SECONDS}
              ${CMAKE_BINARY_DIR}/fuzz-results ${F_ARGS})
    math(EXPR limit "${COHORT_FUZZ_SECONDS} * 3 + 120")
    set_tests_properties(${name} PROPERTIES TIMEOUT ${limit} LABELS "fuzz")
  endfunction()

  # The store: its frame/message parser alone (the store helper's target) and
  # whole sessions through a live server's connection handling.
  cohort_fuzz(fuzz_store_proto ${CMAKE_SOURCE_DIR}/fuzz/fuzz_store_proto.c)
  cohort_fuzz(fuzz_store_session ${CMAKE_SOURCE_DIR}/fuzz/fuzz_store_session.c)
  # Rendezvous: multicast datagrams, node records and plans, scheduler
  # environments with Slurm hostlists, the shared rendezvous file.
  cohort_fuzz(fuzz_mcast_dgram ${CMAKE_SOURCE_DIR}/fuzz/fuzz_mcast_dgram.c)
  cohort_fuzz(fuzz_rdzv_plan ${CMAKE_SOURCE_DIR}/fuzz/fuzz_rdzv_plan.c)
  cohort_fuzz(fuzz_sched_env ${CMAKE_SOURCE_DIR}/fuzz/fuzz_sched_env.c)
  cohort_fuzz(fuzz_hostlist ${CMAKE_SOURCE_DIR}/fuzz/fuzz_hostlist.c)
  # The doctor's sysfs/proc readers over a tree built from the input.
  cohort_fuzz(fuzz_doctor_tree ${CMAKE_SOURCE_DIR}/fuzz/fuzz_doctor_tree.c)
  # The trainer's checkpoint and token-shard readers.
  cohort_fuzz(fuzz_gpt2_ckpt ${CMAKE_SOURCE_DIR}/fuzz/fuzz_gpt2_ckpt.c)
  cohort_fuzz(fuzz_gpt2_data ${CMAKE_SOURCE_DIR}/fuzz/fuzz_gpt2_data.c)
  # Command lines: value parsers and `cohort manifest` (pure: argv to text).
  cohort_fuzz(fuzz_cli ${CMAKE_SOURCE_DIR}/fuzz/fuzz_cli.c
    SOURCES ${CMAKE_SOURCE_DIR}/tools/cohort/cmd_manifest.c
            ${CMAKE_SOURCE_DIR}/tools/cohort/cmd_run.c ${CMAKE_SOURCE_DIR}/tools/cohort/cmd_token.c
            ${CMAKE_SOURCE_DIR}/tools/cli.c
    ARGS -close_fd_mask=3)
  # `cohort plot`'s metrics parser (the eco helper's target).
  cohort_fuzz(fuzz_plot ${CMAKE_SOURCE_DIR}/fuzz/fuzz_plot.c)
  # The agent's reader of PyTorch's error files.
  cohort_fuzz(fuzz_errfile ${CMAKE_SOURCE_DIR}/fuzz/fuzz_errfile.c)
  # The re-form control channel's messages (src/agent/control.c).
  cohort_fuzz(fuzz_control ${CMAKE_SOURCE_DIR}/fuzz/fuzz_control.c)
  # The same channel's messages as a re-formable worker reads them (libcohort's parser).
  cohort_fuzz(fuzz_coll_control ${CMAKE_SOURCE_DIR}/fuzz/fuzz_coll_control.c
    SOURCES ${CMAKE_SOURCE_DIR}/src/coll/control.c)
  # The abort record at the end of a TCP connection whose rank aborted (libcohort's transport).
  cohort_fuzz(fuzz_tcp_abort ${CMAKE_SOURCE_DIR}/fuzz/fuzz_tcp_abort.c
    SOURCES ${CMAKE_SOURCE_DIR}/src/coll/tcp.c)
  # The request parser of `cohort run --metrics-port`'s HTTP server.
  cohort_fuzz(fuzz_metrics_http ${CMAKE_SOURCE_DIR}/fuzz/fuzz_metrics_http.c)
  # What the agent reads from workers while it watches for hangs: stack
  # texts and progress files.
  cohort_fuzz(fuzz_stacks ${CMAKE_SOURCE_DIR}/fuzz/fuzz_stacks.c)
  # What `cohort status` and `cohort stacks` read from a job's store: the
  # nodes' snapshots and stack answers.
  cohort_fuzz(fuzz_status ${CMAKE_SOURCE_DIR}/fuzz/fuzz_status.c
    SOURCES ${CMAKE_SOURCE_DIR}/tools/cohort/cmd_status.c ${CMAKE_SOURCE_DIR}/tools/cohort/job.c
            ${CMAKE_SOURCE_DIR}/tools/cohort/cmd_stacks.c
            ${CMAKE_SOURCE_DIR}/tools/cohort/cmd_token.c
            ${CMAKE_SOURCE_DIR}/tools/cli.c
    ARGS -close_fd_mask=3)
endif()

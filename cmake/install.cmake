# Installation: the cohort command (and cohort-gpt2 when it is built),
# libcohort shared (versioned soname) and static, the public header, a
# pkg-config file, a CMake package (find_package(cohort) -> cohort::cohort)
# and the man pages.
include(CMakePackageConfigHelpers)

set(COHORT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/cohort)


# Consumers of the installed targets find the header under <prefix>/include.
target_include_directories(cohort_shared INTERFACE
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_include_directories(cohort_static INTERFACE
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# cohort::cohort is the shared library; cohort::cohort_static the archive.
set_target_properties(cohort_shared PROPERTIES EXPORT_NAME cohort)
set_target_properties(cohort_static PROPERTIES EXPORT_NAME cohort_static)

install(TARGETS cohort RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS cohort_shared cohort_static EXPORT cohortTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${CMAKE_SOURCE_DIR}/include/cohort/cohort.h
  ${CMAKE_BINARY_DIR}/generated/include/cohort/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cohort)
install(EXPORT cohortTargets NAMESPACE cohort:: DESTINATION ${COHORT_CMAKE_DIR})

# The package configuration: the static library needs Threads and Nettle
# from the consumer's side too (Nettle has no CMake package: pkg-config's).
set(COHORT_CONFIG_FILE ${CMAKE_BINARY_DIR}/cohortConfig.cmake)
file(WRITE ${COHORT_CONFIG_FILE}
"# cohortConfig.cmake - find_package(cohort) gives cohort::cohort (shared
# libcohort) and cohort::cohort_static.
include(CMakeFindDependencyMacro)
find_dependency(Threads)
find_dependency(PkgConfig)
pkg_check_modules(NETTLE REQUIRED IMPORTED_TARGET nettle>=3.4)
include(\${CMAKE_CURRENT_LIST_DIR}/cohortTargets.cmake)
")
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cohortConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${COHORT_CONFIG_FILE} ${CMAKE_BINARY_DIR}/cohortConfigVersion.cmake
  DESTINATION ${COHORT_CMAKE_DIR})

# pkg-config: the prefix is derived from the .pc file's own location so that
# `cmake --install --prefix` anywhere gives a working file.
file(RELATIVE_PATH COHORT_PC_UP /cohort-prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /cohort-prefix)
set(COHORT_PC_FILE ${CMAKE_BINARY_DIR}/cohort.pc)
file(WRITE ${COHORT_PC_FILE}
"prefix=\${pcfiledir}/${COHORT_PC_UP}
libdir=\${prefix}/${CMAKE_INSTALL_LIBDIR}
includedir=\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}

Name: cohort
Description: collectives for multi-node distributed training (allreduce, allgather, ...)
Version: ${PROJECT_VERSION}
Cflags: -I\${includedir}
Libs: -L\${libdir} -lcohort
Requires.private: nettle >= 3.4
Libs.private: -pthread -lrt -lm
")
install(FILES ${COHORT_PC_FILE} DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Man pages, written by hand next to the --help texts they describe.
install(FILES ${CMAKE_SOURCE_DIR}/docs/man/cohort.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)

# cohort-gpt2 is defined by src/gpt2/module.cmake, which is included after
# this file: decide at the end of the directory whether it exists.
function(cohort_install_gpt2)
  if(TARGET cohort-gpt2)
    install(TARGETS cohort-gpt2 RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
    install(FILES ${CMAKE_SOURCE_DIR}/docs/man/cohort-gpt2.1
      DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
  endif()
endfunction()
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL cohort_install_gpt2)

# `make install-torchrun`: a link named torchrun to cohort, which then runs as
# `cohort run` with torchrun's help and defaults (tools/cohort/main.c). Only
# when asked: the component is left out of a plain install.
install(CODE "execute_process(COMMAND \${CMAKE_COMMAND} -E create_symlink cohort
  \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/torchrun\")
  message(STATUS \"Installing: \${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/torchrun -> cohort\")"
  COMPONENT torchrun EXCLUDE_FROM_ALL)

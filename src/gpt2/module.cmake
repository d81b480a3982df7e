# cohort-gpt2: the GPT-2 data-parallel trainer. A static library `gpt2`
# (model, kernels, optimiser, data, checkpoints, data parallelism) and the
# executable built from tools/gpt2/main.c. Matrix products use Debian's
# OpenBLAS (libopenblas-dev); the other kernels use OpenMP.
find_package(OpenMP REQUIRED COMPONENTS C)
find_library(GPT2_OPENBLAS NAMES openblas REQUIRED)
find_path(GPT2_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu REQUIRED)

add_library(gpt2_objects OBJECT)
cohort_module(gpt2_objects)
set_target_properties(gpt2_objects PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(gpt2_objects PUBLIC ${GPT2_CBLAS_INCLUDE})
target_link_libraries(gpt2_objects PUBLIC OpenMP::OpenMP_C PkgConfig::JANSSON)
# The kernels are the hot loops of the trainer: optimise them fully even in
# RelWithDebInfo builds (not in Debug, which the sanitizer build uses).
# -fno-math-errno and -fno-trapping-math let sqrtf and the selects of the
# element-wise kernels vectorise (nothing here reads errno or FP exception
# flags); rounding is unchanged.
if(NOT CMAKE_BUILD_TYPE STREQUAL "Debug")
  target_compile_options(gpt2_objects PRIVATE -O3)
endif()
target_compile_options(gpt2_objects PRIVATE -fno-math-errno -fno-trapping-math)

add_library(gpt2 STATIC $<TARGET_OBJECTS:gpt2_objects>)
target_include_directories(gpt2 PUBLIC ${GPT2_CBLAS_INCLUDE})
target_link_libraries(gpt2 PUBLIC cohort_static OpenMP::OpenMP_C PkgConfig::JANSSON
  ${GPT2_OPENBLAS} m)

# The trainer is an ordinary libcohort user (include/cohort/cohort.h only).
# The same objects linked as a shared library against the shared libcohort,
# which exports only the COHORT_API functions, with no undefined symbol
# allowed: a call into libcohort's internals fails this link. (The sanitizer
# runtime is linked into executables only, so the check is off there.)
add_library(gpt2_public_api_check SHARED $<TARGET_OBJECTS:gpt2_objects>)
target_link_libraries(gpt2_public_api_check PRIVATE cohort_shared OpenMP::OpenMP_C
  PkgConfig::JANSSON ${GPT2_OPENBLAS} m)
if(NOT COHORT_SANITIZE)
  target_link_options(gpt2_public_api_check PRIVATE -Wl,--no-undefined)
endif()
add_dependencies(gpt2 gpt2_public_api_check)

add_executable(cohort-gpt2 ${CMAKE_SOURCE_DIR}/tools/gpt2/main.c)
target_link_libraries(cohort-gpt2 PRIVATE gpt2)

# The sgemm yardstick of the training benchmark (bench/train/run.py).
add_executable(gpt2-sgemm-rate ${CMAKE_SOURCE_DIR}/bench/train/sgemm_rate.c)
target_link_libraries(gpt2-sgemm-rate PRIVATE gpt2)

# PowerSGD's compression and the gradient passes, stage by stage (bench/train/psgd_rate.c).
add_executable(gpt2-psgd-rate ${CMAKE_SOURCE_DIR}/bench/train/psgd_rate.c)
target_link_libraries(gpt2-psgd-rate PRIVATE gpt2)

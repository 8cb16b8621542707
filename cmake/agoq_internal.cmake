# Settings for agoq's own tests, benchmarks and examples (never imposed on users).

include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # Explicit list: "native" fails on machines without a GPU.
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  enable_language(CUDA)
  set(AGOQ_HAS_CUDA ON)
else()
  set(AGOQ_HAS_CUDA OFF)
  message(STATUS "agoq: nvcc not found; device tests, benchmarks and examples are skipped")
endif()

# agoq_target_options(<target>): warnings, the host ISA, C++20.
function(agoq_target_options target)
  target_link_libraries(${target} PRIVATE agoq::agoq)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>
    # CMake 3.25 knows no CUDA20 dialect for nvcc, so the standard is passed directly.
    $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 -Xcompiler=-Wall,-Wextra --Werror all-warnings>)
  if(AGOQ_WERROR)
    # ptxas warns of every kernel that spills registers to local memory, which --Werror makes an
    # error: CI keeps every kernel of the dispatch set free of spills on each architecture.
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror -Xptxas=-warn-spills>)
  endif()
  if(AGOQ_HOST_ARCH)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-march=${AGOQ_HOST_ARCH}>
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-march=${AGOQ_HOST_ARCH}>)
  endif()
endfunction()

# NCCL ships with the CUDA toolkit (nccl.h, libnccl). agoq's own NCCL adapter check and device test
# use it through this imported target; users link NCCL themselves.
if(AGOQ_HAS_CUDA)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    add_library(agoq_nccl UNKNOWN IMPORTED)
    set_target_properties(agoq_nccl PROPERTIES
      IMPORTED_LOCATION ${NCCL_LIBRARY}
      INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
    set(AGOQ_HAS_NCCL ON)
  else()
    set(AGOQ_HAS_NCCL OFF)
    message(STATUS "agoq: NCCL not found next to the CUDA toolkit; the NCCL adapter is not tested")
  endif()
endif()

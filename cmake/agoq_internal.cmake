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
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror>)
  endif()
  if(AGOQ_HOST_ARCH)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-march=${AGOQ_HOST_ARCH}>
      $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-march=${AGOQ_HOST_ARCH}>)
  endif()
endfunction()

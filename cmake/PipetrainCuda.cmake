# Decides PIPETRAIN_WITH_CUDA: ON when a CUDA toolkit (nvcc) is found, OFF otherwise.
# The build works either way; only the `cuda` backend and GPU tests depend on it.
include(CheckLanguage)

if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(_pipetrain_cuda_default ON)
else()
  set(_pipetrain_cuda_default OFF)
endif()
option(PIPETRAIN_WITH_CUDA "Build the CUDA backend (auto: ON when nvcc is found)" ${_pipetrain_cuda_default})

if(PIPETRAIN_WITH_CUDA)
  # CMake 3.25 does not know nvcc's C++20 flag, and static cudart would be linked
  # into every executable; both are set before the language is enabled.
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)  # sm_90 SASS plus compute_90 PTX
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
endif()

# NCCL, for the replicas of CUDA stages (stage_server/collective/nccl_reducer.h): the
# toolkit's libnccl when it has one. Without it replicas reduce with gloo, CUDA or not.
set(PIPETRAIN_WITH_NCCL OFF)
if(PIPETRAIN_WITH_CUDA)
  find_path(PIPETRAIN_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(PIPETRAIN_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(PIPETRAIN_NCCL_INCLUDE_DIR AND PIPETRAIN_NCCL_LIBRARY)
    set(PIPETRAIN_WITH_NCCL ON)
    add_library(pipetrain::nccl SHARED IMPORTED)
    set_target_properties(pipetrain::nccl PROPERTIES
      IMPORTED_LOCATION "${PIPETRAIN_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${PIPETRAIN_NCCL_INCLUDE_DIR}")
  endif()
endif()

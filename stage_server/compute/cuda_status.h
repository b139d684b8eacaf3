// CUDA runtime and cuBLAS errors as absl::Status, shared by the cuda backend's source files (the
// backend and its copy staging), so that every message has the same form and names the
// op that failed. Include only from CUDA-only sources.
#pragma once

#include <string>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pipetrain::compute {

// "cuda backend: <what>: <error name> (<description>)"; out of memory is
// ResourceExhausted, anything else Internal.
inline absl::Status CudaStatus(cudaError_t e, const std::string& what) {
  std::string msg = absl::StrCat("cuda backend: ", what, ": ", cudaGetErrorName(e), " (",
                                 cudaGetErrorString(e), ")");
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

// The same for cuBLAS results.
inline absl::Status CublasStatus(cublasStatus_t s, const std::string& what) {
  std::string msg = absl::StrCat("cuda backend: ", what, ": ", cublasGetStatusName(s), " (",
                                 cublasGetStatusString(s), ")");
  if (s == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace pipetrain::compute

// CUDA_CHECK(expr, describe...): returns a Status naming the op (the StrCat of the
// remaining arguments, built only on failure) if expr is not cudaSuccess.
#define CUDA_CHECK(expr, ...)                                                      \
  do {                                                                             \
    if (cudaError_t _pt_e = (expr); _pt_e != cudaSuccess) {                        \
      return ::pipetrain::compute::CudaStatus(_pt_e, absl::StrCat(__VA_ARGS__));   \
    }                                                                              \
  } while (false)

// CUBLAS_CHECK(expr, describe...): CUDA_CHECK for cuBLAS results.
#define CUBLAS_CHECK(expr, ...)                                                    \
  do {                                                                             \
    if (cublasStatus_t _pt_s = (expr); _pt_s != CUBLAS_STATUS_SUCCESS) {           \
      return ::pipetrain::compute::CublasStatus(_pt_s, absl::StrCat(__VA_ARGS__)); \
    }                                                                              \
  } while (false)

// CudaBackend::Run, the one preamble and epilogue of every op of the cuda backend
// (cuda_backend.h), for the files that define ops (cuda_backend_ops.cc,
// cuda_backend_llama.cc). Include only from CUDA-only sources.
#pragma once

#include <type_traits>

#include <cuda_runtime_api.h>

#include "common/status_macros.h"
#include "stage_server/compute/cuda_backend.h"
#include "stage_server/compute/cuda_status.h"
#include "stage_server/compute/op_checks.h"

namespace pipetrain::compute {

template <typename Launch>
absl::Status CudaBackend::Run(const OpCall& call, Launch&& launch) {
  if (call.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(Activate(call.op()));
  cudaStream_t stream = stream_;
  using Result = std::invoke_result_t<Launch, cudaStream_t>;
  if constexpr (std::is_same_v<Result, cudaError_t>) {
    CUDA_CHECK(launch(stream), call.ToString());
  } else {
    RETURN_IF_ERROR(launch(stream));
  }
  if (!options_.check_every_op) return absl::OkStatus();
  return Finish(call.ToString());
}

}  // namespace pipetrain::compute

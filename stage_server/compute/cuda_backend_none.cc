// Build of the `cuda` backend's factory without the CUDA toolkit
// (PIPETRAIN_WITH_CUDA=OFF): there is never a GPU, and callers learn why.
#include "absl/strings/str_cat.h"
#include "common/cuda_probe.h"
#include "stage_server/compute/cuda_backend.h"

namespace pipetrain::compute {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device,
                                                           CudaBackendOptions options) {
  return absl::FailedPreconditionError(
      absl::StrCat("no usable GPU: ", common::ProbeCuda().reason, "; use --device cpu"));
}

}  // namespace pipetrain::compute

// A build without NCCL (no CUDA toolkit, or one without libnccl): replicas reduce with
// gloo, and CudaPlace says why.
#include "absl/strings/str_cat.h"
#include "stage_server/collective/nccl_reducer.h"
#include "stage_server/collective/reducer_choice.h"

namespace pipetrain::stage_server::collective {

bool NcclBuilt() { return false; }

std::string CudaPlace(int cuda_device) {
  return absl::StrCat("cuda:", cuda_device, ", built without NCCL");
}

absl::StatusOr<std::unique_ptr<GradientReducer>> CreateNcclReducer(const ReducerOptions& options,
                                                                   int cuda_device,
                                                                   CoordinatorStore&, absl::Time) {
  return absl::FailedPreconditionError(
      absl::StrCat(ReducerWho(options), ": cannot reduce on cuda:", cuda_device,
                   " with NCCL: this build has none (configure with the CUDA toolkit's libnccl)"));
}

}  // namespace pipetrain::stage_server::collective

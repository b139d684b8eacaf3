// CudaIpcRegion in a build without CUDA: there is no device memory to share.
#include "stage_server/link/shm/cuda_ipc_region.h"

namespace pipetrain::stage_server {
namespace {

absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "CUDA IPC region: this build has no CUDA (configure with the toolkit under /usr/local/cuda)");
}

}  // namespace

absl::StatusOr<CudaIpcRegion> CudaIpcRegion::Create(int, uint64_t) { return NoCuda(); }
absl::StatusOr<CudaIpcRegion> CudaIpcRegion::Open(int, const std::string&, uint64_t) {
  return NoCuda();
}
CudaIpcRegion::CudaIpcRegion(CudaIpcRegion&& o) noexcept
    : bytes_(o.bytes_), opened_(o.opened_), handle_(std::move(o.handle_)) {}
CudaIpcRegion::~CudaIpcRegion() = default;
absl::Status CudaIpcRegion::CheckRange(uint64_t, uint64_t, const char*) const { return NoCuda(); }
absl::Status CudaIpcRegion::CopyIn(uint64_t, const void*, uint64_t) { return NoCuda(); }
absl::Status CudaIpcRegion::CopyOut(uint64_t, void*, uint64_t) const { return NoCuda(); }

}  // namespace pipetrain::stage_server

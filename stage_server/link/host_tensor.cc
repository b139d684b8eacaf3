#include "stage_server/link/host_tensor.h"

#include <utility>

#include "common/checked_math.h"
#include "common/status_macros.h"

namespace pipetrain::stage_server {

uint64_t SaturatingTensorBytes(common::DType dtype, std::span<const int64_t> shape) {
  uint64_t bytes = common::DTypeSize(dtype);
  for (int64_t d : shape) {
    if (d <= 0) return 0;
    bytes = common::SaturatingMul(bytes, static_cast<uint64_t>(d));
  }
  return bytes;
}

absl::StatusOr<common::Tensor> PooledTensor(common::BufferPool& pool, common::DType dtype,
                                            std::vector<int64_t> shape) {
  ASSIGN_OR_RETURN(const uint64_t n, common::NumElements(shape));
  common::Buffer buffer = pool.Acquire(n * common::DTypeSize(dtype));
  return common::Tensor::FromBuffer(dtype, std::move(shape), std::move(buffer));
}

}  // namespace pipetrain::stage_server

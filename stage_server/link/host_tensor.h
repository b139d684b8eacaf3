// The stage's host tensors: their byte size from dtype and shape (common::DTypeSize,
// the one dtype table), saturating for shapes a request sets, and a tensor whose
// buffer comes from the stage's BufferPool (the executor gives it back once sent).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/buffer_pool.h"
#include "common/tensor.h"

namespace pipetrain::stage_server {

// The dtype's size times the elements, UINT64_MAX instead of overflowing, 0 when a
// dimension is not positive: for sizing before anything is allocated.
uint64_t SaturatingTensorBytes(common::DType dtype, std::span<const int64_t> shape);

// Contents are whatever the pooled buffer held: the caller fills them.
absl::StatusOr<common::Tensor> PooledTensor(common::BufferPool& pool, common::DType dtype,
                                            std::vector<int64_t> shape);

}  // namespace pipetrain::stage_server

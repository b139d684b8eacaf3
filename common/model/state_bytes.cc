#include "common/model/state_bytes.h"

#include "common/tensor.h"

namespace pipetrain::model {

using common::DType;
using common::DTypeSize;

uint64_t WeightBytesPerParam() { return DTypeSize(DType::kF32); }

uint64_t GradientBytesPerParam() { return DTypeSize(DType::kF32); }

uint64_t OptimizerBytesPerParam() { return 2 * DTypeSize(DType::kF32); }

uint64_t StateBytesPerParam() {
  return WeightBytesPerParam() + GradientBytesPerParam() + OptimizerBytesPerParam();
}

uint64_t CheckpointBytesPerParam() { return WeightBytesPerParam() + OptimizerBytesPerParam(); }

}  // namespace pipetrain::model

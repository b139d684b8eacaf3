#include "common/model/state_bytes.h"

#include "common/tensor.h"

namespace pipetrain::model {

using common::DType;
using common::DTypeSize;

uint64_t WeightBytesPerParam() { return DTypeSize(DType::kF32); }

uint64_t GradientBytesPerParam() { return DTypeSize(DType::kF32); }

uint64_t OptimizerBytesPerParam() { return 2 * DTypeSize(DType::kF32); }

uint64_t ProductCopyBytesPerParam(DType products) {
  return products == DType::kF32 ? 0 : DTypeSize(products);
}

uint64_t StateBytesPerParam(DType products) {
  return WeightBytesPerParam() + GradientBytesPerParam() + OptimizerBytesPerParam() +
         ProductCopyBytesPerParam(products);
}

uint64_t CheckpointBytesPerParam() { return WeightBytesPerParam() + OptimizerBytesPerParam(); }

}  // namespace pipetrain::model

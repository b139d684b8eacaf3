// Bytes one parameter takes in each kind of training state, from the dtype table: the
// planner predicts a stage's memory with these and the stage allocates and reports with
// them, so the two cannot disagree. Master weights, gradients and moments are fp32 in
// every precision; bf16 products add the weights' bf16 copy the products read.
#pragma once

#include <cstdint>

#include "common/tensor.h"

namespace pipetrain::model {

uint64_t WeightBytesPerParam();     // the master weight
uint64_t GradientBytesPerParam();   // its gradient (accumulated, all-reduced between replicas)
uint64_t OptimizerBytesPerParam();  // AdamW's two moments
// The copy of a weight the matrix products read, in their operands' dtype, made once
// per step after the optimizer (compute::PipelineLayer::ProductCopy): none when they
// read the fp32 master weight itself, 2 bytes with bf16 products.
uint64_t ProductCopyBytesPerParam(common::DType products);
// What a stage holds for a parameter: weight, gradient, moments and the products' copy
// (16 bytes in fp32, 18 with bf16 products, as Megatron counts for bf16 training).
uint64_t StateBytesPerParam(common::DType products = common::DType::kF32);
// What a checkpoint or an in-memory snapshot stores: weight and moments, no gradient.
uint64_t CheckpointBytesPerParam();

}  // namespace pipetrain::model

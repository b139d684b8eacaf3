// Bytes one parameter takes in each kind of training state, from the dtype table: the
// planner predicts a stage's memory with these and the stage allocates and reports with
// them, so the two cannot disagree. fp32 throughout today; a precision (bf16 compute
// copies with fp32 master weights) changes them here and nowhere else.
#pragma once

#include <cstdint>

namespace pipetrain::model {

uint64_t WeightBytesPerParam();     // the master weight
uint64_t GradientBytesPerParam();   // its gradient (accumulated, all-reduced between replicas)
uint64_t OptimizerBytesPerParam();  // AdamW's two moments
// What a stage holds for a parameter: weight, gradient and moments.
uint64_t StateBytesPerParam();
// What a checkpoint or an in-memory snapshot stores: weight and moments, no gradient.
uint64_t CheckpointBytesPerParam();

}  // namespace pipetrain::model

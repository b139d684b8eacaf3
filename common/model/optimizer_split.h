// How the R copies (data-parallel replicas) of one stage split its optimizer between them
// (pipeline.shard_optimizer; ZeRO-1, Megatron's distributed optimizer): every
// parameter buffer of the stage is cut into R contiguous pieces, copy r owns piece r of
// each, reduces only that piece of the gradient, keeps AdamW's moments only for it and
// updates only its weights, and the copies gather each other's updated pieces. Cutting
// every buffer, not the stage's parameters as one list, keeps the reduction layer by
// layer, overlapped with the backward as the all-reduce is. Pure: the collectives, the
// compute and the planner all take their pieces from here, so they cannot disagree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace pipetrain::model {

// [begin, end) of a buffer's elements.
struct CopyRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
  bool operator==(const CopyRange&) const = default;
};

// The piece of a buffer of `elements` that copy `copy` of `copies` owns: pieces in copy
// order, sizes differing by at most one (the larger ones last), together the buffer.
// copies >= 1 and 0 <= copy < copies; a piece is empty where elements < copies.
CopyRange RangeOfCopy(uint64_t elements, int copies, int copy);

// Every copy's piece size, in copy order: the per-rank counts a collective takes.
std::vector<uint64_t> PieceSizes(uint64_t elements, int copies);

// FAILED_PRECONDITION, naming the job and the stage, where a stage of `params`
// parameters has fewer than `copies` to split (some copy would own none).
absl::Status CheckSplit(const std::string& job_id, int stage, uint64_t params, int copies);

// What a stage holds for a parameter when its `copies` copies split the optimizer: the
// weight, its gradient (whole: every micro-batch accumulates into all of it) and the
// products' copy as before, AdamW's two moments for 1/copies of the parameters. The fp32
// master weights stay whole: the forward reads them directly (embeddings, norms, biases,
// and the products themselves in fp32). fp32: 16 bytes -> 8 + 8/copies.
double SplitStateBytesPerParam(common::DType products, int copies);

}  // namespace pipetrain::model

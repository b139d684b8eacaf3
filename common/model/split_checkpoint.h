// A checkpoint of a stage whose data-parallel copies split the optimizer
// (optimizer_split.h): each copy exports the stage's whole weights but AdamW's moments
// for its own piece of every layer only (zeros elsewhere). Joining the copies' exports
// takes each moment element from the copy that owns it, so the result is the checkpoint
// one unsplit stage would have written, bit for bit, and resumes on any layout. Pure.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/checkpoint.h"

namespace pipetrain::model {

// `copies[r]` is copy r's export of the same layer range (copies.size() copies in all).
// INVALID_ARGUMENT, naming `what` and the copy, when they differ in model, range, step or
// precision, when one lacks optimizer state or a tensor, or when their weights differ
// (the copies gather every update, so they never should).
absl::StatusOr<Checkpoint> JoinCopies(std::vector<Checkpoint> copies, const std::string& what);

}  // namespace pipetrain::model

// Moves a model chunk's state in and out of checkpoints: its parameters, and
// optionally AdamW's moments and step count, by Hugging Face name.
#pragma once

#include "absl/status/statusor.h"
#include "common/model/checkpoint.h"
#include "stage_server/compute/model_chunk.h"

namespace pipetrain::compute {

absl::StatusOr<model::Checkpoint> CheckpointOfChunk(const ModelChunk& chunk, bool with_optimizer);
// The chunk's gradients in checkpoint form (each under its parameter's name), as
// `pipetrain eval --grads-out` writes them.
absl::StatusOr<model::Checkpoint> GradientsOfChunk(const ModelChunk& chunk);
// The checkpoint must hold exactly the chunk's layer range of the same model; its
// optimizer state, when present, replaces the chunk's.
absl::Status RestoreChunk(const model::Checkpoint& checkpoint, ModelChunk& chunk);

}  // namespace pipetrain::compute

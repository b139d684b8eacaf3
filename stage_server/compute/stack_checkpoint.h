// Moves a layer stack's state in and out of checkpoints: its parameters, and
// optionally AdamW's moments and step count, by Hugging Face name.
#pragma once

#include "absl/status/statusor.h"
#include "common/model/checkpoint.h"
#include "stage_server/compute/layer_stack.h"

namespace pipetrain::compute {

absl::StatusOr<model::Checkpoint> CheckpointOfStack(const LayerStack& stack, bool with_optimizer);
// The stack's gradients in checkpoint form (each under its parameter's name), as
// `pipetrain eval --grads-out` writes them.
absl::StatusOr<model::Checkpoint> GradientsOfStack(const LayerStack& stack);
// The checkpoint must hold exactly the stack's layer range of the same model; its
// optimizer state, when present, replaces the stack's.
absl::Status RestoreStack(const model::Checkpoint& checkpoint, LayerStack& stack);

}  // namespace pipetrain::compute

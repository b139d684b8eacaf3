// Forward-only (evaluation) schedules: every micro-batch through every stage's chunks
// once, with the activation sends and receives and nothing else, so the coordinator
// can measure a validation loss through the pipeline without changing the weights.
#pragma once

#include "absl/status/statusor.h"
#include "common/schedule/stage_program.h"

namespace pipetrain::planner {

// Lowered, validated programs (forward_only set, named "eval"), one per stage.
// Micro-batches go in groups of K, each group through chunk 0, then chunk 1, ..., as
// Megatron's interleaved order, so that with v chunks a stage starts chunk c + 1 of a
// micro-batch as soon as the last stage has passed its chunk c on. Any M >= 1 works
// (the last group may be short). Errors name the job-spec field (pipeline.stages,
// pipeline.micro_batches, pipeline.chunks). `placement` is the training schedule's: the
// chunks are where it put them.
absl::StatusOr<schedule::Schedule> ForwardOnlySchedule(
    int stages, int micro_batches, int chunks,
    schedule::Placement placement = schedule::Placement::kLooped);

}  // namespace pipetrain::planner

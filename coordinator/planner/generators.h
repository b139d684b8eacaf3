// Schedule generation: the programs of a schedule from the table (schedule_registry.h)
// for stages K, micro-batches M and chunks v, compute-only (F, B or I/W, OPT), one per
// stage, each carrying its in-flight bound. lowering.h turns them into programs with
// sends and receives.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/schedule/stage_program.h"
#include "coordinator/planner/schedule_registry.h"

namespace pipetrain::planner {

// Limits far above any real job, so that a typo cannot make the planner build programs
// of billions of actions.
inline constexpr int kMaxStages = 1024;
inline constexpr int kMaxMicroBatches = 65536;
inline constexpr int kMaxChunks = 64;

// Whether (K, M, v) suits the schedule; errors name the job-spec field
// (pipeline.stages, pipeline.micro_batches, pipeline.chunks). A chunked schedule needs
// v >= 2, the others v = 1; then the row's own check (interleaved: M a multiple of K).
absl::Status CheckShape(ScheduleKind kind, int stages, int micro_batches, int chunks);

// Stage `stage`'s program with its shape and no action yet; `schedule` names it.
schedule::StageProgram EmptyProgram(absl::string_view schedule, int stage, int stages,
                                    int micro_batches, int chunks);

absl::StatusOr<schedule::Schedule> Generate(ScheduleKind kind, int stages, int micro_batches,
                                            int chunks = 1);

}  // namespace pipetrain::planner

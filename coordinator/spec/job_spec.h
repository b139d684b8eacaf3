// Job specs as users write them: JSON in the protobuf JSON mapping of JobSpec with
// snake_case names. Parsing names unknown fields by their path, `--set a.b=VALUE`
// overrides any field, defaults are filled in one place, and Validate checks everything
// that can be checked without a cluster, each error naming its field.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/planner/planner.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

// Applies overrides "PATH=VALUE" (PATH a dotted field path such as pipeline.stages or
// training.lr) to a JSON object text, creating intermediate objects as needed. VALUE is
// taken as JSON when it parses as a number, true, false, null or a quoted string, and
// as a plain string otherwise (--set pipeline.schedule=gpipe); a string field of JobSpec
// takes an unquoted value as typed (--set name=2024). Errors name the override.
absl::StatusOr<std::string> ApplyOverrides(absl::string_view json,
                                           const std::vector<std::string>& overrides);

// Parses a spec. INVALID_ARGUMENT for malformed JSON (with line and column), unknown
// fields ("unknown field 'pipeline.stagse'", every one of them), and values of the
// wrong type (naming the field).
absl::StatusOr<pipetrain::v1::JobSpec> ParseJobSpec(absl::string_view json);

// The spec with every unset field given its default: pipeline.schedule "1f1b"
// (planner::kDefaultSchedule), pipeline.chunks 1 (2 for a chunked schedule such as
// interleaved), pipeline.recompute "never",
// pipeline.micro_batches = stages, pipeline.replicas 1, training.beta1 0.9, beta2 0.95, weight_decay 0.1,
// data.validation_fraction 0.05 (none with data.validation_tokens), data.format "llmc"
// for data.tokens, checkpoint.snapshot_every_steps 1, fault_tolerance.max_restarts 3 and
// wait_for_stages_s 60, name = the name of the corpus file or of the first data.tokens entry.
pipetrain::v1::JobSpec WithDefaults(pipetrain::v1::JobSpec spec);

// Checks a spec (after WithDefaults) without looking at the cluster or the data files:
// model shape, pipeline (schedule and recompute names, chunks, stages <= pipeline layers,
// replicas in [1, 1024], replicas x micro-batches dividing the batch: "training.batch_size:
// 12 is not divisible by pipeline.replicas 2 x pipeline.micro_batches 4 = 8; ..."), training (steps > 0, lr > 0, betas in [0, 1),
// grad_clip_norm >= 0), data (exactly one of corpus and tokens, format, no empty path,
// validation_tokens only with tokens and without validation_fraction, which is in [0, 1)),
// checkpoint (every_steps >= 0, snapshot_every_steps >= 0), fault_tolerance
// (max_restarts in [0, 1000], wait_for_stages_s in [0, 86400]). The first error, naming its field, e.g.
// "training.batch_size: 10 is not divisible by pipeline.micro_batches 4".
// With pipeline.schedule "auto" (IsAutoSchedule), the pipeline's shape is left to the
// coordinator's planner at submit (coordinator/auto/auto_schedule.h): pipeline.stages,
// replicas, micro_batches, chunks, recompute and schedule_file must be unset (each set
// one is refused, naming it), and the rest is checked as it would be with K = R = M = 1.
absl::Status ValidateJobSpec(const pipetrain::v1::JobSpec& spec);
// ValidateJobSpec, answering the plan options it read from the spec
// (planner::OptionsFromJobSpec's; an "auto" spec's with K = R = M = 1), so that whoever
// plans next does not read them again: a schedule file is parsed and checked once.
absl::StatusOr<planner::PlanOptions> ValidatedPlanOptions(const pipetrain::v1::JobSpec& spec);

// Whether the job's replicas split the optimizer: pipeline.shard_optimizer (unset: true)
// and more than one replica.
bool SplitsOptimizer(const pipetrain::v1::JobSpec& spec);

// pipeline.schedule "auto": the coordinator chooses the shape when the job is submitted.
inline constexpr char kAutoSchedule[] = "auto";
bool IsAutoSchedule(const pipetrain::v1::JobSpec& spec);
// The spec with the one-stage shape (K = R = M = v = 1, gpipe, no recompute) in place of
// "auto": what validation and the planner's base options read the rest of the spec from.
pipetrain::v1::JobSpec WithPlaceholderShape(pipetrain::v1::JobSpec spec);

// The spec as pretty JSON (snake_case names, defaults included), for `status --json`.
std::string JobSpecToJson(const pipetrain::v1::JobSpec& spec);

}  // namespace pipetrain::coordinator

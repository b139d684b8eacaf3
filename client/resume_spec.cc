#include "client/resume_spec.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/job_state.h"
#include "common/model/checkpoint_folder.h"

namespace pipetrain::client {

namespace pb = ::pipetrain::v1;

absl::StatusOr<pb::JobSpec> ResumeSpec(const pb::JobStatus& job) {
  const std::string& id = job.job_id();
  switch (job.state()) {
    case pb::JobStatus::FAILED:
    case pb::JobStatus::CANCELLED:
      break;
    case pb::JobStatus::SUCCEEDED:
      return absl::FailedPreconditionError(absl::StrCat(
          id, " succeeded: it has no steps left. To train further, submit its spec with "
              "--init-from ", job.checkpoint_dir().empty() ? "ITS_CHECKPOINT" : job.checkpoint_dir(),
          " and the number of steps to add in training.steps"));
    default:
      return absl::FailedPreconditionError(absl::StrCat(
          id, " has not stopped (", pb::JobStatus::State_Name(job.state()),
          "): only a failed or cancelled job can be resumed ('pipetrain cancel ", id,
          "' first to restart it)"));
  }
  const std::string& dir = job.checkpoint_dir();
  if (dir.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        id, " stopped before its first checkpoint, so there is nothing to resume from: "
            "submit its spec again (checkpoint.every_steps makes checkpoints more often)"));
  }
  // The coordinator names checkpoints DIR/step-N, N the training run's step.
  const std::optional<int64_t> found = model::CheckpointFolderStep(dir);
  if (!found) {
    return absl::InvalidArgumentError(absl::StrCat(
        id, ": cannot tell the step of checkpoint '", dir,
        "' (expected a folder named step-N); submit with --init-from it instead"));
  }
  const int64_t step = *found;
  // Both count the training run's steps: the job ran first_step .. its last step.
  const int64_t planned = common::JobLastStep(job);
  if (step >= planned) {
    return absl::FailedPreconditionError(absl::StrCat(
        id, ": its checkpoint '", dir, "' is at step ", step, " of ", planned,
        ", so no steps are left"));
  }
  pb::JobSpec spec = job.spec();
  spec.set_init_from(dir);
  spec.mutable_training()->set_steps(static_cast<int32_t>(planned - step));
  return spec;
}

}  // namespace pipetrain::client

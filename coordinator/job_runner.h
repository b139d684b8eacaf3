// Drives one job on the stages it was given: plans it, configures every stage (and
// loads the starting checkpoint), runs the steps (stage 0 gets the token micro-batches,
// the last stage the targets, all stages run at once), measures a validation loss,
// writes checkpoints, and says how it ended. The calls to the stages go through a
// StageGroup; the requests come from stage_configure.h. It knows nothing of the job
// store or the registry: it reports through hooks, which the job manager turns into
// records.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/rpc_security.h"
#include "coordinator/stage_group.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

struct RunnerOptions {
  std::string checkpoint_root;                  // checkpoints go to ROOT/step-N/
  absl::Duration step_deadline = absl::Minutes(10);
  absl::Duration rpc_deadline = absl::Minutes(2);  // Configure, export, import
  int recv_deadline_ms = 30000;                 // a stage's longest wait for a peer
  common::RpcSecurity security;                 // TLS and token for calls to the stages
};

struct RunnerHooks {
  std::function<void(const std::string&)> log;
  std::function<void(const pipetrain::v1::StepRecord&,
                     std::vector<pipetrain::v1::TimelineEvent>)> step;
  std::function<void(const std::string& dir, int64_t step)> checkpoint;
  // The rates the latest steps measured (for `plan --costs-from`); may be unset.
  std::function<void(const pipetrain::v1::MeasuredCostRates&)> measured;
  std::function<bool()> cancelled;
};

struct RunOutcome {
  pipetrain::v1::JobStatus::State state = pipetrain::v1::JobStatus::FAILED;
  std::string reason;
  std::vector<std::string> lost_stage_ids;  // stages that stopped answering
};

// `spec` must have passed ValidateJobSpec (with defaults filled in).
RunOutcome RunJob(const std::string& job_id, const pipetrain::v1::JobSpec& spec,
                  const std::vector<RunnerStage>& stages, const RunnerOptions& options,
                  const RunnerHooks& hooks);

}  // namespace pipetrain::coordinator

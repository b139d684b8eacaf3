// Drives one job on the stages it was given: plans it, configures every stage (and
// loads the starting checkpoint), runs the steps (stage 0 gets the token micro-batches,
// the last stage the targets, all stages run at once), measures a validation loss,
// writes checkpoints, and says how it ended. The calls to the stages go through a
// StageGroup (over a StageConnector: gRPC, or fakes in tests); the requests come from
// stage_configure.h. It knows nothing of the job store or the registry: it reports
// through RunnerHooks, which the job manager's JobReporter turns into records.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/model/checkpoint.h"
#include "common/rpc_security.h"
#include "common/user_path.h"
#include "coordinator/stages/stage_group.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

struct RunnerOptions {
  std::string checkpoint_root;                  // checkpoints go to ROOT/step-N/
  absl::Duration step_deadline = absl::Minutes(10);
  absl::Duration rpc_deadline = absl::Minutes(2);  // Configure, export, import
  int recv_deadline_ms = 30000;                 // a stage's longest wait for a peer
  common::RpcSecurity security;                 // TLS and token for calls to the stages
  // --data-root: the folders a job's paths must resolve into (none: any path). Checked
  // at Submit and again before each run reads them (a symlink may have changed).
  common::DataRoots data_roots;
  // How the stages are called; null: gRPC with `security` (grpc_stage_connector.h).
  // Tests hand in fakes (tests/testing/fake_stages.h).
  std::shared_ptr<StageConnector> connector;
};

// What a run reports to whoever drives it, and what it asks of it (whether to stop).
// The coordinator's is JobReporter (job_reporter.h: store records, events,
// TensorBoard); tests record. Called from the run's thread only.
class RunnerHooks {
 public:
  virtual ~RunnerHooks() = default;
  virtual void Log(const std::string& text) = 0;
  // The training run's number of the job's first step (once, before the first step).
  virtual void FirstStep(int64_t first) = 0;
  // Each step as the simulator predicted it from the costs measured on the steps before
  // (the planner's costs before any), drawn under the measured step; just before Step.
  virtual void PredictedTimeline(std::vector<pipetrain::v1::TimelineEvent> events) = 0;
  virtual void Step(const pipetrain::v1::StepRecord& record,
                    std::vector<pipetrain::v1::TimelineEvent> timeline) = 0;
  virtual void Checkpoint(const std::string& dir, int64_t step) = 0;
  // The rates the latest steps measured (for `plan --costs-from`).
  virtual void Measured(const pipetrain::v1::MeasuredCostRates& rates) = 0;
  // Asked before each step: the job was cancelled or the coordinator is stopping.
  virtual bool Cancelled() = 0;
};

// Where a restarted job continues: the whole model's state after step `step` of the
// training run (weights and AdamW state), from a snapshot or a checkpoint.
struct RestoredState {
  int64_t step = 0;
  model::Checkpoint whole;
  std::string source;  // for the log: "the stages' snapshots", "checkpoint DIR"
};

// How this run of the job starts. A first run starts from init_from or fresh weights; a
// restart from `restored` (or, without it, from the job's start again), with the job's
// first step as the first run found it, so the steps keep their numbers.
struct RunStart {
  int64_t job_first_step = 0;  // 0: the first run (worked out from init_from)
  const RestoredState* restored = nullptr;
};

struct RunOutcome {
  pipetrain::v1::JobStatus::State state = pipetrain::v1::JobStatus::FAILED;
  std::string reason;
  std::vector<std::string> lost_stage_ids;  // stages that stopped answering
  int64_t steps_done = 0;  // the training run's last step this run finished (0 = none)
  bool configured = false; // every stage was configured (the stages hold this run's state)
};

// `spec` must have passed ValidateJobSpec (with defaults filled in).
RunOutcome RunJob(const std::string& job_id, const pipetrain::v1::JobSpec& spec,
                  const std::vector<RunnerStage>& stages, const RunnerOptions& options,
                  RunnerHooks& hooks, const RunStart& start = {});

}  // namespace pipetrain::coordinator

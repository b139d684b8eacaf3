// What becomes of a job once a run of it has ended, or a recovery could not continue
// it: recover it (a stage was lost and restarts are left), end it with a state and a
// reason, or leave it RECOVERING for the next coordinator (this one is stopping, and
// --on-stop says recover). Pure: the job manager (job_manager_runs.cc) gathers the facts and
// applies the verdict.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "coordinator/runner/job_runner.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

// What a job running (or recovering, or waiting for its stages) becomes when the
// coordinator is stopped (SIGINT/SIGTERM): pipetrain-coordinator --on-stop.
enum class OnStop {
  kRecover,  // RECOVERING, for the next coordinator on the same --state-dir (FAILED
             // with fault_tolerance.max_restarts 0)
  kCancel,   // CANCELLED, with its checkpoint and how to resume it: the stop is final
             // (scancel, a machine taken back)
};

// What the rules need to know of the job besides how its run ended, as it is now.
struct JobFacts {
  std::string job_id;
  std::string checkpoint_dir;  // its newest checkpoint ("" none): the resume hint names it
  int64_t steps_done = 0;
  int restarts_done = 0;  // recoveries so far (JobStatus.recoveries)
  int max_restarts = 0;   // fault_tolerance.max_restarts
  bool cancel_requested = false;      // the user cancelled the job
  bool coordinator_stopping = false;  // the coordinator is shutting down
  OnStop on_stop = OnStop::kRecover;  // what that stop makes of the job
};

struct Verdict {
  enum class Action {
    kRecover,                  // restart the job on the stages it can get
    kEnd,                      // the job ends with `state`
    kLeaveForNextCoordinator,  // RECOVERING: a coordinator on the same --state-dir goes on
  };
  Action action = Action::kEnd;
  pipetrain::v1::JobStatus::State state = pipetrain::v1::JobStatus::FAILED;
  std::string reason;  // the job's reason in that state
};

// After a run: a failure that lost a stage is recovered while restarts are left (and
// the job is neither cancelled nor the coordinator stopping); anything else ends it. A
// run the coordinator's stop ended is left for the next coordinator, failed, or (with
// OnStop::kCancel) ended CANCELLED naming its step, the stop and the resume hint; with
// kCancel so is a run that lost stages while the coordinator was stopping.
Verdict AfterRun(const RunOutcome& run, const JobFacts& job);

// After a recovery failed with `error` (no stages in time, or stopped while waiting).
Verdict AfterFailedRecovery(const absl::Status& error, const JobFacts& job);

// Whether a job a previous coordinator was running may be continued by this one:
// CANCELLED when stopped while waiting for its stages, RESOURCE_EXHAUSTED when its
// restarts are used up.
absl::Status MayResume(const JobFacts& job);

// What a starting coordinator does with a job its store holds: one left QUEUED queues
// again; one a previous coordinator was running (RUNNING or RECOVERING) is resumed,
// RECOVERING until its stages register again, when it may restart and ran on stages;
// else it failed, with the resume hint. An ended job is kept as it is.
struct StoredJobVerdict {
  enum class Action { kKeep, kQueue, kResume, kFail };
  Action action = Action::kKeep;
  std::string reason;  // kResume: the RECOVERING reason; kFail: the FAILED one
};
StoredJobVerdict AtCoordinatorStart(const pipetrain::v1::JobStatus& job);

// What a user does about a job that failed: `pipetrain resume` continues it from its
// latest checkpoint ("" without one: nothing to add to the reason).
std::string ResumeHint(const std::string& job_id, const std::string& checkpoint_dir);

// The job's spec for the layout of the `stage_servers` stages it last ran on: a job of
// replicas continues on fewer replicas of the same pipeline (job_recovery.h), a single
// pipeline on fewer stages.
pipetrain::v1::JobSpec SpecForStageServers(pipetrain::v1::JobSpec spec, int stage_servers);

}  // namespace pipetrain::coordinator

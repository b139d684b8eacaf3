#include "coordinator/runner/restart_rules.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;

bool Stopped(const JobFacts& job) { return job.cancel_requested || job.coordinator_stopping; }

// How a job whose run (or recovery) ended with `state` and `reason` ends. A run the
// coordinator's stop cancelled ends CANCELLED with --on-stop cancel; otherwise it is
// left for the next coordinator when the job may be restarted at all, else it failed.
// A failure, and a stop's cancel, say how to resume.
Verdict Ending(pb::JobStatus::State state, std::string reason, const JobFacts& job) {
  using Action = Verdict::Action;
  const bool stopped_by_coordinator = state == pb::JobStatus::CANCELLED && !job.cancel_requested;
  if (stopped_by_coordinator && job.on_stop == OnStop::kCancel) {
    return {Action::kEnd, pb::JobStatus::CANCELLED,
            absl::StrCat("the coordinator was stopped by a signal (--on-stop cancel) after step ",
                         job.steps_done, " (", reason, ")",
                         ResumeHint(job.job_id, job.checkpoint_dir))};
  }
  if (stopped_by_coordinator && job.max_restarts > 0) {
    return {Action::kLeaveForNextCoordinator, pb::JobStatus::RECOVERING,
            absl::StrCat("the coordinator stopped while the job was running (after step ",
                         job.steps_done, "; ", reason,
                         "): a coordinator started on the same --state-dir continues it")};
  }
  if (stopped_by_coordinator) {
    return {Action::kEnd, pb::JobStatus::FAILED,
            absl::StrCat("the coordinator stopped while the job was running (", reason, ")",
                         ResumeHint(job.job_id, job.checkpoint_dir))};
  }
  if (state == pb::JobStatus::FAILED) {
    absl::StrAppend(&reason, ResumeHint(job.job_id, job.checkpoint_dir));
  }
  return {Action::kEnd, state, std::move(reason)};
}

}  // namespace

Verdict AfterRun(const RunOutcome& run, const JobFacts& job) {
  const bool lost = run.state == pb::JobStatus::FAILED && !run.lost_stage_ids.empty();
  if (lost && job.coordinator_stopping && !job.cancel_requested &&
      job.on_stop == OnStop::kCancel) {
    // Its stages were signalled with the coordinator and did not wait for the step: the
    // stop is still the final one it was meant to be, from the newest checkpoint.
    return Ending(pb::JobStatus::CANCELLED, run.reason, job);
  }
  if (!lost || Stopped(job)) return Ending(run.state, run.reason, job);
  const int done = job.restarts_done, max = job.max_restarts;
  if (done < max) {
    return {Verdict::Action::kRecover, pb::JobStatus::RECOVERING,
            absl::StrCat(absl::StrJoin(run.lost_stage_ids, " and "), " lost at step ",
                         run.steps_done + 1, ": recovering (restart ", done + 1, " of ", max,
                         ")")};
  }
  std::string reason = run.reason;
  if (max > 0) {
    absl::StrAppend(&reason, " (after ", done, " restart", done == 1 ? "" : "s",
                    ", fault_tolerance.max_restarts)");
  }
  return Ending(run.state, std::move(reason), job);
}

Verdict AfterFailedRecovery(const absl::Status& error, const JobFacts& job) {
  return Ending(Stopped(job) ? pb::JobStatus::CANCELLED : pb::JobStatus::FAILED,
                std::string(error.message()), job);
}

absl::Status MayResume(const JobFacts& job) {
  if (Stopped(job)) return absl::CancelledError("stopped while waiting for its stages");
  if (job.restarts_done + 1 > job.max_restarts) {
    return absl::ResourceExhaustedError(absl::StrCat("the coordinator restarted after ",
                                                     job.restarts_done,
                                                     " restarts (fault_tolerance.max_restarts)"));
  }
  return absl::OkStatus();
}

StoredJobVerdict AtCoordinatorStart(const pb::JobStatus& job) {
  using Action = StoredJobVerdict::Action;
  if (job.state() == pb::JobStatus::QUEUED) return {Action::kQueue, ""};
  const bool was_running =
      job.state() == pb::JobStatus::RUNNING || job.state() == pb::JobStatus::RECOVERING;
  if (!was_running) return {Action::kKeep, ""};
  if (job.spec().fault_tolerance().max_restarts() > 0 && job.stage_addresses_size() > 0) {
    // Continued without a user: on its stages when they register again, from their
    // snapshots or the newest checkpoint.
    return {Action::kResume,
            absl::StrCat("the coordinator restarted while the job was running (after step ",
                         job.steps_done(), "): waiting for its stages")};
  }
  return {Action::kFail,
          absl::StrCat("the coordinator stopped while the job was running (after step ",
                       job.steps_done(), ")", ResumeHint(job.job_id(), job.checkpoint_dir()))};
}

std::string ResumeHint(const std::string& job_id, const std::string& checkpoint_dir) {
  if (checkpoint_dir.empty()) return "";
  return absl::StrCat("; continue it with 'pipetrain resume ", job_id, "' (from ", checkpoint_dir,
                      ")");
}

pb::JobSpec SpecForStageServers(pb::JobSpec spec, int stage_servers) {
  const int replicas = std::max(1, spec.pipeline().replicas());
  const int stages = spec.pipeline().stages();
  if (replicas > 1 && stages > 0 && stage_servers % stages == 0) {
    spec.mutable_pipeline()->set_replicas(stage_servers / stages);
  } else {
    spec.mutable_pipeline()->set_stages(stage_servers / replicas);
  }
  return spec;
}

}  // namespace pipetrain::coordinator

// Running a job to its end: JobManager::Drive runs it on its stages (job_runner.h) and,
// after a lost stage, restarts it from the newest complete state (job_recovery.h) up to
// fault_tolerance.max_restarts times; ResumeAfterRestart continues a job a previous
// coordinator was running. What follows a run is decided by restart_rules.h; what a run
// reports becomes records through JobReporter (job_reporter.h).
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/planner/shared_devices.h"
#include "coordinator/stages/device_groups.h"
#include "coordinator/stages/grpc_stage_connector.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_manager_internal.h"
#include "coordinator/jobs/job_reporter.h"
#include "coordinator/runner/restart_rules.h"

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;

void JobManager::Drive(LiveJob* job, std::vector<StageRecord> stages,
                       std::optional<Continuation> resumed) {
  const RunnerOptions options = RunnerOptionsFor(FactsOf(job).job_id);
  JobReporter reporter = MakeReporter(job);
  JobRecovery recovery = MakeRecovery(job, options);
  const bool restarted = resumed.has_value();
  Continuation run = restarted ? *std::move(resumed)
                               : Continuation{std::move(stages), StatusOf(job).spec(), {}, {}};
  StartRun(job, run, restarted);
  for (;;) {
    reporter.NewRun();  // a restarted run continues in a TensorBoard file of its own
    const RunOutcome out = RunOnce(job, run, options, reporter);
    const Verdict verdict = AfterRun(out, FactsOf(job));
    if (verdict.action != Verdict::Action::kRecover) return Finish(job, verdict, out.lost_stage_ids);
    Log(job, out.reason);
    SetState(job, pb::JobStatus::RECOVERING, verdict.reason);
    absl::StatusOr<Continuation> next = Recover(job, recovery, run, out);
    if (!next.ok()) return Finish(job, AfterFailedRecovery(next.status(), FactsOf(job)), {});
    run = *std::move(next);
    StartRun(job, run, /*restarted=*/true);
  }
}

void JobManager::ResumeAfterRestart(LiveJob* job) {
  const pb::JobStatus status = StatusOf(job);
  const std::vector<std::optional<StageRecord>> back = AwaitStagesBack(job, status);
  {
    absl::MutexLock lock(&mu_);
    --resuming_;  // queued jobs may take the stages it did not find
    wake_.SignalAll();
  }
  const LostRun run =
      LostRunAfterRestart(status, back, CheckpointRoot(options_.state_dir, status.job_id()));
  const int k = static_cast<int>(back.size());
  Log(job, absl::StrCat("the coordinator restarted: continuing from the newest state its ",
                        k - static_cast<int>(run.lost.size()), " of ", k,
                        " stages that registered again hold"));
  absl::StatusOr<Continuation> next = Resume(job, run);
  if (next.ok()) return Drive(job, {}, *std::move(next));
  Finish(job, AfterFailedRecovery(next.status(), FactsOf(job)), {});
}

pb::JobStatus JobManager::StatusOf(LiveJob* job) {
  absl::MutexLock lock(&mu_);
  return job->status;
}

JobFacts JobManager::FactsOf(LiveJob* job) {
  absl::MutexLock lock(&mu_);
  const pb::JobStatus& s = job->status;
  return {.job_id = s.job_id(),
          .checkpoint_dir = s.checkpoint_dir(),
          .steps_done = s.steps_done(),
          .restarts_done = s.recoveries_size(),
          .max_restarts = s.spec().fault_tolerance().max_restarts(),
          .cancel_requested = job->cancel.load(),
          .coordinator_stopping = shutting_down_.load(),
          .on_stop = options_.on_stop};
}

RunnerOptions JobManager::RunnerOptionsFor(const std::string& job_id) const {
  RunnerOptions options = options_.runner;
  options.checkpoint_root = CheckpointRoot(options_.state_dir, job_id);
  options.connector = ConnectorOrGrpc(options.connector, options.security);
  return options;
}

JobReporter JobManager::MakeReporter(LiveJob* job) {
  const std::string root = options_.tensorboard_dir.empty()
                               ? absl::StrCat(options_.state_dir, "/tensorboard")
                               : options_.tensorboard_dir;
  JobReporter::Job parts{.mu = &mu_,
                         .status = &job->status,
                         .events = &job->events,
                         .log = [this, job](const std::string& text) { Log(job, text); },
                         .stopped = [this, job] { return job->cancel.load() || shutting_down_.load(); }};
  return JobReporter(std::move(parts), *store_, absl::StrCat(root, "/", FactsOf(job).job_id),
                     kTimelineSteps);
}

JobRecovery JobManager::MakeRecovery(LiveJob* job, const RunnerOptions& options) {
  return JobRecovery(
      registry_, options.connector, options.rpc_deadline, options_.heartbeat_interval,
      [this, job](const std::string& text) { Log(job, text); },
      [this, job] { return job->cancel.load() || shutting_down_.load(); });
}

void JobManager::StartRun(LiveJob* job, const Continuation& run, bool restarted) {
  if (restarted) {
    absl::MutexLock lock(&mu_);
    *job->status.add_recoveries() = run.record;
  }
  SetStages(job, run.stages);
  SetState(job, pb::JobStatus::RUNNING, "");
}

RunOutcome JobManager::RunOnce(LiveJob* job, const Continuation& run,
                               const RunnerOptions& options, RunnerHooks& hooks) {
  std::vector<RunnerStage> stages;
  for (const StageRecord& s : run.stages) stages.push_back({s.stage_id, s.address, s.device});
  const pb::JobStatus status = StatusOf(job);
  RunStart start;
  start.job_first_step = status.first_step();
  start.restored = run.restored ? &*run.restored : nullptr;
  return RunJob(status.job_id(), run.spec, stages, options, hooks, start);
}

absl::StatusOr<Continuation> JobManager::Recover(LiveJob* job, JobRecovery& recovery,
                                                 const Continuation& run, const RunOutcome& out) {
  const pb::JobStatus status = StatusOf(job);
  const LostRun lost = LostRunOf(status, CheckpointRoot(options_.state_dir, status.job_id()),
                                 run.spec, run.stages, out.lost_stage_ids, out.steps_done + 1,
                                 out.configured);
  return RecoverKeepingState(job, recovery, lost);
}

absl::StatusOr<Continuation> JobManager::Resume(LiveJob* job, const LostRun& run) {
  RETURN_IF_ERROR(MayResume(FactsOf(job)));
  JobRecovery recovery = MakeRecovery(job, RunnerOptionsFor(run.job_id));
  return RecoverKeepingState(job, recovery, run);
}

absl::StatusOr<Continuation> JobManager::RecoverKeepingState(LiveJob* job, JobRecovery& recovery,
                                                             const LostRun& run) {
  Recovered recovered = recovery.Recover(run);
  if (recovered.stranded && NewerThanCheckpoint(*recovered.stranded, run.checkpoint_dir)) {
    KeepAsCheckpoint(job, *recovered.stranded, run.checkpoint_root);
  }
  return std::move(recovered.next);
}

void JobManager::KeepAsCheckpoint(LiveJob* job, const RestoredState& state,
                                  const std::string& root) {
  absl::StatusOr<std::string> dir = WriteAsCheckpoint(state, root);
  if (!dir.ok()) {
    Log(job, absl::StrCat("could not write the state after step ", state.step, " from ",
                          state.source, ": ", dir.status().message()));
    return;
  }
  Log(job, absl::StrCat("wrote the state after step ", state.step, " from ", state.source,
                        " to ", *dir));
  absl::MutexLock lock(&mu_);
  job->status.set_checkpoint_dir(*dir);
}

std::vector<std::optional<StageRecord>> JobManager::AwaitStagesBack(LiveJob* job,
                                                                    const pb::JobStatus& status) {
  const int k = status.stage_addresses_size();
  std::vector<std::optional<StageRecord>> found(k);
  // Its stages register again within a few heartbeats when they survived: one not back
  // by then is lost, and the recovery takes a free stage, the others, or waits for one.
  const absl::Duration grace =
      std::min(absl::Seconds(status.spec().fault_tolerance().wait_for_stages_s()),
               std::max(absl::Seconds(10), 3 * options_.heartbeat_timeout));
  const absl::Time deadline = absl::Now() + grace;
  for (;;) {
    std::vector<std::string> missing(k);
    for (int i = 0; i < k; ++i) if (!found[i]) missing[i] = status.stage_addresses(i);
    std::vector<std::optional<StageRecord>> got = registry_.AcquireAt(status.job_id(), missing);
    int have = 0;
    for (int i = 0; i < k; ++i) {
      if (!found[i] && got[i]) found[i] = got[i];
      have += found[i] ? 1 : 0;
    }
    const bool stop = job->cancel.load() || shutting_down_.load();
    if (have == k || stop || absl::Now() >= deadline) return found;
    absl::SleepFor(std::min(options_.heartbeat_interval, absl::Milliseconds(200)));
  }
}

void JobManager::Finish(LiveJob* job, const Verdict& verdict,
                        const std::vector<std::string>& lost) {
  const std::string id = FactsOf(job).job_id;
  if (verdict.action == Verdict::Action::kLeaveForNextCoordinator) {
    registry_.Release(id);
    Log(job, verdict.reason);
    SetState(job, pb::JobStatus::RECOVERING, verdict.reason);
    return;
  }
  for (const std::string& stage : lost) registry_.MarkLost(stage);
  registry_.Release(id);
  if (!verdict.reason.empty()) Log(job, verdict.reason);
  SetState(job, verdict.state, verdict.reason);
  absl::MutexLock lock(&mu_);
  wake_.SignalAll();
}

void JobManager::SetStages(LiveJob* job, const std::vector<StageRecord>& stages) {
  absl::MutexLock lock(&mu_);
  job->status.clear_stage_ids();
  job->status.clear_stage_addresses();
  std::vector<pb::DeviceInfo> devices;
  for (const StageRecord& s : stages) {
    job->status.add_stage_ids(s.stage_id);
    job->status.add_stage_addresses(s.address);
    devices.push_back(s.device);
  }
  const int k = std::max(1, job->status.spec().pipeline().stages());
  job->status.set_device_sharing(planner::DescribeSharing(
      GroupDevices(devices), k, static_cast<int>(stages.size()) / k));
}

}  // namespace pipetrain::coordinator

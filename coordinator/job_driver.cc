// Running a job to its end: JobManager::Drive runs it on its stages (job_runner.h) and,
// after a lost stage, restarts it from the newest complete state (job_recovery.h) up to
// fault_tolerance.max_restarts times; ResumeAfterRestart continues a job a previous
// coordinator was running; LeaveForNextCoordinator records one for the next.
#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_state.h"
#include "common/logging.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_manager_internal.h"
#include "coordinator/tensorboard_writer.h"

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;

void JobManager::ResumeAfterRestart(LiveJob* job) {
  pb::JobStatus status;
  {
    absl::MutexLock lock(&mu_);
    status = job->status;
  }
  const std::string& id = status.job_id();
  const int k = status.stage_addresses_size();
  std::vector<std::string> addresses(status.stage_addresses().begin(),
                                     status.stage_addresses().end());
  // Its stages register again within a few heartbeats when they survived: one not back
  // by then is lost, and the recovery takes a free stage, the others, or waits for one.
  std::vector<std::optional<StageRecord>> found(k);
  const absl::Duration grace =
      std::min(absl::Seconds(status.spec().fault_tolerance().wait_for_stages_s()),
               std::max(absl::Seconds(10), 3 * options_.heartbeat_timeout));
  const absl::Time deadline = absl::Now() + grace;
  auto stop = [&] { return job->cancel.load() || shutting_down_.load(); };
  for (;;) {
    std::vector<std::string> missing(k);
    for (int i = 0; i < k; ++i) if (!found[i]) missing[i] = addresses[i];
    std::vector<std::optional<StageRecord>> got = registry_.AcquireAt(id, missing);
    int have = 0;
    for (int i = 0; i < k; ++i) {
      if (!found[i] && got[i]) found[i] = got[i];
      have += found[i] ? 1 : 0;
    }
    if (have == k || stop() || absl::Now() >= deadline) break;
    absl::SleepFor(std::min(options_.heartbeat_interval, absl::Milliseconds(200)));
  }
  {
    absl::MutexLock lock(&mu_);
    --resuming_;  // queued jobs may take the stages it did not find
    wake_.SignalAll();
  }
  LostRun run;
  run.job_id = id;
  run.spec = status.spec();
  // The layout it last ran: a job of replicas continues on fewer replicas of the same K
  // (job_recovery.h), a single pipeline on fewer stages.
  const int replicas = std::max(1, run.spec.pipeline().replicas());
  const int stages = run.spec.pipeline().stages();
  if (replicas > 1 && stages > 0 && k % stages == 0) {
    run.spec.mutable_pipeline()->set_replicas(k / stages);
  } else {
    run.spec.mutable_pipeline()->set_stages(k / replicas);
  }
  for (int i = 0; i < k; ++i) {
    if (found[i]) {
      run.stages.push_back(*found[i]);
      continue;
    }
    // Not back: lost. Its old id may name another stage in this coordinator's registry.
    StageRecord gone;
    gone.stage_id = absl::StrCat(i < status.stage_ids_size() ? status.stage_ids(i) : "stage",
                                 " (", addresses[i], ")");
    gone.address = addresses[i];
    run.stages.push_back(gone);
    run.lost.push_back(gone.stage_id);
  }
  run.failed_step = status.steps_done() + 1;
  run.stages_hold_state = true;  // the stages that survived still hold the job
  run.checkpoint_dir = status.checkpoint_dir();
  run.checkpoint_root = absl::StrCat(options_.state_dir, "/checkpoints/", id);
  run.restart = status.recoveries_size() + 1;
  auto log = [&](const std::string& text) { Log(job, text); };
  Log(job, absl::StrCat("the coordinator restarted: continuing from the newest state its ",
                        k - static_cast<int>(run.lost.size()), " of ", k,
                        " stages that registered again hold"));
  std::string saved;
  absl::StatusOr<Continuation> next = absl::ResourceExhaustedError(absl::StrCat(
      "the coordinator restarted after ", status.recoveries_size(),
      " restarts (fault_tolerance.max_restarts)"));
  if (stop()) {
    next = absl::CancelledError("stopped while waiting for its stages");
  } else if (run.restart <= status.spec().fault_tolerance().max_restarts()) {
    JobRecovery recovery(registry_, options_.runner.security, options_.runner.rpc_deadline,
                         options_.heartbeat_interval, log, stop);
    next = recovery.Recover(run, &saved);
  }
  if (next.ok()) {
    Drive(job, {}, *std::move(next));
    return;
  }
  std::string dir = saved.empty() ? status.checkpoint_dir() : saved;
  {
    absl::MutexLock lock(&mu_);
    job->status.set_checkpoint_dir(dir);
  }
  if (shutting_down_.load() && !job->cancel.load()) {
    LeaveForNextCoordinator(job, std::string(next.status().message()));
    return;
  }
  const pb::JobStatus::State state =
      job->cancel.load() ? pb::JobStatus::CANCELLED : pb::JobStatus::FAILED;
  const std::string reason = absl::StrCat(next.status().message(),
                                          state == pb::JobStatus::FAILED ? ResumeHint(id, dir) : "");
  registry_.Release(id);
  Log(job, reason);
  SetState(job, state, reason);
  absl::MutexLock lock(&mu_);
  wake_.SignalAll();
}

void JobManager::LeaveForNextCoordinator(LiveJob* job, const std::string& why) {
  std::string id;
  int64_t done = 0;
  {
    absl::MutexLock lock(&mu_);
    id = job->status.job_id();
    done = job->status.steps_done();
  }
  registry_.Release(id);
  const std::string reason = absl::StrCat(
      "the coordinator stopped while the job was running (after step ", done, "; ", why,
      "): a coordinator started on the same --state-dir continues it");
  Log(job, reason);
  SetState(job, pb::JobStatus::RECOVERING, reason);
}

void JobManager::SetStages(LiveJob* job, const std::vector<StageRecord>& stages) {
  absl::MutexLock lock(&mu_);
  job->status.clear_stage_ids();
  job->status.clear_stage_addresses();
  for (const StageRecord& s : stages) {
    job->status.add_stage_ids(s.stage_id);
    job->status.add_stage_addresses(s.address);
  }
}

void JobManager::Drive(LiveJob* job, std::vector<StageRecord> stages,
                       std::optional<Continuation> resumed) {
  std::string id;
  pb::JobSpec spec;
  {
    absl::MutexLock lock(&mu_);
    id = job->status.job_id();
    spec = job->status.spec();
  }
  RunnerOptions options = options_.runner;
  options.checkpoint_root = absl::StrCat(options_.state_dir, "/checkpoints/", id);
  const std::string tensorboard_root = options_.tensorboard_dir.empty()
                                           ? absl::StrCat(options_.state_dir, "/tensorboard")
                                           : options_.tensorboard_dir;
  // A failed write is a warning in the job's log, once; the job goes on.
  TensorBoardJobLog tensorboard(absl::StrCat(tensorboard_root, "/", id),
                                [&](const absl::Status& s) {
                                  const std::string text = absl::StrCat(
                                      "no more TensorBoard events for this job: ", s.message());
                                  common::LogWarning("coordinator", absl::StrCat(id, ": ", text));
                                  Log(job, text);
                                });
  RunnerHooks hooks;
  hooks.log = [&](const std::string& text) { Log(job, text); };
  // The runner predicts a step's timeline just before it reports the step.
  pb::Timeline predicted;
  hooks.predicted_timeline = [&](std::vector<pb::TimelineEvent> events) {
    predicted.Clear();
    for (pb::TimelineEvent& e : events) *predicted.add_events() = std::move(e);
  };
  hooks.step = [&](const pb::StepRecord& record, std::vector<pb::TimelineEvent> timeline) {
    tensorboard.Step(record, absl::Now());
    pb::JobStatus copy;
    {
      absl::MutexLock lock(&mu_);
      job->status.set_steps_done(record.step());
      const int n = job->status.recoveries_size();
      if (n > 0 && !job->status.recoveries(n - 1).has_continued()) {
        SetNow(job->status.mutable_recoveries(n - 1)->mutable_continued());
      }
      copy = job->status;
    }
    pb::Timeline measured;
    for (pb::TimelineEvent& e : timeline) *measured.add_events() = std::move(e);
    if (!predicted.events().empty() && predicted.events(0).step() != record.step()) {
      predicted.Clear();  // not this step's
    }
    // A step run again after a restart replaces its first record (and its timelines).
    if (absl::Status s = store_->RecordStep(copy, record, measured, predicted, kTimelineSteps);
        !s.ok()) {
      common::LogWarning("coordinator", std::string(s.message()));
    }
    predicted.Clear();
    pb::JobEvent e;
    *e.mutable_step() = record;
    job->events.Append(std::move(e));
  };
  hooks.checkpoint = [&](const std::string& dir, int64_t step) {
    {
      absl::MutexLock lock(&mu_);
      job->status.set_checkpoint_dir(dir);
    }
    Log(job, absl::StrCat("checkpoint of step ", step, " written to ", dir));
  };
  hooks.measured = [&](const pb::MeasuredCostRates& rates) {
    absl::MutexLock lock(&mu_);
    *job->status.mutable_measured_costs() = rates;  // stored with the step's status
  };
  hooks.cancelled = [&] { return job->cancel.load() || shutting_down_.load(); };
  hooks.first_step = [&](int64_t first) {
    absl::MutexLock lock(&mu_);
    job->status.set_first_step(first);
  };
  JobRecovery recovery(registry_, options_.runner.security, options_.runner.rpc_deadline,
                       options_.heartbeat_interval, hooks.log, hooks.cancelled);

  pb::JobSpec run_spec = spec;
  std::optional<RestoredState> restored;
  int restart = 0;
  if (resumed) {
    stages = std::move(resumed->stages);
    run_spec = std::move(resumed->spec);
    restored = std::move(resumed->restored);
    absl::MutexLock lock(&mu_);
    *job->status.add_recoveries() = resumed->record;
    restart = job->status.recoveries_size();
  }
  SetStages(job, stages);
  SetState(job, pb::JobStatus::RUNNING, "");
  RunOutcome out;
  for (;;) {
    std::vector<RunnerStage> runner_stages;
    for (const StageRecord& s : stages) runner_stages.push_back({s.stage_id, s.address, s.device});
    RunStart start;
    {
      absl::MutexLock lock(&mu_);
      start.job_first_step = job->status.first_step();
    }
    start.restored = restored ? &*restored : nullptr;
    tensorboard.NewRun();  // a restarted run continues in a file of its own
    out = RunJob(id, run_spec, runner_stages, options, hooks, start);
    if (out.state != pb::JobStatus::FAILED || out.lost_stage_ids.empty() || hooks.cancelled()) {
      break;
    }
    const int max = spec.fault_tolerance().max_restarts();
    if (restart >= max) {
      if (max > 0) {
        absl::StrAppend(&out.reason, " (after ", restart, " restart", restart == 1 ? "" : "s",
                        ", fault_tolerance.max_restarts)");
      }
      break;
    }
    ++restart;
    LostRun lost;
    lost.job_id = id;
    lost.spec = run_spec;
    lost.stages = stages;
    lost.lost = out.lost_stage_ids;
    lost.failed_step = out.steps_done + 1;
    lost.stages_hold_state = out.configured;
    lost.checkpoint_root = options.checkpoint_root;
    lost.restart = restart;
    {
      absl::MutexLock lock(&mu_);
      lost.checkpoint_dir = job->status.checkpoint_dir();
    }
    Log(job, out.reason);
    SetState(job, pb::JobStatus::RECOVERING,
             absl::StrCat(absl::StrJoin(lost.lost, " and "), " lost at step ", lost.failed_step,
                          ": recovering (restart ", restart, " of ", max, ")"));
    std::string saved;
    absl::StatusOr<Continuation> next = recovery.Recover(lost, &saved);
    if (!saved.empty()) {
      absl::MutexLock lock(&mu_);
      job->status.set_checkpoint_dir(saved);
    }
    if (!next.ok()) {
      out.state = job->cancel.load() || shutting_down_.load() ? pb::JobStatus::CANCELLED
                                                               : pb::JobStatus::FAILED;
      out.reason = std::string(next.status().message());
      out.lost_stage_ids.clear();  // marked lost by the recovery already
      break;
    }
    stages = std::move(next->stages);
    run_spec = std::move(next->spec);
    restored = std::move(next->restored);
    {
      absl::MutexLock lock(&mu_);
      *job->status.add_recoveries() = next->record;
    }
    SetStages(job, stages);
    SetState(job, pb::JobStatus::RUNNING, "");
  }
  std::string dir;
  {
    absl::MutexLock lock(&mu_);
    dir = job->status.checkpoint_dir();
  }
  if (out.state == pb::JobStatus::CANCELLED && !job->cancel.load() &&
      spec.fault_tolerance().max_restarts() > 0) {
    // The coordinator is stopping: the next one on this --state-dir continues the job.
    LeaveForNextCoordinator(job, out.reason);
    return;
  }
  if (out.state == pb::JobStatus::CANCELLED && !job->cancel.load()) {
    out.state = pb::JobStatus::FAILED;
    out.reason = absl::StrCat("the coordinator stopped while the job was running (", out.reason,
                              ")", ResumeHint(id, dir));
  } else if (out.state == pb::JobStatus::FAILED) {
    absl::StrAppend(&out.reason, ResumeHint(id, dir));
  }
  for (const std::string& lost : out.lost_stage_ids) registry_.MarkLost(lost);
  registry_.Release(id);
  if (!out.reason.empty()) Log(job, out.reason);
  SetState(job, out.state, out.reason);
  absl::MutexLock lock(&mu_);
  wake_.SignalAll();
}

}  // namespace pipetrain::coordinator

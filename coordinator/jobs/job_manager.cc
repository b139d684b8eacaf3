#include "coordinator/jobs/job_manager.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/byte_format.h"
#include "common/job_state.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/runner/job_paths.h"
#include "coordinator/runner/job_data.h"
#include "coordinator/jobs/job_manager_internal.h"
#include "coordinator/spec/job_spec.h"
#include "coordinator/stages/placement.h"
#include "coordinator/planner/planner.h"

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;

namespace {

pb::JobEvent StateEvent(const pb::JobStatus& status) {
  pb::JobEvent e;
  *e.mutable_state_change() = status;
  e.mutable_state_change()->clear_history();
  return e;
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(ManagerOptions options) {
  std::error_code ec;
  std::filesystem::create_directories(options.state_dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--state-dir ", options.state_dir, ": ", ec.message()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<JobStore> store,
                   JobStore::Open(options.state_dir + "/jobs.db"));
  std::unique_ptr<JobManager> m(new JobManager(std::move(options), std::move(store)));
  ASSIGN_OR_RETURN(std::vector<pb::JobStatus> jobs, m->store_->List(0));
  {
    absl::MutexLock lock(&m->mu_);
    for (auto it = jobs.rbegin(); it != jobs.rend(); ++it) {  // oldest first
      RETURN_IF_ERROR(m->TakeOver(*std::move(it)));
    }
  }
  m->scheduler_ = std::thread([p = m.get()] { p->SchedulerLoop(); });
  return m;
}

absl::Status JobManager::TakeOver(pb::JobStatus job) {
  // Its log lines so far, which the events of this coordinator's run follow.
  ASSIGN_OR_RETURN(const std::vector<pb::LogLine> stored_logs, store_->Logs(job.job_id()));
  const StoredJobVerdict verdict = AtCoordinatorStart(job);
  switch (verdict.action) {
    case StoredJobVerdict::Action::kKeep:
      return absl::OkStatus();
    case StoredJobVerdict::Action::kQueue:
      Enqueue(job, stored_logs.size());
      return absl::OkStatus();
    case StoredJobVerdict::Action::kResume:
      job.set_state(pb::JobStatus::RECOVERING);
      job.set_reason(verdict.reason);
      RETURN_IF_ERROR(store_->Update(job));
      StartResuming(std::move(job), stored_logs.size());
      return absl::OkStatus();
    case StoredJobVerdict::Action::kFail:
      job.set_state(pb::JobStatus::FAILED);
      job.set_reason(verdict.reason);
      SetNow(job.mutable_finished());
      return store_->Update(job);
  }
  return absl::OkStatus();
}

void JobManager::StartResuming(pb::JobStatus job, size_t stored_logs) {
  auto live = std::make_shared<LiveJob>(options_.events_in_memory, stored_logs);
  live->status = job;
  live->events.Append(StateEvent(job));
  LiveJob* p = live.get();
  live_[job.job_id()] = std::move(live);
  ++resuming_;
  p->thread = std::thread([this, p, id = job.job_id()] {
    ResumeAfterRestart(p);
    Retire(id);
  });
}

JobManager::JobManager(ManagerOptions options, std::unique_ptr<JobStore> store)
    : options_(std::move(options)), store_(std::move(store)),
      registry_(options_.heartbeat_timeout) {}

JobManager::~JobManager() { Shutdown(); }

void JobManager::Shutdown() {
  shutting_down_ = true;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    wake_.SignalAll();
  }
  if (scheduler_.joinable()) scheduler_.join();
  std::vector<std::shared_ptr<LiveJob>> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, job] : live_) jobs.push_back(job);
    jobs.insert(jobs.end(), retired_.begin(), retired_.end());
    retired_.clear();
  }
  for (auto& job : jobs) if (job->thread.joinable()) job->thread.join();
}

void JobManager::Retire(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(job_id);
  // One the coordinator's stop left RECOVERING stays: Shutdown joins it.
  if (it == live_.end() || !common::JobEnded(it->second->status.state())) return;
  retired_.push_back(std::move(it->second));
  live_.erase(it);
  wake_.SignalAll();
}

void JobManager::ReapRetired() {
  std::vector<std::shared_ptr<LiveJob>> done;
  {
    absl::MutexLock lock(&mu_);
    done.swap(retired_);
  }
  // Retire is the last thing a job's thread does: these joins end at once.
  for (auto& job : done) if (job->thread.joinable()) job->thread.join();
}

absl::Status JobManager::CheckFits(const pb::JobSpec& spec, planner::PlanOptions po) {
  // The live stages' memory, largest first. Registration refuses a stage that reports
  // none (CheckRegisterStageRequest), so the unlimited case below is only a guard.
  std::vector<double> memory;
  for (const pb::StageInfo& s : registry_.Snapshot()) {
    if (s.state() == pb::StageInfo::LOST) continue;
    const uint64_t bytes = s.device().memory_bytes();
    memory.push_back(bytes == 0 ? std::numeric_limits<double>::infinity()
                                : static_cast<double>(bytes));
  }
  const int k = common::JobStageServers(spec);
  // Too few stages yet: it waits in the queue, but a spec the planner refuses fails now.
  if (static_cast<int>(memory.size()) < k) return planner::MakePlan(po).status();
  std::sort(memory.begin(), memory.end(), std::greater<>());
  // Planned as the runner will plan it: split within the memory of the K best stages.
  const double cap = memory[k - 1];
  po.memory_cap_bytes = std::isinf(cap) ? 0 : cap;
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(po);
  if (plan.ok() || plan.status().code() != absl::StatusCode::kResourceExhausted) {
    return plan.status();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "model: does not fit the stages' memory: the ", k, " registered stages with the most "
      "memory have ", common::FormatBytes(cap), " each, and ", plan.status().message(),
      "; use more stages (pipeline.stages), recompute (pipeline.recompute=always), more "
      "micro-batches or a smaller model"));
}

absl::StatusOr<std::string> JobManager::Submit(pb::JobSpec spec) {
  spec = WithDefaults(std::move(spec));
  ASSIGN_OR_RETURN(planner::PlanOptions options, ValidatedPlanOptions(spec));
  // Kinds, sizes and --data-root before anything is opened: a FIFO would block here.
  RETURN_IF_ERROR(CheckJobPaths(spec, options_.runner.data_roots));
  // Maps and scans the token files (layout, ids against the vocabulary): a bad file
  // fails here rather than when the job starts.
  RETURN_IF_ERROR(LoadJobData(spec).status());
  std::optional<AutoChoice> chosen;
  if (IsAutoSchedule(spec)) {
    ASSIGN_OR_RETURN(chosen, PlanAuto(spec));
    spec = chosen->spec;
    // The chosen shape, checked as any other.
    ASSIGN_OR_RETURN(options, ValidatedPlanOptions(spec));
  }
  RETURN_IF_ERROR(CheckFits(spec, std::move(options)));
  ASSIGN_OR_RETURN(std::string id, store_->NextJobId());
  pb::JobStatus status;
  status.set_job_id(id);
  *status.mutable_spec() = spec;
  status.set_state(pb::JobStatus::QUEUED);
  if (chosen) *status.mutable_auto_plan() = chosen->record;
  SetNow(status.mutable_created());
  std::shared_ptr<LiveJob> job;
  {
    // Checked and recorded under one lock, so a job refused during shutdown is never
    // stored (it would otherwise be queued again at the next start).
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the coordinator is stopping; submit again later");
    RETURN_IF_ERROR(store_->Insert(status));
    // Counted before the scheduler (waiting on mu_) can give this job its stages: after,
    // a job that starts at once would read "0 free".
    const int free = registry_.FreeCount(), k = common::JobStageServers(spec);
    Enqueue(status);
    job = live_[id];
    // Before the scheduler can start it, so the choice comes first.
    if (chosen) {
      for (const std::string& line : chosen->log) LogAs(job.get(), id, line);
    }
    if (free < k) {
      LogAs(job.get(), id, absl::StrCat("queued: needs ", k, " free stages, ", free, " free of ",
                                        registry_.LiveCount(), " registered"));
    }
  }
  return id;
}

void JobManager::Enqueue(pb::JobStatus status, size_t stored_logs) {
  auto job = std::make_shared<LiveJob>(options_.events_in_memory, stored_logs);
  job->status = status;
  job->events.Append(StateEvent(status));
  queue_.push_back(status.job_id());
  live_[status.job_id()] = std::move(job);
  wake_.SignalAll();
}

std::shared_ptr<JobManager::LiveJob> JobManager::FindLive(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(job_id);
  return it == live_.end() ? nullptr : it->second;
}

void JobManager::SchedulerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.Unlock();
    for (const std::string& id : registry_.Sweep()) {
      common::LogWarning("coordinator", absl::StrCat(id, " missed its heartbeats: lost"));
    }
    ReapRetired();
    mu_.Lock();
    // Jobs a previous coordinator ran get their stages back first.
    for (auto it = queue_.begin(); it != queue_.end() && !stopping_ && resuming_ == 0;) {
      LiveJob* job = live_[*it].get();
      const int n = common::JobStageServers(job->status.spec());
      std::optional<std::vector<StageRecord>> stages = registry_.Acquire(*it, n);
      if (!stages) {
        ++it;
        continue;
      }
      const std::string id = *it;
      it = queue_.erase(it);
      // The replicas' copies of each stage position on as few hosts as possible, so
      // their all-reduce stays on a host's own links where the stages allow it.
      const int replicas = std::max(1, job->status.spec().pipeline().replicas());
      const int k = job->status.spec().pipeline().stages();
      std::vector<StageRecord> placed = PlaceReplicas(*std::move(stages), replicas, k);
      job->thread = std::thread([this, job, id, replicas, k, s = std::move(placed)] {
        if (replicas > 1) Log(job, DescribePlacement(s, replicas, k));  // Log takes mu_
        Drive(job, s);
        Retire(id);
      });
    }
    wake_.WaitWithTimeout(&mu_, options_.heartbeat_interval);
  }
}

void JobManager::Log(LiveJob* job, const std::string& text) {
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    id = job->status.job_id();
  }
  LogAs(job, id, text);
}

void JobManager::LogAs(LiveJob* job, const std::string& id, const std::string& text) {
  pb::LogLine line;
  SetNow(line.mutable_time());
  line.set_text(text);
  common::LogInfo("coordinator", absl::StrCat(id, ": ", text));
  if (absl::Status s = store_->AppendLog(id, line); !s.ok()) {
    common::LogWarning("coordinator", std::string(s.message()));
  }
  pb::JobEvent e;
  *e.mutable_log() = line;
  job->events.Append(std::move(e));
}

void JobManager::SetState(LiveJob* job, pb::JobStatus::State state, const std::string& reason) {
  pb::JobStatus copy;
  {
    absl::MutexLock lock(&mu_);
    job->status.set_state(state);
    job->status.set_reason(reason);
    if (state == pb::JobStatus::RUNNING && !job->status.has_started()) {
      SetNow(job->status.mutable_started());
    }
    if (common::JobEnded(state)) SetNow(job->status.mutable_finished());
    copy = job->status;
  }
  if (absl::Status s = store_->Update(copy); !s.ok()) {
    common::LogWarning("coordinator", std::string(s.message()));
  }
  job->events.Append(StateEvent(copy));
  if (common::JobEnded(state)) rendezvous_.Forget(copy.job_id());
  if (common::JobEnded(state)) job->events.End();
}

absl::StatusOr<pb::JobStatus> JobManager::Get(const std::string& job_id, bool history) {
  // A live job's status is in memory, as new as the store's or newer: pollers of running
  // jobs then never wait behind the store's writes.
  if (!history) {
    absl::MutexLock lock(&mu_);
    if (auto it = live_.find(job_id); it != live_.end()) return it->second->status;
  }
  return store_->Get(job_id, history);
}

absl::StatusOr<std::vector<pb::JobStatus>> JobManager::List(int limit, bool latest_step) {
  ASSIGN_OR_RETURN(std::vector<pb::JobStatus> jobs, store_->List(limit));
  if (!latest_step) return jobs;
  // Each with its latest step as its history, so a listing can show the last loss.
  for (pb::JobStatus& job : jobs) {
    if (job.steps_done() == 0) continue;
    absl::StatusOr<std::vector<pb::StepRecord>> last = store_->Steps(job.job_id(), job.steps_done());
    if (last.ok() && !last->empty()) *job.add_history() = last->back();
  }
  return jobs;
}

absl::StatusOr<std::vector<pb::StepRecord>> JobManager::Steps(const std::string& job_id,
                                                             int64_t from_step) {
  return store_->Steps(job_id, from_step);
}

absl::StatusOr<pb::JobStatus> JobManager::Cancel(const std::string& job_id) {
  std::shared_ptr<LiveJob> queued;
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(job_id);
    if (it != live_.end() && !common::JobEnded(it->second->status.state())) {
      const std::shared_ptr<LiveJob>& job = it->second;
      job->cancel = true;
      auto q = std::find(queue_.begin(), queue_.end(), job_id);
      if (q != queue_.end()) {
        queue_.erase(q);
        queued = job;
      }
    }
  }
  if (queued != nullptr) {
    Log(queued.get(), "cancelled while queued");
    SetState(queued.get(), pb::JobStatus::CANCELLED, "cancelled while queued");
    Retire(job_id);  // it has no thread
  } else if (std::shared_ptr<LiveJob> job = FindLive(job_id); job != nullptr && job->cancel) {
    Log(job.get(), "cancel requested: stopping after the current step");
    ASSIGN_OR_RETURN(pb::JobStatus status, Get(job_id, false));
    if (status.state() == pb::JobStatus::RUNNING) {
      status.set_reason("cancelling: stops after the current step, with a checkpoint");
    }
    return status;
  }
  return Get(job_id, false);
}

absl::Status JobManager::Watch(const std::string& job_id, int64_t from_step, bool no_follow,
                               const std::function<bool(const pb::JobEvent&)>& sink,
                               const std::function<bool()>& still_wanted) {
  auto wanted = [&](const pb::JobEvent& e) { return !e.has_step() || e.step().step() >= from_step; };
  if (std::shared_ptr<LiveJob> job = FindLive(job_id)) {
    size_t next = 0;
    // The store's count of log lines passed to the watcher (or not wanted); those a
    // previous coordinator stored are not replayed to a watcher of this one's events.
    size_t logs_seen = job->events.stored_logs();
    int64_t last_step = -1;     // the latest step event passed
    auto pass = [&](const pb::JobEvent& e) {
      if (e.has_log()) ++logs_seen;
      if (e.has_step()) last_step = std::max(last_step, e.step().step());
      return !wanted(e) || sink(e);
    };
    for (;;) {
      bool ended = false;
      JobEvents::Missed missed;
      std::vector<pb::JobEvent> events = job->events.Read(
          next, no_follow ? absl::ZeroDuration() : absl::Seconds(1), &ended, &missed);
      if (missed.until > 0) {
        // Older than the events kept in memory: the store has them (the missed state
        // changes are not replayed; the latest state comes with the events that follow).
        RETURN_IF_ERROR(ReplayMissed(job_id, from_step, missed, &logs_seen, &last_step, pass));
        next = missed.until;
      }
      next += events.size();
      for (const pb::JobEvent& e : events) {
        if (!pass(e)) return absl::CancelledError("the watcher went away");
      }
      if (no_follow || (ended && events.empty())) return absl::OkStatus();
      if (events.empty() && !still_wanted()) return absl::CancelledError("the watcher went away");
      if (shutting_down_ && events.empty()) {
        return absl::UnavailableError("the coordinator is stopping");
      }
      // Many watchers of a fast job: take its events in batches, not one wake-up each.
      if (!events.empty()) absl::SleepFor(kWatchBatch);
    }
  }
  // A job that has ended (and left memory, or ran before this coordinator): its record.
  ASSIGN_OR_RETURN(pb::JobStatus status, store_->Get(job_id, false));
  // Every log line and step, read as a watcher behind a live job reads what it missed.
  const JobEvents::Missed everything{.until = 1,
                                     .logs = std::numeric_limits<size_t>::max(),
                                     .last_step = std::numeric_limits<int64_t>::max()};
  size_t logs_seen = 0;
  int64_t last_step = -1;
  const absl::Status replayed =
      ReplayMissed(job_id, from_step, everything, &logs_seen, &last_step, sink);
  if (absl::IsCancelled(replayed)) return absl::OkStatus();  // the watcher went away
  RETURN_IF_ERROR(replayed);
  sink(StateEvent(status));
  return absl::OkStatus();
}

absl::Status JobManager::ReplayMissed(const std::string& job_id, int64_t from_step,
                                      const JobEvents::Missed& missed, size_t* logs_seen,
                                      int64_t* last_step,
                                      const std::function<bool(const pb::JobEvent&)>& pass) {
  if (*logs_seen < missed.logs) {
    ASSIGN_OR_RETURN(std::vector<pb::LogLine> logs, store_->Logs(job_id));
    for (size_t i = *logs_seen; i < std::min(missed.logs, logs.size()); ++i) {
      pb::JobEvent e;
      *e.mutable_log() = std::move(logs[i]);
      if (!pass(e)) return absl::CancelledError("the watcher went away");
    }
    *logs_seen = missed.logs;
  }
  if (*last_step < missed.last_step) {
    ASSIGN_OR_RETURN(std::vector<pb::StepRecord> steps,
                     store_->Steps(job_id, std::max(*last_step + 1, from_step)));
    for (pb::StepRecord& step : steps) {
      if (step.step() > missed.last_step) break;
      pb::JobEvent e;
      *e.mutable_step() = std::move(step);
      if (!pass(e)) return absl::CancelledError("the watcher went away");
    }
    *last_step = missed.last_step;
  }
  return absl::OkStatus();
}

absl::StatusOr<pb::Timeline> JobManager::Timeline(const std::string& job_id, int last_steps) {
  return store_->Timelines(job_id, /*predicted=*/false, last_steps);
}

absl::StatusOr<pb::Timeline> JobManager::PredictedTimeline(const std::string& job_id) {
  return store_->Timelines(job_id, /*predicted=*/true, 1);
}

absl::StatusOr<pb::RegisterStageResponse> JobManager::RegisterStage(
    const pb::RegisterStageRequest& request, const std::string& peer_identity) {
  ASSIGN_OR_RETURN(StageRegistration registered,
                   registry_.Register(request.address(), request.device(),
                                      request.registration_secret(), peer_identity));
  common::LogInfo("coordinator", absl::StrCat(registered.stage_id, " registered from ",
                                              request.address(), " (", request.device().name(),
                                              ")"));
  pb::RegisterStageResponse response;
  response.set_stage_id(registered.stage_id);
  response.set_registration_secret(registered.secret);
  response.set_heartbeat_interval_ms(
      static_cast<int32_t>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
  absl::MutexLock lock(&mu_);
  wake_.SignalAll();
  return response;
}

pb::HeartbeatResponse JobManager::Heartbeat(const pb::HeartbeatRequest& request) {
  pb::HeartbeatResponse response;
  // An id with the wrong secret is answered as unknown: the stage registers again.
  response.set_known(registry_.Heartbeat(
      request.stage_id(), request.registration_secret(),
      {request.links().begin(), request.links().end()}));
  // A stage told to stop keeps serving while a job holds it (pipetrain-stage
  // --stop-grace): until the job's thread has finished its step and freed it.
  response.set_held(response.known() && registry_.Held(request.stage_id()));
  return response;
}

pb::ClusterStatus JobManager::Cluster() {
  pb::ClusterStatus c;
  for (pb::StageInfo& s : registry_.Snapshot()) *c.add_stages() = std::move(s);
  return c;
}

}  // namespace pipetrain::coordinator

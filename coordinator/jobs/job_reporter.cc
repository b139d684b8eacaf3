#include "coordinator/jobs/job_reporter.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "coordinator/jobs/job_manager_internal.h"  // SetNow

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;

namespace {

std::string JobIdOf(const JobReporter::Job& job) {
  absl::MutexLock lock(job.mu);
  return job.status->job_id();
}

}  // namespace

JobReporter::JobReporter(Job job, JobStore& store, std::string tensorboard_dir,
                         JobStore::TimelinesKept timelines_kept)
    : job_(std::move(job)),
      store_(store),
      timelines_kept_(timelines_kept),
      tensorboard_(std::move(tensorboard_dir),
                   [this, id = JobIdOf(job_)](const absl::Status& s) {
                     const std::string text =
                         absl::StrCat("no more TensorBoard events for this job: ", s.message());
                     common::LogWarning("coordinator", absl::StrCat(id, ": ", text));
                     job_.log(text);
                   }) {}

void JobReporter::FirstStep(int64_t first) {
  absl::MutexLock lock(job_.mu);
  job_.status->set_first_step(first);
}

void JobReporter::PredictedTimeline(std::vector<pb::TimelineEvent> events) {
  predicted_.Clear();
  for (pb::TimelineEvent& e : events) *predicted_.add_events() = std::move(e);
}

pb::JobStatus JobReporter::CountStep(const pb::StepRecord& record) {
  absl::MutexLock lock(job_.mu);
  pb::JobStatus& status = *job_.status;
  status.set_steps_done(record.step());
  if (status.has_auto_plan() && std::exchange(first_seen_, true)) {
    step_times_.push_back(record.step_time_s());
    if (step_times_.size() > kMeasuredWindow) step_times_.pop_front();
    std::vector<double> sorted(step_times_.begin(), step_times_.end());
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    status.mutable_auto_plan()->set_measured_step_s(sorted[sorted.size() / 2]);
    status.mutable_auto_plan()->set_steps_measured(static_cast<int>(step_times_.size()));
  }
  const int n = status.recoveries_size();
  if (n > 0 && !status.recoveries(n - 1).has_continued()) {
    SetNow(status.mutable_recoveries(n - 1)->mutable_continued());
  }
  return status;
}

void JobReporter::Step(const pb::StepRecord& record, std::vector<pb::TimelineEvent> timeline) {
  tensorboard_.Step(record, absl::Now());
  const pb::JobStatus copy = CountStep(record);
  pb::Timeline measured;
  for (pb::TimelineEvent& e : timeline) *measured.add_events() = std::move(e);
  if (!predicted_.events().empty() && predicted_.events(0).step() != record.step()) {
    predicted_.Clear();  // not this step's
  }
  if (absl::Status s = store_.RecordStep(copy, record, measured, predicted_, timelines_kept_);
      !s.ok()) {
    common::LogWarning("coordinator", std::string(s.message()));
  }
  predicted_.Clear();
  pb::JobEvent e;
  *e.mutable_step() = record;
  job_.events->Append(std::move(e));
}

void JobReporter::Checkpoint(const std::string& dir, int64_t step) {
  {
    absl::MutexLock lock(job_.mu);
    job_.status->set_checkpoint_dir(dir);
  }
  job_.log(absl::StrCat("checkpoint of step ", step, " written to ", dir));
}

void JobReporter::Measured(const pb::MeasuredCostRates& rates) {
  absl::MutexLock lock(job_.mu);
  *job_.status->mutable_measured_costs() = rates;  // stored with the step's status
}

}  // namespace pipetrain::coordinator

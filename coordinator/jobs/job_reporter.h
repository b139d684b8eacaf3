// The coordinator's RunnerHooks: turns what a run of a job reports into the job's
// status (steps done, newest checkpoint, measured costs, first step), its store
// records (each step with its measured and predicted timelines), its events for
// watchers and its TensorBoard files; and answers the run's "stop?" from the job's
// cancel and the coordinator's stop.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "coordinator/jobs/job_events.h"
#include "coordinator/runner/job_runner.h"
#include "coordinator/store/job_store.h"
#include "coordinator/metrics/tensorboard_writer.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

class JobReporter : public RunnerHooks {
 public:
  // The parts of a live job the reporter writes; `status` is guarded by `mu`.
  struct Job {
    absl::Mutex* mu = nullptr;
    pipetrain::v1::JobStatus* status = nullptr;
    JobEvents* events = nullptr;
    std::function<void(const std::string&)> log;  // the job's log (store, events, stdout)
    std::function<bool()> stopped;                 // cancelled, or the coordinator stops
  };

  // TensorBoard event files go to `tensorboard_dir` (the job's own folder); the store
  // keeps the timelines of the latest steps, as many of each kind as `timelines_kept` says.
  JobReporter(Job job, JobStore& store, std::string tensorboard_dir,
              JobStore::TimelinesKept timelines_kept);
  // Its TensorBoard log's warning refers to it: it stays where it was made.
  JobReporter(const JobReporter&) = delete;
  JobReporter& operator=(const JobReporter&) = delete;

  // A restarted run continues in a TensorBoard file of its own.
  void NewRun() { tensorboard_.NewRun(); }

  void Log(const std::string& text) override { job_.log(text); }
  void FirstStep(int64_t first) override;
  void PredictedTimeline(std::vector<pipetrain::v1::TimelineEvent> events) override;
  // A step run again after a restart replaces its first record (and its timelines).
  void Step(const pipetrain::v1::StepRecord& record,
            std::vector<pipetrain::v1::TimelineEvent> timeline) override;
  void Checkpoint(const std::string& dir, int64_t step) override;
  void Measured(const pipetrain::v1::MeasuredCostRates& rates) override;
  bool Cancelled() override { return job_.stopped(); }

 private:
  // The status with the step counted (and a recovery's first step after it, and an
  // "auto" job's measured step time), copied.
  pipetrain::v1::JobStatus CountStep(const pipetrain::v1::StepRecord& record);

  const Job job_;
  JobStore& store_;
  const JobStore::TimelinesKept timelines_kept_;
  // The runner predicts a step's timeline just before it reports the step.
  pipetrain::v1::Timeline predicted_;
  // A failed write is a warning in the job's log, once; the job goes on.
  TensorBoardJobLog tensorboard_;
  // An "auto" job's latest step times (at most kMeasuredWindow, the first step left out:
  // links and pools warming up), the measured side of its prediction
  // (AutoPlan.measured_step_s, their median). Bounded, so a long job's step stays O(1).
  static constexpr size_t kMeasuredWindow = 100;
  std::deque<double> step_times_;
  bool first_seen_ = false;
};

}  // namespace pipetrain::coordinator

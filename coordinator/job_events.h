// The live events of one job, in order (state changes, steps, log lines), kept in memory
// while the coordinator runs so that any number of WatchJob streams can replay them from
// the start and then wait for more; and the timeline of the job's latest steps.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

class JobEvents {
 public:
  explicit JobEvents(int timeline_steps = 20) : timeline_steps_(timeline_steps) {}

  void Append(pipetrain::v1::JobEvent event);
  // After the last event: readers get what is left, then `ended` is true.
  void End();

  // Events from index `from` on. Waits up to `wait` for one when there are none yet and
  // the job has not ended. `ended` says no more will ever come after these.
  std::vector<pipetrain::v1::JobEvent> Read(size_t from, absl::Duration wait, bool* ended);

  // Keeps the timeline of the latest `timeline_steps` steps.
  void AddTimeline(std::vector<pipetrain::v1::TimelineEvent> events);
  // The last `steps` steps' events (at least the latest one), oldest step first.
  std::vector<pipetrain::v1::TimelineEvent> Timeline(int steps);
  // The simulator's prediction of the latest step, from the costs measured before it
  // (only the latest: it is drawn next to the measured step).
  void SetPredictedTimeline(std::vector<pipetrain::v1::TimelineEvent> events);
  std::vector<pipetrain::v1::TimelineEvent> PredictedTimeline();

 private:
  const int timeline_steps_;
  absl::Mutex mu_;
  absl::CondVar changed_;
  std::vector<pipetrain::v1::JobEvent> events_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::vector<pipetrain::v1::TimelineEvent>> timeline_ ABSL_GUARDED_BY(mu_);
  std::vector<pipetrain::v1::TimelineEvent> predicted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain::coordinator

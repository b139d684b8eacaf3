#include "coordinator/job_events.h"

#include <algorithm>

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;

void JobEvents::Append(pb::JobEvent event) {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(event));
  changed_.SignalAll();
}

void JobEvents::End() {
  absl::MutexLock lock(&mu_);
  ended_ = true;
  changed_.SignalAll();
}

std::vector<pb::JobEvent> JobEvents::Read(size_t from, absl::Duration wait, bool* ended) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + wait;
  while (!ended_ && events_.size() <= from) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
  }
  std::vector<pb::JobEvent> out;
  if (from < events_.size()) out.assign(events_.begin() + from, events_.end());
  *ended = ended_;
  return out;
}

void JobEvents::AddTimeline(std::vector<pb::TimelineEvent> events) {
  absl::MutexLock lock(&mu_);
  timeline_.push_back(std::move(events));
  while (static_cast<int>(timeline_.size()) > timeline_steps_) timeline_.pop_front();
}

std::vector<pb::TimelineEvent> JobEvents::Timeline(int steps) {
  absl::MutexLock lock(&mu_);
  const size_t n = std::min(timeline_.size(), static_cast<size_t>(std::max(steps, 1)));
  std::vector<pb::TimelineEvent> out;
  for (size_t i = timeline_.size() - n; i < timeline_.size(); ++i) {
    out.insert(out.end(), timeline_[i].begin(), timeline_[i].end());
  }
  return out;
}

void JobEvents::SetPredictedTimeline(std::vector<pb::TimelineEvent> events) {
  absl::MutexLock lock(&mu_);
  predicted_ = std::move(events);
}

std::vector<pb::TimelineEvent> JobEvents::PredictedTimeline() {
  absl::MutexLock lock(&mu_);
  return predicted_;
}

}  // namespace pipetrain::coordinator

#include "coordinator/jobs/job_events.h"

#include <algorithm>

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;

void JobEvents::Append(pb::JobEvent event) {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(event));
  while (events_.size() > keep_) {
    const pb::JobEvent& old = events_.front();
    if (old.has_log()) ++dropped_.logs;
    if (old.has_step()) dropped_.last_step = std::max(dropped_.last_step, old.step().step());
    ++dropped_.until;
    events_.pop_front();
  }
  changed_.SignalAll();
}

void JobEvents::End() {
  absl::MutexLock lock(&mu_);
  ended_ = true;
  changed_.SignalAll();
}

std::vector<pb::JobEvent> JobEvents::Read(size_t from, absl::Duration wait, bool* ended,
                                          Missed* missed) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + wait;
  while (!ended_ && dropped_.until + events_.size() <= from) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
  }
  *missed = from < dropped_.until ? dropped_ : Missed{};
  const size_t first = std::max(from, dropped_.until) - dropped_.until;
  std::vector<pb::JobEvent> out;
  if (first < events_.size()) out.assign(events_.begin() + first, events_.end());
  *ended = ended_;
  return out;
}

}  // namespace pipetrain::coordinator

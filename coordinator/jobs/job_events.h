// The live events of one job, in order (state changes, steps, log lines), kept in memory
// while the coordinator runs it so that any number of WatchJob streams can follow it. Only
// the latest `keep` events are kept (everything is in the job store as well): a reader
// that asks for older ones is told what it missed, and reads that from the store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

// Events of each running job kept in memory when the coordinator is not told otherwise
// (--events-in-memory).
inline constexpr size_t kDefaultEventsInMemory = 1024;

class JobEvents {
 public:
  // `stored_logs`: the job's log lines already in the store before these events (a job a
  // previous coordinator queued or ran), so that Missed::logs counts as the store does.
  explicit JobEvents(size_t keep, size_t stored_logs = 0) : keep_(keep < 1 ? 1 : keep) {
    dropped_.logs = stored_logs;
    stored_logs_ = stored_logs;
  }
  size_t stored_logs() const { return stored_logs_; }

  void Append(pipetrain::v1::JobEvent event);
  // After the last event: readers get what is left, then `ended` is true.
  void End();

  // What a reader missed when the events it asked for were no longer kept: every event
  // before index `until`, among them the job's log lines up to the store's `logs`-th
  // (stored_logs() of them from before these events) and its steps up to `last_step`.
  // until == 0: nothing was missed.
  struct Missed {
    size_t until = 0;
    size_t logs = 0;
    int64_t last_step = 0;
  };
  // Events from index `from` on (from `missed->until` when older ones were dropped).
  // Waits up to `wait` for one when there are none yet and the job has not ended.
  // `ended` says no more will ever come after these.
  std::vector<pipetrain::v1::JobEvent> Read(size_t from, absl::Duration wait, bool* ended,
                                            Missed* missed);

 private:
  const size_t keep_;
  size_t stored_logs_ = 0;
  absl::Mutex mu_;
  absl::CondVar changed_;
  std::deque<pipetrain::v1::JobEvent> events_ ABSL_GUARDED_BY(mu_);
  Missed dropped_ ABSL_GUARDED_BY(mu_);  // until = the index of events_.front()
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pipetrain::coordinator

#include "stage_server/exec/overlapped_reduction.h"

#include <utility>

namespace pipetrain::stage_server {

OverlappedReduction::OverlappedReduction(GradientAverage average)
    : state_(std::make_shared<State>(std::move(average))),
      worker_([s = state_] { Work(s); }) {}

OverlappedReduction::~OverlappedReduction() {
  bool aborted = false;
  {
    absl::MutexLock lock(&state_->mu);
    state_->stopping = true;
    aborted = !state_->aborted.empty();
  }
  if (aborted) {
    worker_.detach();  // it holds the state; it ends after the average it is in
  } else {
    worker_.join();
  }
}

void OverlappedReduction::Start(std::vector<float> data, WriteBack write_back) {
  absl::MutexLock lock(&state_->mu);
  if (!state_->aborted.empty()) return;
  state_->items.push_back({std::move(data), std::move(write_back)});
}

void OverlappedReduction::Work(std::shared_ptr<State> s) {
  absl::MutexLock lock(&s->mu);
  for (;;) {
    auto ready = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
      return s->next < s->items.size() || s->stopping;
    };
    s->mu.Await(absl::Condition(&ready));
    if (s->next >= s->items.size()) return;  // stopping, nothing left to do
    Item& item = s->items[s->next];
    if (!s->failure.ok() || !s->aborted.empty()) {
      ++s->next;  // skipped: the collective is broken, or nobody waits for it
      continue;
    }
    s->mu.Unlock();
    const absl::Time start = absl::Now();
    absl::Status status = s->average(std::span<float>(item.data));
    const absl::Duration took = absl::Now() - start;
    s->mu.Lock();
    s->busy += took;
    if (!status.ok() && s->failure.ok()) s->failure = std::move(status);
    ++s->next;
  }
}

absl::Status OverlappedReduction::Finish(ReductionTimes* times) {
  const absl::Time start = absl::Now();
  std::deque<Item> items;
  absl::Status status;
  {
    State& s = *state_;
    absl::MutexLock lock(&s.mu);
    auto done = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
      return s.next == s.items.size() || !s.aborted.empty();
    };
    s.mu.Await(absl::Condition(&done));
    if (!s.aborted.empty()) {
      times->exposed = absl::Now() - start;
      return absl::AbortedError(s.aborted);  // the worker keeps the items it works on
    }
    items.swap(s.items);
    s.next = 0;
    status = std::exchange(s.failure, absl::OkStatus());
    times->busy = std::exchange(s.busy, absl::ZeroDuration());
  }
  times->calls = static_cast<int>(items.size());
  for (Item& item : items) {
    if (!status.ok()) break;
    status = item.write_back(std::span<const float>(item.data));
  }
  times->exposed = absl::Now() - start;
  return status;
}

void OverlappedReduction::Abort(const std::string& why) {
  absl::MutexLock lock(&state_->mu);
  if (state_->aborted.empty()) state_->aborted = why.empty() ? "aborted" : why;
}

int OverlappedReduction::pending() const {
  absl::MutexLock lock(&state_->mu);
  return static_cast<int>(state_->items.size() - state_->next);
}

}  // namespace pipetrain::stage_server

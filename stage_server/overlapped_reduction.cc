#include "stage_server/overlapped_reduction.h"

#include <utility>

namespace pipetrain::stage_server {

OverlappedReduction::OverlappedReduction(GradientAverage average)
    : average_(std::move(average)), worker_([this] { Work(); }) {}

OverlappedReduction::~OverlappedReduction() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  worker_.join();
}

void OverlappedReduction::Start(std::vector<float> data, WriteBack write_back) {
  absl::MutexLock lock(&mu_);
  items_.push_back({std::move(data), std::move(write_back), false});
}

void OverlappedReduction::Work() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return next_ < items_.size() || stopping_;
    };
    mu_.Await(absl::Condition(&ready));
    if (next_ >= items_.size()) return;  // stopping, nothing left to do
    Item& item = items_[next_];
    if (!failure_.ok()) {
      item.done = true;  // skipped: the collective is broken
      ++next_;
      continue;
    }
    mu_.Unlock();
    const absl::Time start = absl::Now();
    absl::Status s = average_(std::span<float>(item.data));
    const absl::Duration took = absl::Now() - start;
    mu_.Lock();
    busy_ += took;
    if (!s.ok() && failure_.ok()) failure_ = std::move(s);
    item.done = true;
    ++next_;
  }
}

absl::Status OverlappedReduction::Finish(ReductionTimes* times) {
  const absl::Time start = absl::Now();
  std::deque<Item> items;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return next_ == items_.size(); };
    mu_.Await(absl::Condition(&all_done));
    items.swap(items_);
    next_ = 0;
    status = std::exchange(failure_, absl::OkStatus());
    times->busy = std::exchange(busy_, absl::ZeroDuration());
  }
  times->calls = static_cast<int>(items.size());
  for (Item& item : items) {
    if (!status.ok()) break;
    status = item.write_back(std::span<const float>(item.data));
  }
  times->exposed = absl::Now() - start;
  return status;
}

int OverlappedReduction::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(items_.size() - next_);
}

}  // namespace pipetrain::stage_server

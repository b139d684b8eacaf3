#include "stage_server/link/shm/shm_slots.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::stage_server {

ShmSlots::ShmSlots(int slots, uint64_t slot_bytes, std::string link)
    : slot_bytes_(std::max<uint64_t>(1, slot_bytes)),
      link_(std::move(link)),
      out_(std::max(1, slots), false),
      free_(std::max(1, slots)) {}

int ShmSlots::SlotsFor(uint64_t bytes) const {
  return static_cast<int>(std::max<uint64_t>(1, (bytes + slot_bytes_ - 1) / slot_bytes_));
}

absl::StatusOr<std::vector<int>> ShmSlots::Acquire(int count, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (count < 1 || count > static_cast<int>(out_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("link ", link_, ": ", count,
                                                   " slots asked of ", out_.size()));
  }
  const auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !closed_.empty() || free_ >= count;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "link ", link_, ": no ", count, " free shared-memory slots (", free_, " of ",
        out_.size(), " free) by the deadline; the receiver returned no credit"));
  }
  if (!closed_.empty()) {
    return absl::AbortedError(absl::StrCat("link ", link_, " closed: ", closed_));
  }
  std::vector<int> slots;
  for (int i = 0; i < static_cast<int>(out_.size()) && static_cast<int>(slots.size()) < count; ++i) {
    if (out_[i]) continue;
    out_[i] = true;
    slots.push_back(i);
  }
  free_ -= count;
  return slots;
}

absl::Status ShmSlots::Release(int slot) {
  absl::MutexLock lock(&mu_);
  if (slot < 0 || slot >= static_cast<int>(out_.size()) || !out_[slot]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "link ", link_, ": a credit for shared-memory slot ", slot,
        ", which is not in flight (", out_.size(), " slots)"));
  }
  out_[slot] = false;
  ++free_;
  return absl::OkStatus();
}

void ShmSlots::Close(const std::string& why) {
  absl::MutexLock lock(&mu_);
  closed_ = why.empty() ? "closed" : why;
  std::fill(out_.begin(), out_.end(), false);
  free_ = static_cast<int>(out_.size());
}

int ShmSlots::free_slots() const {
  absl::MutexLock lock(&mu_);
  return free_;
}

}  // namespace pipetrain::stage_server

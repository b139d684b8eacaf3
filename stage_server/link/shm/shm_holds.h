// The receiving end's account of the slots it keeps: a received tensor that
// came in one part may stay where the sender wrote it, viewed in place by the stage,
// until the stage drops it; only then does its credit go back. The protocol lets a
// receiver keep at most half a region's slots this way (ShmLayout::max_held_slots) and
// a sender's part take at most the other half (ShmLayout::max_part_bytes), so a sender
// always gets slots back from what the receiver copies out, however long the stage
// holds its tensors. A holder keeps the region mapped after the link went. Thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "stage_server/link/shm/shm_transport.h"

namespace pipetrain::stage_server {

class ShmHolds : public std::enable_shared_from_this<ShmHolds> {
 public:
  // `credit` sends the credit for slots the stage let go; it may be called from any
  // thread (whichever drops the tensor), never under the caller's own locks.
  using Credit = std::function<void(std::span<const int>)>;
  explicit ShmHolds(Credit credit) : credit_(std::move(credit)) {}

  // A holder for `slots` of `receiver`'s region, whose last copy's drop credits them;
  // null (keep nothing: copy out and credit now) when it would pass `limit` held slots.
  std::shared_ptr<const void> TryHold(std::shared_ptr<const ShmReceiver> receiver,
                                      std::vector<int> slots, int limit);
  // The link is going away: later drops credit nothing. Waits for a credit in flight.
  void Detach();
  int held() const;

 private:
  void Return(std::span<const int> slots);

  mutable absl::Mutex mu_;
  Credit credit_ ABSL_GUARDED_BY(mu_);
  int held_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pipetrain::stage_server

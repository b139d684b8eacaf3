#include "stage_server/link/shm/shm_holds.h"

#include <utility>

namespace pipetrain::stage_server {
namespace {

// What a held tensor's pieces keep alive: the mapping, and the account to credit.
struct Hold {
  std::shared_ptr<const ShmReceiver> receiver;
  std::shared_ptr<ShmHolds> holds;
  std::vector<int> slots;
};

}  // namespace

std::shared_ptr<const void> ShmHolds::TryHold(std::shared_ptr<const ShmReceiver> receiver,
                                              std::vector<int> slots, int limit) {
  {
    absl::MutexLock lock(&mu_);
    if (!credit_ || held_ + static_cast<int>(slots.size()) > limit) return nullptr;
    held_ += static_cast<int>(slots.size());
  }
  auto* hold = new Hold{std::move(receiver), shared_from_this(), std::move(slots)};
  return std::shared_ptr<const void>(hold, [](Hold* h) {
    h->holds->Return(h->slots);
    delete h;
  });
}

void ShmHolds::Return(std::span<const int> slots) {
  absl::MutexLock lock(&mu_);
  held_ -= static_cast<int>(slots.size());
  if (credit_) credit_(slots);
}

void ShmHolds::Detach() {
  absl::MutexLock lock(&mu_);
  credit_ = nullptr;
}

int ShmHolds::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

}  // namespace pipetrain::stage_server

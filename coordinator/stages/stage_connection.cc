#include "coordinator/stages/stage_connection.h"

#include <utility>

namespace pipetrain::coordinator {

void CallControl::Cancel() {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  if (cancel_) cancel_();
}

bool CallControl::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void CallControl::SetCanceller(std::function<void()> cancel) {
  absl::MutexLock lock(&mu_);
  cancel_ = std::move(cancel);
  if (cancelled_ && cancel_) cancel_();
}

}  // namespace pipetrain::coordinator

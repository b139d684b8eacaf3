#include "common/buffer_pool.h"

#include <utility>

namespace pipetrain::common {

Buffer BufferPool::Acquire(size_t size) {
  {
    absl::MutexLock lock(&mu_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      Buffer b = std::move(it->second.back());
      it->second.pop_back();
      cached_bytes_ -= size;
      ++hits_;
      return b;
    }
  }
  return Buffer(size);
}

void BufferPool::Release(Buffer buffer) {
  const size_t size = buffer.size();
  if (size == 0) return;
  absl::MutexLock lock(&mu_);
  if (cached_bytes_ + size > max_cached_bytes_) return;  // freed on scope exit
  cached_bytes_ += size;
  free_[size].push_back(std::move(buffer));
}

size_t BufferPool::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  return cached_bytes_;
}

size_t BufferPool::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

}  // namespace pipetrain::common

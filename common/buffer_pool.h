// Reuses byte buffers of recurring sizes. Pipeline traffic repeats the same tensor
// sizes every micro-batch and step, and first-touching fresh pages costs far more than
// copying into warm ones, so receivers take their buffers from here.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/tensor.h"

namespace pipetrain::common {

class BufferPool {
 public:
  // max_cached_bytes bounds what idle buffers may hold in total.
  explicit BufferPool(size_t max_cached_bytes = size_t{1} << 30)
      : max_cached_bytes_(max_cached_bytes) {}

  // A buffer of exactly `size` bytes: a cached one if any, else a new one.
  Buffer Acquire(size_t size);
  // Gives a buffer back for reuse; dropped if the cache is full.
  void Release(Buffer buffer);

  size_t cached_bytes() const;
  size_t hits() const;

 private:
  const size_t max_cached_bytes_;
  mutable absl::Mutex mu_;
  std::map<size_t, std::vector<Buffer>> free_ ABSL_GUARDED_BY(mu_);
  size_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t hits_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pipetrain::common

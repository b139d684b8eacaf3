// BackendBuffer: an owning handle to memory allocated by a backend, freed on destruction,
// so layers and chunks cannot leak device memory on an early error return.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "stage_server/compute/backend.h"

namespace pipetrain::compute {

template <typename Real>
class BackendBuffer {
 public:
  BackendBuffer() = default;
  static absl::StatusOr<BackendBuffer> Allocate(BackendT<Real>* backend, size_t bytes) {
    absl::StatusOr<void*> ptr = backend->Allocate(bytes);
    if (!ptr.ok()) return ptr.status();
    return BackendBuffer(backend, *ptr, bytes);
  }
  // Allocates `n` elements of Real, zeroed.
  static absl::StatusOr<BackendBuffer> Zeros(BackendT<Real>* backend, int64_t n) {
    absl::StatusOr<BackendBuffer> b = Allocate(backend, n * sizeof(Real));
    if (!b.ok()) return b;
    if (absl::Status s = backend->Zero(b->data(), b->bytes()); !s.ok()) return s;
    return b;
  }

  BackendBuffer(BackendBuffer&& o) noexcept
      : backend_(o.backend_),
        ptr_(std::exchange(o.ptr_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)) {}
  BackendBuffer& operator=(BackendBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      backend_ = o.backend_;
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  ~BackendBuffer() { Reset(); }

  void Reset() {
    // A failing Free during destruction has nowhere to go; backends log their own.
    if (ptr_ != nullptr) (void)backend_->Free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

  Real* data() const { return static_cast<Real*>(ptr_); }
  int32_t* ints() const { return static_cast<int32_t*>(ptr_); }
  void* raw() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }

 private:
  BackendBuffer(BackendT<Real>* backend, void* ptr, size_t bytes)
      : backend_(backend), ptr_(ptr), bytes_(bytes) {}

  BackendT<Real>* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace pipetrain::compute

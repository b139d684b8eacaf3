// BackendBuffer: an owning handle to memory allocated by a backend, freed on destruction,
// so layers and chunks cannot leak device memory on an early error return. A buffer of
// elements carries their dtype, and every byte count the compute library sizes by comes
// from the dtype table (common/tensor.h) through BytesOf.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "stage_server/compute/backend.h"

namespace pipetrain::compute {

// The dtype of the elements the compute library keeps: F32 for the Real of every
// production backend, I32 for token ids. double, the scalar of the reference backend's
// gradient checks, is no dtype of the wire or of checkpoints: it has no entry, and its
// buffers are sized by its C++ size.
template <typename T>
inline constexpr common::DType kDTypeOf = common::DType::kUnspecified;
template <>
inline constexpr common::DType kDTypeOf<float> = common::DType::kF32;
template <>
inline constexpr common::DType kDTypeOf<int32_t> = common::DType::kI32;

// Bytes of n elements of T.
template <typename T>
size_t BytesOf(int64_t n) {
  if constexpr (kDTypeOf<T> == common::DType::kUnspecified) {
    return static_cast<size_t>(n) * sizeof(T);
  } else {
    return static_cast<size_t>(n) * common::DTypeSize(kDTypeOf<T>);
  }
}

template <typename Real>
class BackendBuffer {
 public:
  BackendBuffer() = default;
  static absl::StatusOr<BackendBuffer> Allocate(BackendT<Real>* backend, size_t bytes) {
    absl::StatusOr<void*> ptr = backend->Allocate(bytes);
    if (!ptr.ok()) return ptr.status();
    return BackendBuffer(backend, *ptr, bytes);
  }
  // Allocates `n` elements of T (Real or int32_t), uninitialised, of T's dtype.
  template <typename T = Real>
  static absl::StatusOr<BackendBuffer> Elements(BackendT<Real>* backend, int64_t n) {
    absl::StatusOr<BackendBuffer> b = Allocate(backend, BytesOf<T>(n));
    if (b.ok()) b->dtype_ = kDTypeOf<T>;
    return b;
  }
  // Allocates `n` elements of Real, zeroed.
  static absl::StatusOr<BackendBuffer> Zeros(BackendT<Real>* backend, int64_t n) {
    absl::StatusOr<BackendBuffer> b = Elements(backend, n);
    if (!b.ok()) return b;
    if (absl::Status s = backend->Zero(b->data(), b->bytes()); !s.ok()) return s;
    return b;
  }

  BackendBuffer(BackendBuffer&& o) noexcept
      : backend_(o.backend_),
        ptr_(std::exchange(o.ptr_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)),
        dtype_(std::exchange(o.dtype_, common::DType::kUnspecified)) {}
  BackendBuffer& operator=(BackendBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      backend_ = o.backend_;
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      dtype_ = std::exchange(o.dtype_, common::DType::kUnspecified);
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
    dtype_ = common::DType::kUnspecified;
  }

  Real* data() const { return static_cast<Real*>(ptr_); }
  int32_t* ints() const { return static_cast<int32_t*>(ptr_); }
  void* raw() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }
  // What Elements allocated (kUnspecified for raw bytes and the reference's doubles).
  common::DType dtype() const { return dtype_; }

 private:
  BackendBuffer(BackendT<Real>* backend, void* ptr, size_t bytes)
      : backend_(backend), ptr_(ptr), bytes_(bytes) {}

  BackendT<Real>* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  common::DType dtype_ = common::DType::kUnspecified;
};

}  // namespace pipetrain::compute

// The host tensor type every module shares: a dtype, a row-major shape and an owned,
// uninitialised-on-allocation byte buffer. Device tensors live in the compute backends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain::common {

// Values match pipetrain.v1.DType on the wire.
enum class DType : int {
  kUnspecified = 0,
  kF32 = 1,
  kBF16 = 2,
  kF16 = 3,
  kI32 = 4,
  kI64 = 5,
  kU8 = 6,
};

// Bytes per element; 0 for kUnspecified or a value outside the enum.
size_t DTypeSize(DType dtype);
std::string DTypeName(DType dtype);
bool IsValidDType(int value);

// Number of elements of a shape, or an error naming `field` if a dimension is
// negative or the product overflows.
absl::StatusOr<uint64_t> NumElements(std::span<const int64_t> shape,
                                     const std::string& field = "shape");
std::string ShapeString(std::span<const int64_t> shape);  // e.g. "(4, 128, 256)"

// An owned byte buffer. Allocation does not zero the memory (first-touching pages is
// the expensive part on these machines; callers that need zeros say so).
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t size);
  Buffer(Buffer&& other) noexcept
      : data_(std::move(other.data_)), size_(std::exchange(other.size_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }

  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }
  std::span<std::byte> span() { return {data_.get(), size_}; }
  std::span<const std::byte> span() const { return {data_.get(), size_}; }

 private:
  std::unique_ptr<std::byte[]> data_;
  size_t size_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates uninitialised storage; fails on an invalid dtype or shape.
  static absl::StatusOr<Tensor> Create(DType dtype, std::vector<int64_t> shape);
  // Wraps existing storage; fails unless buffer.size() matches dtype and shape.
  static absl::StatusOr<Tensor> FromBuffer(DType dtype, std::vector<int64_t> shape,
                                           Buffer buffer);

  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor Clone() const;

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  size_t num_bytes() const { return buffer_.size(); }
  size_t num_elements() const;
  std::span<std::byte> bytes() { return buffer_.span(); }
  std::span<const std::byte> bytes() const { return buffer_.span(); }

  // Typed views; the caller is responsible for T matching dtype().
  template <typename T>
  std::span<T> data() {
    return {reinterpret_cast<T*>(buffer_.data()), buffer_.size() / sizeof(T)};
  }
  template <typename T>
  std::span<const T> data() const {
    return {reinterpret_cast<const T*>(buffer_.data()), buffer_.size() / sizeof(T)};
  }

  // Gives the storage back (for pooling); the tensor becomes empty.
  Buffer ReleaseBuffer();

 private:
  Tensor(DType dtype, std::vector<int64_t> shape, Buffer buffer)
      : dtype_(dtype), shape_(std::move(shape)), buffer_(std::move(buffer)) {}

  DType dtype_ = DType::kUnspecified;
  std::vector<int64_t> shape_;
  Buffer buffer_;
};

}  // namespace pipetrain::common

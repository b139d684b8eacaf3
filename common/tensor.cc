#include "common/tensor.h"

#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::common {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    case DType::kUnspecified: return 0;
  }
  return 0;
}

std::string DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kUnspecified: return "unspecified";
  }
  return absl::StrCat("dtype(", static_cast<int>(dtype), ")");
}

bool IsValidDType(int value) {
  return value > 0 && DTypeSize(static_cast<DType>(value)) != 0;
}

absl::StatusOr<uint64_t> NumElements(std::span<const int64_t> shape,
                                     const std::string& field) {
  uint64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] is negative (", shape[i], ")"));
    }
    const uint64_t d = static_cast<uint64_t>(shape[i]);
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / 16 / d) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " ", ShapeString(shape), " has too many elements"));
    }
    n *= d;
  }
  return n;
}

std::string ShapeString(std::span<const int64_t> shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

Buffer::Buffer(size_t size)
    : data_(size ? std::make_unique_for_overwrite<std::byte[]>(size) : nullptr),
      size_(size) {}

absl::StatusOr<Tensor> Tensor::Create(DType dtype, std::vector<int64_t> shape) {
  if (DTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", DTypeName(dtype), " is not a valid element type"));
  }
  auto n = NumElements(shape);
  if (!n.ok()) return n.status();
  Buffer buffer(*n * DTypeSize(dtype));
  return Tensor(dtype, std::move(shape), std::move(buffer));
}

absl::StatusOr<Tensor> Tensor::FromBuffer(DType dtype, std::vector<int64_t> shape,
                                          Buffer buffer) {
  if (DTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", DTypeName(dtype), " is not a valid element type"));
  }
  auto n = NumElements(shape);
  if (!n.ok()) return n.status();
  if (*n * DTypeSize(dtype) != buffer.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", ShapeString(shape), " of ", DTypeName(dtype), " needs ",
        *n * DTypeSize(dtype), " bytes but the buffer holds ", buffer.size()));
  }
  return Tensor(dtype, std::move(shape), std::move(buffer));
}

Tensor Tensor::Clone() const {
  Buffer copy(buffer_.size());
  if (buffer_.size()) std::memcpy(copy.data(), buffer_.data(), buffer_.size());
  return Tensor(dtype_, shape_, std::move(copy));
}

size_t Tensor::num_elements() const {
  const size_t s = DTypeSize(dtype_);
  return s ? buffer_.size() / s : 0;
}

Buffer Tensor::ReleaseBuffer() {
  shape_.clear();
  dtype_ = DType::kUnspecified;
  return std::move(buffer_);
}

}  // namespace pipetrain::common

// Size arithmetic on figures a request or a file controls (model shapes, batch x
// sequence, byte counts): 64-bit and overflow-checked, and an overflow names the field
// whose value made it, so no size wraps into a negative or small number downstream.
// Where a size is only compared against a limit, the saturating forms stop at
// UINT64_MAX instead, which no limit admits.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pipetrain::common {

// a * b, or INVALID_ARGUMENT "FIELD: A x B overflows 64-bit arithmetic".
inline absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b, absl::string_view field) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", a, " x ", b, " overflows 64-bit arithmetic"));
  }
  return product;
}

// a + b, or INVALID_ARGUMENT "FIELD: A + B overflows 64-bit arithmetic".
inline absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b, absl::string_view field) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", a, " + ", b, " overflows 64-bit arithmetic"));
  }
  return sum;
}

// a + b and a * b, stopping at UINT64_MAX rather than wrapping.
inline uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  uint64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? UINT64_MAX : sum;
}
inline uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  uint64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? UINT64_MAX : product;
}

}  // namespace pipetrain::common

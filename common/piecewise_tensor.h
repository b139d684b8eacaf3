// A tensor whose bytes lie in several read-only pieces: what a peer link receives,
// still in the network's buffers. Consumers copy the pieces once, straight into the
// memory they compute on (Backend::CopyFromHostPieces), instead of the link first
// gathering them into one host buffer. Owned pieces stay alive as long as the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"

namespace pipetrain::common {

class PiecewiseTensor {
 public:
  using Piece = std::span<const std::byte>;

  PiecewiseTensor() = default;
  PiecewiseTensor(PiecewiseTensor&&) noexcept = default;
  PiecewiseTensor& operator=(PiecewiseTensor&&) noexcept = default;

  // One piece that the result owns.
  static PiecewiseTensor FromTensor(Tensor tensor);
  // One piece that the result only views: `tensor` must outlive it.
  static PiecewiseTensor View(const Tensor& tensor);
  // Pieces in order, kept alive by `holders`; fails unless they add up to exactly
  // dtype x shape bytes.
  static absl::StatusOr<PiecewiseTensor> FromPieces(
      DType dtype, std::vector<int64_t> shape, std::vector<Piece> pieces,
      std::vector<std::shared_ptr<const void>> holders);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  size_t num_bytes() const { return num_bytes_; }
  std::span<const Piece> pieces() const { return pieces_; }

  // Copies the bytes, in order, into dst, which must be num_bytes() long.
  void CopyTo(std::span<std::byte> dst) const;

 private:
  DType dtype_ = DType::kUnspecified;
  std::vector<int64_t> shape_;
  size_t num_bytes_ = 0;
  std::vector<Piece> pieces_;
  std::vector<std::shared_ptr<const void>> holders_;
  std::unique_ptr<Tensor> owned_;  // FromTensor's tensor (pieces_ views it)
};

}  // namespace pipetrain::common

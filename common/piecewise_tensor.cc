#include "common/piecewise_tensor.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::common {

PiecewiseTensor PiecewiseTensor::FromTensor(Tensor tensor) {
  PiecewiseTensor out;
  out.owned_ = std::make_unique<Tensor>(std::move(tensor));
  out.dtype_ = out.owned_->dtype();
  out.shape_ = out.owned_->shape();
  out.num_bytes_ = out.owned_->num_bytes();
  if (out.num_bytes_ > 0) out.pieces_.push_back(std::as_const(*out.owned_).bytes());
  return out;
}

PiecewiseTensor PiecewiseTensor::View(const Tensor& tensor) {
  PiecewiseTensor out;
  out.dtype_ = tensor.dtype();
  out.shape_ = tensor.shape();
  out.num_bytes_ = tensor.num_bytes();
  if (out.num_bytes_ > 0) out.pieces_.push_back(tensor.bytes());
  return out;
}

absl::StatusOr<PiecewiseTensor> PiecewiseTensor::FromPieces(
    DType dtype, std::vector<int64_t> shape, std::vector<Piece> pieces,
    std::vector<std::shared_ptr<const void>> holders) {
  if (DTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", static_cast<int>(dtype), " is not a valid tensor dtype"));
  }
  auto n = NumElements(shape);
  if (!n.ok()) return n.status();
  size_t total = 0;
  for (const Piece& p : pieces) total += p.size();
  const uint64_t want = *n * DTypeSize(dtype);
  if (total != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pieces hold ", total, " bytes, but a ", DTypeName(dtype), " ", ShapeString(shape),
        " tensor has ", want));
  }
  PiecewiseTensor out;
  out.dtype_ = dtype;
  out.shape_ = std::move(shape);
  out.num_bytes_ = total;
  for (const Piece& p : pieces) {
    if (!p.empty()) out.pieces_.push_back(p);
  }
  out.holders_ = std::move(holders);
  return out;
}

void PiecewiseTensor::CopyTo(std::span<std::byte> dst) const {
  std::byte* out = dst.data();
  for (const Piece& p : pieces_) {
    std::memcpy(out, p.data(), p.size());
    out += p.size();
  }
}

}  // namespace pipetrain::common

#include "common/tensor_codec.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/error_context.h"
#include "common/status_macros.h"

namespace pipetrain::common {
namespace {

absl::Status Invalid(const FrameTag& tag, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(DescribeTag(tag), ": ", what));
}

}  // namespace

std::string TensorKindName(TensorKind kind) {
  switch (kind) {
    case TensorKind::kActivation: return "activation";
    case TensorKind::kGradient: return "gradient";
    case TensorKind::kTiedGradient: return "tied-embedding gradient";
    case TensorKind::kUnspecified: return "unspecified";
  }
  return absl::StrCat("kind(", static_cast<int>(kind), ")");
}

std::string DescribeTag(const FrameTag& tag) {
  return absl::StrCat(ErrorContext("frame")
                          .Job(tag.job_id)
                          .Step(static_cast<int64_t>(tag.step))
                          .MicroBatch(tag.micro_batch)
                          .Chunk(tag.chunk)
                          .Text(),
                      " (", TensorKindName(tag.kind), ")");
}

absl::StatusOr<TensorEncoder> TensorEncoder::Create(FrameTag tag, DType dtype,
                                                    std::vector<int64_t> shape,
                                                    std::span<const std::byte> data,
                                                    size_t frame_bytes) {
  if (frame_bytes == 0) return absl::InvalidArgumentError("frame_bytes must be > 0");
  if (DTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", DTypeName(dtype), " is not a valid element type"));
  }
  ASSIGN_OR_RETURN(const uint64_t n, NumElements(shape));
  if (n * DTypeSize(dtype) != data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeString(shape), " of ", DTypeName(dtype), " needs ",
                     n * DTypeSize(dtype), " bytes, data has ", data.size()));
  }
  TensorEncoder e;
  e.header_.tag = std::move(tag);
  e.header_.dtype = static_cast<int>(dtype);
  e.header_.shape = std::move(shape);
  e.header_.total_bytes = data.size();
  e.data_ = data;
  e.frame_bytes_ = frame_bytes;
  // An empty tensor still travels as one (empty) frame so that it arrives.
  e.num_frames_ = data.empty() ? 1 : (data.size() + frame_bytes - 1) / frame_bytes;
  return e;
}

FrameView TensorEncoder::frame(size_t index) const {
  FrameView f;
  f.header = header_;
  const size_t begin = std::min(index * frame_bytes_, data_.size());
  const size_t end = std::min(begin + frame_bytes_, data_.size());
  f.header.offset = begin;
  f.payload = data_.subspan(begin, end - begin);
  return f;
}

absl::Status TensorReassembler::CheckFirstFrame(const FrameHeader& h,
                                                size_t payload_size) const {
  if (h.tag.kind != TensorKind::kActivation && h.tag.kind != TensorKind::kGradient &&
      h.tag.kind != TensorKind::kTiedGradient) {
    return Invalid(h.tag, absl::StrCat("kind ", static_cast<int>(h.tag.kind),
                                       " is not activation, gradient or tied-embedding gradient"));
  }
  if (!IsValidDType(h.dtype)) {
    return Invalid(h.tag, absl::StrCat("dtype ", h.dtype, " is not a known dtype"));
  }
  const DType dtype = static_cast<DType>(h.dtype);
  auto n = NumElements(h.shape);
  if (!n.ok()) return Invalid(h.tag, n.status().message());
  if (h.total_bytes > options_.max_tensor_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        DescribeTag(h.tag), ": total_bytes ", h.total_bytes, " exceeds the limit of ",
        options_.max_tensor_bytes, " bytes per tensor"));
  }
  if (*n * DTypeSize(dtype) != h.total_bytes) {
    return Invalid(h.tag, absl::StrCat("shape ", ShapeString(h.shape), " of ",
                                       DTypeName(dtype), " is ", *n * DTypeSize(dtype),
                                       " bytes but total_bytes is ", h.total_bytes));
  }
  if (h.offset != 0) {
    return Invalid(h.tag, absl::StrCat("offset ", h.offset,
                                       " leaves a hole: a tensor starts at offset 0"));
  }
  return absl::OkStatus();
}

absl::Status TensorReassembler::CheckNextFrame(const FrameHeader& h,
                                               size_t payload_size) const {
  const FrameHeader& c = current_;
  if (h.tag.job_id != c.tag.job_id) {
    return Invalid(c.tag, absl::StrCat("job_id changed mid-tensor to '", h.tag.job_id, "'"));
  }
  if (h.tag.step != c.tag.step) {
    return Invalid(c.tag, absl::StrCat("step changed mid-tensor to ", h.tag.step));
  }
  if (h.tag.micro_batch != c.tag.micro_batch) {
    return Invalid(c.tag,
                   absl::StrCat("micro_batch changed mid-tensor to ", h.tag.micro_batch));
  }
  if (h.tag.chunk != c.tag.chunk) {
    return Invalid(c.tag, absl::StrCat("chunk changed mid-tensor to ", h.tag.chunk));
  }
  if (h.tag.kind != c.tag.kind) {
    return Invalid(c.tag, absl::StrCat("kind changed mid-tensor to ",
                                       TensorKindName(h.tag.kind)));
  }
  if (h.dtype != c.dtype) {
    return Invalid(c.tag, absl::StrCat("dtype changed mid-tensor from ", c.dtype, " to ",
                                       h.dtype));
  }
  if (h.shape != c.shape) {
    return Invalid(c.tag, absl::StrCat("shape changed mid-tensor from ",
                                       ShapeString(c.shape), " to ", ShapeString(h.shape)));
  }
  if (h.total_bytes != c.total_bytes) {
    return Invalid(c.tag, absl::StrCat("total_bytes changed mid-tensor from ",
                                       c.total_bytes, " to ", h.total_bytes));
  }
  if (h.offset < received_) {
    return Invalid(c.tag, absl::StrCat("offset ", h.offset, " overlaps bytes already received (next expected offset ",
                                       received_, ")"));
  }
  if (h.offset > received_) {
    return Invalid(c.tag, absl::StrCat("offset ", h.offset,
                                       " leaves a hole (next expected offset ", received_, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<ReceivedTensor>> TensorReassembler::Accept(
    const FrameHeader& header, std::span<const std::byte> payload) {
  const std::span<const std::byte> pieces[] = {payload};
  return Accept(header, pieces);
}

absl::Status TensorReassembler::Check(const FrameHeader& header, size_t payload_size,
                                      bool keep_pieces) {
  absl::Status status = in_progress_ ? CheckNextFrame(header, payload_size)
                                     : CheckFirstFrame(header, payload_size);
  if (status.ok() && in_progress_ && keep_pieces != keep_pieces_) {
    status = absl::InternalError(absl::StrCat(
        DescribeTag(header.tag), ": a tensor's frames mixed copying and keeping pieces"));
  }
  if (status.ok() && payload_size > options_.max_frame_bytes) {
    status = absl::ResourceExhaustedError(
        absl::StrCat(DescribeTag(header.tag), ": payload of ", payload_size,
                     " bytes exceeds the limit of ", options_.max_frame_bytes,
                     " bytes per frame"));
  }
  if (status.ok() && payload_size > header.total_bytes - header.offset) {
    status = Invalid(header.tag,
                     absl::StrCat("payload of ", payload_size, " bytes at offset ",
                                  header.offset, " runs past total_bytes ",
                                  header.total_bytes, " (more bytes than announced)"));
  }
  if (status.ok() && payload_size == 0 && header.total_bytes != 0) {
    status = Invalid(header.tag, absl::StrCat("frame at offset ", header.offset,
                                              " carries no payload"));
  }
  if (!status.ok()) {
    Abandon();
    return status;
  }
  if (!in_progress_) {
    in_progress_ = true;
    keep_pieces_ = keep_pieces;
    current_ = header;
    received_ = 0;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<ReceivedTensor>> TensorReassembler::Accept(
    const FrameHeader& header, std::span<const std::span<const std::byte>> pieces) {
  size_t payload_size = 0;
  for (const auto& piece : pieces) payload_size += piece.size();
  const bool first = !in_progress_;
  RETURN_IF_ERROR(Check(header, payload_size, /*keep_pieces=*/false));
  if (first) {
    // Allocated only now, after the announcement passed every check.
    buffer_ = pool_ ? pool_->Acquire(header.total_bytes) : Buffer(header.total_bytes);
  }
  std::byte* dst = buffer_.data() + header.offset;
  for (const auto& piece : pieces) {
    if (piece.empty()) continue;
    std::memcpy(dst, piece.data(), piece.size());
    dst += piece.size();
  }
  received_ += payload_size;
  if (received_ < current_.total_bytes) return std::optional<ReceivedTensor>();

  in_progress_ = false;
  ReceivedTensor out;
  out.tag = current_.tag;
  ASSIGN_OR_RETURN(out.tensor, Tensor::FromBuffer(static_cast<DType>(current_.dtype),
                                                  current_.shape, std::move(buffer_)));
  return std::optional<ReceivedTensor>(std::move(out));
}

absl::StatusOr<std::optional<ReceivedPieces>> TensorReassembler::AcceptPieces(
    const FrameHeader& header, std::span<const std::span<const std::byte>> pieces,
    std::shared_ptr<const void> holder) {
  size_t payload_size = 0;
  for (const auto& piece : pieces) payload_size += piece.size();
  RETURN_IF_ERROR(Check(header, payload_size, /*keep_pieces=*/true));
  for (const auto& piece : pieces) {
    if (!piece.empty()) pieces_.push_back(piece);
  }
  if (holder) holders_.push_back(std::move(holder));
  received_ += payload_size;
  if (received_ < current_.total_bytes) return std::optional<ReceivedPieces>();

  in_progress_ = false;
  ReceivedPieces out;
  out.tag = current_.tag;
  ASSIGN_OR_RETURN(out.tensor, PiecewiseTensor::FromPieces(
                                   static_cast<DType>(current_.dtype), current_.shape,
                                   std::exchange(pieces_, {}), std::exchange(holders_, {})));
  return std::optional<ReceivedPieces>(std::move(out));
}

absl::Status TensorReassembler::Finish() {
  if (!in_progress_) return absl::OkStatus();
  const std::string what = absl::StrCat(
      "stream ended mid-tensor after ", received_, " of ", current_.total_bytes, " bytes");
  absl::Status s = absl::DataLossError(absl::StrCat(DescribeTag(current_.tag), ": ", what));
  Abandon();
  return s;
}

void TensorReassembler::Abandon() {
  if (in_progress_ && pool_ && buffer_.size() > 0) pool_->Release(std::move(buffer_));
  buffer_ = Buffer();
  pieces_.clear();
  holders_.clear();
  in_progress_ = false;
  received_ = 0;
}

}  // namespace pipetrain::common

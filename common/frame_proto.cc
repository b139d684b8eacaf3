#include "common/frame_proto.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain::common {

void FrameToProto(const FrameView& frame, pipetrain::v1::TensorFrame* out) {
  const FrameHeader& h = frame.header;
  out->set_job_id(h.tag.job_id);
  out->set_step(h.tag.step);
  out->set_micro_batch(h.tag.micro_batch);
  out->set_chunk(h.tag.chunk);
  out->set_kind(static_cast<pipetrain::v1::TensorKind>(h.tag.kind));
  out->set_dtype(static_cast<pipetrain::v1::DType>(h.dtype));
  out->mutable_shape()->Assign(h.shape.begin(), h.shape.end());
  out->set_offset(h.offset);
  out->set_total_bytes(h.total_bytes);
  out->set_payload(reinterpret_cast<const char*>(frame.payload.data()),
                   frame.payload.size());
}

FrameHeader HeaderFromProto(const pipetrain::v1::TensorFrame& proto) {
  FrameHeader h;
  h.tag.job_id = proto.job_id();
  h.tag.step = proto.step();
  h.tag.micro_batch = proto.micro_batch();
  h.tag.chunk = proto.chunk();
  h.tag.kind = static_cast<TensorKind>(proto.kind());
  h.dtype = static_cast<int>(proto.dtype());
  h.shape.assign(proto.shape().begin(), proto.shape().end());
  h.offset = proto.offset();
  h.total_bytes = proto.total_bytes();
  return h;
}

std::span<const std::byte> PayloadOf(const pipetrain::v1::TensorFrame& proto) {
  return {reinterpret_cast<const std::byte*>(proto.payload().data()),
          proto.payload().size()};
}

void TensorToProto(const Tensor& tensor, pipetrain::v1::Tensor* out) {
  out->set_dtype(static_cast<pipetrain::v1::DType>(tensor.dtype()));
  out->mutable_shape()->Assign(tensor.shape().begin(), tensor.shape().end());
  out->set_data(reinterpret_cast<const char*>(tensor.bytes().data()),
                tensor.num_bytes());
}

absl::StatusOr<Tensor> TensorFromProto(const pipetrain::v1::Tensor& proto,
                                       const std::string& field) {
  if (!IsValidDType(proto.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".dtype ", static_cast<int>(proto.dtype()),
                     " is not a known dtype"));
  }
  const DType dtype = static_cast<DType>(proto.dtype());
  std::vector<int64_t> shape(proto.shape().begin(), proto.shape().end());
  ASSIGN_OR_RETURN(const uint64_t n, NumElements(shape, field + ".shape"));
  if (n * DTypeSize(dtype) != proto.data().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".data holds ", proto.data().size(), " bytes but shape ",
        ShapeString(shape), " of ", DTypeName(dtype), " needs ", n * DTypeSize(dtype)));
  }
  ASSIGN_OR_RETURN(Tensor t, Tensor::Create(dtype, std::move(shape)));
  if (t.num_bytes()) std::memcpy(t.bytes().data(), proto.data().data(), t.num_bytes());
  return t;
}

}  // namespace pipetrain::common

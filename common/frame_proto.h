// Translation between the codec's frames and tensors and their protobuf messages
// (pipetrain.v1.TensorFrame, pipetrain.v1.Tensor). No logic beyond field copies.
#pragma once

#include <span>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "common/tensor_codec.h"
#include "pipetrain/v1/tensor.pb.h"

namespace pipetrain::common {

// Fills `out` with the frame; the payload is copied into the message (the one copy of
// the protobuf send path).
void FrameToProto(const FrameView& frame, pipetrain::v1::TensorFrame* out);
// The header of a received frame; its payload is proto.payload(), viewed in place.
FrameHeader HeaderFromProto(const pipetrain::v1::TensorFrame& proto);
std::span<const std::byte> PayloadOf(const pipetrain::v1::TensorFrame& proto);

void TensorToProto(const Tensor& tensor, pipetrain::v1::Tensor* out);
// Checks dtype, shape and size; errors name `field` (e.g. "tokens[3]").
absl::StatusOr<Tensor> TensorFromProto(const pipetrain::v1::Tensor& proto,
                                       const std::string& field);

}  // namespace pipetrain::common

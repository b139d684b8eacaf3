// The data plane's wire form without protobuf copies. A frame is sent as a small
// encoded prefix followed by the tensor bytes themselves, which together are exactly
// a serialized pipetrain.v1.ExchangeMessage{frame: TensorFrame{..., payload}}; and a
// received message, however the network split it into pieces, is parsed into a frame
// header plus views of its payload in those pieces, so the payload is copied once, by
// the reassembler. Pure code: protobuf messages, no gRPC.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor_codec.h"
#include "pipetrain/v1/stage.pb.h"

namespace pipetrain::stage_server {

// The bytes to send before frame.payload so that prefix + payload is a serialized
// ExchangeMessage carrying the frame.
std::string EncodeFramePrefix(const common::FrameView& frame);

// A whole ExchangeMessage for a hello.
std::string EncodeHello(const pipetrain::v1::PeerHello& hello);

struct ParsedExchange {
  // kControl: the same-host transport's messages (offer, answer, frame, credit), small
  // and parsed whole by protobuf into `control`.
  enum class Kind { kHello, kFrame, kControl };
  Kind kind = Kind::kFrame;
  pipetrain::v1::PeerHello hello;                       // kHello
  pipetrain::v1::ExchangeMessage control;               // kControl
  common::FrameHeader header;                           // kFrame
  std::vector<std::span<const std::byte>> payload;      // kFrame: views into the input
};

// Parses one serialized ExchangeMessage given as consecutive pieces. Payload views
// point into `pieces`, which must outlive the result. Malformed input is an
// INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<ParsedExchange> ParseExchange(
    std::span<const std::span<const std::byte>> pieces);

}  // namespace pipetrain::stage_server

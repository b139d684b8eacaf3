// Fuzzes what takes tensor frames off the wire and rebuilds tensors: the frame wire
// parser (stage_server/frame_wire, ParseExchange over pieces as the network splits a
// message), the proto frame codec (common/frame_proto) and the reassembler
// (common/tensor_codec, Accept copying and AcceptPieces viewing). The input is a
// sequence of records: one control byte (bits 0-1: pieces - 1; bit 2: AcceptPieces;
// bit 3: end the stream after this one), a 2-byte little-endian length, the message.
// Round trip that must hold: a parsed frame re-encoded with EncodeFramePrefix +
// payload parses back, by ParseExchange and by protobuf, to the same header and payload.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/frame_proto.h"
#include "common/tensor_codec.h"
#include "google/protobuf/stubs/logging.h"
#include "pipetrain/v1/stage.pb.h"
#include "stage_server/link/frame_wire.h"

namespace common = pipetrain::common;
namespace stage_server = pipetrain::stage_server;
using Bytes = std::span<const std::byte>;

namespace {

bool SameHeader(const common::FrameHeader& a, const common::FrameHeader& b) {
  return a.tag == b.tag && a.dtype == b.dtype && a.shape == b.shape && a.offset == b.offset &&
         a.total_bytes == b.total_bytes;
}

std::string Gather(const std::vector<Bytes>& pieces) {
  std::string out;
  for (Bytes p : pieces) out.append(reinterpret_cast<const char*>(p.data()), p.size());
  return out;
}

void CheckRoundTrip(const stage_server::ParsedExchange& parsed) {
  const std::string payload = Gather(parsed.payload);
  const common::FrameView view{parsed.header, std::as_bytes(std::span(payload))};
  const std::string wire = stage_server::EncodeFramePrefix(view) + payload;
  const Bytes whole = std::as_bytes(std::span(wire));
  auto again = stage_server::ParseExchange(std::span(&whole, 1));
  if (!again.ok() || again->kind != stage_server::ParsedExchange::Kind::kFrame ||
      !SameHeader(again->header, parsed.header) || Gather(again->payload) != payload) {
    __builtin_trap();
  }
  pipetrain::v1::ExchangeMessage message;
  if (!message.ParseFromString(wire) || !message.has_frame() ||
      !SameHeader(common::HeaderFromProto(message.frame()), parsed.header) ||
      message.frame().payload() != payload) {
    __builtin_trap();
  }
}

}  // namespace

// Protobuf logs every string field that is not UTF-8; the parse failing is the test.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Small limits keep a hostile announcement within the fuzzer's memory limit; the
  // checks are the same as with the stage's defaults.
  common::ReassemblerOptions limits;
  limits.max_tensor_bytes = 1 << 20;
  limits.max_frame_bytes = 1 << 16;
  common::BufferPool pool;
  common::TensorReassembler reassembler(limits, &pool);
  // Every message stays alive until the end, as AcceptPieces' holders keep them.
  auto input = std::make_shared<std::vector<uint8_t>>(data, data + size);

  size_t at = 0;
  while (at + 3 <= input->size()) {
    const uint8_t control = (*input)[at];
    size_t len = (*input)[at + 1] | (size_t{(*input)[at + 2]} << 8);
    at += 3;
    len = std::min(len, input->size() - at);
    const Bytes message(reinterpret_cast<const std::byte*>(input->data() + at), len);
    at += len;

    // Split as the network might: up to four pieces, empty ones included.
    const size_t num_pieces = (control & 3) + 1;
    std::vector<Bytes> pieces;
    for (size_t i = 0; i < num_pieces; ++i) {
      const size_t begin = len * i / num_pieces, end = len * (i + 1) / num_pieces;
      pieces.push_back(message.subspan(begin, end - begin));
    }
    auto parsed = stage_server::ParseExchange(pieces);
    if (parsed.ok() && parsed->kind == stage_server::ParsedExchange::Kind::kFrame) {
      CheckRoundTrip(*parsed);
      if (control & 4) {
        auto done = reassembler.AcceptPieces(parsed->header, parsed->payload, input);
        if (done.ok() && done->has_value()) {
          std::vector<std::byte> copy((*done)->tensor.num_bytes());
          (*done)->tensor.CopyTo(copy);
        }
      } else {
        auto done = reassembler.Accept(parsed->header, parsed->payload);
        if (done.ok() && done->has_value() &&
            (*done)->tensor.bytes().size() != (*done)->tensor.num_bytes()) {
          __builtin_trap();
        }
      }
    }
    // The same bytes as a protobuf frame, through frame_proto's conversions.
    pipetrain::v1::ExchangeMessage proto;
    if (proto.ParseFromArray(message.data(), static_cast<int>(len)) && proto.has_frame()) {
      (void)reassembler.Accept(common::HeaderFromProto(proto.frame()),
                               common::PayloadOf(proto.frame()));
    }
    if (control & 8) (void)reassembler.Finish();
  }
  (void)reassembler.Finish();
  return 0;
}

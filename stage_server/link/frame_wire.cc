#include "stage_server/link/frame_wire.h"

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/frame_proto.h"

namespace pipetrain::stage_server {
namespace {

// Protobuf wire types and the field numbers used here.
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;
constexpr int kExchangeHelloField = 1, kExchangeFrameField = 2, kFramePayloadField = 10;
// ExchangeMessage.shm_offer .. shm_credit.
constexpr int kExchangeFirstControlField = 3, kExchangeLastControlField = 6;

void AppendVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void AppendTag(std::string* out, int field, int wire_type) {
  AppendVarint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

// Reads bytes across pieces without copying them.
class Cursor {
 public:
  explicit Cursor(std::span<const std::span<const std::byte>> pieces) : pieces_(pieces) {
    Normalize();
  }
  bool done() const { return piece_ == pieces_.size(); }
  size_t position() const { return consumed_; }

  absl::StatusOr<uint64_t> ReadVarint(absl::string_view what) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) return Truncated(what);
      const uint8_t b = static_cast<uint8_t>(pieces_[piece_][offset_]);
      Advance(1);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    return absl::InvalidArgumentError(absl::StrCat("malformed varint in ", what));
  }

  // Moves n bytes forward, appending views of them to `views` (if given) or their
  // bytes to `copy` (if given).
  absl::Status Take(uint64_t n, absl::string_view what,
                    std::vector<std::span<const std::byte>>* views, std::string* copy) {
    while (n > 0) {
      if (done()) return Truncated(what);
      const auto& p = pieces_[piece_];
      const size_t k = std::min<uint64_t>(n, p.size() - offset_);
      if (views) views->push_back(p.subspan(offset_, k));
      if (copy) copy->append(reinterpret_cast<const char*>(p.data() + offset_), k);
      Advance(k);
      n -= k;
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Truncated(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("message ends inside ", what, " at byte ", consumed_));
  }
  void Advance(size_t k) {
    offset_ += k;
    consumed_ += k;
    Normalize();
  }
  void Normalize() {
    while (piece_ < pieces_.size() && offset_ == pieces_[piece_].size()) {
      ++piece_;
      offset_ = 0;
    }
  }

  std::span<const std::span<const std::byte>> pieces_;
  size_t piece_ = 0, offset_ = 0, consumed_ = 0;
};

// Skips (or copies) one field's value of the given wire type.
absl::Status TakeValue(Cursor& c, int wire_type, absl::string_view what, std::string* copy) {
  switch (wire_type) {
    case kVarint: {
      auto v = c.ReadVarint(what);
      if (!v.ok()) return v.status();
      if (copy) AppendVarint(copy, *v);
      return absl::OkStatus();
    }
    case kFixed64: return c.Take(8, what, nullptr, copy);
    case kFixed32: return c.Take(4, what, nullptr, copy);
    case kLengthDelimited: {
      auto len = c.ReadVarint(what);
      if (!len.ok()) return len.status();
      if (copy) AppendVarint(copy, *len);
      return c.Take(*len, what, nullptr, copy);
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported wire type ", wire_type, " in ", what));
  }
}

}  // namespace

std::string EncodeFramePrefix(const common::FrameView& frame) {
  pipetrain::v1::TensorFrame header;
  common::FrameView no_payload{frame.header, {}};
  common::FrameToProto(no_payload, &header);
  header.clear_payload();
  const std::string header_bytes = header.SerializeAsString();
  const uint64_t payload = frame.payload.size();
  const uint64_t frame_len = header_bytes.size() + 1 + VarintSize(payload) + payload;
  std::string out;
  out.reserve(header_bytes.size() + 24);
  AppendTag(&out, kExchangeFrameField, kLengthDelimited);
  AppendVarint(&out, frame_len);
  out += header_bytes;
  AppendTag(&out, kFramePayloadField, kLengthDelimited);
  AppendVarint(&out, payload);
  return out;
}

std::string EncodeHello(const pipetrain::v1::PeerHello& hello) {
  pipetrain::v1::ExchangeMessage m;
  *m.mutable_hello() = hello;
  return m.SerializeAsString();
}

absl::StatusOr<ParsedExchange> ParseExchange(
    std::span<const std::span<const std::byte>> pieces) {
  Cursor c(pieces);
  ParsedExchange out;
  bool have_body = false;
  while (!c.done()) {
    auto tag = c.ReadVarint("ExchangeMessage tag");
    if (!tag.ok()) return tag.status();
    const int field = static_cast<int>(*tag >> 3), wire_type = static_cast<int>(*tag & 7);
    const bool control = field >= kExchangeFirstControlField && field <= kExchangeLastControlField;
    if (wire_type != kLengthDelimited ||
        (field != kExchangeHelloField && field != kExchangeFrameField && !control)) {
      // Unknown fields are skipped, as protobuf parsers do.
      if (absl::Status s = TakeValue(c, wire_type, "ExchangeMessage", nullptr); !s.ok()) return s;
      continue;
    }
    auto len = c.ReadVarint("ExchangeMessage body length");
    if (!len.ok()) return len.status();
    const size_t end = c.position() + *len;
    have_body = true;
    if (control) {
      std::string bytes;
      AppendVarint(&bytes, *tag);
      AppendVarint(&bytes, *len);
      if (absl::Status s = c.Take(*len, "same-host message", nullptr, &bytes); !s.ok()) return s;
      out.kind = ParsedExchange::Kind::kControl;
      if (!out.control.ParseFromString(bytes)) {
        return absl::InvalidArgumentError("a same-host message is not a valid ExchangeMessage");
      }
      continue;
    }
    if (field == kExchangeHelloField) {
      std::string bytes;
      if (absl::Status s = c.Take(*len, "hello", nullptr, &bytes); !s.ok()) return s;
      out.kind = ParsedExchange::Kind::kHello;
      if (!out.hello.ParseFromString(bytes)) {
        return absl::InvalidArgumentError("hello is not a valid PeerHello message");
      }
      continue;
    }
    // A TensorFrame: every field but the payload is gathered and parsed by protobuf;
    // the payload is only viewed.
    out.kind = ParsedExchange::Kind::kFrame;
    out.payload.clear();
    std::string header_bytes;
    while (c.position() < end) {
      auto ftag = c.ReadVarint("TensorFrame tag");
      if (!ftag.ok()) return ftag.status();
      const int ffield = static_cast<int>(*ftag >> 3), fwire = static_cast<int>(*ftag & 7);
      if (ffield == kFramePayloadField && fwire == kLengthDelimited) {
        auto plen = c.ReadVarint("payload length");
        if (!plen.ok()) return plen.status();
        if (c.position() + *plen > end) {
          return absl::InvalidArgumentError("payload runs past the end of its TensorFrame");
        }
        out.payload.clear();  // the last occurrence wins, as in protobuf
        if (absl::Status s = c.Take(*plen, "payload", &out.payload, nullptr); !s.ok()) return s;
        continue;
      }
      AppendVarint(&header_bytes, *ftag);
      if (absl::Status s = TakeValue(c, fwire, "TensorFrame", &header_bytes); !s.ok()) return s;
    }
    if (c.position() != end) {
      return absl::InvalidArgumentError("a TensorFrame field runs past the end of the frame");
    }
    pipetrain::v1::TensorFrame header;
    if (!header.ParseFromString(header_bytes)) {
      return absl::InvalidArgumentError("frame header is not a valid TensorFrame message");
    }
    out.header = common::HeaderFromProto(header);
  }
  if (!have_body) return absl::InvalidArgumentError("message carries neither hello nor frame");
  return out;
}

}  // namespace pipetrain::stage_server

#include "stage_server/link/frame_wire.h"

#include <cstring>
#include <random>

#include "common/frame_proto.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::stage_server {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<std::byte> Bytes(const std::string& s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

// Splits `data` into random pieces (including empty ones).
std::vector<std::span<const std::byte>> Split(const std::vector<std::byte>& data,
                                              std::mt19937& rng) {
  std::vector<std::span<const std::byte>> pieces;
  size_t at = 0;
  while (at < data.size()) {
    const size_t n = std::min<size_t>(data.size() - at, rng() % 23);
    pieces.emplace_back(data.data() + at, n);
    at += n;
  }
  return pieces;
}

std::vector<std::byte> Concat(const std::vector<std::span<const std::byte>>& parts) {
  std::vector<std::byte> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

common::FrameView RandomFrame(std::mt19937& rng, std::vector<std::byte>& storage) {
  storage.resize(rng() % 300);
  for (std::byte& b : storage) b = static_cast<std::byte>(rng());
  common::FrameView f;
  f.header.tag = {"job-" + std::to_string(rng() % 100), rng() % 1000000,
                  static_cast<uint32_t>(rng() % 64), static_cast<uint32_t>(rng() % 4),
                  common::TensorKind::kGradient};
  f.header.dtype = static_cast<int>(common::DType::kU8);
  f.header.shape = {static_cast<int64_t>(storage.size())};
  f.header.offset = rng() % 1000;
  f.header.total_bytes = 5000000000ull + rng();
  f.payload = storage;
  return f;
}

void ExpectSameHeader(const common::FrameHeader& a, const common::FrameHeader& b) {
  EXPECT_EQ(a.tag, b.tag);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.shape, b.shape);
  EXPECT_EQ(a.offset, b.offset);
  EXPECT_EQ(a.total_bytes, b.total_bytes);
}

TEST(FrameWireTest, PrefixPlusPayloadIsAValidExchangeMessage) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<std::byte> storage;
    common::FrameView f = RandomFrame(rng, storage);
    std::string wire = EncodeFramePrefix(f);
    wire.append(reinterpret_cast<const char*>(f.payload.data()), f.payload.size());
    pipetrain::v1::ExchangeMessage msg;
    ASSERT_TRUE(msg.ParseFromString(wire)) << "trial " << trial;
    ASSERT_TRUE(msg.has_frame());
    ExpectSameHeader(common::HeaderFromProto(msg.frame()), f.header);
    EXPECT_EQ(msg.frame().payload().size(), f.payload.size());
    EXPECT_EQ(std::memcmp(msg.frame().payload().data(), f.payload.data(), f.payload.size()), 0);
  }
}

TEST(FrameWireTest, ParsesAnySplitWithoutCopyingThePayload) {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::byte> storage;
    common::FrameView f = RandomFrame(rng, storage);
    // Encoded by protobuf itself, so the parser is checked against the real format.
    pipetrain::v1::ExchangeMessage msg;
    common::FrameToProto(f, msg.mutable_frame());
    const std::vector<std::byte> wire = Bytes(msg.SerializeAsString());
    const auto pieces = Split(wire, rng);
    auto parsed = ParseExchange(pieces);
    ASSERT_THAT(parsed, IsOk()) << "trial " << trial;
    ASSERT_EQ(parsed->kind, ParsedExchange::Kind::kFrame);
    ExpectSameHeader(parsed->header, f.header);
    const std::vector<std::byte> payload = Concat(parsed->payload);
    ASSERT_EQ(payload.size(), f.payload.size());
    EXPECT_EQ(std::memcmp(payload.data(), f.payload.data(), payload.size()), 0);
    for (const auto& view : parsed->payload) {
      EXPECT_GE(view.data(), wire.data());
      EXPECT_LE(view.data() + view.size(), wire.data() + wire.size()) << "views point into the input";
    }
  }
}

TEST(FrameWireTest, ParsesHello) {
  pipetrain::v1::PeerHello hello;
  hello.set_job_id("j1");
  hello.set_from_stage(3);
  hello.set_peer_secret("s3cret");
  const std::vector<std::byte> wire = Bytes(EncodeHello(hello));
  std::mt19937 rng(1);
  auto parsed = ParseExchange(Split(wire, rng));
  ASSERT_THAT(parsed, IsOk());
  ASSERT_EQ(parsed->kind, ParsedExchange::Kind::kHello);
  EXPECT_EQ(parsed->hello.job_id(), "j1");
  EXPECT_EQ(parsed->hello.from_stage(), 3);
  EXPECT_EQ(parsed->hello.peer_secret(), "s3cret");
}

// The same-host transport's messages are parsed whole, however they were split.
TEST(FrameWireTest, ParsesTheSameHostMessages) {
  pipetrain::v1::ExchangeMessage offer;
  offer.mutable_shm_offer()->set_name("/pipetrain-00ff");
  offer.mutable_shm_offer()->set_slots(8);
  offer.mutable_shm_offer()->set_slot_bytes(4096);
  pipetrain::v1::ExchangeMessage frame;
  frame.mutable_shm_frame()->mutable_header()->set_job_id("j1");
  frame.mutable_shm_frame()->add_slots(3);
  frame.mutable_shm_frame()->add_slots(0);
  frame.mutable_shm_frame()->set_bytes(5000);
  std::mt19937 rng(2);
  for (const pipetrain::v1::ExchangeMessage& m : {offer, frame}) {
    const std::vector<std::byte> wire = Bytes(m.SerializeAsString());
    auto parsed = ParseExchange(Split(wire, rng));
    ASSERT_THAT(parsed, IsOk());
    ASSERT_EQ(parsed->kind, ParsedExchange::Kind::kControl);
    EXPECT_EQ(parsed->control.SerializeAsString(), m.SerializeAsString());
  }
  // A truncated one is an error, as a frame's is.
  const std::vector<std::byte> wire = Bytes(frame.SerializeAsString());
  std::vector<std::span<const std::byte>> cut = {std::span<const std::byte>(wire).first(wire.size() - 1)};
  EXPECT_THAT(ParseExchange(cut), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(FrameWireTest, RejectsMalformedMessages) {
  std::mt19937 rng(13);
  std::vector<std::byte> storage;
  common::FrameView f = RandomFrame(rng, storage);
  pipetrain::v1::ExchangeMessage msg;
  common::FrameToProto(f, msg.mutable_frame());
  std::vector<std::byte> wire = Bytes(msg.SerializeAsString());
  // Every truncation is an error, never a crash or a silently short payload.
  for (size_t cut = 1; cut < wire.size(); cut += 7) {
    std::vector<std::span<const std::byte>> pieces = {std::span<const std::byte>(wire).first(cut)};
    EXPECT_THAT(ParseExchange(pieces), StatusIs(absl::StatusCode::kInvalidArgument)) << cut;
  }
  EXPECT_THAT(ParseExchange({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("neither hello nor frame")));
  std::vector<std::byte> garbage(16, std::byte{0xff});
  std::vector<std::span<const std::byte>> g = {garbage};
  EXPECT_THAT(ParseExchange(g), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace pipetrain::stage_server

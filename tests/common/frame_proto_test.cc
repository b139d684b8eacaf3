#include "common/frame_proto.h"

#include <cstring>
#include <random>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::common {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

TEST(FrameProtoTest, FramesSurviveSerialization) {
  std::mt19937 rng(3);
  Tensor src = *Tensor::Create(DType::kBF16, {3, 7, 5});
  for (std::byte& b : src.bytes()) b = static_cast<std::byte>(rng());
  FrameTag tag{"j", 11, 4, 1, TensorKind::kGradient};
  auto enc = TensorEncoder::Create(tag, src, 33);
  ASSERT_THAT(enc, IsOk());
  TensorReassembler re;
  std::optional<ReceivedTensor> got;
  for (size_t i = 0; i < enc->num_frames(); ++i) {
    pipetrain::v1::TensorFrame msg;
    FrameToProto(enc->frame(i), &msg);
    std::string wire = msg.SerializeAsString();
    pipetrain::v1::TensorFrame parsed;
    ASSERT_TRUE(parsed.ParseFromString(wire));
    auto r = re.Accept(HeaderFromProto(parsed), PayloadOf(parsed));
    ASSERT_THAT(r, IsOk());
    if (r->has_value()) got = std::move(**r);
  }
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->tag, tag);
  EXPECT_EQ(got->tensor.shape(), src.shape());
  EXPECT_EQ(std::memcmp(got->tensor.bytes().data(), src.bytes().data(), src.num_bytes()), 0);
}

TEST(FrameProtoTest, WholeTensorsRoundTripAndAreChecked) {
  Tensor t = *Tensor::Create(DType::kI32, {2, 3});
  for (int i = 0; i < 6; ++i) t.data<int32_t>()[i] = 100 + i;
  pipetrain::v1::Tensor p;
  TensorToProto(t, &p);
  auto back = TensorFromProto(p, "tokens[0]");
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->shape(), t.shape());
  EXPECT_EQ(back->data<int32_t>()[5], 105);

  p.mutable_data()->pop_back();
  EXPECT_THAT(TensorFromProto(p, "tokens[0]"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tokens[0].data holds 23 bytes")));
  p.set_dtype(pipetrain::v1::DTYPE_UNSPECIFIED);
  EXPECT_THAT(TensorFromProto(p, "targets[1]"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("targets[1].dtype")));
}

}  // namespace
}  // namespace pipetrain::common

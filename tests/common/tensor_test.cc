#include "common/tensor.h"

#include <cstring>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::common {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

TEST(TensorTest, DTypeSizes) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  EXPECT_EQ(DTypeSize(DType::kUnspecified), 0u);
  EXPECT_FALSE(IsValidDType(0));
  EXPECT_FALSE(IsValidDType(7));
  EXPECT_TRUE(IsValidDType(1));
}

TEST(TensorTest, CreateSizesTheBuffer) {
  auto t = Tensor::Create(DType::kF32, {2, 3, 4});
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->num_bytes(), 96u);
  EXPECT_EQ(t->num_elements(), 24u);
  EXPECT_EQ(t->data<float>().size(), 24u);
  auto scalar = Tensor::Create(DType::kI64, {});
  ASSERT_THAT(scalar, IsOk());
  EXPECT_EQ(scalar->num_bytes(), 8u);
}

TEST(TensorTest, CreateRejectsBadInput) {
  EXPECT_THAT(Tensor::Create(DType::kUnspecified, {2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
  EXPECT_THAT(Tensor::Create(DType::kF32, {2, -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape[1] is negative")));
  EXPECT_THAT(Tensor::FromBuffer(DType::kF32, {3}, Buffer(8)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs 12 bytes")));
}

TEST(TensorTest, CloneCopiesAndReleaseEmpties) {
  Tensor t = *Tensor::Create(DType::kI32, {4});
  for (int i = 0; i < 4; ++i) t.data<int32_t>()[i] = i * 7;
  Tensor c = t.Clone();
  EXPECT_NE(c.bytes().data(), t.bytes().data());
  EXPECT_EQ(std::memcmp(c.bytes().data(), t.bytes().data(), 16), 0);
  Buffer b = t.ReleaseBuffer();
  EXPECT_EQ(b.size(), 16u);
  EXPECT_EQ(t.num_bytes(), 0u);
  EXPECT_TRUE(t.shape().empty());
  Buffer moved = std::move(b);
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(moved.size(), 16u);
}

TEST(TensorTest, ShapeString) { EXPECT_EQ(ShapeString(std::vector<int64_t>{4, 128, 256}), "(4, 128, 256)"); }

}  // namespace
}  // namespace pipetrain::common

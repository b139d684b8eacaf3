#include "common/piecewise_tensor.h"

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

std::vector<std::byte> RandomBytes(size_t n, std::mt19937& rng) {
  std::vector<std::byte> v(n);
  for (std::byte& b : v) b = static_cast<std::byte>(rng() & 0xff);
  return v;
}

TEST(PiecewiseTensorTest, PiecesGatherInOrder) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t rows = 1 + rng() % 7, cols = 1 + rng() % 11;
    auto bytes = std::make_shared<std::vector<std::byte>>(RandomBytes(rows * cols * 4, rng));
    // Random cut points, empty pieces included.
    std::vector<PiecewiseTensor::Piece> pieces;
    size_t at = 0;
    while (at < bytes->size()) {
      const size_t n = std::min<size_t>(rng() % 9, bytes->size() - at);
      pieces.emplace_back(bytes->data() + at, n);
      at += n;
    }
    auto t = PiecewiseTensor::FromPieces(DType::kF32, {rows, cols}, pieces, {bytes});
    ASSERT_THAT(t, IsOk());
    EXPECT_EQ(t->num_bytes(), bytes->size());
    for (const auto& p : t->pieces()) EXPECT_FALSE(p.empty()) << "empty pieces are dropped";
    std::vector<std::byte> out(t->num_bytes());
    t->CopyTo(out);
    EXPECT_EQ(out, *bytes) << "trial " << trial;
    EXPECT_EQ(t->dtype(), DType::kF32);
    EXPECT_EQ(t->shape(), (std::vector<int64_t>{rows, cols}));
  }
}

TEST(PiecewiseTensorTest, HoldersLiveAsLongAsTheTensor) {
  std::mt19937 rng(8);
  auto bytes = std::make_shared<std::vector<std::byte>>(RandomBytes(16, rng));
  std::weak_ptr<std::vector<std::byte>> watch = bytes;
  std::vector<PiecewiseTensor::Piece> pieces = {{bytes->data(), 16}};
  auto t = PiecewiseTensor::FromPieces(DType::kU8, {16}, pieces, {std::move(bytes)});
  ASSERT_THAT(t, IsOk());
  EXPECT_FALSE(watch.expired());
  PiecewiseTensor moved = std::move(*t);
  EXPECT_FALSE(watch.expired());
  moved = PiecewiseTensor();
  EXPECT_TRUE(watch.expired());
}

TEST(PiecewiseTensorTest, SizesMustMatchDtypeAndShape) {
  std::vector<std::byte> bytes(12);
  std::vector<PiecewiseTensor::Piece> pieces = {{bytes.data(), 12}};
  EXPECT_THAT(PiecewiseTensor::FromPieces(DType::kF32, {2, 2}, pieces, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("12 bytes"), HasSubstr("(2, 2)"), HasSubstr("16"))));
  EXPECT_THAT(PiecewiseTensor::FromPieces(DType::kUnspecified, {3}, pieces, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
  EXPECT_THAT(PiecewiseTensor::FromPieces(DType::kF32, {-3}, pieces, {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PiecewiseTensor::FromPieces(DType::kF32, {3}, pieces, {}), IsOk());
}

TEST(PiecewiseTensorTest, FromTensorOwnsItWithoutCopying) {
  std::mt19937 rng(9);
  Tensor t = *Tensor::Create(DType::kI32, {3, 5});
  for (std::byte& b : t.bytes()) b = static_cast<std::byte>(rng() & 0xff);
  const std::byte* storage = t.bytes().data();
  const Tensor copy = t.Clone();
  PiecewiseTensor p = PiecewiseTensor::FromTensor(std::move(t));
  ASSERT_EQ(p.pieces().size(), 1u);
  EXPECT_EQ(p.pieces()[0].data(), storage);
  PiecewiseTensor moved = std::move(p);  // the view stays valid across moves
  EXPECT_EQ(moved.pieces()[0].data(), storage);
  EXPECT_EQ(moved.dtype(), DType::kI32);
  EXPECT_EQ(moved.shape(), (std::vector<int64_t>{3, 5}));
  std::vector<std::byte> out(moved.num_bytes());
  moved.CopyTo(out);
  EXPECT_EQ(std::memcmp(out.data(), copy.bytes().data(), copy.num_bytes()), 0);
}

TEST(PiecewiseTensorTest, ViewDoesNotOwn) {
  Tensor t = *Tensor::Create(DType::kU8, {4});
  for (size_t i = 0; i < 4; ++i) t.bytes()[i] = static_cast<std::byte>(i + 1);
  PiecewiseTensor v = PiecewiseTensor::View(t);
  ASSERT_EQ(v.pieces().size(), 1u);
  EXPECT_EQ(v.pieces()[0].data(), t.bytes().data());
  t.bytes()[2] = std::byte{42};
  std::vector<std::byte> out(4);
  v.CopyTo(out);
  EXPECT_EQ(out[2], std::byte{42}) << "a view reads the tensor it views";
}

}  // namespace
}  // namespace pipetrain::common

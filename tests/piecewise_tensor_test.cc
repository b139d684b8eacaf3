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
    Tensor whole = std::move(*t).ToTensor();
    EXPECT_EQ(whole.shape(), (std::vector<int64_t>{rows, cols}));
    ASSERT_EQ(whole.num_bytes(), bytes->size());
    EXPECT_EQ(std::memcmp(whole.bytes().data(), bytes->data(), bytes->size()), 0);
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

TEST(PiecewiseTensorTest, FromTensorOwnsAndGivesItBackWithoutCopying) {
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
  Tensor back = std::move(moved).ToTensor();
  EXPECT_EQ(back.bytes().data(), storage) << "the owned tensor comes back, not a copy";
  EXPECT_EQ(std::memcmp(back.bytes().data(), copy.bytes().data(), copy.num_bytes()), 0);
}

TEST(PiecewiseTensorTest, ViewDoesNotOwn) {
  Tensor t = *Tensor::Create(DType::kU8, {4});
  for (size_t i = 0; i < 4; ++i) t.bytes()[i] = static_cast<std::byte>(i + 1);
  PiecewiseTensor v = PiecewiseTensor::View(t);
  ASSERT_EQ(v.pieces().size(), 1u);
  EXPECT_EQ(v.pieces()[0].data(), t.bytes().data());
  Tensor copy = std::move(v).ToTensor();
  EXPECT_NE(copy.bytes().data(), t.bytes().data()) << "a view's tensor is a copy";
  EXPECT_EQ(std::memcmp(copy.bytes().data(), t.bytes().data(), 4), 0);
}

}  // namespace
}  // namespace pipetrain::common

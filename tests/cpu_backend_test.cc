// What is particular to the cpu backend; its ops are held to the reference by the
// conformance suite (backend_conformance_test.cc): the default CopyFromHostPieces it
// inherits, and a property of its attention.
#include "stage_server/compute/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "common/model/init.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/backend_testing.h"

namespace pipetrain::compute {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::RandomNormal;

class CpuBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = CpuBackend::Create(1);
    ASSERT_THAT(b, IsOk());
    cpu_ = std::move(*b);
  }
  std::unique_ptr<CpuBackend> cpu_;
};

TEST_F(CpuBackendTest, AttentionFirstPositionIsItsOwnValue) {
  // The first position attends only to itself: its output is its own v.
  const int B = 2, T = 7, C = 12, NH = 3;
  auto qkv = RandomNormal(B * T * 3 * C, 50);
  std::vector<float> out(B * T * C), probs(B * NH * T * T, std::numeric_limits<float>::quiet_NaN());
  ASSERT_THAT(cpu_->AttentionForward(B, T, C, NH, qkv.data(), out.data(), probs.data()), IsOk());
  for (int i = 0; i < C; ++i) EXPECT_FLOAT_EQ(out[i], qkv[2 * C + i]);
}

// The default CopyFromHostPieces: pieces land back to back, empty ones take no room,
// and nothing past the last piece is written.
TEST_F(CpuBackendTest, CopyFromHostPiecesPlacesPiecesConsecutively) {
  std::vector<std::byte> src(1000);
  const uint64_t key = model::InitStreamKey(77, 3000, 0);
  for (size_t i = 0; i < src.size(); ++i) {
    src[i] =
        static_cast<std::byte>(static_cast<uint64_t>(std::fabs(model::NormalAt(key, i)) * 1e6));
  }
  // Lengths 0, 1, 0, 300, 0, 699, 0: empty pieces at both ends and in between.
  const std::span<const std::byte> all(src);
  const std::vector<std::span<const std::byte>> pieces = {
      all.subspan(0, 0),   all.subspan(0, 1),   all.subspan(1, 0), all.subspan(1, 300),
      all.subspan(301, 0), all.subspan(301, 699), {}};
  auto buf = cpu_->Allocate(src.size() + 8);
  ASSERT_THAT(buf, IsOk());
  auto* dst = static_cast<std::byte*>(*buf);
  std::fill(dst, dst + src.size() + 8, std::byte{0xEE});
  ASSERT_THAT(cpu_->CopyFromHostPieces(dst, pieces), IsOk());
  EXPECT_TRUE(std::equal(src.begin(), src.end(), dst));
  for (size_t i = src.size(); i < src.size() + 8; ++i) {
    EXPECT_EQ(dst[i], std::byte{0xEE}) << "byte " << i << " past the pieces was written";
  }
  EXPECT_THAT(cpu_->CopyFromHostPieces(dst, {}), IsOk());
  ASSERT_THAT(cpu_->Free(*buf), IsOk());
}

}  // namespace
}  // namespace pipetrain::compute

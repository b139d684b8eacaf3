// The optimizer split among a stage's copies: pieces cover each buffer once, in copy
// order, balanced; stages too small to split are refused by name; the bytes a parameter
// takes follow the dtype table.
#include "common/model/optimizer_split.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/model/state_bytes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/status_matchers.h"

namespace pipetrain::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;

TEST(OptimizerSplitTest, PiecesCoverEachBufferOnceInCopyOrderAndDifferByAtMostOne) {
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{3}, uint64_t{7}, uint64_t{10007},
                     uint64_t{38597376}}) {
    for (int copies : {1, 2, 3, 4, 7, 8}) {
      SCOPED_TRACE(absl::StrCat(n, " elements, ", copies, " copies"));
      uint64_t next = 0, smallest = n, largest = 0;
      for (int r = 0; r < copies; ++r) {
        const CopyRange piece = RangeOfCopy(n, copies, r);
        EXPECT_EQ(piece.begin, next) << "copy " << r;
        ASSERT_LE(piece.begin, piece.end);
        next = piece.end;
        smallest = std::min(smallest, piece.size());
        largest = std::max(largest, piece.size());
      }
      EXPECT_EQ(next, n);
      EXPECT_LE(largest - smallest, 1u);
      EXPECT_EQ(PieceSizes(n, copies).size(), static_cast<size_t>(copies));
    }
  }
  EXPECT_THAT(PieceSizes(10, 4), ElementsAre(2, 3, 2, 3));
  EXPECT_EQ(RangeOfCopy(10, 4, 1), (CopyRange{2, 5}));
  EXPECT_THAT(PieceSizes(2, 3), ElementsAre(0, 1, 1)) << "fewer elements than copies";
}

TEST(OptimizerSplitTest, HugeBuffersDoNotOverflow) {
  const uint64_t n = std::numeric_limits<uint64_t>::max() - 5;
  EXPECT_EQ(RangeOfCopy(n, 1024, 1023).end, n);
  EXPECT_EQ(RangeOfCopy(n, 2, 1).begin, n / 2);
}

TEST(OptimizerSplitTest, AStageWithFewerParametersThanCopiesIsRefusedByName) {
  EXPECT_THAT(CheckSplit("job-7", 2, 4, 4), IsOk());
  EXPECT_THAT(CheckSplit("job-7", 2, 3, 4),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("job 'job-7' stage 2 holds 3 parameters, fewer than its 4 "
                                 "copies")));
  EXPECT_THAT(CheckSplit("job-7", 0, 100, 0), StatusIs(absl::StatusCode::kInvalidArgument,
                                                       HasSubstr("stage 0")));
}

TEST(OptimizerSplitTest, OnlyTheMomentsAreDividedAmongTheCopies) {
  using common::DType;
  EXPECT_EQ(SplitStateBytesPerParam(DType::kF32, 1),
            static_cast<double>(StateBytesPerParam(DType::kF32)));
  EXPECT_EQ(SplitStateBytesPerParam(DType::kF32, 1), 16.0);
  EXPECT_EQ(SplitStateBytesPerParam(DType::kF32, 2), 12.0);
  EXPECT_EQ(SplitStateBytesPerParam(DType::kF32, 4), 10.0);
  EXPECT_EQ(SplitStateBytesPerParam(DType::kBF16, 4),
            static_cast<double>(StateBytesPerParam(DType::kBF16)) - 6.0);
}

}  // namespace
}  // namespace pipetrain::model

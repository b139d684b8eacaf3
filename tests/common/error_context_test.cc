#include "common/error_context.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::common {
namespace {

using ::pipetrain::testing::StatusIs;

TEST(ErrorContextTest, NamesTheFieldsInOneOrderWhateverOrderTheyWereSet) {
  EXPECT_EQ(ErrorContext("configure").Stage(2).Job("a").Text(), "configure of job 'a' stage 2");
  EXPECT_EQ(ErrorContext().Job("a").Step(7).Stage(1).Text(), "job 'a' stage 1 step 7");
  EXPECT_EQ(ErrorContext("snapshot").Chunk(3).MicroBatch(0).Step(4).Replica(1).Text(),
            "snapshot replica 1 step 4 micro-batch 0 chunk 3");
  EXPECT_EQ(ErrorContext("import").Text(), "import");
  EXPECT_EQ(ErrorContext().Text(), "");
}

TEST(ErrorContextTest, WrapKeepsTheCodeAndPrefixesTheMessage) {
  const ErrorContext ctx = ErrorContext().Job("j").Stage(0);
  EXPECT_THAT(ctx.Wrap(absl::UnavailableError("peer gone")),
              StatusIs(absl::StatusCode::kUnavailable, "job 'j' stage 0: peer gone"));
  EXPECT_TRUE(ctx.Wrap(absl::OkStatus()).ok());
  absl::StatusOr<int> bad = absl::InvalidArgumentError("field x");
  EXPECT_THAT(ctx.Wrap(std::move(bad)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "job 'j' stage 0: field x"));
  absl::StatusOr<int> good = 5;
  EXPECT_EQ(*ctx.Wrap(std::move(good)), 5);
  EXPECT_THAT(ctx.Wrap(absl::DataLossError("bad crc"), "reading chunk 2"),
              StatusIs(absl::StatusCode::kDataLoss, "job 'j' stage 0: reading chunk 2: bad crc"));
  EXPECT_TRUE(ctx.Wrap(absl::OkStatus(), "reading").ok());
  EXPECT_THAT(ErrorContext().Wrap(absl::InternalError("m")),
              StatusIs(absl::StatusCode::kInternal, "m"));
}

TEST(ErrorContextTest, ErrorMakesANewStatus) {
  EXPECT_THAT(ErrorContext("export").Job("x").Chunk(1).Error(absl::StatusCode::kNotFound, "gone"),
              StatusIs(absl::StatusCode::kNotFound, "export of job 'x' chunk 1: gone"));
}

}  // namespace
}  // namespace pipetrain::common

// The recompute table and its rule: names parsed and listed from it, and which chunk of
// which stage recomputes under each mode (the answer the stages are sent).
#include "coordinator/planner/recompute_policy.h"

#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::planner {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::IsOkAndHolds;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

using Grid = std::vector<std::vector<bool>>;

TEST(RecomputePolicyTest, NamesRoundTripAndUnsetIsNever) {
  for (const RecomputeEntry& e : RecomputeTable()) {
    EXPECT_THAT(ParseRecompute(e.name), IsOkAndHolds(e.mode)) << e.name;
    EXPECT_EQ(RecomputeName(e.mode), e.name);
  }
  EXPECT_THAT(ParseRecompute(""), IsOkAndHolds(pb::RECOMPUTE_NEVER));
  EXPECT_EQ(RecomputeName(pb::RECOMPUTE_UNSPECIFIED), "never");
  EXPECT_EQ(RecomputeName(pb::RECOMPUTE_EXCEPT_LAST), "except-last");
}

TEST(RecomputePolicyTest, ListsComeFromTheTable) {
  EXPECT_EQ(RecomputeNameList(), "never, always or except-last");
  EXPECT_THAT(ParseRecompute("sometimes"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pipeline.recompute: unknown mode 'sometimes' (expected never, "
                                 "always or except-last)")));
  const std::string help = RecomputeHelp();
  for (const RecomputeEntry& e : RecomputeTable()) {
    EXPECT_THAT(help, HasSubstr(std::string("  ") + e.name + "  "));
    EXPECT_THAT(help, HasSubstr(e.description));
  }
}

TEST(RecomputePolicyTest, EachModeSaysWhichChunkOfWhichStageRecomputes) {
  EXPECT_EQ(ResolveRecompute(pb::RECOMPUTE_NEVER, 3, 1), (Grid{{false}, {false}, {false}}));
  EXPECT_EQ(ResolveRecompute(pb::RECOMPUTE_UNSPECIFIED, 2, 1), (Grid{{false}, {false}}));
  EXPECT_EQ(ResolveRecompute(pb::RECOMPUTE_ALWAYS, 2, 2), (Grid{{true, true}, {true, true}}));
  EXPECT_EQ(ResolveRecompute(pb::RECOMPUTE_EXCEPT_LAST, 3, 1), (Grid{{true}, {true}, {false}}));
  // Interleaved: "last" is the last stage, every chunk of it, not only the chunk that
  // holds the last virtual stage.
  EXPECT_EQ(ResolveRecompute(pb::RECOMPUTE_EXCEPT_LAST, 2, 3),
            (Grid{{true, true, true}, {false, false, false}}));
  // One stage is the last one.
  EXPECT_EQ(ResolveRecompute(pb::RECOMPUTE_EXCEPT_LAST, 1, 2), (Grid{{false, false}}));
}

}  // namespace
}  // namespace pipetrain::planner

// The schedule table: every row complete, names listed from it (errors, help, defaults),
// and its bounds and textbook bubbles equal to the papers' formulas, written here again.
#include "coordinator/planner/schedule_registry.h"

#include <algorithm>
#include <set>
#include <string>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::planner {
namespace {

using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ScheduleRegistryTest, EveryRowIsCompleteAndNamedOnce) {
  std::set<std::string> names;
  for (const ScheduleEntry& e : ScheduleTable()) {
    SCOPED_TRACE(e.name);
    EXPECT_TRUE(names.insert(e.name).second) << "twice in the table";
    EXPECT_NE(std::string(e.description), "");
    EXPECT_EQ(std::string(e.description).find('\n'), std::string::npos);
    EXPECT_NE(e.stage_order, nullptr);
    EXPECT_NE(e.in_flight_bound, nullptr);
    EXPECT_NE(e.textbook_bubble, nullptr);
    EXPECT_NE(std::string(e.bubble_formula), "");
  }
  EXPECT_GE(names.size(), 4u);
}

TEST(ScheduleRegistryTest, EnumeratorsNameTheirRows) {
  EXPECT_EQ(ScheduleName(ScheduleKind::kGpipe), "gpipe");
  EXPECT_EQ(ScheduleName(ScheduleKind::kOneFOneB), "1f1b");
  EXPECT_EQ(ScheduleName(ScheduleKind::kInterleaved), "interleaved");
  EXPECT_EQ(ScheduleName(ScheduleKind::kZbH1), "zb-h1");
  EXPECT_EQ(ScheduleName(kDefaultSchedule), "1f1b");
  for (const ScheduleEntry& e : ScheduleTable()) {
    auto kind = ParseScheduleKind(e.name);
    ASSERT_TRUE(kind.ok()) << e.name;
    EXPECT_EQ(&EntryOf(*kind), &e);
  }
}

TEST(ScheduleRegistryTest, ListsComeFromTheTable) {
  EXPECT_EQ(ScheduleNameList(), "gpipe, 1f1b, interleaved, zb-h1, zb-v or dualpipe-v");
  EXPECT_THAT(ParseScheduleKind("fifo"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pipeline.schedule: unknown schedule 'fifo' (expected gpipe, "
                                 "1f1b, interleaved, zb-h1, zb-v or dualpipe-v)")));
  const std::string help = ScheduleHelp();
  for (const ScheduleEntry& e : ScheduleTable()) {
    EXPECT_THAT(help, HasSubstr(std::string("  ") + e.name + "  ")) << help;
    EXPECT_THAT(help, HasSubstr(e.description));
  }
  EXPECT_EQ(std::count(help.begin(), help.end(), '\n'),
            static_cast<long>(ScheduleTable().size()));
}

TEST(ScheduleRegistryTest, DefaultChunksFollowTheRow) {
  EXPECT_EQ(DefaultChunks("interleaved"), 2);
  EXPECT_EQ(DefaultChunks("gpipe"), 1);
  EXPECT_EQ(DefaultChunks("zb-h1"), 1);
  EXPECT_EQ(DefaultChunks("no-such-schedule"), 1);
  for (const ScheduleEntry& e : ScheduleTable()) {
    EXPECT_EQ(DefaultChunks(e.name), e.chunked ? 2 : 1) << e.name;
  }
}

// The same figures as before the table, bit for bit.
TEST(ScheduleRegistryTest, BoundsAndBubblesAreThePapersFormulas) {
  for (int k = 1; k <= 8; ++k) {
    for (int m = 1; m <= 16; ++m) {
      for (int v = 1; v <= 4; ++v) {
        SCOPED_TRACE(::testing::Message() << "K=" << k << " M=" << m << " v=" << v);
        const double K = k, M = m, V = v;
        EXPECT_EQ(TextbookBubble(ScheduleKind::kGpipe, k, m, 1), (K - 1) / (M + K - 1));
        EXPECT_EQ(TextbookBubble(ScheduleKind::kOneFOneB, k, m, 1), (K - 1) / (M + K - 1));
        EXPECT_EQ(TextbookBubble(ScheduleKind::kInterleaved, k, m, v), (K - 1) / (V * M + K - 1));
        EXPECT_EQ(TextbookBubble(ScheduleKind::kZbH1, k, m, 1), (K - 1) / (3 * M + K - 1));
        for (int s = 0; s < k; ++s) {
          EXPECT_EQ(InFlightBound(ScheduleKind::kGpipe, k, m, 1, s), m);
          EXPECT_EQ(InFlightBound(ScheduleKind::kOneFOneB, k, m, 1, s), std::min(k - s, m));
          EXPECT_EQ(InFlightBound(ScheduleKind::kInterleaved, k, m, v, s),
                    std::min(2 * (k - s - 1) + (v - 1) * k + 1, v * m));
          EXPECT_EQ(InFlightBound(ScheduleKind::kZbH1, k, m, 1, s), std::min(k, m));
        }
      }
    }
  }
  EXPECT_EQ(TextbookFormula(ScheduleKind::kGpipe), "(K-1)/(M+K-1)");
  EXPECT_EQ(TextbookFormula(ScheduleKind::kOneFOneB), "(K-1)/(M+K-1)");
  EXPECT_EQ(TextbookFormula(ScheduleKind::kInterleaved), "(K-1)/(vM+K-1)");
  EXPECT_EQ(TextbookFormula(ScheduleKind::kZbH1), "(K-1)/(3M+K-1)");
}

TEST(ScheduleRegistryTest, LoopedPlacementWrapsChunksRoundTheStages) {
  // K = 4: virtual stages 0..3 are chunk 0 of stages 0..3, 4..7 chunk 1.
  for (int j = 0; j < 8; ++j) {
    const ChunkSlot slot = Place(Placement::kLooped, j, 4);
    EXPECT_EQ(slot.stage, j % 4) << j;
    EXPECT_EQ(slot.chunk, j / 4) << j;
  }
  const ChunkSlot plain = Place(Placement::kLooped, 2, 3);
  EXPECT_EQ(plain.stage, 2);
  EXPECT_EQ(plain.chunk, 0);
}

}  // namespace
}  // namespace pipetrain::planner

#include "bench/scaling_math.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::bench {
namespace {

using ::testing::HasSubstr;

const ScalingRow& Row(const std::vector<ScalingRow>& rows, int k, int m, const std::string& s) {
  for (const ScalingRow& r : rows) {
    if (r.k == k && r.m == m && r.schedule == s) return r;
  }
  ADD_FAILURE() << "no row " << CellName(k, m, s);
  static const ScalingRow none;
  return none;
}

TEST(IdealSpeedupTest, IsTheTextbookFormula) {
  EXPECT_DOUBLE_EQ(IdealSpeedup(1, 1), 1);
  EXPECT_DOUBLE_EQ(IdealSpeedup(1, 32), 1);
  EXPECT_DOUBLE_EQ(IdealSpeedup(8, 1), 1);  // one micro-batch: no overlap at all
  EXPECT_DOUBLE_EQ(IdealSpeedup(4, 4), 16.0 / 7);
  EXPECT_DOUBLE_EQ(IdealSpeedup(8, 32), 256.0 / 39);
  EXPECT_DOUBLE_EQ(IdealSpeedup(2, 8), 16.0 / 9);
}

TEST(BuildScalingTableTest, OneStageNormalisesToOne) {
  auto rows = BuildScalingTable({{1, 4, "gpipe", 123.0}, {1, 8, "gpipe", 456.0}},
                                {{1, 4, "gpipe", 0.3}, {1, 8, "gpipe", 0.7}}, "gpipe");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  for (const ScalingRow& r : *rows) {
    EXPECT_DOUBLE_EQ(r.measured_speedup, 1) << CellName(r.k, r.m, r.schedule);
    EXPECT_DOUBLE_EQ(r.ideal, 1);
    EXPECT_DOUBLE_EQ(r.bound, 1);
    EXPECT_DOUBLE_EQ(r.efficiency_ideal, 1);
    EXPECT_FALSE(r.kept_advantage.has_value());
  }
}

// K = 4, M = 4: baseline 100 tokens/s and a 1.0 s simulated step. 1F1B measures 200
// against a 0.5 s prediction (bound 2); ZB-H1 225 against 0.4 s (bound 2.5, a predicted
// 25% over 1F1B of which it keeps (2.25/2 - 1)/0.25 = half); interleaved is predicted
// only 1% over 1F1B, too little to take a share of.
class FabricatedGridTest : public ::testing::Test {
 protected:
  std::vector<ScalingMeasurement> measured_ = {{1, 4, "gpipe", 100},
                                               {4, 4, "1f1b", 200},
                                               {4, 4, "zb-h1", 225},
                                               {4, 4, "interleaved", 210},
                                               {4, 1, "gpipe", 90}};
  std::vector<ScalingPrediction> predicted_ = {{1, 4, "gpipe", 1.0},
                                               {4, 4, "1f1b", 0.5},
                                               {4, 4, "zb-h1", 0.4},
                                               {4, 4, "interleaved", 0.5 / 1.01},
                                               {1, 1, "gpipe", 0.25},
                                               {4, 1, "gpipe", 0.25}};
};

TEST_F(FabricatedGridTest, GivesTheKnownAnswers) {
  measured_.push_back({1, 1, "gpipe", 100});
  auto rows = BuildScalingTable(measured_, predicted_, "gpipe");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), measured_.size());
  const ScalingRow& f = Row(*rows, 4, 4, "1f1b");
  EXPECT_DOUBLE_EQ(f.measured_speedup, 2);
  EXPECT_DOUBLE_EQ(f.ideal, 16.0 / 7);
  EXPECT_DOUBLE_EQ(f.bound, 2);
  EXPECT_DOUBLE_EQ(f.efficiency_ideal, 2 / (16.0 / 7));
  EXPECT_DOUBLE_EQ(f.efficiency_bound, 1);
  EXPECT_FALSE(f.kept_advantage.has_value());  // 1F1B is the reference itself

  const ScalingRow& z = Row(*rows, 4, 4, "zb-h1");
  EXPECT_DOUBLE_EQ(z.measured_speedup, 2.25);
  EXPECT_DOUBLE_EQ(z.bound, 2.5);
  EXPECT_DOUBLE_EQ(z.efficiency_bound, 0.9);
  ASSERT_TRUE(z.kept_advantage.has_value());
  EXPECT_NEAR(*z.kept_advantage, 0.5, 1e-12);

  EXPECT_FALSE(Row(*rows, 4, 4, "interleaved").kept_advantage.has_value());
  EXPECT_DOUBLE_EQ(Row(*rows, 4, 1, "gpipe").measured_speedup, 0.9);
  EXPECT_DOUBLE_EQ(Row(*rows, 4, 1, "gpipe").ideal, 1);
}

TEST_F(FabricatedGridTest, TargetsPassAndMissOnTheRightCells) {
  measured_.push_back({1, 1, "gpipe", 100});
  auto rows = BuildScalingTable(measured_, predicted_, "gpipe");
  ASSERT_TRUE(rows.ok()) << rows.status();
  // M >= K: the three K = 4, M = 4 cells; efficiencies 0.875, 0.984, 0.919.
  TargetCheck speed = CheckSpeedupTarget(*rows, 0.9);
  EXPECT_EQ(speed.cells, 3);
  EXPECT_FALSE(speed.pass());
  ASSERT_EQ(speed.misses.size(), 1u);
  EXPECT_THAT(speed.misses[0], HasSubstr("k4_m4_1f1b"));
  EXPECT_EQ(speed.worst, "k4_m4_1f1b");
  EXPECT_THAT(speed.Line(), HasSubstr("MISS"));
  EXPECT_TRUE(CheckSpeedupTarget(*rows, 0.8).pass());
  EXPECT_THAT(CheckSpeedupTarget(*rows, 0.8).Line(), HasSubstr("PASS"));

  TargetCheck kept = CheckKeptAdvantageTarget(*rows, 0.9);
  EXPECT_EQ(kept.cells, 1);  // only zb-h1's advantage is predicted above 2%
  EXPECT_EQ(kept.worst, "k4_m4_zb_h1");
  EXPECT_FALSE(kept.pass());
  EXPECT_TRUE(CheckKeptAdvantageTarget(*rows, 0.5 - 1e-9).pass());
}

TEST_F(FabricatedGridTest, MissingOneStageBaselineIsAClearError) {
  // No K = 1, M = 1 measurement for the K = 4, M = 1 cell.
  auto rows = BuildScalingTable(measured_, predicted_, "gpipe");
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(rows.status().message(), HasSubstr("K = 4, M = 1"));
  EXPECT_THAT(rows.status().message(), HasSubstr("no K = 1 baseline"));
  // A baseline measured with another schedule does not count.
  measured_.push_back({1, 1, "1f1b", 100});
  EXPECT_FALSE(BuildScalingTable(measured_, predicted_, "gpipe").ok());
}

TEST_F(FabricatedGridTest, MissingPredictionOrBadFigureNamesTheCell) {
  measured_.push_back({1, 1, "gpipe", 100});
  measured_.push_back({8, 4, "1f1b", 100});
  auto rows = BuildScalingTable(measured_, predicted_, "gpipe");
  ASSERT_FALSE(rows.ok());
  EXPECT_THAT(rows.status().message(), HasSubstr("K = 8, M = 4, schedule 1f1b was not simulated"));

  measured_.pop_back();
  measured_.push_back({4, 4, "gpipe", 0});
  rows = BuildScalingTable(measured_, predicted_, "gpipe");
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rows.status().message(), HasSubstr("K = 4, M = 4, schedule gpipe"));
}

TEST(ScalingDataTextTest, DocumentsTheColumnsAndWritesOneLineARow) {
  ScalingRow r;
  r.k = 8;
  r.m = 32;
  r.schedule = "zb-h1";
  r.measured_speedup = 6.1;
  r.ideal = 256.0 / 39;
  r.bound = 6.3;
  r.tokens_per_s = 12345.6;
  const std::string text = ScalingDataText({r});
  EXPECT_THAT(text, HasSubstr("# K M schedule measured_speedup ideal bound tokens_per_s\n"));
  EXPECT_THAT(text, HasSubstr("EMULATED"));
  EXPECT_THAT(text, HasSubstr("\n8 32 zb-h1 6.1000 6.5641 6.3000 12345.6\n"));
  EXPECT_EQ(CellName(8, 32, "zb-h1"), "k8_m32_zb_h1");
}

}  // namespace
}  // namespace pipetrain::bench

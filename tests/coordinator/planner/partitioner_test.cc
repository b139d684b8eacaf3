#include "coordinator/planner/partitioner.h"

#include <algorithm>
#include <functional>
#include <random>

#include "common/model/transformer_config.h"
#include "common/testing/status_matchers.h"
#include "coordinator/planner/generators.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::planner {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Every contiguous split of n layers into `parts` non-empty parts.
void ForEachSplit(int n, int parts, const std::function<void(const Partition&)>& f) {
  Partition p;
  p.bounds = {0};
  std::function<void(int)> rec = [&](int start) {
    const int left = parts - (p.parts());
    if (left == 1) {
      p.bounds.push_back(n);
      f(p);
      p.bounds.pop_back();
      return;
    }
    for (int end = start + 1; end <= n - (left - 1); ++end) {
      p.bounds.push_back(end);
      rec(end);
      p.bounds.pop_back();
    }
  };
  rec(0);
}

TEST(PartitionerTest, ByCountSpreadsTheRemainderOverTheFirstStages) {
  auto p = PartitionByCount(10, 4);
  ASSERT_THAT(p, IsOk());
  EXPECT_THAT(p->bounds, ElementsAre(0, 3, 6, 8, 10));
  auto one = PartitionByCount(5, 1);
  ASSERT_THAT(one, IsOk());
  EXPECT_THAT(one->bounds, ElementsAre(0, 5));
}

TEST(PartitionerTest, MoreStagesThanLayersIsAnError) {
  EXPECT_THAT(PartitionByCount(6, 7),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("6 pipeline layers into 7"), HasSubstr("at most 6"))));
  EXPECT_THAT(PartitionByCost({1, 1}, 3), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PartitionByCost({1, 1}, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PartitionByCost({1, -1}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer 1")));
}

TEST(PartitionerTest, ByParamsBalancesTheLargestStage) {
  // A light first layer, four equal blocks, a heavy last layer.
  auto p = PartitionByCost({1, 10, 10, 10, 10, 25}, 3);
  ASSERT_THAT(p, IsOk());
  EXPECT_THAT(p->bounds, ElementsAre(0, 3, 5, 6));  // 21 | 20 | 25
  EXPECT_EQ(MaxPartCost({1, 10, 10, 10, 10, 25}, *p), 25);
}

TEST(PartitionerTest, ByCostIsOptimalAgainstBruteForce) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> cost(0.1, 10);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + trial % 9;
    const int parts = 1 + (trial / 9) % n;
    std::vector<double> c(n);
    for (double& x : c) x = cost(rng);
    double best = 1e300;
    ForEachSplit(n, parts, [&](const Partition& p) { best = std::min(best, MaxPartCost(c, p)); });
    auto p = PartitionByCost(c, parts);
    ASSERT_THAT(p, IsOk());
    EXPECT_EQ(p->parts(), parts);
    EXPECT_NEAR(MaxPartCost(c, *p), best, 1e-9) << "n=" << n << " parts=" << parts;
  }
}

// The slowest part's time (its cost over its speed) under a partition.
double MaxPartTime(const std::vector<double>& cost, const std::vector<double>& speed,
                   const Partition& p) {
  double worst = 0;
  for (int part = 0; part < p.parts(); ++part) {
    double sum = 0;
    for (int l = p.begin(part); l < p.end(part); ++l) sum += cost[l];
    worst = std::max(worst, sum / speed[part]);
  }
  return worst;
}

TEST(PartitionerTest, ByCostWithSpeedsIsOptimalAgainstBruteForce) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> cost(0.1, 10), speed(0.25, 4);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + trial % 9;
    const int parts = 1 + (trial / 9) % n;
    std::vector<double> c(n), v(parts);
    for (double& x : c) x = cost(rng);
    for (double& x : v) x = speed(rng);
    double best = 1e300;
    ForEachSplit(n, parts, [&](const Partition& p) { best = std::min(best, MaxPartTime(c, v, p)); });
    auto p = PartitionByCost(c, parts, nullptr, &v);
    ASSERT_THAT(p, IsOk());
    EXPECT_NEAR(MaxPartTime(c, v, *p), best, 1e-9 * best) << "n=" << n << " parts=" << parts;
  }
  // Twice as fast takes twice the layers: 12 equal layers over speeds 2, 2, 1, 1.
  const std::vector<double> two_speeds = {2, 2, 1, 1};
  auto p = PartitionByCost(std::vector<double>(12, 1.0), 4, nullptr, &two_speeds);
  ASSERT_THAT(p, IsOk());
  EXPECT_THAT(p->bounds, ElementsAre(0, 4, 8, 10, 12));
  const std::vector<double> wrong = {1, 0};
  EXPECT_THAT(PartitionByCost(std::vector<double>(4, 1.0), 2, nullptr, &wrong),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("speeds")));
}

TEST(PartitionerTest, MemoryCapIsRespectedAndOptimalAgainstBruteForce) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0.5, 4);
  int feasible = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + trial % 7;
    const int parts = 1 + (trial / 7) % std::min(n, 4);
    MemoryLimit limit;
    std::vector<double> c(n);
    for (int l = 0; l < n; ++l) {
      c[l] = u(rng);
      limit.weight_bytes.push_back(u(rng));
      limit.activation_bytes.push_back(u(rng));
    }
    for (int s = 0; s < parts; ++s) limit.in_flight.push_back(parts - s);  // 1F1B
    limit.cap_bytes = 4 + 6 * u(rng);
    double best = 1e300;
    ForEachSplit(n, parts, [&](const Partition& p) {
      for (int s = 0; s < parts; ++s) {
        if (PartMemory(limit, s, p.begin(s), p.end(s)) > limit.cap_bytes) return;
      }
      best = std::min(best, MaxPartCost(c, p));
    });
    auto p = PartitionByCost(c, parts, &limit);
    if (best == 1e300) {
      EXPECT_THAT(p, StatusIs(absl::StatusCode::kResourceExhausted));
      continue;
    }
    ++feasible;
    ASSERT_THAT(p, IsOk());
    EXPECT_NEAR(MaxPartCost(c, *p), best, 1e-9);
    for (int s = 0; s < parts; ++s) {
      EXPECT_LE(PartMemory(limit, s, p->begin(s), p->end(s)), limit.cap_bytes);
    }
  }
  EXPECT_GT(feasible, 20);  // the trials exercise both outcomes
}

TEST(PartitionerTest, FirstStageOfOneFOneBGetsFewerLayersUnderACap) {
  // Equal layers; 1F1B holds 4, 3, 2, 1 micro-batches on stages 0..3, so stage 0's
  // activations weigh most and the cap leaves it a single layer.
  MemoryLimit limit;
  limit.weight_bytes.assign(8, 1);
  limit.activation_bytes.assign(8, 1);
  for (int s = 0; s < 4; ++s)
    limit.in_flight.push_back(InFlightBound(ScheduleKind::kOneFOneB, 4, 8, 1, s));
  limit.cap_bytes = 8;
  auto p = PartitionByCost(std::vector<double>(8, 1), 4, &limit);
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->end(0) - p->begin(0), 1);
  EXPECT_EQ(MaxPartCost(std::vector<double>(8, 1), *p), 3);
  auto unlimited = PartitionByCost(std::vector<double>(8, 1), 4);
  EXPECT_EQ(MaxPartCost(std::vector<double>(8, 1), *unlimited), 2);
}

TEST(PartitionerTest, ModelThatCannotFitSaysHowMuchIsNeeded) {
  MemoryLimit limit;
  const double gib = 1024.0 * 1024 * 1024;
  limit.weight_bytes.assign(4, 3 * gib);
  limit.activation_bytes.assign(4, 0);
  limit.in_flight = {2, 1};
  limit.cap_bytes = 4 * gib;
  EXPECT_THAT(PartitionByCost({1, 1, 1, 1}, 2, &limit),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("does not fit in 2 stages of 4.00 GiB"),
                             HasSubstr("needs 6.00 GiB on stage 0"),
                             HasSubstr("available 4.00 GiB per stage"))));
}

TEST(PartitionerTest, LightEmbeddingAndHeavyHeadFromTheModelCosts) {
  // GPT-2's 50257-token vocabulary on a narrow model: the head costs as much as many
  // blocks, the embedding almost nothing.
  model::TransformerConfig config{50257, 128, 128, 4, 6};
  std::vector<double> flops;
  for (int l = 0; l < config.num_pipeline_layers(); ++l) {
    const model::LayerCost c = model::CostOfLayer(config, l);
    flops.push_back(c.forward_flops + c.backward_input_flops + c.backward_weight_flops);
  }
  ASSERT_GT(flops.back(), 10 * flops[1]);
  ASSERT_LT(flops.front(), flops[1] / 10);
  auto p = PartitionByCost(flops, 3);
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->begin(2), config.num_pipeline_layers() - 1);  // the head alone
  EXPECT_EQ(p->begin(0), 0);
  EXPECT_GE(p->end(0) - p->begin(0), 3);  // the embedding shares with blocks
  auto by_count = PartitionByCount(config.num_pipeline_layers(), 3);
  EXPECT_LT(MaxPartCost(flops, *p), MaxPartCost(flops, *by_count));
}

}  // namespace
}  // namespace pipetrain::planner

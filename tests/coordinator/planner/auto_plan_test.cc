// The automatic planner's rules: it plans every shape it may, never one over the memory
// cap, ranks by predicted step with ties broken the same way every time, and its
// choice is never slower than the default plan (1f1b, M = K, no recompute).
#include "coordinator/planner/auto_plan.h"

#include <set>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::planner {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

PlanOptions Base() {
  PlanOptions o;
  o.model.vocab_size = 512;
  o.model.seq_len = 128;
  o.model.d_model = 256;
  o.model.n_heads = 8;
  o.model.n_layers = 8;
  o.batch_size = 16;
  o.device_flops = 1e12;
  o.link_bytes_per_s = 1e9;
  return o;
}

TEST(AutoPlanTest, TheChoiceIsTheFastestAndNeverSlowerThanTheDefault) {
  absl::StatusOr<AutoResult> r = SearchPlans(Base(), {.max_devices = 4});
  ASSERT_THAT(r.status(), IsOk());
  for (const Candidate& c : r->ranked) EXPECT_LE(r->best().step_s, c.step_s);
  PlanOptions fallback = Base();
  fallback.stages = 4;
  fallback.micro_batches = 4;
  absl::StatusOr<Plan> plain = MakePlan(fallback);
  ASSERT_THAT(plain.status(), IsOk());
  EXPECT_LE(r->best().step_s, plain->simulation.step_time_s);
  // Every shape was tried: 1 to 4 stages, 1 to 4 replicas, every schedule.
  std::set<std::string> schedules;
  int most_stages = 0, most_replicas = 0;
  for (const Candidate& c : r->ranked) {
    schedules.insert(ScheduleName(c.options.schedule));
    most_stages = std::max(most_stages, c.options.stages);
    most_replicas = std::max(most_replicas, c.options.replicas);
    EXPECT_LE(c.devices(), 4);
    EXPECT_EQ(Base().batch_size % (c.options.replicas * c.options.micro_batches), 0);
  }
  EXPECT_EQ(schedules.size(), ScheduleTable().size());
  EXPECT_EQ(most_stages, 4);
  EXPECT_EQ(most_replicas, 4);
}

// The search hands over the winner's plan, the one MakePlan makes of its options, and
// keeps no other candidate's.
TEST(AutoPlanTest, TheBestKeepsItsPlanAndOnlyIt) {
  absl::StatusOr<AutoResult> r = SearchPlans(Base(), {.max_devices = 4});
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_NE(r->best().plan, nullptr);
  absl::StatusOr<Plan> again = MakePlan(r->best().options);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(r->best().plan->simulation.step_time_s, again->simulation.step_time_s);
  EXPECT_EQ(schedule::ToText(r->best().plan->programs), schedule::ToText(again->programs));
  for (size_t i = 1; i < r->ranked.size(); ++i) EXPECT_EQ(r->ranked[i].plan, nullptr) << i;
  for (const Candidate& c : r->refused) EXPECT_EQ(c.plan, nullptr);
}

// Four stage servers on a host of two slots: four replicas of one stage slow each other
// down, so the search no longer takes them for four devices.
TEST(AutoPlanTest, ServersSharingADeviceAreNotPlannedAsDevicesOfTheirOwn) {
  PlanOptions shared = Base();
  shared.devices = EvenlyShared(4, 4, 2);
  absl::StatusOr<AutoResult> apart = SearchPlans(Base(), {.max_devices = 4});
  absl::StatusOr<AutoResult> on_one = SearchPlans(shared, {.max_devices = 4});
  ASSERT_THAT(apart.status(), IsOk());
  ASSERT_THAT(on_one.status(), IsOk());
  // Two slots do at most twice one device's work: the best step is at least half the
  // best one-server plan's, while four devices of their own beat that.
  absl::StatusOr<AutoResult> one = SearchPlans(Base(), {.max_devices = 1});
  ASSERT_THAT(one.status(), IsOk());
  EXPECT_GE(on_one->best().step_s, 0.5 * one->best().step_s * (1 - 1e-9));
  EXPECT_LT(apart->best().step_s, 0.5 * one->best().step_s);
}

TEST(AutoPlanTest, NoChoiceIsOverTheMemoryCap) {
  absl::StatusOr<AutoResult> free = SearchPlans(Base(), {.max_devices = 4});
  ASSERT_THAT(free.status(), IsOk());
  // A cap between the smallest and the largest peak the free search found.
  double low = 1e30, high = 0;
  for (const Candidate& c : free->ranked) {
    low = std::min(low, c.peak_memory_bytes);
    high = std::max(high, c.peak_memory_bytes);
  }
  ASSERT_LT(low, high);
  PlanOptions capped = Base();
  capped.memory_cap_bytes = (low + high) / 2;
  absl::StatusOr<AutoResult> r = SearchPlans(capped, {.max_devices = 4});
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_FALSE(r->refused.empty());
  for (const Candidate& c : r->ranked) EXPECT_LE(c.peak_memory_bytes, capped.memory_cap_bytes);
  for (const Candidate& c : r->refused) EXPECT_THAT(c.why_not, HasSubstr("does not fit"));
  EXPECT_THAT(RenderAutoReport(*r), HasSubstr("refused: "));
  // Nothing fits a cap below every plan: the error says so and why.
  capped.memory_cap_bytes = low / 4;
  EXPECT_THAT(SearchPlans(capped, {.max_devices = 4}).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("does not fit")));
}

TEST(AutoPlanTest, TiesAreBrokenTheSameWayEveryTime) {
  absl::StatusOr<AutoResult> a = SearchPlans(Base(), {.max_devices = 3});
  absl::StatusOr<AutoResult> b = SearchPlans(Base(), {.max_devices = 3});
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  ASSERT_EQ(a->ranked.size(), b->ranked.size());
  for (size_t i = 0; i < a->ranked.size(); ++i) {
    EXPECT_EQ(DescribeShape(a->ranked[i].options), DescribeShape(b->ranked[i].options)) << i;
  }
  // The order: step, then fewer devices, then less memory.
  for (size_t i = 1; i < a->ranked.size(); ++i) {
    const Candidate &p = a->ranked[i - 1], &c = a->ranked[i];
    EXPECT_TRUE(p.step_s < c.step_s ||
                (p.step_s == c.step_s && (p.devices() < c.devices() ||
                                          (p.devices() == c.devices() &&
                                           p.peak_memory_bytes <= c.peak_memory_bytes))))
        << i;
  }
}

TEST(AutoPlanTest, EqualStageCostsAreRefused) {
  PlanOptions o = Base();
  o.equal_stage_cost = true;
  EXPECT_THAT(SearchPlans(o, {.max_devices = 2}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("equal stage costs")));
}

}  // namespace
}  // namespace pipetrain::planner

#include "coordinator/metrics/step_metrics.h"

#include <cmath>

#include "common/testing/status_matchers.h"
#include "coordinator/planner/generators.h"
#include "coordinator/planner/lowering.h"
#include "coordinator/planner/simulator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;

void AddTiming(pb::RunStepResponse& r, const std::string& lane, int64_t start, int64_t end,
               uint64_t bytes = 0) {
  pb::ActionTiming* t = r.add_timings();
  t->set_lane(lane);
  t->set_start_us(start);
  t->set_end_us(end);
  t->set_bytes(bytes);
  t->mutable_action()->set_kind(lane == "compute" ? pb::FORWARD : pb::SEND_ACTIVATION);
}

TEST(StepMetricsTest, BubbleIsIdleShareOfStageTimeOverTheLongestSpan) {
  // Stage 0 computes 0-60 of a 100 us step, stage 1 computes 40-100: busy 120 of 200.
  std::vector<pb::RunStepResponse> r(2);
  AddTiming(r[0], "compute", 0, 60);
  AddTiming(r[0], "link", 60, 70, 1000);  // link time is not compute
  AddTiming(r[1], "compute", 40, 100);
  EXPECT_DOUBLE_EQ(MeasuredBubble(r), 1.0 - 120.0 / 200.0);
  EXPECT_DOUBLE_EQ(MeasuredBubble({}), 0);
}

TEST(StepMetricsTest, RecordCarriesLossThroughputAndPerStageFigures) {
  std::vector<pb::RunStepResponse> r(2);
  AddTiming(r[0], "compute", 0, 50);
  AddTiming(r[1], "compute", 50, 100);
  r[1].add_losses(2.0f);
  r[1].add_losses(4.0f);
  r[0].set_peak_memory_bytes(123);
  r[1].set_bytes_received(456);
  auto rec = MakeStepRecord(3, r, 0.5, 1000, 0.25);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->step(), 3);
  EXPECT_DOUBLE_EQ(rec->loss(), 3.0);
  EXPECT_DOUBLE_EQ(rec->tokens_per_s(), 2000);
  EXPECT_DOUBLE_EQ(rec->bubble_measured(), 0.5);
  EXPECT_DOUBLE_EQ(rec->bubble_predicted(), 0.25);
  ASSERT_EQ(rec->stages_size(), 2);
  EXPECT_EQ(rec->stages(0).peak_memory_bytes(), 123u);
  EXPECT_EQ(rec->stages(1).bytes_received(), 456u);
  EXPECT_DOUBLE_EQ(rec->stages(1).compute_s(), 50e-6);
}

TEST(StepMetricsTest, NoLossIsAnErrorNamingTheStep) {
  std::vector<pb::RunStepResponse> r(2);
  EXPECT_THAT(MakeStepRecord(9, r, 1, 1, 0).status(),
              StatusIs(absl::StatusCode::kInternal, ::testing::HasSubstr("step 9")));
}

TEST(StepMetricsTest, TimelineHasEveryActionOfEveryStage) {
  std::vector<pb::RunStepResponse> r(2);
  AddTiming(r[0], "compute", 0, 10);
  AddTiming(r[0], "link", 10, 20, 64);
  AddTiming(r[1], "compute", 20, 30);
  // A recomputing backward: 4 of its 10 us re-ran the forward.
  pb::ActionTiming* b = r[1].add_timings();
  b->set_lane("compute");
  b->set_start_us(30);
  b->set_end_us(40);
  b->set_recompute_us(4);
  b->mutable_action()->set_kind(pb::BACKWARD);
  std::vector<pb::TimelineEvent> t = TimelineOf(5, r);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[1].stage(), 0);
  EXPECT_EQ(t[1].lane(), "link");
  EXPECT_EQ(t[1].bytes(), 64u);
  EXPECT_EQ(t[2].stage(), 1);
  EXPECT_EQ(t[2].step(), 5);
  EXPECT_EQ(t[2].recompute_us(), 0);  // a forward recomputes nothing
  EXPECT_EQ(t[3].action().kind(), pb::BACKWARD);
  EXPECT_EQ(t[3].recompute_us(), 4);
}

TEST(StepMetricsTest, PredictedTimelineIsTheSimulatedStepInMicroseconds) {
  auto generated = planner::Generate(planner::ScheduleKind::kOneFOneB, 2, 2, 1);
  ASSERT_THAT(generated, IsOk());
  const schedule::Schedule programs = planner::Lower(*generated);
  planner::CostModel costs = planner::EqualStageCost(2);
  costs.allreduce_stage_s = {0.002, 0.003};
  auto sim = planner::Simulate(programs, costs);
  ASSERT_THAT(sim, IsOk());
  const std::vector<pb::TimelineEvent> t = PredictedTimelineOf(9, *sim);
  ASSERT_EQ(t.size(), sim->events.size());
  int links = 0, opts = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const planner::TimelineEvent& e = sim->events[i];
    EXPECT_EQ(t[i].step(), 9);
    EXPECT_EQ(t[i].stage(), e.stage);
    EXPECT_EQ(t[i].action().micro_batch(), e.action.micro_batch);
    EXPECT_EQ(t[i].start_us(), std::llround(e.start_s * 1e6));
    EXPECT_EQ(t[i].end_us(), std::llround(e.end_s * 1e6));
    const bool link = schedule::IsCommunication(e.action.kind);
    EXPECT_EQ(t[i].lane(), link ? "link" : "compute");
    links += link;
    if (t[i].action().kind() == pb::OPTIMIZER_STEP) {
      ++opts;
      EXPECT_EQ(t[i].reduce_total_us(), e.stage == 0 ? 2000 : 3000);
    } else {
      EXPECT_EQ(t[i].reduce_total_us(), 0);
    }
  }
  EXPECT_GT(links, 0);
  EXPECT_EQ(opts, 2);
}

}  // namespace
}  // namespace pipetrain::coordinator

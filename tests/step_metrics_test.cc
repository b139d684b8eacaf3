#include "coordinator/step_metrics.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
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

}  // namespace
}  // namespace pipetrain::coordinator

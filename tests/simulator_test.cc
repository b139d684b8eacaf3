#include "coordinator/planner/simulator.h"

#include "common/testing/status_matchers.h"
#include "coordinator/planner/generators.h"
#include "coordinator/planner/lowering.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::planner {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

schedule::Schedule Lowered(ScheduleKind kind, int k, int m, int v = 1) {
  auto s = Generate(kind, k, m, v);
  EXPECT_TRUE(s.ok()) << s.status();
  return Lower(*s);
}

TEST(SimulatorTest, TransferTimeDelaysTheReceiverOnly) {
  CostModel costs = EqualStageCost(2);
  for (auto& stage : costs.chunks) {
    stage[0].send_activation_s = 0.5;
    stage[0].send_gradient_s = 0.25;
  }
  auto sim = Simulate(Lowered(ScheduleKind::kOneFOneB, 2, 1), costs);
  ASSERT_THAT(sim, IsOk());
  // s0 F0 [0,1]; arrives 1.5; s1 F0 [1.5,2.5], B0 [2.5,4.5]; arrives 4.75; s0 B0 [4.75,6.75].
  EXPECT_DOUBLE_EQ(sim->step_time_s, 6.75);
  EXPECT_DOUBLE_EQ(sim->busy_s[0], 3);
  EXPECT_DOUBLE_EQ(sim->bubble_fraction, 1 - 6 / (2 * 6.75));
  bool saw_wait = false;
  for (const TimelineEvent& e : sim->events) {
    if (e.stage == 0 && e.action.kind == schedule::ActionKind::kBackward) {
      EXPECT_DOUBLE_EQ(e.start_s, 4.75);
      EXPECT_DOUBLE_EQ(e.end_s, 6.75);
    }
    if (e.stage == 1 && e.action.kind == schedule::ActionKind::kRecvActivation) {
      EXPECT_DOUBLE_EQ(e.start_s, 0);  // waits from the start ...
      EXPECT_DOUBLE_EQ(e.end_s, 1.5);  // ... until the activation arrives
      saw_wait = true;
    }
  }
  EXPECT_TRUE(saw_wait);
}

TEST(SimulatorTest, PeakActivationsFollowTheInFlightCount) {
  CostModel costs = EqualStageCost(4);
  for (auto& stage : costs.chunks) stage[0].stored_bytes = 100;
  auto ofob = Simulate(Lowered(ScheduleKind::kOneFOneB, 4, 8), costs);
  auto gpipe = Simulate(Lowered(ScheduleKind::kGpipe, 4, 8), costs);
  ASSERT_TRUE(ofob.ok() && gpipe.ok());
  EXPECT_THAT(ofob->peak_activation_bytes, ::testing::ElementsAre(400, 300, 200, 100));
  EXPECT_THAT(gpipe->peak_activation_bytes, ::testing::ElementsAre(800, 800, 800, 800));
}

TEST(SimulatorTest, RecomputationAddsTheRebuiltActivationsOfOneMicroBatch) {
  CostModel costs = EqualStageCost(2);
  for (auto& stage : costs.chunks) {
    stage[0].stored_bytes = 10;          // only the stage input is kept
    stage[0].backward_extra_bytes = 90;  // the rest is rebuilt during the backward
    stage[0].recompute_s = 1;            // by rerunning the forward
  }
  auto sim = Simulate(Lowered(ScheduleKind::kOneFOneB, 2, 4), costs);
  ASSERT_THAT(sim, IsOk());
  // Stage 0 holds 2 inputs when its first backward starts: 2 * 10 + 90.
  EXPECT_DOUBLE_EQ(sim->peak_activation_bytes[0], 110);
  EXPECT_DOUBLE_EQ(sim->peak_activation_bytes[1], 100);
  EXPECT_DOUBLE_EQ(sim->busy_s[0], 4 * 4);  // F 1 + recompute 1 + B 2 per micro-batch
}

TEST(SimulatorTest, SplitBackwardKeepsActivationsUntilTheWeightPart) {
  CostModel costs = EqualStageCost(1);
  costs.chunks[0][0].stored_bytes = 1;
  schedule::Schedule s = Lowered(ScheduleKind::kZbH1, 1, 3);
  // Defer every W to the end: all three activations are held at once.
  s[0].actions = {schedule::Forward(0),        schedule::BackwardInput(0),
                  schedule::Forward(1),        schedule::BackwardInput(1),
                  schedule::Forward(2),        schedule::BackwardInput(2),
                  schedule::BackwardWeight(0), schedule::BackwardWeight(1),
                  schedule::BackwardWeight(2), schedule::OptimizerStep()};
  auto sim = Simulate(s, costs);
  ASSERT_THAT(sim, IsOk());
  EXPECT_DOUBLE_EQ(sim->peak_activation_bytes[0], 3);
  EXPECT_DOUBLE_EQ(sim->step_time_s, 9);
  EXPECT_DOUBLE_EQ(sim->bubble_fraction, 0);
}

TEST(SimulatorTest, ErrorsOnMismatchedCostsAndDeadlock) {
  EXPECT_THAT(Simulate(Lowered(ScheduleKind::kGpipe, 2, 2), EqualStageCost(3)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("costs for 3 stages")));
  EXPECT_THAT(Simulate(Lowered(ScheduleKind::kInterleaved, 2, 2, 2), EqualStageCost(2, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chunks")));
  schedule::Schedule r = Lowered(ScheduleKind::kGpipe, 2, 1);
  r[0].actions[0] = schedule::Forward(7);
  EXPECT_THAT(Simulate(r, EqualStageCost(2)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stage 0 action F7")));
  schedule::Schedule s = Lowered(ScheduleKind::kGpipe, 2, 1);
  std::swap(s[0].actions[1], s[0].actions[2]);  // RECV_B0 before SEND_F0
  EXPECT_THAT(Simulate(s, EqualStageCost(2)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("deadlock")));
}

}  // namespace
}  // namespace pipetrain::planner

#include "coordinator/planner/simulator.h"

#include <algorithm>

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

// The event of `kind` (and micro-batch) on a stage; fails the test when there is none.
TimelineEvent EventOf(const SimulationResult& sim, int stage, schedule::ActionKind kind,
                      int micro_batch = 0) {
  for (const TimelineEvent& e : sim.events) {
    if (e.stage == stage && e.action.kind == kind &&
        (kind == schedule::ActionKind::kOptimizerStep || e.action.micro_batch == micro_batch)) {
      return e;
    }
  }
  ADD_FAILURE() << "no such event on stage " << stage;
  return {};
}

// 1F1B, K = 2, M = 2, forward 1, backward 2: stage 1's last B ends at 7, stage 0's at 9.
// Stage 1's reduction runs beside its SEND_B1 and delays only its optimizer step; stage
// 0's comes after the step's last backward, so all of it adds to the step.
TEST(SimulatorTest, TheReductionRunsOnItsOwnLaneBeforeTheOptimizerStep) {
  const schedule::Schedule programs = Lowered(ScheduleKind::kOneFOneB, 2, 2);
  auto plain = Simulate(programs, EqualStageCost(2));
  ASSERT_THAT(plain, IsOk());
  EXPECT_DOUBLE_EQ(plain->step_time_s, 9);
  EXPECT_TRUE(plain->reductions.empty());
  EXPECT_DOUBLE_EQ(plain->step_time_without_reduction_s, 9);

  CostModel costs = EqualStageCost(2);
  costs.allreduce_stage_s = {0.5, 3};
  auto sim = Simulate(programs, costs);
  ASSERT_THAT(sim, IsOk());
  ASSERT_EQ(sim->reductions.size(), 2u);
  const ReductionEvent& r0 = sim->reductions[0];
  const ReductionEvent& r1 = sim->reductions[1];
  EXPECT_EQ(r0.stage, 0);
  EXPECT_EQ(r1.stage, 1);
  using schedule::ActionKind;
  EXPECT_DOUBLE_EQ(r1.start_s, EventOf(*sim, 1, ActionKind::kBackward, 1).end_s);
  EXPECT_DOUBLE_EQ(r1.start_s, 7);
  EXPECT_DOUBLE_EQ(r1.end_s, 10);
  EXPECT_DOUBLE_EQ(r0.start_s, 9);
  EXPECT_DOUBLE_EQ(r0.end_s, 9.5);
  // The send of the last gradient is not held up; the optimizer step is.
  EXPECT_DOUBLE_EQ(EventOf(*sim, 1, ActionKind::kSendGradient, 1).start_s, 7);
  EXPECT_DOUBLE_EQ(EventOf(*sim, 1, ActionKind::kOptimizerStep).start_s, 10);
  EXPECT_DOUBLE_EQ(EventOf(*sim, 0, ActionKind::kOptimizerStep).start_s, 9.5);
  // Nothing else moved: every compute action is where it was.
  for (size_t i = 0; i < sim->events.size(); ++i) {
    if (sim->events[i].action.kind == ActionKind::kOptimizerStep) continue;
    EXPECT_DOUBLE_EQ(sim->events[i].start_s, plain->events[i].start_s) << i;
  }
  EXPECT_DOUBLE_EQ(sim->step_time_s, 10);
  EXPECT_DOUBLE_EQ(sim->step_time_without_reduction_s, 9);
  // Stage 1's reduction reaches 1 of its 3 units past the step without reductions;
  // stage 0's ends past it by all its length.
  EXPECT_DOUBLE_EQ(r1.hidden_fraction, 2.0 / 3);
  EXPECT_DOUBLE_EQ(r0.hidden_fraction, 0);
  EXPECT_DOUBLE_EQ(sim->busy_s[0], plain->busy_s[0]) << "a reduction is not compute";

  // Short enough to end before stage 0 does, stage 1's reduction is hidden entirely.
  costs.allreduce_stage_s = {0.5, 1.5};
  sim = Simulate(programs, costs);
  ASSERT_THAT(sim, IsOk());
  EXPECT_DOUBLE_EQ(sim->reductions[1].hidden_fraction, 1);
  EXPECT_DOUBLE_EQ(sim->step_time_s, 9.5);
}

// With split backwards the gradients are final only after the stage's last W.
TEST(SimulatorTest, TheReductionStartsAfterTheLastWeightGradient) {
  const schedule::Schedule programs = Lowered(ScheduleKind::kZbH1, 3, 6);
  CostModel costs = EqualStageCost(3);
  costs.allreduce_stage_s = {1, 1, 1};
  auto sim = Simulate(programs, costs);
  ASSERT_THAT(sim, IsOk());
  ASSERT_EQ(sim->reductions.size(), 3u);
  for (const ReductionEvent& r : sim->reductions) {
    double last_w = -1, last_i = -1;
    for (const TimelineEvent& e : sim->events) {
      if (e.stage != r.stage) continue;
      using schedule::ActionKind;
      if (e.action.kind == ActionKind::kBackwardWeight) last_w = std::max(last_w, e.end_s);
      if (e.action.kind == ActionKind::kBackwardInput) last_i = std::max(last_i, e.end_s);
    }
    EXPECT_DOUBLE_EQ(r.start_s, last_w) << "stage " << r.stage;
    EXPECT_LT(last_i, last_w) << "stage " << r.stage;
    EXPECT_DOUBLE_EQ(r.end_s, r.start_s + 1);
    EXPECT_DOUBLE_EQ(EventOf(*sim, r.stage, schedule::ActionKind::kOptimizerStep).start_s,
                     std::max(r.end_s, last_w));
  }
  EXPECT_THAT(Simulate(programs, [] {
                CostModel c = EqualStageCost(3);
                c.allreduce_stage_s = {1, 1};
                return c;
              }()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("all-reduce costs for 2")));
}

// Every compute action's interval on `stages`, in time order.
std::vector<std::pair<double, double>> ComputeOn(const SimulationResult& sim,
                                                 const std::vector<int>& stages) {
  std::vector<std::pair<double, double>> out;
  for (const TimelineEvent& e : sim.events) {
    const bool computes = schedule::IsCompute(e.action.kind) ||
                          e.action.kind == schedule::ActionKind::kOptimizerStep;
    if (computes && std::find(stages.begin(), stages.end(), e.stage) != stages.end()) {
      out.push_back({e.start_s, e.end_s});
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(SimulatorTest, StagesSharingOneSlotNeverComputeAtOnce) {
  CostModel costs = EqualStageCost(2);
  costs.device_of_stage = {0, 0};
  costs.device_slots = {1};
  auto shared = Simulate(Lowered(ScheduleKind::kGpipe, 2, 4), costs);
  ASSERT_THAT(shared, IsOk());
  const auto intervals = ComputeOn(*shared, {0, 1});
  ASSERT_EQ(intervals.size(), 2u * 4 * 2 + 2);  // F and B of 4 micro-batches, and OPT
  for (size_t i = 1; i < intervals.size(); ++i) {
    EXPECT_GE(intervals[i].first, intervals[i - 1].second) << "interval " << i;
  }
  // The device is never idle while a stage could compute: the step is the work of both
  // stages, 4 micro-batches x (1 + 2) each, and nothing is lost to a bubble.
  EXPECT_DOUBLE_EQ(shared->step_time_s, 24);
  EXPECT_DOUBLE_EQ(shared->bubble_fraction, 0);
  auto apart = Simulate(Lowered(ScheduleKind::kGpipe, 2, 4), EqualStageCost(2));
  ASSERT_THAT(apart, IsOk());
  EXPECT_LT(apart->step_time_s, shared->step_time_s);
}

TEST(SimulatorTest, ADeviceWithASlotPerStageIsAsDevicesOfTheirOwn) {
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB}) {
    CostModel apart = EqualStageCost(4);
    for (int s = 0; s < 4; ++s) apart.chunks[s][0].send_activation_s = 0.1 * (s + 1);
    CostModel shared = apart;
    shared.device_of_stage = {0, 0, 1, 1};
    shared.device_slots = {2, 2};
    auto a = Simulate(Lowered(kind, 4, 8), apart);
    auto b = Simulate(Lowered(kind, 4, 8), shared);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_DOUBLE_EQ(a->step_time_s, b->step_time_s);
    EXPECT_DOUBLE_EQ(a->bubble_fraction, b->bubble_fraction);
    ASSERT_EQ(a->events.size(), b->events.size());
    for (size_t i = 0; i < a->events.size(); ++i) {
      EXPECT_DOUBLE_EQ(a->events[i].start_s, b->events[i].start_s) << i;
      EXPECT_DOUBLE_EQ(a->events[i].end_s, b->events[i].end_s) << i;
    }
  }
}

TEST(SimulatorTest, TwoSlotsRunTwoOfFourStagesAtOnce) {
  CostModel costs = EqualStageCost(4);
  costs.device_of_stage = {0, 0, 0, 0};
  costs.device_slots = {2};
  auto sim = Simulate(Lowered(ScheduleKind::kOneFOneB, 4, 8), costs);
  ASSERT_THAT(sim, IsOk());
  const auto intervals = ComputeOn(*sim, {0, 1, 2, 3});
  // At no instant do three compute actions overlap: sweep the interval ends.
  std::vector<std::pair<double, int>> edges;
  for (const auto& [start, end] : intervals) {
    edges.push_back({start, +1});
    edges.push_back({end, -1});
  }
  std::sort(edges.begin(), edges.end());  // an end (-1) before a start at the same time
  int running = 0, most = 0;
  for (const auto& [t, d] : edges) most = std::max(most, running += d);
  EXPECT_EQ(most, 2);
  // Work 4 x 8 x 3 = 96 on two slots takes at least 48.
  EXPECT_GE(sim->step_time_s, 48);
}

TEST(SimulatorTest, RefusesADeviceWithoutSlots) {
  CostModel costs = EqualStageCost(2);
  costs.device_of_stage = {0};
  costs.device_slots = {1};
  EXPECT_THAT(Simulate(Lowered(ScheduleKind::kGpipe, 2, 2), costs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device costs for 1")));
  costs.device_of_stage = {0, 1};
  EXPECT_THAT(Simulate(Lowered(ScheduleKind::kGpipe, 2, 2), costs),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device 1 has no slots")));
}

}  // namespace
}  // namespace pipetrain::planner

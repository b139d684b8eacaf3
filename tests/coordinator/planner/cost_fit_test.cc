#include "coordinator/planner/cost_fit.h"

#include <cmath>

#include "common/schedule/stage_program.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::planner {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using schedule::ActionKind;
using ::testing::HasSubstr;

#define ASSERT_OK(expr) ASSERT_THAT((expr), IsOk())
#define FIT_CONCAT_(a, b) a##b
#define FIT_CONCAT(a, b) FIT_CONCAT_(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) ASSIGN_IMPL_(FIT_CONCAT(result_, __LINE__), lhs, expr)
#define ASSIGN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                 \
  ASSERT_TRUE(tmp.ok()) << tmp.status(); \
  lhs = std::move(*tmp)

// A simulated step as the stages would report it: whole microseconds, and the bytes of
// every send as the plan's transfer time times the link's rate.
std::vector<pb::TimelineEvent> AsReported(const SimulationResult& sim, const CostModel& costs,
                                          double link_bytes_per_s, int64_t step = 2) {
  std::vector<pb::TimelineEvent> out;
  for (const TimelineEvent& e : sim.events) {
    pb::TimelineEvent& t = out.emplace_back();
    t.set_step(step);
    t.set_stage(e.stage);
    *t.mutable_action() = schedule::ActionToProto(e.action);
    t.set_lane(schedule::IsCompute(e.action.kind) ? "compute" : "link");
    t.set_start_us(std::llround(e.start_s * 1e6));
    t.set_end_us(std::llround(e.end_s * 1e6));
    const ChunkCost& c = costs.chunks[e.stage][e.action.chunk];
    if (e.action.kind == ActionKind::kSendActivation)
      t.set_bytes(std::llround(c.send_activation_s * link_bytes_per_s));
    if (e.action.kind == ActionKind::kSendGradient)
      t.set_bytes(std::llround(c.send_gradient_s * link_bytes_per_s));
  }
  return out;
}

PlanOptions Options(ScheduleKind kind, int k, int m, int v = 1) {
  PlanOptions o;
  o.model = {256, 64, 128, 4, 8};  // vocab, seq, d_model, heads, blocks
  o.stages = k;
  o.micro_batches = m;
  o.chunks = v;
  o.schedule = kind;
  o.batch_size = 2 * m;
  o.device_flops = 2e9;     // actions of a few ms
  o.link_bytes_per_s = 2e8;  // transfers of a fraction of one
  return o;
}

// What a real stage adds that the analytic model leaves out: sends and receives that
// take time, and an optimizer step.
CostModel WithRuntimeCosts(CostModel c) {
  for (auto& stage : c.chunks) {
    for (ChunkCost& cc : stage) {
      cc.send_busy_s = 0.0004;
      cc.recv_busy_s = 0.0001;
    }
  }
  c.optimizer_stage_s.assign(c.chunks.size(), 0.003);
  return c;
}

// Measuring the simulator's own step and fitting gives back a model that predicts the
// same step: every cost the fit recovers is the one that produced the timeline.
void ExpectFitReproduces(ScheduleKind kind, int k, int m, int v) {
  SCOPED_TRACE(::testing::Message() << ScheduleName(kind) << " K=" << k << " M=" << m);
  ASSERT_OK_AND_ASSIGN(Plan plan, MakePlan(Options(kind, k, m, v)));
  const CostModel truth = WithRuntimeCosts(plan.costs);
  ASSERT_OK_AND_ASSIGN(SimulationResult sim, Simulate(plan.programs, truth));
  MeasuredCosts measured(k, v);
  ASSERT_OK(measured.AddStep(AsReported(sim, truth, plan.options.link_bytes_per_s)));
  // Start from a guess that is wrong everywhere, as the device-rate guess is.
  CostModel guess = plan.costs;
  for (auto& stage : guess.chunks) {
    for (ChunkCost& cc : stage) {
      cc.forward_s *= 3;
      cc.backward_input_s *= 0.5;
      cc.send_activation_s = cc.send_gradient_s = 0;
    }
  }
  ASSERT_OK_AND_ASSIGN(SimulationResult fitted, Simulate(plan.programs, measured.Fit(guess)));
  const double us = 1e-6 * static_cast<double>(plan.programs[0].actions.size());
  EXPECT_NEAR(fitted.step_time_s, sim.step_time_s, 4 * us);
  EXPECT_NEAR(fitted.bubble_fraction, sim.bubble_fraction, 1e-3);
  for (int s = 0; s < k; ++s) EXPECT_NEAR(fitted.busy_s[s], sim.busy_s[s], 4 * us) << "stage " << s;
}

TEST(CostFitTest, FittingASimulatedStepPredictsItAgain) {
  ExpectFitReproduces(ScheduleKind::kGpipe, 4, 8, 1);
  ExpectFitReproduces(ScheduleKind::kOneFOneB, 4, 8, 1);
  ExpectFitReproduces(ScheduleKind::kZbH1, 4, 8, 1);
  ExpectFitReproduces(ScheduleKind::kInterleaved, 2, 4, 2);
  ExpectFitReproduces(ScheduleKind::kOneFOneB, 1, 4, 1);
}

// Predict draws each action's time from that very action's measured ones: with every
// step alike it is the simulated step itself, and with two unlike steps it lies between.
TEST(CostFitTest, PredictDrawsEachActionFromItsOwnMeasurements) {
  ASSERT_OK_AND_ASSIGN(Plan plan, MakePlan(Options(ScheduleKind::kOneFOneB, 4, 8)));
  const CostModel truth = WithRuntimeCosts(plan.costs);
  ASSERT_OK_AND_ASSIGN(SimulationResult sim, Simulate(plan.programs, truth));
  const double link = plan.options.link_bytes_per_s;
  MeasuredCosts same(4, 1);
  ASSERT_OK(same.AddStep(AsReported(sim, truth, link, 2)));
  ASSERT_OK(same.AddStep(AsReported(sim, truth, link, 3)));
  ASSERT_OK_AND_ASSIGN(MeasuredCosts::Prediction p, same.Predict(plan.programs, plan.costs, 8));
  EXPECT_NEAR(p.step_time_s, sim.step_time_s, 2e-4);
  EXPECT_NEAR(p.bubble_fraction, sim.bubble_fraction, 1e-3);

  CostModel slow = truth;
  for (auto& stage : slow.chunks) {
    for (ChunkCost& cc : stage) cc.forward_s *= 2;
  }
  ASSERT_OK_AND_ASSIGN(SimulationResult slow_sim, Simulate(plan.programs, slow));
  MeasuredCosts mixed(4, 1);
  ASSERT_OK(mixed.AddStep(AsReported(sim, truth, link, 2)));
  ASSERT_OK(mixed.AddStep(AsReported(slow_sim, slow, link, 3)));
  ASSERT_OK_AND_ASSIGN(p, mixed.Predict(plan.programs, plan.costs, 16));
  EXPECT_GT(p.step_time_s, sim.step_time_s);
  EXPECT_LT(p.step_time_s, slow_sim.step_time_s);
  // The same measurements give the same prediction.
  ASSERT_OK_AND_ASSIGN(MeasuredCosts::Prediction again, mixed.Predict(plan.programs, plan.costs, 16));
  EXPECT_EQ(again.step_time_s, p.step_time_s);
}

TEST(CostFitTest, MeansComeFromTheActionsAndTransfersFromWaitedMessages) {
  // Two stages, one micro-batch: F0 on stage 0 takes 10 ms and sends at 10-11 ms; stage 1
  // waits from 0 and has the tensor at 16 ms, 6 ms after the send began.
  auto event = [](int stage, ActionKind kind, int64_t start, int64_t end, uint64_t bytes = 0) {
    pb::TimelineEvent e;
    e.set_step(2);
    e.set_stage(stage);
    *e.mutable_action() = schedule::ActionToProto({kind, 0, 0});
    e.set_start_us(start);
    e.set_end_us(end);
    e.set_bytes(bytes);
    return e;
  };
  std::vector<pb::TimelineEvent> step = {
      event(0, ActionKind::kForward, 0, 10000),
      event(0, ActionKind::kSendActivation, 10000, 11000, 5000),
      event(1, ActionKind::kRecvActivation, 0, 16000),
      event(1, ActionKind::kForward, 16000, 20000),
      event(1, ActionKind::kBackward, 20000, 28000),
      event(1, ActionKind::kSendGradient, 28000, 28500, 5000),
      // Stage 0 comes to the receive only after the gradient is there: not a transfer.
      event(0, ActionKind::kRecvGradient, 40000, 40200),
      event(0, ActionKind::kBackward, 40200, 60200),
      event(0, ActionKind::kOptimizerStep, 60200, 61200),
      event(1, ActionKind::kOptimizerStep, 28500, 29000),
  };
  MeasuredCosts m(2, 1);
  ASSERT_OK(m.AddStep(step));
  const auto means = m.Means();
  EXPECT_DOUBLE_EQ(means[0][0].forward_s, 0.010);
  EXPECT_DOUBLE_EQ(means[0][0].backward_s, 0.020);
  EXPECT_DOUBLE_EQ(means[1][0].backward_s, 0.008);
  EXPECT_DOUBLE_EQ(means[0][0].send_busy_s, 0.001);
  EXPECT_DOUBLE_EQ(means[0][0].transfer_activation_s, 0.006);
  EXPECT_LT(means[1][0].transfer_gradient_s, 0);  // never waited for
  EXPECT_DOUBLE_EQ(means[0][0].recv_busy_s, 0.0002);
  EXPECT_DOUBLE_EQ(m.TransferSecondsPerByte(), 0.006 / 5000);
  EXPECT_THAT(m.OptimizerMeans(), ::testing::ElementsAre(0.001, 0.0005));

  // Fit: B's whole time is the backward; the unwaited gradient takes the link's rate.
  ASSERT_OK_AND_ASSIGN(Plan plan, MakePlan(Options(ScheduleKind::kOneFOneB, 2, 1)));
  const CostModel fitted = m.Fit(plan.costs);
  EXPECT_DOUBLE_EQ(fitted.chunks[0][0].backward_input_s, 0.020);
  EXPECT_DOUBLE_EQ(fitted.chunks[0][0].backward_weight_s, 0);
  EXPECT_DOUBLE_EQ(fitted.chunks[1][0].send_gradient_s, 5000 * (0.006 / 5000));
  // The receiver's own part of the wait is not the link's.
  EXPECT_NEAR(fitted.chunks[0][0].send_activation_s, 0.006, 1e-12);
  EXPECT_THAT(fitted.optimizer_stage_s, ::testing::ElementsAre(0.001, 0.0005));
}

TEST(CostFitTest, KeepsOnlyTheLatestStepsOfItsWindow) {
  auto forward = [](int64_t us) {
    pb::TimelineEvent e;
    e.set_stage(0);
    *e.mutable_action() = schedule::ActionToProto({ActionKind::kForward, 0, 0});
    e.set_end_us(us);
    return std::vector<pb::TimelineEvent>{e};
  };
  MeasuredCosts m(1, 1, /*window=*/2);
  ASSERT_OK(m.AddStep(forward(1000)));
  ASSERT_OK(m.AddStep(forward(3000)));
  ASSERT_OK(m.AddStep(forward(5000)));
  EXPECT_EQ(m.steps(), 2);
  EXPECT_DOUBLE_EQ(m.Means()[0][0].forward_s, 0.004);
}

// Stages on one device take turns in the plan; what they measured already holds the
// turns, so the fitted model runs the measured times as they came.
TEST(CostFitTest, MeasuredTimesReplaceTheDevicesTurns) {
  pb::TimelineEvent e;
  e.set_stage(0);
  *e.mutable_action() = schedule::ActionToProto({ActionKind::kForward, 0, 0});
  e.set_end_us(2000);
  CostModel planned = EqualStageCost(2);
  planned.device_of_stage = {0, 0};
  planned.device_slots = {1};
  MeasuredCosts m(2, 1);
  EXPECT_EQ(m.Fit(planned).device_slots, planned.device_slots) << "nothing measured yet";
  ASSERT_OK(m.AddStep({e}));
  const CostModel fitted = m.Fit(planned);
  EXPECT_TRUE(fitted.device_of_stage.empty());
  EXPECT_TRUE(fitted.device_slots.empty());
  EXPECT_DOUBLE_EQ(fitted.chunks[0][0].forward_s, 0.002);
}

TEST(CostFitTest, RefusesEventsOutsideTheJobsShape) {
  MeasuredCosts m(2, 1);
  pb::TimelineEvent e;
  e.set_step(7);
  e.set_stage(2);
  *e.mutable_action() = schedule::ActionToProto({ActionKind::kForward, 0, 0});
  EXPECT_THAT(m.AddStep({e}), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("step 7 stage 2")));
  e.set_stage(0);
  *e.mutable_action() = schedule::ActionToProto({ActionKind::kForward, 0, 1});
  EXPECT_THAT(m.AddStep({e}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("F0@1")));
  EXPECT_EQ(m.steps(), 0);
  ASSERT_OK_AND_ASSIGN(Plan plan, MakePlan(Options(ScheduleKind::kOneFOneB, 2, 2)));
  EXPECT_THAT(RatesFromMeasured(plan, m), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                   HasSubstr("no training step")));
  EXPECT_THAT(RatesFromMeasured(plan, MeasuredCosts(4, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4 stages")));
}

// Rates measured on one shape predict another shape as the true device would: a job
// measured with 1F1B on 2 stages foresees zb-h1 on 4 with 16 micro-batches.
void ExpectRatesCarryOver(pipetrain::v1::RecomputeMode recompute) {
  PlanOptions measured_options = Options(ScheduleKind::kOneFOneB, 2, 4);
  measured_options.recompute = recompute;
  ASSERT_OK_AND_ASSIGN(Plan measured_plan, MakePlan(measured_options));
  ASSERT_OK_AND_ASSIGN(SimulationResult sim,
                       Simulate(measured_plan.programs, measured_plan.costs));
  MeasuredCosts m(2, 1);
  ASSERT_OK(m.AddStep(AsReported(sim, measured_plan.costs, measured_options.link_bytes_per_s)));
  ASSERT_OK_AND_ASSIGN(CostRates rates, RatesFromMeasured(measured_plan, m));
  EXPECT_NEAR(rates.forward_s_per_flop * measured_options.device_flops, 1.0, 1e-3);
  EXPECT_NEAR(rates.backward_input_s_per_flop * measured_options.device_flops, 1.0, 1e-3);
  EXPECT_NEAR(rates.backward_weight_s_per_flop * measured_options.device_flops, 1.0, 1e-3);
  EXPECT_NEAR(rates.transfer_s_per_byte * measured_options.link_bytes_per_s, 1.0, 1e-3);
  EXPECT_EQ(rates.steps, 1);

  for (auto [kind, k, mb, v] : {std::tuple{ScheduleKind::kZbH1, 4, 16, 1},
                                std::tuple{ScheduleKind::kGpipe, 8, 8, 1},
                                std::tuple{ScheduleKind::kInterleaved, 2, 8, 2}}) {
    PlanOptions other = Options(kind, k, mb, v);
    other.recompute = recompute;
    ASSERT_OK_AND_ASSIGN(Plan truth, MakePlan(other));
    other.rates = rates;
    other.device_flops = 1e15;  // ignored: the rates replace it
    ASSERT_OK_AND_ASSIGN(Plan predicted, MakePlan(other));
    EXPECT_NEAR(predicted.simulation.step_time_s / truth.simulation.step_time_s, 1.0, 2e-3)
        << ScheduleName(kind) << " K=" << k;
    EXPECT_NEAR(predicted.simulation.bubble_fraction, truth.simulation.bubble_fraction, 2e-3);
  }
}

TEST(CostFitTest, RatesPredictOtherShapesOfTheSameModel) {
  ExpectRatesCarryOver(pipetrain::v1::RECOMPUTE_NEVER);
}

TEST(CostFitTest, RatesTakeTheRecomputeOutOfTheBackward) {
  ExpectRatesCarryOver(pipetrain::v1::RECOMPUTE_ALWAYS);
}

}  // namespace
}  // namespace pipetrain::planner

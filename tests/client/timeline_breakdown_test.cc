// BreakDownTimeline: hand-built timelines whose answer is known (a recomputing 1F1B
// step, a split I/W schedule, several steps averaged, overlapping events, bad input),
// the table and JSON it prints, and a property over the planner's simulator: for
// every schedule, K and recompute setting, each stage's categories add up to the step
// time, the compute and optimizer ones to the simulator's busy time, and the rest
// (idle, waiting, sending) to the simulator's idle share.
#include "client/timeline_breakdown.h"

#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/schedule/stage_program.h"
#include "common/testing/status_matchers.h"
#include "coordinator/planner/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain::client {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using TC = TimeCategory;

void Add(pb::Timeline& t, int64_t step, int stage, pb::ActionKind kind, int64_t start_us,
         int64_t end_us, int64_t recompute_us = 0) {
  pb::TimelineEvent* e = t.add_events();
  e->set_step(step);
  e->set_stage(stage);
  e->mutable_action()->set_kind(kind);
  const bool link = kind == pb::SEND_ACTIVATION || kind == pb::SEND_GRADIENT ||
                    kind == pb::RECV_ACTIVATION || kind == pb::RECV_GRADIENT;
  e->set_lane(link ? "link" : "compute");
  e->set_start_us(start_us);
  e->set_end_us(end_us);
  e->set_recompute_us(recompute_us);
}

// Expects exactly these microseconds per category (the rest 0).
void ExpectTimes(const StageTimes& got, std::map<TC, int64_t> want_us) {
  for (TC c : kAllTimeCategories) {
    EXPECT_DOUBLE_EQ(got[c], static_cast<double>(want_us[c]) / 1e6)
        << "stage " << got.stage << " " << TimeCategoryName(c);
  }
}

// One micro-batch through two stages with recomputation: stage 1 ends 70 us early.
pb::Timeline RecomputingStep() {
  pb::Timeline t;
  t.set_job_id("job-7");
  Add(t, 1, 0, pb::FORWARD, 0, 100);
  Add(t, 1, 0, pb::SEND_ACTIVATION, 100, 110);
  Add(t, 1, 0, pb::RECV_GRADIENT, 110, 300);
  Add(t, 1, 0, pb::BACKWARD, 300, 500, 80);
  Add(t, 1, 0, pb::OPTIMIZER_STEP, 500, 520);
  Add(t, 1, 1, pb::RECV_ACTIVATION, 0, 120);
  Add(t, 1, 1, pb::FORWARD, 120, 220);
  Add(t, 1, 1, pb::BACKWARD, 220, 420, 60);
  Add(t, 1, 1, pb::SEND_GRADIENT, 420, 430);
  Add(t, 1, 1, pb::OPTIMIZER_STEP, 430, 450);
  return t;
}

// Two replicas of one stage, two steps: the OPT's first reduce_us is the all-reduce it
// waited for; reduce_total_us, all of it, gives the share hidden behind the backward.
TEST(TimelineBreakdownTest, TheAllReduceTheOptimizerWaitedForIsItsOwnCategoryWithItsHiddenShare) {
  pb::Timeline t;
  t.set_job_id("job-8");
  for (int64_t step : {1, 2}) {
    for (int stage : {0, 1}) {
      Add(t, step, stage, pb::FORWARD, 0, 100);
      Add(t, step, stage, pb::BACKWARD, 100, 300);
      Add(t, step, stage, pb::OPTIMIZER_STEP, 300, 400);
      pb::TimelineEvent& opt = *t.mutable_events(t.events_size() - 1);
      opt.set_reduce_us(stage == 0 ? 40 : 500);  // more than the action: clamped to it
      opt.set_reduce_total_us(stage == 0 ? 160 : 100);
    }
  }
  auto b = BreakDownTimeline(t);
  ASSERT_THAT(b.status(), IsOk());
  ASSERT_EQ(b->stages.size(), 2u);
  ExpectTimes(b->stages[0], {{TC::kForward, 100}, {TC::kBackward, 200}, {TC::kAllReduce, 40},
                             {TC::kOptimizer, 60}});
  ExpectTimes(b->stages[1], {{TC::kForward, 100}, {TC::kBackward, 200}, {TC::kAllReduce, 100}});
  EXPECT_DOUBLE_EQ(b->stages[0].allreduce_total_s, 160e-6);  // a step's, the mean of two
  EXPECT_DOUBLE_EQ(b->stages[0].AllReduceHidden(), 0.75);
  EXPECT_DOUBLE_EQ(b->stages[1].AllReduceHidden(), 0.0);
  const std::string table = BreakdownTable(*b);
  EXPECT_THAT(table, HasSubstr("allreduce"));
  EXPECT_THAT(table, HasSubstr("stage 0: the replicas' gradient all-reduce took 160 us a step, "
                               "75% of it hidden behind the backward"));
  const nlohmann::json j = nlohmann::json::parse(BreakdownJson(*b));
  EXPECT_DOUBLE_EQ(j["stages"][0]["allreduce_s"].get<double>(), 40e-6);
  EXPECT_DOUBLE_EQ(j["stages"][0]["allreduce_hidden"].get<double>(), 0.75);
  // Without replicas there is no such line.
  EXPECT_THAT(BreakdownTable(*BreakDownTimeline(RecomputingStep())),
              ::testing::Not(HasSubstr("all-reduce")));
}

TEST(TimelineBreakdownTest, RecomputeIsTakenOutOfTheBackwardAndIdleFillsTheStep) {
  auto b = BreakDownTimeline(RecomputingStep());
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_EQ(b->job_id, "job-7");
  ASSERT_EQ(b->steps.size(), 1u);
  EXPECT_DOUBLE_EQ(b->step_time_s, 520e-6);  // the longest span, stage 0's
  ASSERT_EQ(b->stages.size(), 2u);
  ExpectTimes(b->stages[0], {{TC::kForward, 100}, {TC::kSend, 10}, {TC::kRecvWait, 190},
                             {TC::kRecompute, 80}, {TC::kBackward, 120}, {TC::kOptimizer, 20}});
  ExpectTimes(b->stages[1], {{TC::kRecvWait, 120}, {TC::kForward, 100}, {TC::kRecompute, 60},
                             {TC::kBackward, 140}, {TC::kSend, 10}, {TC::kOptimizer, 20},
                             {TC::kIdle, 70}});
  for (const StageTimes& st : b->stages) EXPECT_NEAR(st.Total(), b->step_time_s, 1e-15);
  // One step: its own figures are the mean.
  EXPECT_EQ(b->steps[0].stages[1].seconds, b->stages[1].seconds);
}

TEST(TimelineBreakdownTest, ASplitBackwardCountsInputAndWeightApart) {
  pb::Timeline t;
  t.set_job_id("zb");
  Add(t, 2, 0, pb::FORWARD, 0, 10);
  Add(t, 2, 0, pb::FORWARD, 10, 20);
  Add(t, 2, 0, pb::BACKWARD_INPUT, 20, 40, 5);
  Add(t, 2, 0, pb::BACKWARD_INPUT, 40, 60, 5);
  Add(t, 2, 0, pb::BACKWARD_WEIGHT, 60, 70);
  Add(t, 2, 0, pb::BACKWARD_WEIGHT, 70, 80);
  Add(t, 2, 1, pb::FORWARD, 50, 100);  // makes the step 100 us
  auto b = BreakDownTimeline(t);
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_DOUBLE_EQ(b->step_time_s, 100e-6);
  ExpectTimes(b->stages[0], {{TC::kForward, 20}, {TC::kBackwardInput, 30}, {TC::kRecompute, 10},
                             {TC::kBackwardWeight, 20}, {TC::kIdle, 20}});
  ExpectTimes(b->stages[1], {{TC::kForward, 50}, {TC::kIdle, 50}});
  EXPECT_DOUBLE_EQ(ShareOfStep(b->stages[0][TC::kBackwardInput], b->step_time_s), 0.3);
}

TEST(TimelineBreakdownTest, SeveralStepsAreAveragedAndAMissingStageIsIdle) {
  pb::Timeline t;
  t.set_job_id("avg");
  Add(t, 4, 0, pb::FORWARD, 0, 100);
  Add(t, 4, 0, pb::RECV_GRADIENT, 100, 300);
  Add(t, 4, 1, pb::FORWARD, 200, 300);
  Add(t, 3, 0, pb::FORWARD, 0, 100);  // stage 1 reported nothing for step 3
  auto b = BreakDownTimeline(t);
  ASSERT_THAT(b.status(), IsOk());
  ASSERT_EQ(b->steps.size(), 2u);
  EXPECT_EQ(b->steps[0].step, 3);
  EXPECT_EQ(b->steps[1].step, 4);
  EXPECT_DOUBLE_EQ(b->steps[0].step_time_s, 100e-6);
  EXPECT_DOUBLE_EQ(b->steps[1].step_time_s, 300e-6);
  ExpectTimes(b->steps[0].stages[1], {{TC::kIdle, 100}});
  ExpectTimes(b->steps[1].stages[0], {{TC::kForward, 100}, {TC::kRecvWait, 200}});
  // Means: (100 + 300) / 2 us a step.
  EXPECT_DOUBLE_EQ(b->step_time_s, 200e-6);
  ExpectTimes(b->stages[0], {{TC::kForward, 100}, {TC::kRecvWait, 100}});
  ExpectTimes(b->stages[1], {{TC::kForward, 50}, {TC::kIdle, 150}});
  EXPECT_DOUBLE_EQ(ShareOfStep(b->stages[1][TC::kIdle], b->step_time_s), 0.75);
}

TEST(TimelineBreakdownTest, OverlapsCountOnceAndRecomputeNeverExceedsItsAction) {
  pb::Timeline t;
  Add(t, 0, 0, pb::FORWARD, 0, 100);
  Add(t, 0, 0, pb::SEND_ACTIVATION, 50, 150);     // half under the forward
  Add(t, 0, 0, pb::BACKWARD, 150, 200, 500);      // recompute_us beyond its length
  Add(t, 0, 0, pb::RECV_GRADIENT, 160, 190);      // wholly under the backward
  Add(t, 0, 0, pb::OPTIMIZER_STEP, -20, 0);       // before the step: clamped away
  auto b = BreakDownTimeline(t);
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_DOUBLE_EQ(b->step_time_s, 200e-6);
  ExpectTimes(b->stages[0], {{TC::kForward, 100}, {TC::kSend, 50}, {TC::kRecompute, 50}});
}

TEST(TimelineBreakdownTest, BadTimelinesAreErrorsNamingWhatIsWrong) {
  pb::Timeline empty;
  empty.set_job_id("job-000009");
  EXPECT_THAT(BreakDownTimeline(empty).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job-000009"), HasSubstr("no step has finished"))));
  pb::Timeline unknown = RecomputingStep();
  unknown.mutable_events(3)->mutable_action()->set_kind(pb::ACTION_KIND_UNSPECIFIED);
  EXPECT_THAT(BreakDownTimeline(unknown).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job-7"), HasSubstr("event 3 (step 1 stage 0)"),
                             HasSubstr("action kind 0"))));
  pb::Timeline negative = RecomputingStep();
  negative.mutable_events(5)->set_stage(-1);
  EXPECT_THAT(BreakDownTimeline(negative).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative stage")));
}

TEST(TimelineBreakdownTest, TheTableHasARowPerStageWithTimesAndShares) {
  auto b = BreakDownTimeline(RecomputingStep());
  ASSERT_THAT(b.status(), IsOk());
  const std::string table = BreakdownTable(*b);
  std::vector<std::string> lines = absl::StrSplit(table, '\n');
  ASSERT_EQ(lines.size(), 5u) << table;  // title, header, 2 stages, and the final newline
  EXPECT_EQ(lines[0], "job-7: step 1, step time 520 us (the longest stage span)");
  for (const char* column : {"stage", "forward", "backward", "input", "weight", "recompute",
                             "optimizer", "send", "recv-wait", "idle"}) {
    EXPECT_THAT(lines[1], HasSubstr(column));
  }
  // Stage 1: recv-wait 120 us (23%), idle 70 us (13%).
  EXPECT_THAT(lines[3], AllOf(::testing::StartsWith("1 "), HasSubstr("120 us  23%"),
                              HasSubstr("70 us  13%"), HasSubstr("60 us  12%")));
  EXPECT_THAT(lines[2], HasSubstr("190 us  37%"));
  EXPECT_EQ(lines[4], "");
}

TEST(TimelineBreakdownTest, JsonCarriesSecondsAndSharesUnderStableNames) {
  auto b = BreakDownTimeline(RecomputingStep());
  ASSERT_THAT(b.status(), IsOk());
  auto j = nlohmann::json::parse(BreakdownJson(*b), nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["job_id"], "job-7");
  EXPECT_EQ(j["steps"], nlohmann::json::array({1}));
  EXPECT_DOUBLE_EQ(j["step_time_s"].get<double>(), 520e-6);
  ASSERT_EQ(j["stages"].size(), 2u);
  const nlohmann::json& s1 = j["stages"][1];
  EXPECT_EQ(s1["stage"], 1);
  for (const char* name : {"forward", "backward", "backward_input", "backward_weight",
                           "recompute", "optimizer", "send", "recv_wait", "idle"}) {
    ASSERT_TRUE(s1.contains(absl::StrCat(name, "_s"))) << name;
    ASSERT_TRUE(s1["shares"].contains(name)) << name;
  }
  EXPECT_DOUBLE_EQ(s1["idle_s"].get<double>(), 70e-6);
  EXPECT_DOUBLE_EQ(s1["recompute_s"].get<double>(), 60e-6);
  EXPECT_NEAR(s1["shares"]["idle"].get<double>(), 70.0 / 520, 1e-12);
  double shares = 0;
  for (const auto& [name, share] : s1["shares"].items()) shares += share.get<double>();
  EXPECT_NEAR(shares, 1.0, 1e-12);
}

// The simulator's prediction as the coordinator would serve a measured step, one tick
// of the timeline per nanosecond of simulated time (so that rounding stays small).
constexpr double kTicksPerSecond = 1e9;

pb::Timeline TimelineOfSimulation(const planner::Plan& plan) {
  pb::Timeline t;
  t.set_job_id("simulated");
  for (const planner::TimelineEvent& e : plan.simulation.events) {
    pb::TimelineEvent* out = t.add_events();
    out->set_stage(e.stage);
    *out->mutable_action() = schedule::ActionToProto(e.action);
    out->set_lane(schedule::IsCommunication(e.action.kind) ? "link" : "compute");
    out->set_start_us(std::llround(e.start_s * kTicksPerSecond));
    out->set_end_us(std::llround(e.end_s * kTicksPerSecond));
    if (schedule::ProducesInputGradient(e.action.kind)) {
      const double recompute = plan.costs.chunks[e.stage][e.action.chunk].recompute_s;
      out->set_recompute_us(std::llround(recompute * kTicksPerSecond));
    }
  }
  return t;
}

TEST(TimelineBreakdownTest, ASimulatedStepAddsUpAndMatchesTheSimulatorsBusyTime) {
  for (planner::ScheduleKind kind :
       {planner::ScheduleKind::kGpipe, planner::ScheduleKind::kOneFOneB,
        planner::ScheduleKind::kInterleaved, planner::ScheduleKind::kZbH1}) {
    for (int K : {2, 4}) {
      for (auto recompute : {pb::RECOMPUTE_NEVER, pb::RECOMPUTE_ALWAYS}) {
        SCOPED_TRACE(absl::StrCat(planner::ScheduleName(kind), " K=", K, " recompute ",
                                  planner::RecomputeName(recompute)));
        planner::PlanOptions o;
        o.model = {.vocab_size = 256, .seq_len = 64, .d_model = 64, .n_heads = 4, .n_layers = 8};
        o.stages = K;
        o.micro_batches = 8;
        o.chunks = kind == planner::ScheduleKind::kInterleaved ? 2 : 1;
        o.schedule = kind;
        o.recompute = recompute;
        o.batch_size = 8;
        o.device_flops = 1e9;  // milliseconds an action: many ticks each
        auto plan = planner::MakePlan(o);
        ASSERT_THAT(plan.status(), IsOk());
        auto b = BreakDownTimeline(TimelineOfSimulation(*plan));
        ASSERT_THAT(b.status(), IsOk());
        const planner::SimulationResult& sim = plan->simulation;
        const double step_ticks = b->step_time_s * 1e6;
        EXPECT_NEAR(step_ticks, sim.step_time_s * kTicksPerSecond, 1);
        ASSERT_EQ(b->stages.size(), static_cast<size_t>(K));
        for (int s = 0; s < K; ++s) {
          SCOPED_TRACE(absl::StrCat("stage ", s));
          const StageTimes& st = b->stages[s];
          // Each edge rounds by at most half a tick.
          const double events = static_cast<double>(plan->programs[s].actions.size());
          const double tolerance = (events + 1) / step_ticks;
          EXPECT_NEAR(st.Total(), b->step_time_s, 1e-12);
          double busy = 0;
          for (TC c : {TC::kForward, TC::kBackward, TC::kBackwardInput, TC::kBackwardWeight,
                       TC::kRecompute, TC::kOptimizer}) {
            busy += st[c];
          }
          EXPECT_NEAR(ShareOfStep(busy, b->step_time_s), sim.busy_s[s] / sim.step_time_s,
                      tolerance);
          const double not_busy = st[TC::kIdle] + st[TC::kRecvWait] + st[TC::kSend];
          EXPECT_NEAR(ShareOfStep(not_busy, b->step_time_s), 1 - sim.busy_s[s] / sim.step_time_s,
                      tolerance);
          EXPECT_EQ(st[TC::kSend], 0);  // the simulator's sends cost the sender nothing
          if (recompute == pb::RECOMPUTE_ALWAYS) {
            EXPECT_GT(st[TC::kRecompute], 0);
          } else {
            EXPECT_EQ(st[TC::kRecompute], 0);
          }
          // Split schedules have I and W and no B; the others the reverse.
          const bool split = kind == planner::ScheduleKind::kZbH1;
          EXPECT_EQ(st[TC::kBackward] > 0, !split);
          EXPECT_EQ(st[TC::kBackwardInput] > 0, split);
          EXPECT_EQ(st[TC::kBackwardWeight] > 0, split);
        }
      }
    }
  }
}

}  // namespace
}  // namespace pipetrain::client

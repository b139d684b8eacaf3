// Property tests over K 1..8, M 1..16 for every schedule, and golden text schedules.
#include "coordinator/planner/generators.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/schedule/validator.h"
#include "common/testing/status_matchers.h"
#include "coordinator/planner/forward_only.h"
#include "coordinator/planner/lowering.h"
#include "coordinator/planner/simulator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::planner {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

// Every schedule of the table, so that a new row is held to every property below.
std::vector<ScheduleKind> All() {
  std::vector<ScheduleKind> all;
  for (const ScheduleEntry& e : ScheduleTable()) all.push_back(*ParseScheduleKind(e.name));
  return all;
}

int ChunksFor(ScheduleKind kind) { return EntryOf(kind).chunked ? 2 : 1; }
bool IsV(ScheduleKind kind) { return EntryOf(kind).placement == schedule::Placement::kV; }

TEST(GeneratorsTest, NamesRoundTrip) {
  for (ScheduleKind k : All()) {
    auto parsed = ParseScheduleKind(ScheduleName(k));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, k);
  }
  EXPECT_THAT(ParseScheduleKind("pipedream"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pipeline.schedule")));
}

TEST(GeneratorsTest, InvalidShapesAreRejectedNamingTheField) {
  EXPECT_THAT(
      Generate(ScheduleKind::kInterleaved, 4, 6, 2),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("pipeline.micro_batches (6) must be a multiple of pipeline.stages (4)")));
  EXPECT_THAT(
      Generate(ScheduleKind::kInterleaved, 4, 8, 1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pipeline.chunks must be >= 2")));
  EXPECT_THAT(Generate(ScheduleKind::kOneFOneB, 4, 8, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pipeline.chunks must be 1")));
  EXPECT_THAT(Generate(ScheduleKind::kGpipe, 0, 8),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pipeline.stages")));
  EXPECT_THAT(Generate(ScheduleKind::kGpipe, 2, 1 << 20),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pipeline.micro_batches")));
  EXPECT_THAT(Generate(ScheduleKind::kInterleaved, 2, 2, 1000),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pipeline.chunks")));
  EXPECT_THAT(Generate(ScheduleKind::kZbH1, 2, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pipeline.micro_batches")));
  EXPECT_THAT(Generate(ScheduleKind::kZbV, 4, 8, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pipeline.chunks must be 2 for the zb-v schedule (got 3)")));
  EXPECT_THAT(Generate(ScheduleKind::kDualPipeV, 4, 6, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pipeline.micro_batches (6) must be at least 2 x "
                                 "pipeline.stages - 1 (7) for the dualpipe-v schedule")));
}

// The V schedules' placement: stage 0 holds virtual stages 0 and 2K-1 (the embedding
// and the head), stage K-1 the middle two, and lowering hands stage K-1's activation
// from its chunk 0 to its chunk 1 (and the gradient back) with a send and a receive on
// the same stage, which the validator matches like any other.
TEST(GeneratorsTest, VSchedulesTurnOnTheLastStage) {
  for (ScheduleKind kind : {ScheduleKind::kZbV, ScheduleKind::kDualPipeV}) {
    auto gen = Generate(kind, 3, 5, 2);
    ASSERT_THAT(gen, IsOk());
    const schedule::Schedule lowered = Lower(*gen);
    EXPECT_EQ(lowered[0].placement, schedule::Placement::kV);
    const std::vector<schedule::Action>& last = lowered[2].actions;
    auto at = [&](schedule::Action a) { return std::find(last.begin(), last.end(), a) - last.begin(); };
    using schedule::ActionKind;
    const auto send = at({ActionKind::kSendActivation, 0, 0});
    const auto recv = at({ActionKind::kRecvActivation, 0, 1});
    ASSERT_LT(send, static_cast<long>(last.size()));
    EXPECT_LT(send, recv);
    // Stage 0 receives no activation for chunk 0 and sends no gradient from it; it
    // receives chunk 1's input from stage 1 and sends nothing downstream from chunk 1.
    for (const schedule::Action& a : lowered[0].actions) {
      EXPECT_FALSE(a.chunk == 0 && a.kind == ActionKind::kRecvActivation) << ToString(a);
      EXPECT_FALSE(a.chunk == 1 && a.kind == ActionKind::kSendActivation) << ToString(a);
    }
  }
}

// Every generated schedule over the grid: valid before and after lowering (which
// includes the deadlock check), within its in-flight bound (the bound is reached), and
// with equal costs and free transfer the simulated bubble matches the formulas:
//   GPipe, 1F1B: (K-1)/(M+K-1) exactly;
//   interleaved (v = 2, M a multiple of K): (K-1)/(vM+K-1) exactly, i.e. the bubble
//     time is (K-1)/(vM) of the ideal step (Narayanan et al. 2021, sec. 2.2);
//   ZB-H1: (K-1)/(3M+K-1) exactly when M >= K, i.e. bubble time (K-1)(F+I-W), a third
//     of 1F1B's (Qi et al. 2023, sec. 3.1); for M < K no worse than 1F1B.
//   ZB-V, DualPipe-V (M >= 2K-1): (K-1)/(6M+K-1), bubble time (K-1)/2: each stage
//     waits K-1 chunk passes of half a stage's time, half of ZB-H1's.
TEST(GeneratorsTest, GridIsValidBoundedAndMatchesTheTextbookBubble) {
  for (ScheduleKind kind : All()) {
    for (int k = 1; k <= 8; ++k) {
      for (int m = 1; m <= 16; ++m) {
        const int v = ChunksFor(kind);
        SCOPED_TRACE(absl::StrCat(ScheduleName(kind), " K=", k, " M=", m, " v=", v));
        auto gen = Generate(kind, k, m, v);
        if ((kind == ScheduleKind::kInterleaved && m % k != 0) || (IsV(kind) && m < 2 * k - 1)) {
          EXPECT_THAT(gen, StatusIs(absl::StatusCode::kInvalidArgument));
          continue;
        }
        ASSERT_THAT(gen, IsOk());
        ASSERT_THAT(schedule::Validate(*gen, {.lowered = false}), IsOk());
        const schedule::Schedule lowered = Lower(*gen);
        ASSERT_THAT(schedule::Validate(lowered), IsOk());
        for (int s = 0; s < k; ++s) {
          EXPECT_THAT(schedule::ValidateProgram(lowered[s]), IsOk()) << "stage " << s;
          EXPECT_EQ(schedule::PeakInFlight((*gen)[s]), InFlightBound(kind, k, m, v, s))
              << "stage " << s;
        }
        auto sim = Simulate(lowered, EqualStageCost(k, v));
        ASSERT_THAT(sim, IsOk());
        const double textbook = TextbookBubble(kind, k, m, v);
        const double one_f_one_b = TextbookBubble(ScheduleKind::kOneFOneB, k, m, 1);
        if (kind == ScheduleKind::kZbH1 && m < k) {
          EXPECT_LE(sim->bubble_fraction, one_f_one_b + 1e-12);
        } else {
          EXPECT_NEAR(sim->bubble_fraction, textbook, 1e-12);
          // Step time: the ideal 3M units plus the bubble time of the formula.
          const double bubble_time = kind == ScheduleKind::kZbH1          ? (k - 1)
                                     : IsV(kind)                          ? (k - 1) / 2.0
                                     : kind == ScheduleKind::kInterleaved ? 3.0 * (k - 1) / v
                                                                          : 3.0 * (k - 1);
          EXPECT_NEAR(sim->step_time_s, 3.0 * m + bubble_time, 1e-9);
        }
      }
    }
  }
}

TEST(GeneratorsTest, InterleavedWithMoreChunksKeepsItsBubbleAndBound) {
  for (int v = 3; v <= 4; ++v) {
    for (int k = 1; k <= 8; ++k) {
      for (int m = k; m <= 16; m += k) {
        SCOPED_TRACE(absl::StrCat("K=", k, " M=", m, " v=", v));
        auto gen = Generate(ScheduleKind::kInterleaved, k, m, v);
        ASSERT_THAT(gen, IsOk());
        const schedule::Schedule lowered = Lower(*gen);
        ASSERT_THAT(schedule::Validate(lowered), IsOk());
        auto sim = Simulate(lowered, EqualStageCost(k, v));
        ASSERT_THAT(sim, IsOk());
        EXPECT_NEAR(sim->bubble_fraction, TextbookBubble(ScheduleKind::kInterleaved, k, m, v),
                    1e-9);
      }
    }
  }
}

TEST(GeneratorsTest, ZbH1BubbleIsAThirdOfOneFOneBs) {
  for (int k = 2; k <= 8; ++k) {
    for (int m = k; m <= 16; ++m) {
      auto zb = Simulate(Lower(*Generate(ScheduleKind::kZbH1, k, m)), EqualStageCost(k));
      auto ofob = Simulate(Lower(*Generate(ScheduleKind::kOneFOneB, k, m)), EqualStageCost(k));
      ASSERT_TRUE(zb.ok() && ofob.ok());
      const double zb_idle = zb->step_time_s - 3.0 * m;
      const double ofob_idle = ofob->step_time_s - 3.0 * m;
      EXPECT_NEAR(zb_idle * 3, ofob_idle, 1e-9) << "K=" << k << " M=" << m;
    }
  }
}

// ZB-H1 keeps 1F1B's order of forwards and input gradients, so counted up to I (the
// full activation stash) stage s holds K - s micro-batches exactly like 1F1B; counted
// up to W, as the validator and simulator count, every stage holds min(K, M).
TEST(GeneratorsTest, ZbH1HoldsOneFOneBsCountUpToTheInputGradient) {
  for (int k = 1; k <= 8; ++k) {
    for (int m = 1; m <= 16; ++m) {
      auto zb = Generate(ScheduleKind::kZbH1, k, m);
      ASSERT_TRUE(zb.ok());
      for (int s = 0; s < k; ++s) {
        int held = 0, peak = 0;
        for (const schedule::Action& a : (*zb)[s].actions) {
          if (a.kind == schedule::ActionKind::kForward) ++held;
          if (a.kind == schedule::ActionKind::kBackwardInput) --held;
          peak = std::max(peak, held);
        }
        EXPECT_EQ(peak, std::min(k - s, m)) << "K=" << k << " M=" << m << " stage " << s;
        EXPECT_EQ(schedule::PeakInFlight((*zb)[s]), std::min(k, m));
      }
    }
  }
}

std::string TestData(const std::string& name) {
  return std::string(PIPETRAIN_TESTDATA_DIR) + "/schedules/" + name;
}

// Golden files hold the compute-only and lowered programs of every schedule of the
// table for K = 2 and 3: M = K + 1 with one chunk, M = 2K with two (a chunked schedule's
// micro-batches go round in groups of K). Set PIPETRAIN_UPDATE_GOLDEN=1 to write them
// for a new schedule or rewrite them after an intended change.
TEST(GeneratorsTest, GoldenSchedules) {
  struct Case {
    ScheduleKind kind;
    int k, m, v;
  };
  std::vector<Case> cases;
  for (ScheduleKind kind : All()) {
    for (int k : {2, 3}) {
      cases.push_back(EntryOf(kind).chunked ? Case{kind, k, 2 * k, 2} : Case{kind, k, k + 1, 1});
    }
  }
  std::set<std::string> checked;
  const bool update = std::getenv("PIPETRAIN_UPDATE_GOLDEN") != nullptr;
  for (const Case& c : cases) {
    for (bool lowered : {false, true}) {
      const std::string name = absl::StrCat(ScheduleName(c.kind), "_k", c.k, "_m", c.m,
                                            lowered ? "_lowered" : "", ".txt");
      SCOPED_TRACE(name);
      checked.insert(name);
      auto gen = Generate(c.kind, c.k, c.m, c.v);
      ASSERT_TRUE(gen.ok());
      const schedule::Schedule s = lowered ? Lower(*gen) : *gen;
      if (update) std::ofstream(TestData(name)) << schedule::ToText(s);
      std::ifstream in(TestData(name));
      ASSERT_TRUE(in) << "missing golden file " << TestData(name);
      std::stringstream text;
      text << in.rdbuf();
      auto golden = schedule::ParseScheduleText(text.str());
      ASSERT_THAT(golden, IsOk());
      EXPECT_EQ(schedule::ToText(*golden), schedule::ToText(s));
      EXPECT_EQ(*golden, s);
    }
  }
  // And no golden file is left of a schedule the table no longer has.
  for (const auto& file : std::filesystem::directory_iterator(TestData(""))) {
    EXPECT_TRUE(checked.contains(file.path().filename().string())) << file.path();
  }
}

TEST(GeneratorsTest, EveryGeneratedScheduleRoundTripsThroughTextAndProto) {
  for (ScheduleKind kind : All()) {
    auto gen = Generate(kind, 4, 8, ChunksFor(kind));
    ASSERT_TRUE(gen.ok());
    const schedule::Schedule lowered = Lower(*gen);
    auto back = schedule::ParseScheduleText(schedule::ToText(lowered));
    ASSERT_THAT(back, IsOk());
    EXPECT_EQ(*back, lowered);
    for (const schedule::StageProgram& p : lowered) {
      auto q = schedule::FromProto(schedule::ToProto(p));
      ASSERT_THAT(q, IsOk());
      EXPECT_EQ(*q, p);
    }
  }
}

// Forward-only (evaluation) schedules over K 1..8, M 1..16, v 1..3: valid as they
// come (lowered), each program alone too, every forward and transfer there once and
// nothing else, one activation held at a time. With equal costs and free transfer the
// pipeline fills once: vM + K - 1 forward slots (of 1/v each) when M is a multiple of
// K; a short last group of micro-batches may wait, never longer than a full one would.
TEST(ForwardOnlyScheduleTest, GridIsValidAndFillsThePipelineOnce) {
  for (int k = 1; k <= 8; ++k) {
    for (int m = 1; m <= 16; ++m) {
      for (int v = 1; v <= 3; ++v) {
        SCOPED_TRACE(absl::StrCat("K=", k, " M=", m, " v=", v));
        auto eval = ForwardOnlySchedule(k, m, v);
        ASSERT_THAT(eval, IsOk());
        ASSERT_EQ(eval->size(), static_cast<size_t>(k));
        ASSERT_THAT(schedule::Validate(*eval), IsOk());
        for (int s = 0; s < k; ++s) {
          const schedule::StageProgram& p = (*eval)[s];
          EXPECT_TRUE(p.forward_only);
          EXPECT_EQ(p.schedule, "eval");
          EXPECT_THAT(schedule::ValidateProgram(p), IsOk());
          EXPECT_EQ(schedule::PeakInFlight(p), 1);
          // M*v forwards, and a receive and a send for each but at the two ends.
          int forwards = 0;
          for (const schedule::Action& a : p.actions) {
            forwards += a.kind == schedule::ActionKind::kForward;
          }
          EXPECT_EQ(forwards, m * v);
          const int ends = (s == 0 ? m : 0) + (s == k - 1 ? m : 0);
          EXPECT_EQ(static_cast<int>(p.actions.size()), 3 * m * v - ends);
        }
        auto sim = Simulate(*eval, EqualStageCost(k, v));
        ASSERT_THAT(sim, IsOk());
        const double filled = (v * m + k - 1) / static_cast<double>(v);
        if (m % k == 0) {
          EXPECT_NEAR(sim->step_time_s, filled, 1e-9);
        } else {
          const int full = (m / k + 1) * k;  // as if the last group were full
          EXPECT_LE(sim->step_time_s, (v * full + k - 1) / static_cast<double>(v) + 1e-9);
        }
      }
    }
  }
}

TEST(ForwardOnlyScheduleTest, GroupsOfKMicroBatchesGoThroughEachChunkInTurn) {
  // K = 2, M = 3, v = 2: micro-batches {0, 1} through chunk 0 then chunk 1, then {2}.
  auto eval = ForwardOnlySchedule(2, 3, 2);
  ASSERT_THAT(eval, IsOk());
  EXPECT_EQ(schedule::ToText(*eval),
            "schedule eval stages 2 micro_batches 3 chunks 2 forward_only\n"
            "stage 0 max_in_flight 1: F0 SEND_F0 F1 SEND_F1 RECV_F0@1 F0@1 SEND_F0@1 RECV_F1@1 "
            "F1@1 SEND_F1@1 F2 SEND_F2 RECV_F2@1 F2@1 SEND_F2@1\n"
            "stage 1 max_in_flight 1: RECV_F0 F0 SEND_F0 RECV_F1 F1 SEND_F1 RECV_F0@1 F0@1 "
            "RECV_F1@1 F1@1 RECV_F2 F2 SEND_F2 RECV_F2@1 F2@1\n");
  auto one = ForwardOnlySchedule(1, 2, 1);
  ASSERT_THAT(one, IsOk());
  EXPECT_EQ(ToString((*one)[0].actions), "F0 F1");
  // Round trips, as every program a stage receives must.
  auto back = schedule::ParseScheduleText(schedule::ToText(*eval));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(*back, *eval);
  for (const schedule::StageProgram& p : *eval) {
    auto q = schedule::FromProto(schedule::ToProto(p));
    ASSERT_THAT(q, IsOk());
    EXPECT_EQ(*q, p);
  }
}

TEST(ForwardOnlyScheduleTest, InvalidShapesAreRejectedNamingTheField) {
  EXPECT_THAT(ForwardOnlySchedule(0, 4, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pipeline.stages")));
  EXPECT_THAT(ForwardOnlySchedule(2, 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pipeline.micro_batches")));
  EXPECT_THAT(ForwardOnlySchedule(2, 4, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pipeline.chunks")));
  EXPECT_THAT(ForwardOnlySchedule(2, 4, 1000),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pipeline.chunks")));
}

}  // namespace
}  // namespace pipetrain::planner

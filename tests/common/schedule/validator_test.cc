#include "common/schedule/validator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::schedule {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// 1F1B on K = 2 stages with M = 3 micro-batches, lowered.
constexpr char kLowered[] =
    "schedule 1f1b stages 2 micro_batches 3 chunks 1\n"
    "stage 0 max_in_flight 2: F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 F2 SEND_F2 RECV_B1 B1 RECV_B2 B2 "
    "OPT\n"
    "stage 1 max_in_flight 1: RECV_F0 F0 B0 SEND_B0 RECV_F1 F1 B1 SEND_B1 RECV_F2 F2 B2 SEND_B2 "
    "OPT\n";
constexpr char kComputeOnly[] =
    "schedule 1f1b stages 2 micro_batches 3 chunks 1\n"
    "stage 0 max_in_flight 2: F0 F1 B0 F2 B1 B2 OPT\n"
    "stage 1 max_in_flight 1: F0 B0 F1 B1 F2 B2 OPT\n";

Schedule Parse(const char* text) {
  auto s = ParseScheduleText(text);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

int Find(const Schedule& s, int stage, const std::string& action) {
  const auto& acts = s[stage].actions;
  for (size_t i = 0; i < acts.size(); ++i) {
    if (ToString(acts[i]) == action) return static_cast<int>(i);
  }
  ADD_FAILURE() << action << " not on stage " << stage;
  return 0;
}

void Erase(Schedule& s, int stage, const std::string& action) {
  auto& acts = s[stage].actions;
  acts.erase(acts.begin() + Find(s, stage, action));
}

// Moves `action` to just before `before` on the same stage.
void MoveBefore(Schedule& s, int stage, const std::string& action, const std::string& before) {
  auto& acts = s[stage].actions;
  Action a = acts[Find(s, stage, action)];
  Erase(s, stage, action);
  acts.insert(acts.begin() + Find(s, stage, before), a);
}

// Every error prints the table (its header row and every stage) and brackets the cell.
auto HasTableMarking(const std::string& cell) {
  return AllOf(HasSubstr("\nposition "), HasSubstr("\nstage 0 "), HasSubstr("\nstage 1 "),
               HasSubstr("[" + cell + "]"));
}

TEST(ValidatorTest, CorrectSchedulesPass) {
  EXPECT_THAT(Validate(Parse(kLowered)), IsOk());
  EXPECT_THAT(Validate(Parse(kComputeOnly), {.lowered = false}), IsOk());
}

TEST(ValidatorTest, MissingForward) {
  Schedule s = Parse(kComputeOnly);
  Erase(s, 1, "F1");
  EXPECT_THAT(Validate(s, {.lowered = false}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("stage 1 position 2 (B1): missing forward F1"),
                             HasTableMarking("B1"))));
  // Lowered: the receive stays, the forward is gone; the send downstream is missing too.
  Schedule l = Parse(kLowered);
  Erase(l, 1, "F1");
  EXPECT_THAT(Validate(l), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("stage 1 position 5 (B1): missing forward F1")));
}

TEST(ValidatorTest, MissingBackward) {
  Schedule s = Parse(kComputeOnly);
  Erase(s, 0, "B2");
  EXPECT_THAT(Validate(s, {.lowered = false}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("stage 0: missing backward B2"), HasSubstr("\nstage 1 "))));
}

TEST(ValidatorTest, DuplicateBackward) {
  Schedule s = Parse(kComputeOnly);
  auto& acts = s[0].actions;
  acts.insert(acts.begin() + Find(s, 0, "B1"), Backward(0));
  EXPECT_THAT(
      Validate(s, {.lowered = false}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("stage 0 position 4 (B0): duplicate backward of micro-batch 0 "
                               "(first at position 2)"),
                     HasTableMarking("B0"))));
}

TEST(ValidatorTest, BackwardBeforeForward) {
  Schedule s = Parse(kComputeOnly);
  MoveBefore(s, 1, "B0", "F0");
  EXPECT_THAT(Validate(s, {.lowered = false}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("stage 1 position 0 (B0): comes before the forward of "
                                       "micro-batch 0 at position 1"),
                             HasTableMarking("B0"), HasSubstr("[F0]"))));
}

TEST(ValidatorTest, SendWithNoMatchingReceive) {
  Schedule s = Parse(kLowered);
  Erase(s, 1, "RECV_F2");
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    AllOf(HasSubstr("stage 0 position 7 (SEND_F2): no matching "
                                                    "RECV_F2 on stage 1"),
                                          HasTableMarking("SEND_F2"))));
}

TEST(ValidatorTest, ReceiveWithNoSend) {
  Schedule s = Parse(kLowered);
  Erase(s, 1, "SEND_B1");
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    AllOf(HasSubstr("stage 0 position 8 (RECV_B1): no matching "
                                                    "SEND_B1 on stage 1"),
                                          HasTableMarking("RECV_B1"))));
}

TEST(ValidatorTest, DeadlockByReordering) {
  // Stage 0 waits for the gradient of micro-batch 0 before sending its activation.
  Schedule s = Parse(kLowered);
  MoveBefore(s, 0, "RECV_B0", "SEND_F0");
  EXPECT_THAT(Validate(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("deadlock"),
                             HasSubstr("stage 0 position 1 (RECV_B0) waits for stage 1"),
                             HasSubstr("stage 1 position 0 (RECV_F0) waits for stage 0"),
                             HasTableMarking("RECV_B0"), HasSubstr("[RECV_F0]"))));
  // Compute-only: stage 0 waits for B0 before running F1; stage 1 wants F1 before B0.
  Schedule c = Parse(kComputeOnly);
  c[0].actions = ParseActions("F0 B0 F1 B1 F2 B2 OPT").value();
  c[1].actions = ParseActions("F0 F1 B0 B1 F2 B2 OPT").value();
  EXPECT_THAT(
      Validate(c, {.lowered = false}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("deadlock"), HasSubstr("stage 0 position 1 (B0) waits for stage 1"),
                     HasSubstr("stage 1 position 1 (F1) waits for stage 0"), HasTableMarking("B0"),
                     HasSubstr("[F1]"))));
}

TEST(ValidatorTest, InFlightBoundExceeded) {
  Schedule s = Parse(kComputeOnly);
  MoveBefore(s, 0, "F2", "B0");  // GPipe order on stage 0: three activations held
  EXPECT_THAT(Validate(s, {.lowered = false}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("stage 0 position 2 (F2): 3 activations in flight, above "
                                       "this stage's bound of 2"),
                             HasTableMarking("F2"))));
  s[0].max_in_flight = 3;
  EXPECT_THAT(Validate(s, {.lowered = false}), IsOk());
  EXPECT_EQ(PeakInFlight(s[0]), 3);
}

TEST(ValidatorTest, OtherMistakesNameTheCell) {
  Schedule s = Parse(kLowered);
  s[1].actions.push_back(Forward(0));  // after OPT
  EXPECT_THAT(Validate(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stage 1 position 13 (F0): comes after the optimizer")));
  s = Parse(kLowered);
  s[1].actions[1] = Forward(5);
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("stage 1 position 1 (F5): out of range")));
  s = Parse(kLowered);
  s[1].actions.insert(s[1].actions.begin(), Action{ActionKind::kSendActivation, 0, 0});
  EXPECT_THAT(Validate(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nothing downstream")));
  s = Parse(kLowered);
  s[1].num_micro_batches = 4;
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("program 1")));
  s = Parse(kLowered);
  for (StageProgram& p : s) p.num_micro_batches = 1 << 30;  // as a hostile proto could say
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more than")));
  EXPECT_THAT(Validate(Parse(kLowered), {.lowered = false}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("compute-only")));
  // Split backward: W before I, and I without W.
  s = Parse(kComputeOnly);
  s[1].actions[1] = BackwardWeight(0);
  EXPECT_THAT(Validate(s, {.lowered = false}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stage 1 position 1 (W0): weight gradient before the input")));
  s[1].actions[1] = BackwardInput(0);
  EXPECT_THAT(Validate(s, {.lowered = false}), StatusIs(absl::StatusCode::kInvalidArgument,
                                                        HasSubstr("missing weight gradient W0")));
}

TEST(ValidatorTest, TableHasOneRowPerStageAndOneColumnPerPosition) {
  const std::string table = RenderTable(Parse(kComputeOnly), {{1, 2}});
  EXPECT_EQ(table,
            "position  0     1     2     3     4     5     6\n"
            "stage 0   F0    F1    B0    F2    B1    B2    OPT\n"
            "stage 1   F0    B0   [F1]   B1    F2    B2    OPT\n");
}

TEST(ValidatorTest, OneProgramAloneAsAStageServerSeesIt) {
  const Schedule s = Parse(kLowered);
  for (const StageProgram& p : s) EXPECT_THAT(ValidateProgram(p), IsOk());
  // Stage 1 without the receive its first forward needs: caught without stage 0.
  StageProgram p = s[1];
  p.actions.erase(p.actions.begin());
  EXPECT_THAT(ValidateProgram(p),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("stage 1 position 0 (F0): its input is never received"),
                             HasSubstr("\nstage 1  [F0]"), ::testing::Not(HasSubstr("stage 0")))));
  p = s[0];
  p.actions.insert(p.actions.begin() + 6, Action{ActionKind::kSendGradient, 0, 0});
  EXPECT_THAT(ValidateProgram(p),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stage 0 position 6 (SEND_B0): nothing upstream")));
  p = s[0];
  p.max_in_flight = 1;
  EXPECT_THAT(ValidateProgram(p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 activations in flight")));
  p.stage = 2;
  EXPECT_THAT(ValidateProgram(p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stage 2 is not in 0..1")));
  p = s[0];
  p.num_stages = 1 << 30;
  EXPECT_THAT(ValidateProgram(p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_stages")));
}

// Evaluation on K = 2 stages with M = 2 micro-batches: forwards and their transfers only.
constexpr char kForwardOnly[] =
    "schedule eval stages 2 micro_batches 2 chunks 1 forward_only\n"
    "stage 0 max_in_flight 1: F0 SEND_F0 F1 SEND_F1\n"
    "stage 1 max_in_flight 1: RECV_F0 F0 RECV_F1 F1\n";

TEST(ValidatorTest, ForwardOnlySchedulesNeedNoBackward) {
  const Schedule s = Parse(kForwardOnly);
  EXPECT_THAT(Validate(s), IsOk());
  for (const StageProgram& p : s) {
    EXPECT_THAT(ValidateProgram(p), IsOk());
    // A forward frees its activations as it ends: one micro-batch at a time.
    EXPECT_EQ(PeakInFlight(p), 1);
  }
  // Without the flag the same programs are training programs missing their backward.
  Schedule training = s;
  for (StageProgram& p : training) p.forward_only = false;
  EXPECT_THAT(Validate(training),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("missing backward")));
}

TEST(ValidatorTest, ForwardOnlyRefusesBackwardAndOptimizerNamingTheAction) {
  Schedule s = Parse(kForwardOnly);
  s[1].actions.push_back(Backward(0));
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    AllOf(HasSubstr("stage 1 position 4 (B0): not allowed in a "
                                                    "forward-only program"),
                                          HasTableMarking("B0"))));
  EXPECT_THAT(ValidateProgram(s[1]), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("stage 1 position 4 (B0): not allowed")));
  s = Parse(kForwardOnly);
  s[0].actions.push_back(OptimizerStep());
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("stage 0 position 4 (OPT): not allowed in a "
                                              "forward-only program")));
  for (const char* action : {"I1", "W1", "SEND_B1", "RECV_B0"}) {
    s = Parse(kForwardOnly);
    s[0].actions.push_back(*ParseAction(action));
    EXPECT_THAT(
        Validate(s),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr(absl::StrCat("stage 0 position 4 (", action, "): not allowed"))));
  }
}

TEST(ValidatorTest, ForwardOnlyStillChecksForwardsTransfersAndDeadlock) {
  Schedule s = Parse(kForwardOnly);
  Erase(s, 1, "F1");
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("stage 1: missing forward F1 of micro-batch 1")));
  s = Parse(kForwardOnly);
  s[0].actions.push_back(Forward(1));
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("stage 0 position 4 (F1): duplicate forward")));
  s = Parse(kForwardOnly);
  Erase(s, 1, "RECV_F1");
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("(SEND_F1): no matching RECV_F1 on stage 1")));
  // Stage 1 receives micro-batch 1 first; stage 0 sends it second: fine (sends do not
  // block). Stage 0 waiting on stage 1 cannot happen without chunks, so wrap with v = 2.
  s = Parse(kForwardOnly);
  MoveBefore(s, 1, "RECV_F1", "RECV_F0");
  EXPECT_THAT(Validate(s), IsOk());
  Schedule ring = Parse(
      "schedule eval stages 2 micro_batches 1 chunks 2 forward_only\n"
      "stage 0 max_in_flight 1: RECV_F0@1 F0@1 SEND_F0@1 F0 SEND_F0\n"
      "stage 1 max_in_flight 1: RECV_F0 F0 SEND_F0 RECV_F0@1 F0@1\n");
  EXPECT_THAT(Validate(ring),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("deadlock"), HasSubstr("stage 0 position 0 (RECV_F0@1)"),
                             HasSubstr("stage 1 position 0 (RECV_F0)"))));
  // Chunk 0 first on stage 0 is the order that runs.
  ring[0].actions = *ParseActions("F0 SEND_F0 RECV_F0@1 F0@1 SEND_F0@1");
  EXPECT_THAT(Validate(ring), IsOk());
  // Every program of a step is forward-only, or none is.
  s = Parse(kForwardOnly);
  s[1].forward_only = false;
  EXPECT_THAT(Validate(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("program 1 has forward_only false")));
}

TEST(ValidatorTest, LongProgramsShowAWindowAroundTheOffendingCell) {
  Schedule s = Parse(kComputeOnly);
  s[0].num_micro_batches = s[1].num_micro_batches = 400;
  s[0].actions.clear();
  for (int m = 0; m < 400; ++m) s[0].actions.push_back(Forward(m));
  s[0].actions.push_back(Backward(300));
  s[0].actions.push_back(Backward(300));
  const std::string table = RenderTable(s, {{0, 401}});
  EXPECT_THAT(table, HasSubstr("[B300]"));
  EXPECT_THAT(table, HasSubstr("(positions 341..401 of 402)"));
  EXPECT_THAT(table, ::testing::Not(HasSubstr(" F0 ")));
  EXPECT_LT(table.size(), 3000u);
}

}  // namespace
}  // namespace pipetrain::schedule

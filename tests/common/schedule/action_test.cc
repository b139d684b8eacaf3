#include "common/schedule/action.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::schedule {
namespace {

using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ActionTest, PrintsTheCompactForm) {
  EXPECT_EQ(ToString(Forward(3)), "F3");
  EXPECT_EQ(ToString(Backward(3)), "B3");
  EXPECT_EQ(ToString(BackwardInput(3)), "I3");
  EXPECT_EQ(ToString(BackwardWeight(3)), "W3");
  EXPECT_EQ(ToString(Action{ActionKind::kSendActivation, 3, 0}), "SEND_F3");
  EXPECT_EQ(ToString(Action{ActionKind::kRecvActivation, 3, 0}), "RECV_F3");
  EXPECT_EQ(ToString(Action{ActionKind::kSendGradient, 3, 0}), "SEND_B3");
  EXPECT_EQ(ToString(Action{ActionKind::kRecvGradient, 12, 1}), "RECV_B12@1");
  EXPECT_EQ(ToString(Forward(3, 1)), "F3@1");
  EXPECT_EQ(ToString(OptimizerStep()), "OPT");
}

TEST(ActionTest, EveryKindRoundTripsThroughText) {
  const ActionKind kinds[] = {ActionKind::kForward,        ActionKind::kBackward,
                              ActionKind::kBackwardInput,  ActionKind::kBackwardWeight,
                              ActionKind::kSendActivation, ActionKind::kRecvActivation,
                              ActionKind::kSendGradient,   ActionKind::kRecvGradient};
  for (ActionKind k : kinds) {
    for (int mb : {0, 7, 123}) {
      for (int chunk : {0, 1, 5}) {
        const Action a{k, mb, chunk};
        auto parsed = ParseAction(ToString(a));
        ASSERT_TRUE(parsed.ok()) << ToString(a) << ": " << parsed.status();
        EXPECT_EQ(*parsed, a) << ToString(a);
      }
    }
  }
  auto opt = ParseAction("OPT");
  ASSERT_TRUE(opt.ok());
  EXPECT_EQ(*opt, OptimizerStep());
}

TEST(ActionTest, ProgramRoundTripsAndAcceptsAnyWhitespace) {
  std::vector<Action> program = {Forward(0),        {ActionKind::kSendActivation, 0, 0},
                                 Forward(1, 1),     BackwardInput(0),
                                 BackwardWeight(0), OptimizerStep()};
  const std::string text = ToString(program);
  EXPECT_EQ(text, "F0 SEND_F0 F1@1 I0 W0 OPT");
  auto parsed = ParseActions(text);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, program);
  auto spaced = ParseActions("  F0\tSEND_F0\n F1@1  I0 W0 OPT \n");
  ASSERT_TRUE(spaced.ok());
  EXPECT_EQ(*spaced, program);
}

TEST(ActionTest, MalformedTextIsAnErrorQuotingIt) {
  EXPECT_THAT(ParseAction("X3"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'X3'")));
  EXPECT_THAT(ParseAction("F"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("micro-batch")));
  EXPECT_THAT(ParseAction("F-1"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseAction("F3@"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chunk")));
  EXPECT_THAT(ParseAction("F3@x"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("F3@x")));
  EXPECT_THAT(ParseActions("F0 B0 Q1"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Q1")));
}

}  // namespace
}  // namespace pipetrain::schedule

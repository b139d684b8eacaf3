#include "common/schedule/stage_program.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::schedule {
namespace {

using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

Schedule TwoStages() {
  StageProgram a{0, 2, 2, 2, "interleaved", {}, 3};
  a.actions = {Forward(0), {ActionKind::kSendActivation, 0, 0}, Forward(1, 1), OptimizerStep()};
  StageProgram b{1, 2, 2, 2, "interleaved", {}, 1};
  b.actions = {{ActionKind::kRecvActivation, 0, 0}, BackwardInput(1), BackwardWeight(1, 1)};
  return {a, b};
}

TEST(StageProgramTest, ProtoRoundTrip) {
  for (const StageProgram& p : TwoStages()) {
    pipetrain::v1::StageProgram proto = ToProto(p);
    EXPECT_EQ(proto.actions_size(), static_cast<int>(p.actions.size()));
    auto back = FromProto(proto);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, p);
  }
}

TEST(StageProgramTest, FromProtoRejectsUnknownKindsNamingTheAction) {
  pipetrain::v1::StageProgram proto = ToProto(TwoStages()[0]);
  proto.mutable_actions(2)->set_kind(pipetrain::v1::ACTION_KIND_UNSPECIFIED);
  EXPECT_THAT(FromProto(proto),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("actions[2].kind")));
}

TEST(StageProgramTest, ActionFromProtoRoundTripsAndNamesItsField) {
  const Action a{ActionKind::kSendGradient, 3, 1};
  auto back = ActionFromProto(ActionToProto(a));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, a);
  pipetrain::v1::Action bad;
  EXPECT_THAT(ActionFromProto(bad, "events[4].action"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("events[4].action.kind")));
}

TEST(StageProgramTest, FromProtoTreatsZeroChunksAsOne) {
  pipetrain::v1::StageProgram proto;
  proto.set_num_stages(1);
  proto.set_num_micro_batches(1);
  auto p = FromProto(proto);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->num_chunks, 1);
}

TEST(StageProgramTest, TextRoundTrip) {
  const Schedule s = TwoStages();
  const std::string text = ToText(s);
  EXPECT_EQ(text,
            "schedule interleaved stages 2 micro_batches 2 chunks 2\n"
            "stage 0 max_in_flight 3: F0 SEND_F0 F1@1 OPT\n"
            "stage 1 max_in_flight 1: RECV_F0 I1 W1@1\n");
  auto back = ParseScheduleText("# a comment\n\n" + text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);
}

TEST(StageProgramTest, ForwardOnlyRoundTripsThroughProtoAndText) {
  StageProgram p{0, 2, 1, 1, "eval", {Forward(0), {ActionKind::kSendActivation, 0, 0}}, 1};
  p.forward_only = true;
  EXPECT_TRUE(ToProto(p).forward_only());
  auto back = FromProto(ToProto(p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, p);
  StageProgram q{1, 2, 1, 1, "eval", {{ActionKind::kRecvActivation, 0, 0}, Forward(0)}, 1};
  q.forward_only = true;
  const std::string text = ToText({p, q});
  EXPECT_EQ(text,
            "schedule eval stages 2 micro_batches 1 chunks 1 forward_only\n"
            "stage 0 max_in_flight 1: F0 SEND_F0\n"
            "stage 1 max_in_flight 1: RECV_F0 F0\n");
  auto parsed = ParseScheduleText(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, (Schedule{p, q}));
  // Training schedules keep their eight-word header; a stray ninth word is an error.
  EXPECT_THAT(ToText(TwoStages()), ::testing::Not(HasSubstr("forward_only")));
  EXPECT_THAT(ParseScheduleText("schedule x stages 1 micro_batches 1 chunks 1 backward_only\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 1")));
}

TEST(StageProgramTest, TextErrorsNameTheLine) {
  EXPECT_THAT(ParseScheduleText(""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseScheduleText("schedule x stages 2\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 1")));
  // A header without programs (tests/fuzz/corpus/schedule/header_only: the rest of
  // the text a comment) would parse to an empty schedule that prints back as "".
  EXPECT_THAT(ParseScheduleText("schedule gpipe stages 2 micro_batches 3 chunks 1\n"
                                "# stage 0 max_in_flight 3: F0 SEND_F0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no 'stage S")));
  // chunks 0 (tests/fuzz/corpus/schedule/chunks_zero) read back from the proto form
  // as 1, where proto3's 0 means unset; the text form has no unset.
  for (const char* header : {"schedule x stages 2 micro_batches 3 chunks 0\n",
                             "schedule x stages 0 micro_batches 3 chunks 1\n",
                             "schedule x stages 2 micro_batches -1 chunks 1\n"}) {
    EXPECT_THAT(ParseScheduleText(std::string(header) + "stage 0 max_in_flight 1: F0\n"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("line 1: "), HasSubstr("must be >= 1"))))
        << header;
  }
  // stage -2 (tests/fuzz/corpus/schedule/negative_stage) cannot go into the proto form,
  // whose numbers are unsigned; nor can a negative max_in_flight.
  for (const char* line : {"stage -2 max_in_flight 2: F0\n", "stage 0 max_in_flight -1: F0\n"}) {
    EXPECT_THAT(
        ParseScheduleText(std::string("schedule x stages 2 micro_batches 1 chunks 1\n") + line),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr("line 2: "), HasSubstr("must be >= 0"))))
        << line;
  }
  EXPECT_THAT(ParseScheduleText("schedule x stages 1 micro_batches 1 chunks 1\nstage 0: F0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2")));
  EXPECT_THAT(ParseScheduleText(
                  "schedule x stages 1 micro_batches 1 chunks 1\nstage 0 max_in_flight 1: F0 Z0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2: action 'Z0'")));
}

TEST(StageProgramTest, ChunkTopologyWrapsFromTheLastStageToTheFirst) {
  EXPECT_EQ(VirtualStage(3, 0, 4), 3);
  EXPECT_EQ(VirtualStage(0, 1, 4), 4);
  EXPECT_EQ(StageOfVirtual(4, 4), 0);
  EXPECT_EQ(ChunkOfVirtual(4, 4), 1);
  EXPECT_EQ(StageOfVirtual(7, 4), 3);
}

}  // namespace
}  // namespace pipetrain::schedule
